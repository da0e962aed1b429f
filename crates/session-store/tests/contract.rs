//! One contract, two backends: every scenario runs against SQLite (a file
//! on disk) and against a real PostgreSQL server (Debian's package, started
//! for the test as an unprivileged user), each scenario in a fresh database.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_fakes::postgres::Postgres;
use agentry_proto::sessions::v1 as pb;
use agentry_proto::sessions::v1::session_store_server::SessionStore;
use agentry_session_store::store::StoreError;
use agentry_session_store::{Backend, PgStore, SessionStoreService, Store};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::StreamExt;

/// Makes replicas of store `n`: the first call for an `n` makes a fresh
/// store, later ones another handle on the same data (another connection
/// pool for PostgreSQL; the same store for SQLite, which one process owns).
type Replicas = Box<dyn Fn(u32) -> Pin<Box<dyn Future<Output = Backend> + Send>> + Send + Sync>;

fn user(text: &str) -> pb::Event {
    pb::Event {
        kind: Some(pb::event::Kind::UserMessage(pb::UserMessage {
            text: text.into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn delta(text: &str) -> pb::Event {
    pb::Event {
        kind: Some(pb::event::Kind::ModelTextDelta(pb::ModelTextDelta {
            text: text.into(),
        })),
        ..Default::default()
    }
}

fn finished() -> pb::Event {
    pb::Event {
        kind: Some(pb::event::Kind::TurnFinished(pb::TurnFinished::default())),
        ..Default::default()
    }
}

async fn sessions_are_created_listed_and_refused_when_invalid(replicas: &Replicas, n: u32) {
    let store = replicas(n).await;
    let a = store.create_session("a".into(), "".into()).await.unwrap();
    assert_eq!((a.id.as_str(), a.event_count, a.turn_open), ("a", 0, false));
    let generated = store
        .create_session(String::new(), "titled".into())
        .await
        .unwrap();
    assert!(!generated.id.is_empty());
    assert_eq!(generated.title, "titled");
    assert!(matches!(
        store.create_session("a".into(), "".into()).await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert!(matches!(
        store.create_session("no spaces".into(), "".into()).await,
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(matches!(
        store.get_session("nobody".into()).await,
        Err(StoreError::NotFound(_))
    ));
    // Most recently touched first.
    store
        .append("a".into(), 1, vec![user("hello there")])
        .await
        .unwrap();
    let (listed, total) = store.list_sessions(0, 0, false).await.unwrap();
    assert_eq!(total, 2);
    assert_eq!(listed[0].id, "a");
    assert_eq!(listed[0].title, "hello there");
    assert_eq!(listed[0].preview, "hello there");
    assert_eq!(listed[0].user_message_count, 1);
    let (open, open_total) = store.list_sessions(0, 0, true).await.unwrap();
    assert_eq!((open.len(), open_total), (1, 1));
    assert!(open[0].turn_open);
    store.append("a".into(), 2, vec![finished()]).await.unwrap();
    assert_eq!(store.list_sessions(0, 0, true).await.unwrap().1, 0);
    // Priced turns add up, in the last one's currency; unpriced ones add
    // nothing.
    let priced = |cost: f64| pb::Event {
        kind: Some(pb::event::Kind::TurnFinished(pb::TurnFinished {
            cost: Some(cost),
            currency: "USD".into(),
            ..Default::default()
        })),
        ..Default::default()
    };
    store
        .append("a".into(), 3, vec![user("more"), priced(0.25)])
        .await
        .unwrap();
    store
        .append(
            "a".into(),
            5,
            vec![user("again"), priced(0.5), user("x"), finished()],
        )
        .await
        .unwrap();
    let a = store.get_session("a".into()).await.unwrap();
    assert_eq!((a.cost, a.currency.as_str()), (0.75, "USD"));
    let (page, _) = store.list_sessions(1, 1, false).await.unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].id, generated.id);
}

async fn appends_are_gap_free_and_refused_out_of_order(replicas: &Replicas, n: u32) {
    let store = replicas(n).await;
    store.create_session("s".into(), "".into()).await.unwrap();
    let stored = store
        .append("s".into(), 1, vec![user("a"), delta("b"), delta("c")])
        .await
        .unwrap();
    let seqs: Vec<u64> = stored.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert!(
        stored
            .iter()
            .all(|e| e.session_id == "s" && e.time.is_some())
    );
    match store.append("s".into(), 1, vec![delta("again")]).await {
        Err(StoreError::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (1, 4)),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert!(matches!(
        store.append("s".into(), 9, vec![delta("gap")]).await,
        Err(StoreError::Conflict { actual: 4, .. })
    ));
    assert!(matches!(
        store.append("s".into(), 4, vec![]).await,
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(matches!(
        store
            .append("s".into(), 4, vec![pb::Event::default()])
            .await,
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(matches!(
        store.append("ghost".into(), 1, vec![delta("x")]).await,
        Err(StoreError::NotFound(_))
    ));
    store.append("s".into(), 4, vec![delta("d")]).await.unwrap();
    assert_eq!(store.get_session("s".into()).await.unwrap().event_count, 4);
}

async fn concurrent_appends_to_one_session_let_exactly_one_win(replicas: &Replicas, n: u32) {
    let first = replicas(n).await;
    let second = replicas(n).await;
    first
        .create_session("race".into(), "".into())
        .await
        .unwrap();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let store = if i % 2 == 0 {
                first.clone()
            } else {
                second.clone()
            };
            tokio::spawn(async move {
                store
                    .append("race".into(), 1, vec![delta(&format!("{i}"))])
                    .await
            })
        })
        .collect();
    let mut won = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => won += 1,
            Err(StoreError::Conflict { actual: 2, .. }) => {}
            Err(e) => panic!("unexpected failure: {e}"),
        }
    }
    assert_eq!(won, 1);
    let (events, more) = second.read("race".into(), 1, 0).await.unwrap();
    assert_eq!((events.len(), more), (1, false));
}

async fn appends_arriving_together_share_commits(replicas: &Replicas, n: u32) {
    let store = replicas(n).await;
    for i in 0..32 {
        store
            .create_session(format!("s{i}"), "".into())
            .await
            .unwrap();
    }
    let before = store.commits();
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                for seq in 1..=10u64 {
                    store
                        .append(format!("s{i}"), seq, vec![delta(&seq.to_string())])
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let commits = store.commits() - before;
    assert!(commits < 320, "320 appends took {commits} commits");
    for i in 0..32 {
        let (events, _) = store.read(format!("s{i}"), 1, 0).await.unwrap();
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=10).collect::<Vec<_>>());
    }
}

async fn reads_page_through_a_log(replicas: &Replicas, n: u32) {
    let store = replicas(n).await;
    store.create_session("p".into(), "".into()).await.unwrap();
    let events: Vec<pb::Event> = (0..25).map(|i| delta(&format!("{i}"))).collect();
    store.append("p".into(), 1, events).await.unwrap();
    let (first, more) = store.read("p".into(), 1, 10).await.unwrap();
    assert_eq!((first.len(), more), (10, true));
    assert_eq!(first[9].seq, 10);
    let (last, more) = store.read("p".into(), 21, 10).await.unwrap();
    assert_eq!((last.len(), more), (5, false));
    let (none, more) = store.read("p".into(), 100, 10).await.unwrap();
    assert_eq!((none.len(), more), (0, false));
    assert!(matches!(
        store.read("nobody".into(), 1, 10).await,
        Err(StoreError::NotFound(_))
    ));
}

async fn forks_copy_the_log_and_deletes_remove_it(replicas: &Replicas, n: u32) {
    let store = replicas(n).await;
    store.create_session("src".into(), "".into()).await.unwrap();
    store
        .append("src".into(), 1, vec![user("one"), finished(), user("two")])
        .await
        .unwrap();
    let fork = store
        .fork_session(
            "src".into(),
            2,
            "fork".into(),
            "/home/p/try-b".into(),
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(fork.forked_from, "src");
    assert_eq!(fork.project_dir, "/home/p/try-b");
    assert_eq!(fork.event_count, 2);
    assert!(!fork.turn_open);
    let (events, _) = store.read("fork".into(), 1, 0).await.unwrap();
    assert!(events.iter().all(|e| e.session_id == "fork"));
    let whole = store
        .fork_session("src".into(), 0, String::new(), String::new(), Vec::new())
        .await
        .unwrap();
    assert_eq!(whole.event_count, 3);
    assert_eq!(whole.project_dir, "", "a scratch workspace unless told");
    assert!(whole.turn_open);
    assert!(matches!(
        store
            .fork_session("src".into(), 9, "f2".into(), String::new(), Vec::new())
            .await,
        Err(StoreError::InvalidArgument(_))
    ));
    // The fork's own events follow the copy in the same transaction.
    let own = store
        .fork_session(
            "src".into(),
            2,
            "own".into(),
            String::new(),
            vec![user("mine")],
        )
        .await
        .unwrap();
    assert_eq!(own.event_count, 3);
    let (events, _) = store.read("own".into(), 1, 0).await.unwrap();
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(events[2].session_id == "own" && events[2].time.is_some());
    // An own event that cannot be stored leaves no fork at all.
    assert!(matches!(
        store
            .fork_session(
                "src".into(),
                2,
                "half".into(),
                String::new(),
                vec![user("fine"), pb::Event::default()],
            )
            .await,
        Err(StoreError::InvalidArgument(_))
    ));
    assert!(matches!(
        store.read("half".into(), 1, 0).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store
            .fork_session("src".into(), 1, "fork".into(), String::new(), Vec::new())
            .await,
        Err(StoreError::AlreadyExists(_))
    ));
    assert_eq!(store.delete_session("src".into()).await.unwrap(), 3);
    assert!(matches!(
        store.read("src".into(), 1, 0).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.delete_session("src".into()).await,
        Err(StoreError::NotFound(_))
    ));
    // The fork lives on.
    assert_eq!(
        store.get_session("fork".into()).await.unwrap().event_count,
        2
    );
}

/// A watcher on one replica while another appends: the stored events, then
/// the live ones, each once, in order.
async fn watch_replays_then_tails_across_replicas(replicas: &Replicas, n: u32) {
    let writer = replicas(n).await;
    let reader = replicas(n).await;
    writer.create_session("w".into(), "".into()).await.unwrap();
    writer
        .append("w".into(), 1, vec![user("first"), delta("a")])
        .await
        .unwrap();
    let (_closing_tx, closing) = tokio::sync::watch::channel(false);
    let service = SessionStoreService::new(reader, closing);
    let mut stream = service
        .watch(tonic::Request::new(pb::WatchRequest {
            session_id: "w".into(),
            from_seq: 1,
        }))
        .await
        .unwrap()
        .into_inner();
    let appender = tokio::spawn(async move {
        for seq in 3..=60u64 {
            writer
                .append("w".into(), seq, vec![delta(&seq.to_string())])
                .await
                .unwrap();
        }
    });
    let mut seen = Vec::new();
    while seen.len() < 60 {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .unwrap_or_else(|_| panic!("the watch stalled after {seen:?}"))
            .unwrap()
            .unwrap();
        seen.push(event.seq);
    }
    appender.await.unwrap();
    assert_eq!(seen, (1..=60).collect::<Vec<_>>());
}

/// Leases: one live driver per session; a driver that stops heartbeating
/// loses the session to the next that asks, and its appends are refused
/// from then on.
async fn leases_fence_a_driver_that_lost_its_session(replicas: &Replicas, n: u32) {
    let one = replicas(n).await;
    let two = replicas(n).await;
    one.create_session("l".into(), "".into()).await.unwrap();
    one.heartbeat("A".into(), "http://a:1".into(), 60_000)
        .await
        .unwrap();
    two.heartbeat("B".into(), "http://b:1".into(), 60_000)
        .await
        .unwrap();
    let a = one.acquire_session("l".into(), "A".into()).await.unwrap();
    assert!(a.acquired);
    assert_eq!((a.epoch, a.owner_url.as_str()), (1, "http://a:1"));
    // Asking again changes nothing.
    assert_eq!(
        one.acquire_session("l".into(), "A".into()).await.unwrap(),
        a
    );
    let b = two.acquire_session("l".into(), "B".into()).await.unwrap();
    assert!(!b.acquired);
    assert_eq!(
        (b.owner.as_str(), b.owner_url.as_str()),
        ("A", "http://a:1")
    );
    one.append_leased("l".into(), 1, 1, vec![user("by A")])
        .await
        .unwrap();
    // A's heartbeat runs out: B takes over with a new epoch, A is fenced.
    one.heartbeat("A".into(), "http://a:1".into(), 150)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = two.acquire_session("l".into(), "B".into()).await.unwrap();
    assert!(b.acquired);
    assert_eq!(b.epoch, 2);
    match one
        .append_leased("l".into(), 2, 1, vec![delta("stale")])
        .await
    {
        Err(StoreError::LeaseLost { epoch, current, .. }) => assert_eq!((epoch, current), (1, 2)),
        other => panic!("a stale driver appended: {other:?}"),
    }
    two.append_leased("l".into(), 2, 2, vec![delta("by B")])
        .await
        .unwrap();
    // Back alive, A does not get it while B lives; B lets go, A may.
    one.heartbeat("A".into(), "http://a:1".into(), 60_000)
        .await
        .unwrap();
    assert!(
        !one.acquire_session("l".into(), "A".into())
            .await
            .unwrap()
            .acquired
    );
    assert!(
        !one.release_session("l".into(), "A".into(), 2)
            .await
            .unwrap()
    );
    assert!(
        two.release_session("l".into(), "B".into(), 2)
            .await
            .unwrap()
    );
    let a = one.acquire_session("l".into(), "A".into()).await.unwrap();
    assert!(a.acquired);
    assert_eq!(a.epoch, 3);
    // A heartbeat of 0 ends a replica at once (a clean shutdown).
    one.heartbeat("A".into(), "http://a:1".into(), 0)
        .await
        .unwrap();
    assert!(
        two.acquire_session("l".into(), "B".into())
            .await
            .unwrap()
            .acquired
    );
    assert!(matches!(
        one.acquire_session("ghost".into(), "A".into()).await,
        Err(StoreError::NotFound(_))
    ));
    // Nothing stale got in.
    let (events, _) = two.read("l".into(), 1, 0).await.unwrap();
    assert_eq!(events.len(), 2);
}

async fn a_sub_agents_session_keeps_its_parent(replicas: &Replicas, n: u32) {
    let store = replicas(n).await;
    let parent = pb::SessionParent {
        session_id: "p".into(),
        call_id: "call-7".into(),
        agent: "researcher".into(),
    };
    store.create_session("p".into(), "".into()).await.unwrap();
    let child = store
        .create(agentry_proto::sessions::v1::CreateSessionRequest {
            session_id: "c".into(),
            title: "a task".into(),
            parent: Some(parent.clone()),
            project_dir: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(child.parent.as_ref(), Some(&parent));
    assert_eq!(
        store.get_session("c".into()).await.unwrap().parent,
        Some(parent.clone())
    );
    assert_eq!(store.get_session("p".into()).await.unwrap().parent, None);
    let (listed, _) = store.list_sessions(10, 0, false).await.unwrap();
    let c = listed.iter().find(|s| s.id == "c").unwrap();
    assert_eq!(c.parent, Some(parent));
}

async fn names_are_unique_checked_and_kept_with_the_project(replicas: &Replicas, n: u32) {
    let store = replicas(n).await;
    let made = store
        .create(agentry_proto::sessions::v1::CreateSessionRequest {
            session_id: "a".into(),
            project_dir: "/home/me/repo".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(made.project_dir, "/home/me/repo");
    store.create_session("b".into(), "".into()).await.unwrap();
    let named = store.rename("a".into(), "fix-login".into()).await.unwrap();
    assert_eq!(named.name, "fix-login");
    assert_eq!(named.project_dir, "/home/me/repo");
    let taken = store
        .rename("b".into(), "fix-login".into())
        .await
        .unwrap_err();
    assert!(
        matches!(&taken, StoreError::NameTaken { by, .. } if by == "a"),
        "{taken}"
    );
    for bad in ["two words", "deadbeef-01", &"x".repeat(65)] {
        assert!(
            matches!(
                store.rename("b".into(), bad.to_string()).await,
                Err(StoreError::InvalidArgument(_))
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        store.rename("nobody".into(), "x1".into()).await,
        Err(StoreError::NotFound(_))
    ));
    // Renaming to its own name, then clearing it, frees the name.
    store.rename("a".into(), "fix-login".into()).await.unwrap();
    assert_eq!(store.rename("a".into(), "".into()).await.unwrap().name, "");
    assert_eq!(
        store
            .rename("b".into(), "fix-login".into())
            .await
            .unwrap()
            .name,
        "fix-login"
    );
    let (listed, _) = store.list_sessions(10, 0, false).await.unwrap();
    assert_eq!(
        listed.iter().find(|s| s.id == "b").unwrap().name,
        "fix-login"
    );
}

async fn checkpoints_ride_with_appends(replicas: &Replicas, n: u32) {
    let store = replicas(n).await;
    store.create_session("c".into(), "".into()).await.unwrap();
    let checkpoint = |seq: u64, state: &[u8]| pb::Checkpoint {
        seq,
        format: 1,
        state: state.to_vec(),
    };
    assert_eq!(store.checkpoint("c".into()).await.unwrap(), None);
    store
        .append_checkpointed(
            "c".into(),
            1,
            0,
            vec![user("a"), finished()],
            Some(checkpoint(2, b"two")),
        )
        .await
        .unwrap();
    assert_eq!(
        store.checkpoint("c".into()).await.unwrap(),
        Some(checkpoint(2, b"two"))
    );
    // One naming an event the log does not have is refused, and the
    // events it came with are not stored.
    for seq in [0, 5] {
        let refused = store
            .append_checkpointed(
                "c".into(),
                3,
                0,
                vec![user("b"), finished()],
                Some(checkpoint(seq, b"x")),
            )
            .await;
        assert!(
            matches!(refused, Err(StoreError::InvalidArgument(_))),
            "{refused:?}"
        );
    }
    assert_eq!(store.get_session("c".into()).await.unwrap().event_count, 2);
    // A later one replaces it; an append without one leaves it.
    store
        .append_checkpointed(
            "c".into(),
            3,
            0,
            vec![user("b"), finished()],
            Some(checkpoint(4, b"four")),
        )
        .await
        .unwrap();
    store.append("c".into(), 5, vec![user("c")]).await.unwrap();
    assert_eq!(
        store.checkpoint("c".into()).await.unwrap(),
        Some(checkpoint(4, b"four"))
    );

    // Read from it: the checkpoint, then the events after it.
    let (_closing_tx, closing) = tokio::sync::watch::channel(false);
    let service = SessionStoreService::new(store.clone(), closing);
    let read = |from_seq: u64, from_checkpoint: bool| {
        service.read(tonic::Request::new(pb::ReadRequest {
            session_id: "c".into(),
            from_seq,
            limit: 0,
            from_checkpoint,
        }))
    };
    let page = read(1, true).await.unwrap().into_inner();
    assert_eq!(page.checkpoint, Some(checkpoint(4, b"four")));
    assert_eq!(page.events.iter().map(|e| e.seq).collect::<Vec<_>>(), [5]);
    assert_eq!((page.next_seq, page.has_more), (6, false));
    let page = read(1, false).await.unwrap().into_inner();
    assert_eq!((page.checkpoint, page.events.len()), (None, 5));
    // Asked from after the checkpoint: the events from there, no checkpoint.
    let page = read(5, true).await.unwrap().into_inner();
    assert_eq!((page.checkpoint, page.events.len()), (None, 1));

    // A fork starts without one; a deleted session's goes with it.
    store
        .fork_session("c".into(), 0, "c-fork".into(), String::new(), Vec::new())
        .await
        .unwrap();
    assert_eq!(store.checkpoint("c-fork".into()).await.unwrap(), None);
    store.delete_session("c".into()).await.unwrap();
    assert!(matches!(
        store.checkpoint("c".into()).await,
        Err(StoreError::NotFound(_))
    ));
    store.create_session("c".into(), "".into()).await.unwrap();
    assert_eq!(store.checkpoint("c".into()).await.unwrap(), None);
}

async fn run_contract(replicas: Replicas) {
    sessions_are_created_listed_and_refused_when_invalid(&replicas, 0).await;
    appends_are_gap_free_and_refused_out_of_order(&replicas, 1).await;
    concurrent_appends_to_one_session_let_exactly_one_win(&replicas, 2).await;
    appends_arriving_together_share_commits(&replicas, 3).await;
    reads_page_through_a_log(&replicas, 4).await;
    forks_copy_the_log_and_deletes_remove_it(&replicas, 5).await;
    watch_replays_then_tails_across_replicas(&replicas, 6).await;
    leases_fence_a_driver_that_lost_its_session(&replicas, 7).await;
    a_sub_agents_session_keeps_its_parent(&replicas, 8).await;
    names_are_unique_checked_and_kept_with_the_project(&replicas, 9).await;
    checkpoints_ride_with_appends(&replicas, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_keeps_the_contract() {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let stores: Arc<std::sync::Mutex<std::collections::HashMap<u32, Backend>>> = Arc::default();
    let make: Replicas = Box::new(move |n| {
        let dir = dir.clone();
        let stores = stores.clone();
        Box::pin(async move {
            stores
                .lock()
                .unwrap()
                .entry(n)
                .or_insert_with(|| {
                    let store = Store::open(&dir.path().join(format!("s{n}.db"))).unwrap();
                    Backend::Sqlite(Arc::new(store))
                })
                .clone()
        })
    });
    run_contract(make).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_keeps_the_contract() {
    let Some(server) = Postgres::start() else {
        return;
    };
    let server = Arc::new(server);
    let made: Arc<std::sync::Mutex<std::collections::HashSet<u32>>> = Arc::default();
    let make: Replicas = Box::new(move |n| {
        let server = server.clone();
        let made = made.clone();
        Box::pin(async move {
            let name = format!("contract{n}");
            let url = if made.lock().unwrap().insert(n) {
                server.create_database(&name)
            } else {
                server.url(&name)
            };
            Backend::Postgres(Arc::new(
                PgStore::connect(&url, Duration::from_secs(10))
                    .await
                    .unwrap_or_else(|e| panic!("{e}\n{}", server.log())),
            ))
        })
    });
    run_contract(make).await;
}

/// PostgreSQL going away and coming back: appends fail meanwhile with an
/// error the caller may retry, and afterwards the store, its
/// notifications and an open watch carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restarts_are_survived() {
    let Some(mut server) = Postgres::start() else {
        return;
    };
    let url = server.create_database("restart");
    let writer = PgStore::connect(&url, Duration::from_secs(10))
        .await
        .unwrap();
    let reader = Backend::Postgres(Arc::new(
        PgStore::connect(&url, Duration::from_secs(10))
            .await
            .unwrap(),
    ));
    writer.create_session("r", "").await.unwrap();
    writer.append("r", 1, vec![user("before")]).await.unwrap();
    let (_closing_tx, closing) = tokio::sync::watch::channel(false);
    let service = SessionStoreService::new(reader, closing);
    let mut stream = service
        .watch(tonic::Request::new(pb::WatchRequest {
            session_id: "r".into(),
            from_seq: 1,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stream.next().await.unwrap().unwrap().seq, 1);

    server.stop();
    let error = writer
        .append("r", 2, vec![delta("during")])
        .await
        .unwrap_err();
    assert!(error.is_retryable(), "{error:?}");
    assert!(error.to_string().contains("unavailable"), "{error}");
    let status = agentry_session_store::service::status_of(error);
    assert_eq!(status.code(), tonic::Code::Unavailable);

    server.start_again();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match writer.append("r", 2, vec![delta("after")]).await {
            Ok(_) => break,
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the store did not recover: {e}\n{}", server.log()),
        }
    }
    let event = tokio::time::timeout(Duration::from_secs(15), stream.next())
        .await
        .expect("the watch heard nothing after the restart")
        .unwrap()
        .unwrap();
    assert_eq!(event.seq, 2);
    // Nothing was stored twice or lost.
    let (events, _) = writer.read("r", 1, 0).await.unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2]);
}

/// `agentry migrate` imports sessions into PostgreSQL: a sub-agent's
/// session keeps its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_imported_sub_agents_session_keeps_its_parent() {
    let Some(server) = Postgres::start() else {
        return;
    };
    let url = server.create_database("imported");
    let store = PgStore::connect(&url, Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    let parent = pb::SessionParent {
        session_id: "p".into(),
        call_id: "call-1".into(),
        agent: "researcher".into(),
    };
    let session = pb::Session {
        id: "sub-0a".into(),
        title: "a task".into(),
        event_count: 1,
        parent: Some(parent.clone()),
        ..Default::default()
    };
    let mut event = user("what does it say?");
    event.session_id = "sub-0a".into();
    event.seq = 1;
    assert!(store.import_session(&session, &[event]).await.unwrap());
    let imported = store.get_session("sub-0a").await.unwrap();
    assert_eq!(imported.parent, Some(parent));
    assert_eq!(imported.event_count, 1);
}
