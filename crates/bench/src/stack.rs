//! The four services as child processes of the `agentry` binary, with a
//! fresh data directory on disk and the fake model as the LLM server.

use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_runtime::Auth;
use agentry_testkit::cluster::Channel;
use anyhow::Context;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};

pub const SERVICES: [&str; 4] = ["session-store", "tool-runner", "scheduler", "orchestrator"];

/// Every service given an address (the gateway too, started when asked).
const ADDRESSED: [&str; 5] = [
    "session-store",
    "tool-runner",
    "scheduler",
    "orchestrator",
    "gateway",
];

pub struct Stack {
    children: Vec<(&'static str, Child)>,
    /// Every service's environment (more orchestrators start with it).
    env: Vec<(String, String)>,
    /// The orchestrators besides the first, by URL.
    pub more_orchestrators: Vec<String>,
    pub urls: BTreeMap<&'static str, String>,
    pub data: tempfile::TempDir,
    /// The services' tokens, read from the data dir once they are up.
    pub auth: Auth,
    /// Where the session store serves its metrics.
    store_metrics: String,
    /// The `agentry` binary the services run.
    bin: std::path::PathBuf,
    _config: tempfile::TempDir,
}

/// A loopback port free now, below the kernel's ephemeral range: a service
/// started (or restarted) on it later does not find it taken by one of the
/// many outgoing connections, whose ports come from that range.
pub fn free_port() -> anyhow::Result<u16> {
    let mut last = None;
    for _ in 0..200 {
        let port = agentry_testkit::cluster::port_below_ephemeral();
        match std::net::TcpListener::bind(("127.0.0.1", port)) {
            Ok(_) => return Ok(port),
            Err(e) => last = Some(e),
        }
    }
    anyhow::bail!(
        "no free loopback port below the ephemeral range: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    )
}

/// The part of a service's environment variables that names it
/// (`SESSION_STORE`).
pub fn var(service: &str) -> String {
    service.replace('-', "_").to_uppercase()
}

impl Stack {
    /// Starts the four services and waits until each answers.
    pub async fn start(bin: &Path, model_url: &str) -> anyhow::Result<Stack> {
        Self::start_only(bin, model_url, &SERVICES).await
    }

    /// Starts some of the services.
    pub async fn start_only(
        bin: &Path,
        model_url: &str,
        services: &[&'static str],
    ) -> anyhow::Result<Stack> {
        Self::start_with(bin, model_url, services, &[]).await
    }

    /// Starts some of the services with more environment (every service
    /// gets it).
    pub async fn start_with(
        bin: &Path,
        model_url: &str,
        services: &[&'static str],
        extra: &[(String, String)],
    ) -> anyhow::Result<Stack> {
        let data = tempfile::tempdir()?;
        let config = tempfile::tempdir()?;
        let mut urls = BTreeMap::new();
        let mut env: Vec<(String, String)> = vec![
            (
                "AGENTRY_CONFIG_DIR".into(),
                config.path().display().to_string(),
            ),
            ("AGENTRY_DATA_DIR".into(), data.path().display().to_string()),
            ("AGENTRY_LLM_BASE_URL".into(), model_url.to_string()),
            ("AGENTRY_LLM_MODEL".into(), "fake-model".into()),
            // The services' log level: AGENTRY_BENCH_LOG, else warnings only.
            (
                "AGENTRY_LOG".into(),
                std::env::var("AGENTRY_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            ),
        ];
        for service in ADDRESSED {
            let port = free_port()?;
            let v = var(service);
            env.push((format!("AGENTRY_{v}_LISTEN"), format!("127.0.0.1:{port}")));
            env.push((
                format!("AGENTRY_{v}_URL"),
                format!("http://127.0.0.1:{port}"),
            ));
            urls.insert(service, format!("http://127.0.0.1:{port}"));
        }
        // The store's metrics, for the commits a turn costs.
        let store_metrics = format!("127.0.0.1:{}", free_port()?);
        env.push((
            "AGENTRY_SESSION_STORE_METRICS_LISTEN".into(),
            store_metrics.clone(),
        ));
        env.extend(extra.iter().cloned());
        let mut stack = Stack {
            bin: bin.to_path_buf(),
            store_metrics,
            children: Vec::new(),
            env: env.clone(),
            more_orchestrators: Vec::new(),
            urls,
            data,
            auth: Auth::off(),
            _config: config,
        };
        for &service in services {
            let child = stack.spawn(service)?;
            stack.children.push((service, child));
        }
        for &service in services {
            stack.wait_for(service).await?;
        }
        if !services.is_empty() {
            let auth_dir = stack.data.path().join("auth");
            stack.auth = Auth::with_tokens(
                agentry_runtime::auth::read_token(&auth_dir.join("client.token"))?,
                agentry_runtime::auth::read_token(&auth_dir.join("service.token"))?,
            );
        }
        Ok(stack)
    }

    /// Starts `agentry serve <service>` with the stack's environment and
    /// `more`.
    fn spawn_with(&self, service: &'static str, more: &[(&str, &str)]) -> anyhow::Result<Child> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(["serve", service])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        for (k, v) in more {
            cmd.env(k, v);
        }
        cmd.spawn()
            .with_context(|| format!("cannot start {} serve {service}", self.bin.display()))
    }

    /// Starts `agentry serve <service>` with the stack's environment.
    fn spawn(&self, service: &'static str) -> anyhow::Result<Child> {
        self.spawn_with(service, &[])
    }

    /// Kills a service and starts it again on the same address and data;
    /// waits until it answers.
    pub async fn restart(&mut self, service: &'static str) -> anyhow::Result<()> {
        let i = self
            .children
            .iter()
            .position(|(name, _)| *name == service)
            .with_context(|| format!("the {service} is not running"))?;
        let (_, mut child) = self.children.remove(i);
        let _ = child.kill();
        let _ = child.wait();
        let child = self.spawn(service)?;
        self.children.push((service, child));
        self.wait_for(service).await
    }

    /// Starts one more orchestrator (another port, the same services and
    /// environment, advertising its own URL) and waits until it answers.
    pub async fn add_orchestrator(&mut self) -> anyhow::Result<String> {
        let port = free_port()?;
        let url = format!("http://127.0.0.1:{port}");
        let listen = format!("127.0.0.1:{port}");
        let mut child = self.spawn_with(
            "orchestrator",
            &[
                ("AGENTRY_ORCHESTRATOR_LISTEN", &listen),
                ("AGENTRY_ORCHESTRATOR_URL", &url),
                ("AGENTRY_ORCHESTRATOR_ADVERTISE_URL", &url),
            ],
        )?;
        let endpoint = self.auth.endpoint(&url)?;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while endpoint.connect().await.is_err() {
            if let Some(status) = child.try_wait()? {
                anyhow::bail!("another orchestrator did not come up: it exited ({status})");
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "another orchestrator did not come up"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        self.children.push(("orchestrator", child));
        self.more_orchestrators.push(url.clone());
        Ok(url)
    }

    /// A client of the orchestrator at `url`.
    pub async fn orchestrator_at(&self, url: &str) -> anyhow::Result<OrchestratorClient<Channel>> {
        let client = Auth::client_with(self.auth.client_token().cloned());
        Ok(OrchestratorClient::new(
            agentry_testkit::cluster::connect_as(&client, url).await?,
        ))
    }

    /// Waits until `service` answers, and fails at once if its process
    /// exited (its port might otherwise be answered by someone else).
    async fn wait_for(&mut self, service: &'static str) -> anyhow::Result<()> {
        let endpoint = self.auth.endpoint(&self.urls[service])?;
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let http = self.urls[service].trim_start_matches("http://").to_string();
        loop {
            if let Some((_, child)) = self.children.iter_mut().find(|(name, _)| *name == service)
                && let Some(status) = child.try_wait()?
            {
                anyhow::bail!("the {service} did not come up: it exited ({status})");
            }
            // The gateway speaks HTTP/1: a connection is enough.
            let connected = if service == "gateway" {
                tokio::net::TcpStream::connect(&http)
                    .await
                    .map(|_| ())
                    .map_err(anyhow::Error::from)
            } else {
                endpoint
                    .connect()
                    .await
                    .map(|_| ())
                    .map_err(anyhow::Error::from)
            };
            match connected {
                Ok(()) => return Ok(()),
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(e).with_context(|| format!("the {service} did not come up"));
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    }

    /// The process id of a service.
    pub fn pid(&self, service: &str) -> Option<u32> {
        self.children
            .iter()
            .find(|(name, _)| *name == service)
            .map(|(_, c)| c.id())
    }

    /// Peak resident memory of each service, in MiB.
    pub fn peak_rss_mib(&self) -> BTreeMap<&'static str, f64> {
        self.children
            .iter()
            .filter_map(|(name, c)| {
                crate::stats::status_kib(c.id(), "VmHWM").map(|kib| (*name, kib as f64 / 1024.0))
            })
            .collect()
    }

    /// CPU time each service has used so far, in ms (all its processes: two
    /// orchestrators count as one entry).
    pub fn cpu_ms(&self) -> BTreeMap<&'static str, f64> {
        let mut by_service = BTreeMap::new();
        for (name, child) in &self.children {
            if let Some(ms) = crate::stats::cpu_ms(child.id()) {
                *by_service.entry(*name).or_insert(0.0) += ms;
            }
        }
        by_service
    }

    /// Bytes of the session store's database on disk (with its WAL).
    pub fn store_bytes(&self) -> u64 {
        ["sessions.db", "sessions.db-wal"]
            .iter()
            .filter_map(|f| std::fs::metadata(self.data.path().join(f)).ok())
            .map(|m| m.len())
            .sum()
    }

    /// A new connection to the orchestrator (one per 100 sessions: each
    /// HTTP/2 connection carries a bounded number of streams), with the
    /// client token as the CLI has.
    pub async fn orchestrator(&self) -> anyhow::Result<OrchestratorClient<Channel>> {
        let client = Auth::client_with(self.auth.client_token().cloned());
        Ok(OrchestratorClient::new(
            agentry_testkit::cluster::connect_as(&client, &self.urls["orchestrator"]).await?,
        ))
    }

    /// A new connection to `service` with the service token.
    pub async fn as_service(&self, service: &str) -> anyhow::Result<Channel> {
        agentry_testkit::cluster::connect_as(&self.auth, &self.urls[service]).await
    }

    /// The session store's append requests and durable commits so far
    /// (from its metrics).
    pub async fn store_writes(&self) -> anyhow::Result<StoreWrites> {
        let url = format!("http://{}/metrics", self.store_metrics);
        // The metrics page may open a moment after the store answers gRPC.
        let mut tries = 0;
        let response = loop {
            match reqwest::get(&url)
                .await
                .and_then(reqwest::Response::error_for_status)
            {
                Ok(response) => break response,
                Err(e) if tries < 50 && e.is_connect() => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot read the session store's metrics at {url}")
                    });
                }
            }
        };
        let text = response.text().await?;
        let value = |name: &str| -> anyhow::Result<f64> {
            text.lines()
                .find_map(|line| {
                    let (series, value) = line.split_once(' ')?;
                    (series == name).then(|| value.trim().parse::<f64>().ok())?
                })
                .with_context(|| format!("the session store's metrics lack {name}"))
        };
        Ok(StoreWrites {
            appends: value("agentry_store_appends_total").unwrap_or(0.0),
            commits: value("agentry_store_commits_total")?,
            events: value("agentry_store_events_appended_total").unwrap_or(0.0),
        })
    }

    /// The workspace of a session.
    pub fn workspace(&self, session_id: &str) -> std::path::PathBuf {
        self.data.path().join("workspaces").join(session_id)
    }
}

/// Writes the session store has taken.
#[derive(Debug, Clone, Copy, Default)]
pub struct StoreWrites {
    /// Append requests stored.
    pub appends: f64,
    /// Durable transactions (appends that arrive together share one).
    pub commits: f64,
    /// Events appended.
    pub events: f64,
}

impl Drop for Stack {
    fn drop(&mut self) {
        // The clients of the others first: the orchestrator never finds the
        // store gone under it.
        for (_, child) in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
