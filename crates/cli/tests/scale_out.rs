//! Two orchestrators on one PostgreSQL: the session store and the scheduler
//! in process on a real PostgreSQL server (started for the test), and two
//! `agentry serve orchestrator` processes on their own ports. A turn works
//! through either; killing the one that drives a session in the middle of
//! a turn leaves the session to the other, with nothing lost.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_fakes::postgres::Postgres;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_proto::sessions::v1::{self as spb, ApprovalMode, event::Kind};
use agentry_testkit::Cluster;
use agentry_testkit::cluster::{Channel, Service};
use agentry_testkit::fake_model::{Reply, finish, pause, text};
use common::{BIN, follow};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An orchestrator replica as a child process.
struct Replica {
    child: Option<Child>,
    url: String,
}

impl Replica {
    fn start(
        cluster: &Cluster,
        addr: std::net::SocketAddr,
        metrics: std::net::SocketAddr,
        log: &std::path::Path,
    ) -> Replica {
        let c = &cluster.config;
        let url = format!("http://{addr}");
        let mut cmd = Command::new(BIN);
        cmd.env("AGENTRY_ORCHESTRATOR_METRICS_LISTEN", metrics.to_string());
        cmd.args(["serve", "orchestrator"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .env_remove("RUST_LOG")
            .env("AGENTRY_CONFIG_DIR", cluster.dir().join("no-config"))
            .env("AGENTRY_DATA_DIR", cluster.data_dir())
            .env("AGENTRY_LLM_BASE_URL", &c.llm.base_url)
            .env("AGENTRY_LLM_MODEL", &c.llm.model)
            .env("AGENTRY_ORCHESTRATOR_LISTEN", addr.to_string())
            .env("AGENTRY_ORCHESTRATOR_URL", &url)
            .env("AGENTRY_ORCHESTRATOR_ADVERTISE_URL", &url)
            .env("AGENTRY_SESSION_STORE_URL", &c.session_store.url)
            .env("AGENTRY_TOOL_RUNNER_URL", &c.tool_runner.url)
            .env("AGENTRY_SCHEDULER_URL", &c.scheduler.url);
        Replica {
            child: Some(cmd.spawn().unwrap()),
            url,
        }
    }

    async fn client(&self, cluster: &Cluster) -> OrchestratorClient<Channel> {
        let channel = agentry_testkit::cluster::connect_as(&cluster.client_auth(), &self.url)
            .await
            .unwrap();
        OrchestratorClient::new(channel)
    }

    fn kill(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

async fn submit(
    client: &mut OrchestratorClient<Channel>,
    session_id: &str,
    text: &str,
) -> Result<pb::SubmitResponse, tonic::Status> {
    client
        .submit(pb::SubmitRequest {
            session_id: session_id.into(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::UserMessage(pb::UserInput {
                    text: text.into(),
                    approval_mode: ApprovalMode::Always as i32,
                    ..Default::default()
                })),
            }),
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Follows the session through `client` until turn `turn_id` finishes.
async fn finished(
    client: &mut OrchestratorClient<Channel>,
    session_id: &str,
    turn_id: &str,
    within: Duration,
) -> spb::TurnFinished {
    let mut events = follow(client, session_id).await;
    tokio::time::timeout(within, async {
        while let Some(event) = events.message().await.unwrap() {
            if let Some(Kind::TurnFinished(f)) = event.kind
                && event.turn_id == turn_id
            {
                return f;
            }
        }
        panic!("the event stream ended");
    })
    .await
    .unwrap_or_else(|_| panic!("turn {turn_id} did not finish within {within:?}"))
}

async fn log_of(cluster: &Cluster, session_id: &str) -> Vec<spb::Event> {
    cluster
        .store()
        .await
        .unwrap()
        .read(spb::ReadRequest {
            session_id: session_id.into(),
            from_seq: 1,
            limit: 0,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events
}

/// The metrics page served at `addr`.
async fn reqwest_metrics(addr: std::net::SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).await.unwrap();
    page
}

/// Waits until the replica at `client` answers.
async fn ready(client: &mut OrchestratorClient<Channel>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while client
        .list_sessions(spb::ListSessionsRequest::default())
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "an orchestrator did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_orchestrators_share_sessions_and_survive_one_being_killed() {
    let Some(server) = Postgres::start() else {
        return;
    };
    let url = server.create_database("agentry");
    let cluster = Cluster::start_only(
        &[
            Service::SessionStore,
            Service::ToolRunner,
            Service::Scheduler,
        ],
        |c| {
            c.session_store.database_url = url.clone();
            c.scheduler.database_url = url.clone();
        },
    )
    .await
    .unwrap();
    let logs = tempfile::tempdir().unwrap();
    let b_metrics = free_addr();
    let mut a = Replica::start(
        &cluster,
        free_addr(),
        free_addr(),
        &logs.path().join("a.log"),
    );
    let b = Replica::start(&cluster, free_addr(), b_metrics, &logs.path().join("b.log"));
    let mut to_a = a.client(&cluster).await;
    let mut to_b = b.client(&cluster).await;
    ready(&mut to_a).await;
    ready(&mut to_b).await;

    // A takes the session with the first turn; B forwards the second to A.
    let session = to_a
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    cluster.model.push(Reply::text("One."));
    let turn = submit(&mut to_a, &session.id, "first").await.unwrap();
    let done = finished(
        &mut to_b,
        &session.id,
        &turn.turn_id,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(done.outcome, spb::TurnOutcome::Completed as i32);
    cluster.model.push(Reply::text("Two."));
    let turn = submit(&mut to_b, &session.id, "second, through B")
        .await
        .unwrap();
    let done = finished(
        &mut to_a,
        &session.id,
        &turn.turn_id,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(done.outcome, spb::TurnOutcome::Completed as i32);

    // Any input is passed on as received, also one the receiving replica
    // has no form of its own for (a switch of model).
    to_b.submit(pb::SubmitRequest {
        session_id: session.id.clone(),
        input: Some(pb::Input {
            kind: Some(pb::input::Kind::Model(pb::ModelInput {
                name: String::new(),
            })),
        }),
    })
    .await
    .expect("a switch of model through B");
    assert!(
        log_of(&cluster, &session.id)
            .await
            .iter()
            .any(|e| matches!(e.kind, Some(Kind::ModelChanged(_)))),
        "the switch reached the log"
    );

    // Streamed text is live (never logged): a client following the
    // session through B gets it from A, which drives the session.
    let mut through_b = follow(&mut to_b, &session.id).await;
    cluster.model.push(Reply::stream(vec![
        pause(Duration::from_millis(500)),
        text("streamed "),
        text("live"),
        finish("stop"),
    ]));
    let turn = submit(&mut to_a, &session.id, "stream it").await.unwrap();
    let streamed = tokio::time::timeout(Duration::from_secs(20), async {
        let mut streamed = String::new();
        while let Some(event) = through_b.message().await.unwrap() {
            match event.kind {
                Some(Kind::ModelTextDelta(d)) => {
                    assert!(event.live, "streamed text is live");
                    streamed.push_str(&d.text);
                }
                Some(Kind::TurnFinished(_)) if event.turn_id == turn.turn_id => break,
                _ => {}
            }
        }
        streamed
    })
    .await
    .expect("the streamed turn finishes within 20 s");
    assert_eq!(streamed, "streamed live");
    assert!(
        log_of(&cluster, &session.id)
            .await
            .iter()
            .all(|e| !matches!(e.kind, Some(Kind::ModelTextDelta(_)))),
        "no streamed text in the log"
    );

    // A third turn, through B, runs on A; A is killed while the model
    // answers. B takes the session over and the turn finishes there.
    let asked = cluster.model.request_count();
    cluster
        .model
        .push(Reply::text("never heard").delay(Duration::from_secs(30)));
    cluster
        .model
        .push(Reply::text("Three, after the takeover."));
    let turn = submit(&mut to_b, &session.id, "third").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.model.request_count() == asked {
        assert!(
            Instant::now() < deadline,
            "the third turn never asked the model"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before_kill = log_of(&cluster, &session.id).await;
    a.kill();
    let killed = Instant::now();
    let done = finished(
        &mut to_b,
        &session.id,
        &turn.turn_id,
        Duration::from_secs(15),
    )
    .await;
    assert_eq!(
        done.outcome,
        spb::TurnOutcome::Completed as i32,
        "{}",
        std::fs::read_to_string(logs.path().join("b.log")).unwrap_or_default()
    );
    // And B takes new turns.
    cluster.model.push(Reply::text("Four."));
    let turn = submit(&mut to_b, &session.id, "fourth").await.unwrap();
    finished(
        &mut to_b,
        &session.id,
        &turn.turn_id,
        Duration::from_secs(10),
    )
    .await;
    let usable_after = killed.elapsed();
    assert!(
        usable_after < Duration::from_secs(10),
        "the session was usable again only {usable_after:?} after the kill"
    );

    // Every event stored before the kill is still there, unchanged, and
    // the log has no gap.
    let after = log_of(&cluster, &session.id).await;
    assert_eq!(after[..before_kill.len()], before_kill[..]);
    let seqs: Vec<u64> = after.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=after.len() as u64).collect::<Vec<_>>());
    let answers: Vec<&str> = after
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ModelMessage(m)) => Some(m.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        answers,
        [
            "One.",
            "Two.",
            "streamed live",
            "Three, after the takeover.",
            "Four."
        ]
    );
    // B forwarded its inputs while A lived, then took the session over.
    let page = reqwest_metrics(b_metrics).await;
    assert!(
        page.contains("agentry_session_routing_total{how=\"forwarded\"} 3"),
        "{page}"
    );
    assert!(
        page.contains("agentry_session_routing_total{how=\"taken_over\"} 1"),
        "{page}"
    );
    drop(server);
}

/// `agentry migrate`: a data directory used with SQLite is copied into
/// PostgreSQL, and `agentry up` on PostgreSQL then shows the same sessions
/// and reminders.
#[tokio::test(flavor = "multi_thread")]
async fn migrate_copies_sqlite_into_postgres() {
    use common::install::{Up, text};
    use serde_json::json;
    let Some(server) = Postgres::start() else {
        return;
    };
    let url = server.create_database("migrated");
    let model = agentry_testkit::FakeModel::start().await.unwrap();
    model.push(Reply::tool_call(
        "r1",
        "schedule_reminder",
        json!({"message": "water the plants", "due": "in 3d"}),
    ));
    model.push(Reply::text("I will remind you."));
    model.push(Reply::text("Second answer."));
    let (install, up, _log) = Up::start(&model.base_url());
    let out = install.run(&[
        "run",
        "--approve",
        "always",
        "remind me to water the plants",
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
    let id = install.latest_session();
    let out = install.run(&["run", "--session", &id, "--approve", "always", "and then?"]);
    assert!(out.status.success(), "{:?}", text(&out));
    let (before, _) = text(&install.run(&["sessions", "show", "--json", &id]));
    up.stop();

    // A password in the URL (the test server trusts any) is never shown.
    let with_password = url.replace("agentry@", "agentry:pw-secret@");
    let out = install.run(&["migrate", "--to", &with_password]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("copied 1 sessions"), "{stdout}");
    assert!(stdout.contains("1 reminders"), "{stdout}");
    assert!(stdout.contains("checked: all 1 sessions"), "{stdout}");
    assert!(!stdout.contains("pw-secret"), "{stdout}");
    assert!(stdout.contains("agentry:***@"), "{stdout}");
    // Again: nothing new, nothing broken.
    let out = install.run(&["migrate", "--to", &url]);
    let (stdout, _) = text(&out);
    assert!(out.status.success());
    assert!(
        stdout.contains("copied 0 sessions (0 events; 1 were there already)"),
        "{stdout}"
    );

    // The services on PostgreSQL see the same.
    let mut on_pg = install;
    on_pg
        .env
        .push(("AGENTRY_SESSION_STORE_DATABASE_URL".into(), url.clone()));
    on_pg
        .env
        .push(("AGENTRY_SCHEDULER_DATABASE_URL".into(), url.clone()));
    let log = on_pg.dir.path().join("up-pg.log");
    let up = Up::try_start(&on_pg, &log).expect("agentry up on PostgreSQL");
    let (after, _) = text(&on_pg.run(&["sessions", "show", "--json", &id]));
    assert_eq!(after, before);
    let (reminders, _) = text(&on_pg.run(&["reminders", "list"]));
    assert!(reminders.contains("water the plants"), "{reminders}");
    drop(up);
    // A bad target is a clear error.
    let out = on_pg.run(&["migrate", "--to", "postgres://nobody@127.0.0.1:1/x"]);
    let (_, stderr) = text(&out);
    assert!(!out.status.success());
    assert!(stderr.contains("cannot reach PostgreSQL"), "{stderr}");
}
