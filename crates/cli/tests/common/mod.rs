//! Helpers shared by the process-level tests: Agentry services run as
//! child processes of the real `agentry` binary, killed with SIGKILL.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod install;
pub mod tmux;

use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_proto::sessions::v1::{self as spb, ApprovalMode, event::Kind};
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Channel;
use agentry_testkit::cluster::Service;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_agentry");

/// Every service in process but the orchestrator, which the test runs as a
/// child process (see [`Orchestrator`]).
pub async fn cluster_without_orchestrator(
    adjust: impl FnOnce(&mut agentry_runtime::Config),
) -> Cluster {
    Cluster::start_only(
        &[
            Service::SessionStore,
            Service::ToolRunner,
            Service::Scheduler,
        ],
        adjust,
    )
    .await
    .unwrap()
}

/// The orchestrator as a child process.
pub struct Orchestrator {
    child: Option<Child>,
    addr: SocketAddr,
    /// The cluster's client token (the process shares its data dir).
    auth: agentry_runtime::Auth,
    env: Vec<(String, String)>,
    config_dir: tempfile::TempDir,
}

impl Orchestrator {
    pub fn new(cluster: &mut Cluster) -> Orchestrator {
        let addr = cluster.release(Service::Orchestrator).unwrap();
        let config_dir = tempfile::tempdir().unwrap();
        let c = &cluster.config;
        let env = vec![
            (
                "AGENTRY_CONFIG_DIR",
                config_dir.path().display().to_string(),
            ),
            ("AGENTRY_DATA_DIR", cluster.data_dir().display().to_string()),
            ("AGENTRY_LLM_BASE_URL", c.llm.base_url.clone()),
            ("AGENTRY_LLM_MODEL", c.llm.model.clone()),
            ("AGENTRY_ORCHESTRATOR_LISTEN", addr.to_string()),
            ("AGENTRY_ORCHESTRATOR_URL", format!("http://{addr}")),
            ("AGENTRY_SESSION_STORE_URL", c.session_store.url.clone()),
            ("AGENTRY_TOOL_RUNNER_URL", c.tool_runner.url.clone()),
            ("AGENTRY_SCHEDULER_URL", c.scheduler.url.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        Orchestrator {
            child: None,
            addr,
            auth: cluster.client_auth(),
            env,
            config_dir,
        }
    }

    /// Settings of its own (`local.toml` in its config directory), read at
    /// its next start.
    pub fn local_config(&self, toml: &str) {
        std::fs::write(self.config_dir.path().join("local.toml"), toml).unwrap();
    }

    pub async fn start(&mut self) -> OrchestratorClient<Channel> {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "orchestrator"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_remove("RUST_LOG");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        let _ = &self.config_dir;
        self.child = Some(cmd.spawn().unwrap());
        let channel =
            agentry_testkit::cluster::connect_as(&self.auth, &format!("http://{}", self.addr))
                .await
                .unwrap();
        OrchestratorClient::new(channel)
    }

    pub fn kill(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }

    /// The `agentry` CLI, set up to talk to this orchestrator.
    pub fn cli(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args).env_remove("RUST_LOG");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }
}

impl Drop for Orchestrator {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub async fn submit(
    client: &mut OrchestratorClient<Channel>,
    session_id: &str,
    kind: pb::input::Kind,
) -> pb::SubmitResponse {
    client
        .submit(pb::SubmitRequest {
            session_id: session_id.into(),
            input: Some(pb::Input { kind: Some(kind) }),
        })
        .await
        .unwrap()
        .into_inner()
}

pub fn message(text: &str, mode: ApprovalMode) -> pb::input::Kind {
    pb::input::Kind::UserMessage(pb::UserInput {
        text: text.into(),
        approval_mode: mode as i32,
        plan: false,
        network: false,
        budget: None,
        compact: false,
        images: Vec::new(),
        interrupt: false,
    })
}

/// Follows a session through the orchestrator, which also sends its live
/// events (streamed text, never in the log).
pub struct Live(tonic::Streaming<spb::Event>);

/// Follows a session through `client` from its start: the log, then new
/// events with the live ones.
pub async fn follow(
    client: &mut OrchestratorClient<Channel>,
    session_id: &str,
) -> tonic::Streaming<spb::Event> {
    client
        .subscribe(pb::SubscribeRequest {
            session_id: session_id.into(),
            from_seq: 1,
            live_only: false,
        })
        .await
        .unwrap()
        .into_inner()
}

impl Live {
    pub async fn follow(client: &mut OrchestratorClient<Channel>, session_id: &str) -> Live {
        Live(follow(client, session_id).await)
    }

    /// Waits for streamed text; panics after 20 s.
    pub async fn text(&mut self, what: &str) -> String {
        let found = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(e) = self.0.message().await.unwrap() {
                if let Some(Kind::ModelTextDelta(d)) = e.kind {
                    assert!(e.live, "streamed text is live, never logged");
                    return d.text;
                }
            }
            panic!("the session's events ended before {what}");
        })
        .await;
        found.unwrap_or_else(|_| panic!("no {what} within 20 s"))
    }
}

/// Follows the session's log in the store (which outlives the orchestrator).
pub struct Log {
    stream: tonic::Streaming<spb::Event>,
    pub seen: Vec<spb::Event>,
}

impl Log {
    pub async fn follow(cluster: &Cluster, session_id: &str) -> Log {
        let stream = cluster
            .store()
            .await
            .unwrap()
            .watch(spb::WatchRequest {
                session_id: session_id.into(),
                from_seq: 1,
            })
            .await
            .unwrap()
            .into_inner();
        Log {
            stream,
            seen: Vec::new(),
        }
    }

    /// Reads until an event matches; panics after 20 s.
    pub async fn until(&mut self, what: &str, matches: impl Fn(&Kind) -> bool) -> spb::Event {
        let found = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(e) = self.stream.message().await.unwrap() {
                self.seen.push(e.clone());
                if e.kind.as_ref().is_some_and(&matches) {
                    return e;
                }
            }
            panic!("the log ended before {what}");
        })
        .await;
        match found {
            Ok(e) => e,
            Err(_) => panic!("no {what} within 20 s; log so far: {:#?}", self.seen),
        }
    }

    pub async fn finished(&mut self) -> spb::TurnFinished {
        match self
            .until("turn_finished", |k| matches!(k, Kind::TurnFinished(_)))
            .await
            .kind
        {
            Some(Kind::TurnFinished(f)) => f,
            _ => unreachable!(),
        }
    }
}

/// The scheduler as a child process (`agentry serve scheduler`).
pub struct SchedulerProcess {
    child: Option<Child>,
    addr: SocketAddr,
    env: Vec<(String, String)>,
    _config_dir: tempfile::TempDir,
}

impl SchedulerProcess {
    /// Takes the cluster's reserved scheduler address.
    pub fn new(cluster: &mut Cluster) -> SchedulerProcess {
        let addr = cluster.release(Service::Scheduler).unwrap();
        let config_dir = tempfile::tempdir().unwrap();
        std::fs::write(
            config_dir.path().join("local.toml"),
            "[scheduler]\nredeliver_after_secs = 1\n",
        )
        .unwrap();
        let env = vec![
            (
                "AGENTRY_CONFIG_DIR",
                config_dir.path().display().to_string(),
            ),
            ("AGENTRY_DATA_DIR", cluster.data_dir().display().to_string()),
            ("AGENTRY_SCHEDULER_LISTEN", addr.to_string()),
            ("AGENTRY_SCHEDULER_URL", format!("http://{addr}")),
            (
                "AGENTRY_SESSION_STORE_URL",
                cluster.config.session_store.url.clone(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        SchedulerProcess {
            child: None,
            addr,
            env,
            _config_dir: config_dir,
        }
    }

    /// Starts it and waits until it answers.
    pub async fn start(&mut self) {
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "scheduler"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_remove("RUST_LOG");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().unwrap());
        agentry_testkit::cluster::connect(&format!("http://{}", self.addr))
            .await
            .unwrap();
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for SchedulerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
