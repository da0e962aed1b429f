#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Integration tests of the session store over real gRPC on 127.0.0.1.

use agentry_proto::sessions::v1 as pb;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_proto::sessions::v1::{
    AppendRequest, CreateSessionRequest, DeleteSessionRequest, Event, ForkSessionRequest,
    GetSessionRequest, ListSessionsRequest, ReadRequest, ReadResponse, Session, WatchRequest,
    event,
};
use pretty_assertions::assert_eq;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// No single wait in these tests may take longer than this.
const WAIT: Duration = Duration::from_secs(10);

type Client = SessionStoreClient<Channel>;

/// A session store served on an ephemeral port.
struct Server {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), agentry_session_store::RunError>>>,
}

impl Server {
    async fn start(data_dir: &Path) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = oneshot::channel::<()>();
        let dir: PathBuf = data_dir.to_path_buf();
        let task = tokio::spawn(async move {
            // Credentials are tested with the whole cluster; this store is
            // on loopback and asks for none.
            let auth = agentry_runtime::Auth::off();
            let mut config =
                agentry_runtime::Config::load(&agentry_runtime::ConfigSource::default()).unwrap();
            config.data_dir = dir.to_string_lossy().into_owned();
            agentry_session_store::run(&config, &auth, listener, async {
                let _ = rx.await;
            })
            .await
        });
        Server {
            addr,
            shutdown: Some(tx),
            task: Some(task),
        }
    }

    async fn client(&self) -> Client {
        tokio::time::timeout(
            WAIT,
            SessionStoreClient::connect(format!("http://{}", self.addr)),
        )
        .await
        .expect("connecting timed out")
        .expect("cannot connect to the store")
    }

    /// Stops the server through its shutdown future and checks it ends cleanly.
    async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let task = self.task.take().unwrap();
        let result = tokio::time::timeout(WAIT, task)
            .await
            .expect("the store did not stop in time")
            .expect("the store task panicked");
        assert!(result.is_ok(), "the store stopped with {result:?}");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A fresh data directory and a server on it.
async fn start_fresh() -> (tempfile::TempDir, Server, Client) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let client = server.client().await;
    (dir, server, client)
}

fn user(text: &str) -> Event {
    Event {
        turn_id: "turn-1".into(),
        kind: Some(event::Kind::UserMessage(pb::UserMessage {
            images: Vec::new(),
            text: text.into(),
            approval_mode: pb::ApprovalMode::Policy as i32,
            plan: false,
            network: false,
            budget: None,
            compact: false,
        })),
        ..Default::default()
    }
}

fn delta(text: &str) -> Event {
    Event {
        turn_id: "turn-1".into(),
        kind: Some(event::Kind::ModelTextDelta(pb::ModelTextDelta {
            text: text.into(),
        })),
        ..Default::default()
    }
}

fn text_of(e: &Event) -> &str {
    match &e.kind {
        Some(event::Kind::UserMessage(m)) => &m.text,
        Some(event::Kind::ModelTextDelta(d)) => &d.text,
        other => panic!("no text in {other:?}"),
    }
}

fn seqs(events: &[Event]) -> Vec<u64> {
    events.iter().map(|e| e.seq).collect()
}

async fn create(client: &mut Client, id: &str, title: &str) -> Session {
    client
        .create_session(CreateSessionRequest {
            project_dir: String::new(),
            session_id: id.into(),
            title: title.into(),
            parent: None,
        })
        .await
        .expect("CreateSession failed")
        .into_inner()
}

async fn get(client: &mut Client, id: &str) -> Result<Session, Status> {
    client
        .get_session(GetSessionRequest {
            session_id: id.into(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn list(client: &mut Client, limit: u32, offset: u32) -> (Vec<Session>, u64) {
    let r = client
        .list_sessions(ListSessionsRequest {
            limit,
            offset,
            only_open_turns: false,
        })
        .await
        .expect("ListSessions failed")
        .into_inner();
    (r.sessions, r.total)
}

async fn append(
    client: &mut Client,
    id: &str,
    expected_seq: u64,
    events: Vec<Event>,
) -> Result<u64, Status> {
    client
        .append(AppendRequest {
            session_id: id.into(),
            expected_seq,
            events,
            lease_epoch: 0,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().last_seq)
}

async fn read(
    client: &mut Client,
    id: &str,
    from_seq: u64,
    limit: u32,
) -> Result<ReadResponse, Status> {
    client
        .read(ReadRequest {
            session_id: id.into(),
            from_seq,
            limit,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

/// The whole log of a session, page by page.
async fn read_all(client: &mut Client, id: &str) -> Vec<Event> {
    let mut events = Vec::new();
    let mut from = 1;
    loop {
        let page = read(client, id, from, 0).await.expect("Read failed");
        events.extend(page.events);
        from = page.next_seq;
        if !page.has_more {
            return events;
        }
    }
}

async fn watch(client: &mut Client, id: &str, from_seq: u64) -> Result<Streaming<Event>, Status> {
    client
        .watch(WatchRequest {
            session_id: id.into(),
            from_seq,
        })
        .await
        .map(|r| r.into_inner())
}

/// The next event of a watch stream, within `WAIT`.
async fn next_event(stream: &mut Streaming<Event>) -> Event {
    tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("no event within the deadline")
        .expect("the watch stream failed")
        .expect("the watch stream ended")
}

/// The next `n` events of a watch stream.
async fn next_events(stream: &mut Streaming<Event>, n: usize) -> Vec<Event> {
    let mut events = Vec::with_capacity(n);
    for _ in 0..n {
        events.push(next_event(stream).await);
    }
    events
}

/// Asserts that nothing more arrives on a watch stream for a while.
async fn assert_quiet(stream: &mut Streaming<Event>) {
    if let Ok(extra) = tokio::time::timeout(Duration::from_millis(300), stream.message()).await {
        panic!("unexpected message on the watch stream: {extra:?}");
    }
}

#[track_caller]
fn assert_code<T: std::fmt::Debug>(result: Result<T, Status>, code: Code) -> Status {
    match result {
        Ok(v) => panic!("expected {code:?}, got Ok({v:?})"),
        Err(status) => {
            assert_eq!(status.code(), code, "{status:?}");
            status
        }
    }
}

fn ts(seconds: i64, nanos: i32) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds, nanos }
}

/// One event of every kind, with every field set.
fn one_of_each_kind() -> Vec<Event> {
    use event::Kind;
    let usage = pb::TokenUsage {
        prompt_tokens: 120,
        completion_tokens: 30,
        total_tokens: 150,
        cached_prompt_tokens: 20,
        cache_write_prompt_tokens: 0,
    };
    let kinds = vec![
        Kind::UserMessage(pb::UserMessage {
            images: Vec::new(),
            text: "List the files, please.\nThanks ✓".into(),
            approval_mode: pb::ApprovalMode::Always as i32,
            plan: false,
            network: false,
            budget: None,
            compact: false,
        }),
        Kind::ModelTextDelta(pb::ModelTextDelta {
            text: "Sure".into(),
        }),
        Kind::ModelMessage(pb::ModelMessage {
            text: "Sure, running ls.".into(),
            finish_reason: "tool_calls".into(),
            usage: Some(usage),
            model: "test-model".into(),
            step: 1,
            ..Default::default()
        }),
        Kind::ToolCallRequested(pb::ToolCallRequested {
            call_id: "c1".into(),
            tool: "bash".into(),
            arguments_json: r#"{"command":"ls"}"#.into(),
            read_only: false,
            parallel_safe: false,
        }),
        Kind::ApprovalRequested(pb::ApprovalRequested {
            call_id: "c1".into(),
            tool: "bash".into(),
            arguments_json: r#"{"command":"ls"}"#.into(),
            matched_rule: "bash: ask".into(),
            network: false,
            outcome_unknown: false,
            approvers: Vec::new(),
            approvals_required: 0,
        }),
        Kind::ApprovalDecided(pb::ApprovalDecided {
            call_id: "c1".into(),
            decision: pb::ApprovalDecision::Edit as i32,
            reason: "list hidden files too".into(),
            edited_arguments_json: r#"{"command":"ls -a"}"#.into(),
            allowances: vec![pb::SessionAllowance {
                tool: "bash".into(),
                command: "ls -a".into(),
                path: String::new(),
            }],
            approved_by: Vec::new(),
            approvals_missing: 0,
        }),
        Kind::ToolCallState(pb::ToolCallState {
            call_id: "c1".into(),
            phase: pb::ToolCallPhase::Executing as i32,
            detail: "approved".into(),
            allowed_by: 0,
        }),
        Kind::ToolOutputChunk(pb::ToolOutputChunk {
            call_id: "c1".into(),
            stream: pb::OutputStream::Stderr as i32,
            text: "warning\n".into(),
        }),
        Kind::ToolResult(pb::ToolResult {
            truncated: false,
            timed_out: false,
            sub_agent_usage: None,
            call_id: "c1".into(),
            tool: "bash".into(),
            output: ".\n..\nfile\n".into(),
            is_error: false,
            exit_code: Some(0),
            duration_ms: 12,
            runner_id: "runner-1".into(),
            secrets_used: vec!["GH_TOKEN".into()],
        }),
        Kind::ReminderDue(pb::ReminderDue {
            reminder_id: "r1".into(),
            firing_id: "r1-1".into(),
            message: "stand up".into(),
            kind: pb::ReminderKind::Notify as i32,
            legacy_kind: String::new(),
            due_time: Some(ts(1_700_000_000, 0)),
            late_ms: 15,
            ..Default::default()
        }),
        Kind::Error(pb::Error {
            source: pb::ErrorSource::Tool as i32,
            message: "runner unavailable".into(),
            retryable: true,
        }),
        Kind::TurnFinished(pb::TurnFinished {
            outcome: pb::TurnOutcome::Completed as i32,
            message: "done".into(),
            steps: 2,
            usage: Some(usage),
            cost: Some(0.25),
            currency: "USD".into(),
        }),
        Kind::CancelRequested(pb::CancelRequested {
            reason: "enough".into(),
        }),
    ];
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| Event {
            turn_id: "turn-1".into(),
            time: Some(ts(1_700_000_100 + i as i64, 123_456_789)),
            kind: Some(kind),
            ..Default::default()
        })
        .collect()
}

fn millis(t: &Option<prost_types::Timestamp>) -> i64 {
    let t = t.as_ref().expect("timestamp missing");
    t.seconds * 1000 + i64::from(t.nanos) / 1_000_000
}

// ---------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------

#[tokio::test]
async fn create_and_get_sessions() {
    let (_dir, _server, mut client) = start_fresh().await;
    let s = create(&mut client, "alpha", "My title").await;
    assert_eq!(s.id, "alpha");
    assert_eq!(s.title, "My title");
    assert_eq!((s.event_count, s.user_message_count), (0, 0));
    assert_eq!((s.preview.as_str(), s.forked_from.as_str()), ("", ""));
    assert!(s.created_at.is_some());
    assert_eq!(s.created_at, s.updated_at);
    assert_eq!(get(&mut client, "alpha").await.unwrap(), s);

    // An empty id gets a generated one.
    let generated = create(&mut client, "", "").await;
    assert_eq!(generated.id.len(), 36, "{generated:?}");
    assert_eq!(get(&mut client, &generated.id).await.unwrap(), generated);
    assert_ne!(create(&mut client, "", "").await.id, generated.id);

    // A title is cut to its first line.
    let s = create(&mut client, "multi", "\n  First line  \nsecond").await;
    assert_eq!(s.title, "First line");

    let status = assert_code(
        client
            .create_session(CreateSessionRequest {
                project_dir: String::new(),
                session_id: "alpha".into(),
                title: String::new(),
                parent: None,
            })
            .await,
        Code::AlreadyExists,
    );
    assert!(status.message().contains("alpha"), "{status:?}");
    assert_eq!(get(&mut client, "alpha").await.unwrap().title, "My title");

    for bad in ["../evil", "has space", "a/b", &"x".repeat(65)] {
        let status = assert_code(
            client
                .create_session(CreateSessionRequest {
                    project_dir: String::new(),
                    session_id: bad.into(),
                    title: String::new(),
                    parent: None,
                })
                .await,
            Code::InvalidArgument,
        );
        assert!(
            status.message().contains("invalid session id"),
            "{status:?}"
        );
    }
    assert_eq!(list(&mut client, 0, 0).await.1, 4);
}

#[tokio::test]
async fn list_is_newest_first_with_titles_previews_and_counts() {
    let (_dir, _server, mut client) = start_fresh().await;
    for id in ["a", "b", "c"] {
        create(&mut client, id, "").await;
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
    let (sessions, total) = list(&mut client, 0, 0).await;
    assert_eq!(total, 3);
    let ids: Vec<&str> = sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["c", "b", "a"]);

    // Appending makes a session the most recently updated.
    let before = get(&mut client, "a").await.unwrap();
    append(
        &mut client,
        "a",
        1,
        vec![
            delta("not a user message"),
            user("\n   How do I bake bread?  \nWith details."),
        ],
    )
    .await
    .unwrap();
    append(
        &mut client,
        "a",
        3,
        vec![user("A second question"), delta("x")],
    )
    .await
    .unwrap();
    let (sessions, total) = list(&mut client, 0, 0).await;
    assert_eq!(total, 3);
    let ids: Vec<&str> = sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["a", "c", "b"]);
    let a = &sessions[0];
    assert_eq!(a.title, "How do I bake bread?");
    assert_eq!(a.preview, "How do I bake bread?");
    assert_eq!(a.event_count, 4);
    assert_eq!(a.user_message_count, 2);
    assert_eq!(a.created_at, before.created_at);
    assert!(millis(&a.updated_at) > millis(&before.updated_at), "{a:?}");
    assert_eq!(sessions[1].event_count, 0);
    assert_eq!(sessions[1].preview, "");

    // A given title is kept; the preview still comes from the first message.
    create(&mut client, "titled", "Kept title").await;
    let long = "é".repeat(200);
    append(&mut client, "titled", 1, vec![user(&long)])
        .await
        .unwrap();
    let titled = get(&mut client, "titled").await.unwrap();
    assert_eq!(titled.title, "Kept title");
    assert_eq!(titled.preview, format!("{}…", "é".repeat(120)));

    // Paging.
    let (page, total) = list(&mut client, 2, 0).await;
    assert_eq!(total, 4);
    let ids: Vec<&str> = page.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["titled", "a"]);
    let (page, _) = list(&mut client, 2, 2).await;
    let ids: Vec<&str> = page.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["c", "b"]);
    let (page, total) = list(&mut client, 2, 4).await;
    assert!(page.is_empty());
    assert_eq!(total, 4);
}

#[tokio::test]
async fn delete_removes_a_session_and_its_log() {
    let (_dir, _server, mut client) = start_fresh().await;
    create(&mut client, "doomed", "").await;
    create(&mut client, "kept", "").await;
    append(
        &mut client,
        "doomed",
        1,
        vec![user("q"), delta("a"), delta("b")],
    )
    .await
    .unwrap();
    append(&mut client, "kept", 1, vec![user("other")])
        .await
        .unwrap();

    let deleted = client
        .delete_session(DeleteSessionRequest {
            session_id: "doomed".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deleted.deleted_events, 3);
    assert_code(get(&mut client, "doomed").await, Code::NotFound);
    assert_code(read(&mut client, "doomed", 1, 0).await, Code::NotFound);
    assert_code(
        append(&mut client, "doomed", 4, vec![delta("c")]).await,
        Code::NotFound,
    );
    assert_code(
        client
            .delete_session(DeleteSessionRequest {
                session_id: "doomed".into(),
            })
            .await,
        Code::NotFound,
    );
    let (sessions, total) = list(&mut client, 0, 0).await;
    assert_eq!(total, 1);
    assert_eq!(sessions[0].id, "kept");
    assert_eq!(read_all(&mut client, "kept").await.len(), 1);

    // The id can be used again, with an empty log.
    let again = create(&mut client, "doomed", "").await;
    assert_eq!(again.event_count, 0);
    assert!(read_all(&mut client, "doomed").await.is_empty());
    append(&mut client, "doomed", 1, vec![delta("fresh")])
        .await
        .unwrap();
}

#[tokio::test]
async fn fork_copies_the_log_up_to_a_seq() {
    let (_dir, _server, mut client) = start_fresh().await;
    create(&mut client, "src", "").await;
    append(
        &mut client,
        "src",
        1,
        vec![user("question"), delta("one"), delta("two")],
    )
    .await
    .unwrap();
    let source_events = read_all(&mut client, "src").await;
    let source = get(&mut client, "src").await.unwrap();

    let forker = client.clone();
    let fork = |up_to_seq: u64, new_id: &str| {
        let mut client = forker.clone();
        let new_id = new_id.to_string();
        async move {
            client
                .fork_session(ForkSessionRequest {
                    project_dir: String::new(),
                    events: Vec::new(),
                    session_id: "src".into(),
                    up_to_seq,
                    new_session_id: new_id,
                })
                .await
                .map(|r| r.into_inner())
        }
    };

    let f = fork(2, "half").await.unwrap();
    assert_eq!(f.id, "half");
    assert_eq!(f.forked_from, "src");
    assert_eq!(f.event_count, 2);
    assert_eq!(f.user_message_count, 1);
    assert_eq!(f.title, source.title);
    assert_eq!(f.preview, source.preview);
    assert_eq!(get(&mut client, "half").await.unwrap(), f);
    let expected: Vec<Event> = source_events[..2]
        .iter()
        .map(|e| Event {
            session_id: "half".into(),
            ..e.clone()
        })
        .collect();
    assert_eq!(read_all(&mut client, "half").await, expected);

    // 0 copies everything; an empty new id is generated.
    let whole = fork(0, "").await.unwrap();
    assert_eq!(whole.event_count, 3);
    assert_eq!(whole.id.len(), 36);
    let copied = read_all(&mut client, &whole.id).await;
    assert_eq!(copied.len(), 3);
    for (c, s) in copied.iter().zip(&source_events) {
        assert_eq!(
            c,
            &Event {
                session_id: whole.id.clone(),
                ..s.clone()
            }
        );
    }

    // The fork continues on its own; the source is untouched.
    assert_eq!(
        append(&mut client, "half", 3, vec![delta("fork only")])
            .await
            .unwrap(),
        3
    );
    assert_eq!(read_all(&mut client, "src").await, source_events);
    assert_eq!(get(&mut client, "src").await.unwrap().event_count, 3);

    let status = assert_code(fork(4, "too-far").await, Code::InvalidArgument);
    assert!(status.message().contains("ends at seq 3"), "{status:?}");
    assert_code(fork(1, "half").await, Code::AlreadyExists);
    assert_code(fork(1, "bad id").await, Code::InvalidArgument);
    assert_code(
        client
            .fork_session(ForkSessionRequest {
                project_dir: String::new(),
                events: Vec::new(),
                session_id: "missing".into(),
                up_to_seq: 0,
                new_session_id: "x".into(),
            })
            .await,
        Code::NotFound,
    );
    // Failed forks created nothing.
    assert_code(get(&mut client, "too-far").await, Code::NotFound);
    let missing = assert_code(get(&mut client, "x").await, Code::NotFound);
    assert_eq!(
        agentry_runtime::reasons::reason_of(&missing),
        agentry_runtime::reasons::Reason::SessionNotFound
    );
    assert_eq!(list(&mut client, 0, 0).await.1, 3);
}

// ---------------------------------------------------------------------------
// Append and Read
// ---------------------------------------------------------------------------

#[tokio::test]
async fn append_sets_session_and_seq_and_keeps_the_rest() {
    let (_dir, _server, mut client) = start_fresh().await;
    create(&mut client, "s", "").await;
    let mut sent = one_of_each_kind();
    // The store overrides session id and seq, and fills in a missing time.
    sent[0].session_id = "someone-else".into();
    sent[0].seq = 99;
    sent[1].time = None;
    let last = append(&mut client, "s", 1, sent.clone()).await.unwrap();
    assert_eq!(last, sent.len() as u64);

    let stored = read_all(&mut client, "s").await;
    assert_eq!(stored.len(), sent.len());
    assert!(stored[1].time.is_some(), "a missing time is filled in");
    let expected: Vec<Event> = sent
        .iter()
        .zip(1..)
        .map(|(e, seq)| Event {
            session_id: "s".into(),
            seq,
            time: if seq == 2 { stored[1].time } else { e.time },
            ..e.clone()
        })
        .collect();
    assert_eq!(stored, expected);

    let session = get(&mut client, "s").await.unwrap();
    assert_eq!(session.event_count, one_of_each_kind().len() as u64);
    assert_eq!(session.user_message_count, 1);
    assert_eq!(session.preview, "List the files, please.");

    // The next append continues the log.
    let next = one_of_each_kind().len() as u64 + 1;
    assert_eq!(
        append(&mut client, "s", next, vec![delta("more")])
            .await
            .unwrap(),
        next
    );
    assert_eq!(
        seqs(&read_all(&mut client, "s").await),
        (1..=next).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn append_with_a_wrong_expected_seq_fails_and_stores_nothing() {
    let (_dir, _server, mut client) = start_fresh().await;
    create(&mut client, "s", "").await;
    assert_code(
        append(&mut client, "s", 0, vec![user("x")]).await,
        Code::FailedPrecondition,
    );
    assert_code(
        append(&mut client, "s", 2, vec![user("x")]).await,
        Code::FailedPrecondition,
    );
    assert!(read_all(&mut client, "s").await.is_empty());
    assert_eq!(get(&mut client, "s").await.unwrap().event_count, 0);

    assert_eq!(
        append(&mut client, "s", 1, vec![user("q"), delta("a")])
            .await
            .unwrap(),
        2
    );
    let log = read_all(&mut client, "s").await;
    let session = get(&mut client, "s").await.unwrap();
    for expected_seq in [1, 2, 4, 100] {
        let status = assert_code(
            append(
                &mut client,
                "s",
                expected_seq,
                vec![user("late"), delta("b")],
            )
            .await,
            Code::FailedPrecondition,
        );
        assert_eq!(
            agentry_runtime::reasons::reason_of(&status),
            agentry_runtime::reasons::Reason::AppendConflict
        );
        assert!(
            status.message().contains(&format!(
                "expected next seq {expected_seq} but the log's next seq is 3"
            )),
            "{status:?}"
        );
    }
    assert_eq!(read_all(&mut client, "s").await, log);
    assert_eq!(get(&mut client, "s").await.unwrap(), session);
    assert_eq!(
        append(&mut client, "s", 3, vec![delta("b")]).await.unwrap(),
        3
    );
}

#[tokio::test]
async fn unknown_sessions_are_not_found() {
    let (_dir, _server, mut client) = start_fresh().await;
    assert_code(get(&mut client, "ghost").await, Code::NotFound);
    let status = assert_code(
        append(&mut client, "ghost", 1, vec![user("hello")]).await,
        Code::NotFound,
    );
    assert!(status.message().contains("ghost"), "{status:?}");
    assert_code(read(&mut client, "ghost", 1, 0).await, Code::NotFound);
    assert_code(
        client
            .delete_session(DeleteSessionRequest {
                session_id: "ghost".into(),
            })
            .await,
        Code::NotFound,
    );
    // Appending did not create it.
    assert_code(get(&mut client, "ghost").await, Code::NotFound);
    assert_eq!(list(&mut client, 0, 0).await.1, 0);
}

#[tokio::test]
async fn malformed_appends_are_invalid_arguments_and_store_nothing() {
    let (_dir, _server, mut client) = start_fresh().await;
    create(&mut client, "s", "").await;
    let status = assert_code(
        append(&mut client, "s", 1, vec![Event::default()]).await,
        Code::InvalidArgument,
    );
    assert!(
        status
            .message()
            .contains("event 0 of the append has no kind"),
        "{status:?}"
    );
    let no_kind = Event {
        turn_id: "t".into(),
        ..Default::default()
    };
    let status = assert_code(
        append(&mut client, "s", 1, vec![user("fine"), no_kind]).await,
        Code::InvalidArgument,
    );
    assert!(status.message().contains("event 1"), "{status:?}");
    let status = assert_code(
        append(&mut client, "s", 1, vec![]).await,
        Code::InvalidArgument,
    );
    assert!(
        status.message().contains("at least one event"),
        "{status:?}"
    );

    let session = get(&mut client, "s").await.unwrap();
    assert_eq!((session.event_count, session.user_message_count), (0, 0));
    assert_eq!(session.preview, "");
    assert!(read_all(&mut client, "s").await.is_empty());
    assert_eq!(
        append(&mut client, "s", 1, vec![user("fine")])
            .await
            .unwrap(),
        1
    );
}

#[tokio::test]
async fn read_pages_through_the_log() {
    let (_dir, _server, mut client) = start_fresh().await;
    create(&mut client, "s", "").await;
    let sent: Vec<Event> = (1..=25).map(|i| delta(&format!("d{i}"))).collect();
    assert_eq!(append(&mut client, "s", 1, sent).await.unwrap(), 25);

    let page = read(&mut client, "s", 1, 10).await.unwrap();
    assert_eq!(seqs(&page.events), (1..=10).collect::<Vec<_>>());
    assert_eq!((page.next_seq, page.has_more), (11, true));
    let page = read(&mut client, "s", 11, 10).await.unwrap();
    assert_eq!(seqs(&page.events), (11..=20).collect::<Vec<_>>());
    assert_eq!((page.next_seq, page.has_more), (21, true));
    let page = read(&mut client, "s", 21, 10).await.unwrap();
    assert_eq!(seqs(&page.events), (21..=25).collect::<Vec<_>>());
    assert_eq!((page.next_seq, page.has_more), (26, false));
    assert_eq!(text_of(&page.events[4]), "d25");

    // A page that ends exactly at the end of the log.
    let page = read(&mut client, "s", 16, 10).await.unwrap();
    assert_eq!(seqs(&page.events), (16..=25).collect::<Vec<_>>());
    assert_eq!((page.next_seq, page.has_more), (26, false));

    // Past the end: nothing, and the same seq to ask for next.
    let page = read(&mut client, "s", 26, 10).await.unwrap();
    assert!(page.events.is_empty());
    assert_eq!((page.next_seq, page.has_more), (26, false));
    let page = read(&mut client, "s", 100, 0).await.unwrap();
    assert!(page.events.is_empty());
    assert_eq!((page.next_seq, page.has_more), (100, false));

    // 0 and 1 both read from the start; limit 0 reads up to 1000.
    let from0 = read(&mut client, "s", 0, 0).await.unwrap();
    let from1 = read(&mut client, "s", 1, 0).await.unwrap();
    assert_eq!(from0, from1);
    assert_eq!(seqs(&from0.events), (1..=25).collect::<Vec<_>>());
    assert_eq!((from0.next_seq, from0.has_more), (26, false));

    // Paging by 7 yields the whole log exactly once.
    let mut paged = Vec::new();
    let mut from = 1;
    let mut pages = 0;
    loop {
        let page = read(&mut client, "s", from, 7).await.unwrap();
        pages += 1;
        assert!(page.events.len() <= 7);
        paged.extend(page.events);
        from = page.next_seq;
        if !page.has_more {
            break;
        }
    }
    assert_eq!(pages, 4);
    assert_eq!(paged, from1.events);

    // An empty session.
    create(&mut client, "empty", "").await;
    let page = read(&mut client, "empty", 0, 0).await.unwrap();
    assert!(page.events.is_empty());
    assert_eq!((page.next_seq, page.has_more), (1, false));
}

#[tokio::test]
async fn a_page_of_large_events_stays_under_the_message_limit() {
    let (_dir, server, _) = start_fresh().await;
    let mut client = server
        .client()
        .await
        .max_decoding_message_size(agentry_runtime::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(agentry_runtime::MAX_MESSAGE_BYTES);
    create(&mut client, "big", "").await;
    // Five messages with a 9 MiB image each: 45 MiB in all.
    for n in 1..=5u64 {
        let mut event = user(&format!("m{n}"));
        if let Some(event::Kind::UserMessage(m)) = &mut event.kind {
            m.images.push(pb::Image {
                path: format!("{n}.png"),
                mime: "image/png".into(),
                data: vec![n as u8; 9 * 1024 * 1024],
            });
        }
        assert_eq!(append(&mut client, "big", n, vec![event]).await.unwrap(), n);
    }
    let first = read(&mut client, "big", 1, 0).await.unwrap();
    assert_eq!(seqs(&first.events), vec![1, 2, 3]);
    assert_eq!((first.next_seq, first.has_more), (4, true));
    let all = read_all(&mut client, "big").await;
    assert_eq!(seqs(&all), vec![1, 2, 3, 4, 5]);
    assert_eq!(text_of(&all[4]), "m5");
    // One event larger than a page still comes, alone.
    let one = read(&mut client, "big", 5, 0).await.unwrap();
    assert_eq!((one.events.len(), one.has_more), (1, false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_survives_a_server_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path()).await;
    let mut client = server.client().await;
    create(&mut client, "chat", "").await;
    create(&mut client, "other", "Other title").await;
    append(&mut client, "chat", 1, one_of_each_kind())
        .await
        .unwrap();
    append(
        &mut client,
        "chat",
        one_of_each_kind().len() as u64 + 1,
        vec![user("second"), delta("reply")],
    )
    .await
    .unwrap();
    append(&mut client, "other", 1, vec![delta("x")])
        .await
        .unwrap();
    client
        .fork_session(ForkSessionRequest {
            project_dir: String::new(),
            events: Vec::new(),
            session_id: "chat".into(),
            up_to_seq: 5,
            new_session_id: "chat-fork".into(),
        })
        .await
        .unwrap();
    let events_before = read_all(&mut client, "chat").await;
    let fork_before = read_all(&mut client, "chat-fork").await;
    let list_before = list(&mut client, 0, 0).await;
    assert_eq!(events_before.len(), one_of_each_kind().len() + 2);
    assert_eq!(list_before.1, 3);
    drop(client);
    server.stop().await;

    let server = Server::start(dir.path()).await;
    let mut client = server.client().await;
    assert_eq!(read_all(&mut client, "chat").await, events_before);
    assert_eq!(read_all(&mut client, "chat-fork").await, fork_before);
    assert_eq!(list(&mut client, 0, 0).await, list_before);
    // The log continues where it stopped.
    assert_code(
        append(
            &mut client,
            "chat",
            one_of_each_kind().len() as u64 + 2,
            vec![delta("dup")],
        )
        .await,
        Code::FailedPrecondition,
    );
    let next = one_of_each_kind().len() as u64 + 3;
    assert_eq!(
        append(&mut client, "chat", next, vec![delta("after")])
            .await
            .unwrap(),
        next
    );
    drop(client);
    server.stop().await;
}

// ---------------------------------------------------------------------------
// Watch
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_replays_from_a_seq_then_tails_live_appends() {
    let (_dir, server, mut writer) = start_fresh().await;
    let mut watcher_client = server.client().await;
    create(&mut writer, "s", "").await;
    create(&mut writer, "noise", "").await;
    append(&mut writer, "s", 1, vec![user("q"), delta("a"), delta("b")])
        .await
        .unwrap();

    let mut from2 = watch(&mut watcher_client, "s", 2).await.unwrap();
    let mut from0 = watch(&mut watcher_client, "s", 0).await.unwrap();
    let replayed = next_events(&mut from2, 2).await;
    assert_eq!(seqs(&replayed), [2, 3]);
    let all = next_events(&mut from0, 3).await;
    assert_eq!(all, read_all(&mut writer, "s").await);
    assert_eq!(replayed, all[1..].to_vec());
    assert_quiet(&mut from2).await;

    // A live append from another client.
    append(&mut writer, "s", 4, vec![delta("live")])
        .await
        .unwrap();
    let live = next_event(&mut from2).await;
    assert_eq!((live.seq, text_of(&live)), (4, "live"));
    assert_eq!(live.session_id, "s");
    assert_eq!(next_event(&mut from0).await, live);

    // Three appends in quick succession, with another session's in between.
    append(&mut writer, "s", 5, vec![delta("r1")])
        .await
        .unwrap();
    append(&mut writer, "noise", 1, vec![delta("elsewhere")])
        .await
        .unwrap();
    append(&mut writer, "s", 6, vec![delta("r2"), delta("r3")])
        .await
        .unwrap();
    append(&mut writer, "s", 8, vec![delta("r4")])
        .await
        .unwrap();
    let burst = next_events(&mut from2, 4).await;
    assert_eq!(seqs(&burst), [5, 6, 7, 8]);
    let texts: Vec<&str> = burst.iter().map(text_of).collect();
    assert_eq!(texts, ["r1", "r2", "r3", "r4"]);
    assert!(burst.iter().all(|e| e.session_id == "s"));
    assert_eq!(next_events(&mut from0, 4).await, burst);

    // Exactly what the log holds, and nothing more.
    let log = read_all(&mut writer, "s").await;
    assert_eq!(log[1..], [replayed, vec![live], burst.clone()].concat()[..]);
    assert_quiet(&mut from2).await;
    assert_quiet(&mut from0).await;

    // A watcher starting mid-log gets the rest, then live events.
    let mut from7 = watch(&mut watcher_client, "s", 7).await.unwrap();
    assert_eq!(next_events(&mut from7, 2).await, burst[2..].to_vec());
    append(&mut writer, "s", 9, vec![delta("tail")])
        .await
        .unwrap();
    assert_eq!(next_event(&mut from7).await.seq, 9);
    assert_eq!(next_event(&mut from2).await.seq, 9);
    assert_quiet(&mut from7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_joining_during_appends_see_every_event_exactly_once() {
    const TOTAL: u64 = 80;
    const JOIN_AT: u64 = 20;
    let (_dir, server, mut client) = start_fresh().await;
    create(&mut client, "busy", "").await;
    let mut writer = server.client().await;
    let (ready_tx, ready_rx) = oneshot::channel::<()>();
    let appender = tokio::spawn(async move {
        let mut ready_tx = Some(ready_tx);
        let mut seq = 1;
        while seq <= TOTAL {
            // Mostly single events, sometimes a batch of three.
            let n = if seq % 10 == 0 && seq + 2 <= TOTAL {
                3
            } else {
                1
            };
            let events = (seq..seq + n).map(|s| delta(&format!("e{s}"))).collect();
            let last = append(&mut writer, "busy", seq, events).await.unwrap();
            assert_eq!(last, seq + n - 1);
            seq += n;
            // Past JOIN_AT, tell the watchers to join, and keep appending meanwhile.
            if seq > JOIN_AT
                && let Some(tx) = ready_tx.take()
            {
                let _ = tx.send(());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });

    tokio::time::timeout(WAIT, ready_rx)
        .await
        .expect("the appender made no progress")
        .unwrap();
    // From the start, from the middle of what is stored, and from a seq not
    // written yet.
    let mut from_start = watch(&mut client, "busy", 1).await.unwrap();
    let mut from_middle = watch(&mut client, "busy", 10).await.unwrap();
    let mut from_future = watch(&mut client, "busy", 70).await.unwrap();

    let all = next_events(&mut from_start, TOTAL as usize).await;
    let middle = next_events(&mut from_middle, (TOTAL - 9) as usize).await;
    let future = next_events(&mut from_future, (TOTAL - 69) as usize).await;
    tokio::time::timeout(WAIT, appender)
        .await
        .expect("the appender did not finish")
        .unwrap();
    assert_eq!(seqs(&all), (1..=TOTAL).collect::<Vec<_>>());
    assert_eq!(seqs(&middle), (10..=TOTAL).collect::<Vec<_>>());
    assert_eq!(seqs(&future), (70..=TOTAL).collect::<Vec<_>>());
    let log = read_all(&mut client, "busy").await;
    assert_eq!(all, log);
    assert_eq!(middle, log[9..].to_vec());
    assert_eq!(future, log[69..].to_vec());
    assert_quiet(&mut from_start).await;
    assert_quiet(&mut from_middle).await;
    assert_quiet(&mut from_future).await;
}

#[tokio::test]
async fn watch_on_an_unknown_session_is_not_found() {
    let (_dir, _server, mut client) = start_fresh().await;
    let status = assert_code(watch(&mut client, "ghost", 0).await, Code::NotFound);
    assert!(status.message().contains("ghost"), "{status:?}");
    // Watching does not create the session.
    assert_code(get(&mut client, "ghost").await, Code::NotFound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_ends_with_not_found_when_the_session_is_deleted() {
    let (_dir, _server, mut client) = start_fresh().await;
    create(&mut client, "doomed", "").await;
    append(&mut client, "doomed", 1, vec![user("hi")])
        .await
        .unwrap();
    let mut stream = watch(&mut client, "doomed", 1).await.unwrap();
    assert_eq!(next_event(&mut stream).await.seq, 1);
    client
        .delete_session(DeleteSessionRequest {
            session_id: "doomed".into(),
        })
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .expect("the watch stream ended");
    let status = ended.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert!(status.message().contains("deleted"), "{status:?}");
}

// ---------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appenders_with_the_same_expected_seq_exactly_one_wins() {
    const APPENDERS: usize = 8;
    let (_dir, server, mut client) = start_fresh().await;
    create(&mut client, "race", "").await;
    // Separate connections, so the appends really race.
    let mut clients = Vec::new();
    for _ in 0..APPENDERS {
        clients.push(server.client().await);
    }
    for round in 0..5u64 {
        let expected_seq = round * 2 + 1;
        let attempts = clients.iter().enumerate().map(|(i, c)| {
            let mut c = c.clone();
            async move {
                let events = vec![user(&format!("round {round} from {i}")), delta("x")];
                (i, append(&mut c, "race", expected_seq, events).await)
            }
        });
        let results = tokio::time::timeout(WAIT, futures::future::join_all(attempts))
            .await
            .expect("the appends did not finish");
        let winners: Vec<usize> = results
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(i, _)| *i)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        for (_, r) in &results {
            match r {
                Ok(last) => assert_eq!(*last, expected_seq + 1),
                Err(status) => assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}"),
            }
        }
        let log = read_all(&mut client, "race").await;
        assert_eq!(log.len() as u64, expected_seq + 1);
        assert_eq!(
            text_of(&log[expected_seq as usize - 1]),
            format!("round {round} from {}", winners[0])
        );
    }
    let session = get(&mut client, "race").await.unwrap();
    assert_eq!((session.event_count, session.user_message_count), (10, 5));
}
