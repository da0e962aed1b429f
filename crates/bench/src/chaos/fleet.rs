//! The services of a soak as separate `agentry serve …` processes, each
//! behind a small TCP proxy the harness controls: every client and every
//! other service reaches a service through its proxy, so a connection can
//! be cut or slowed, and a process can be killed, restarted, paused and
//! resumed, one at a time or several at once.

use crate::stack::{free_port, var};
use agentry_runtime::Auth;
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

/// How a proxy treats its connections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Link {
    /// Bytes pass.
    Open,
    /// Every connection is dropped and new ones are refused.
    Cut,
    /// Each piece of data waits this long before it is passed on.
    Slow(Duration),
}

/// A TCP proxy in front of one service.
pub struct Proxy {
    /// The port clients dial.
    pub port: u16,
    link: watch::Sender<Link>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards each connection to
    /// the first of `targets` that accepts it, starting one further each
    /// time (a load balancer in front of replicas, or one process).
    async fn start(targets: Vec<u16>) -> anyhow::Result<Arc<Proxy>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let (link, _) = watch::channel(Link::Open);
        let proxy = Arc::new(Proxy { port, link });
        let weak = Arc::downgrade(&proxy);
        let targets = Arc::new(targets);
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Some(proxy) = weak.upgrade() else {
                    return;
                };
                let mut link = proxy.link.subscribe();
                if *link.borrow_and_update() == Link::Cut {
                    continue;
                }
                let (targets, next) = (targets.clone(), next.clone());
                tokio::spawn(async move {
                    let first = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let mut upstream = None;
                    for i in 0..targets.len() {
                        let port = targets[(first + i) % targets.len()];
                        if let Ok(stream) =
                            tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                        {
                            upstream = Some(stream);
                            break;
                        }
                    }
                    let Some(upstream) = upstream else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = upstream.set_nodelay(true);
                    let (cr, cw) = client.into_split();
                    let (ur, uw) = upstream.into_split();
                    tokio::select! {
                        _ = pipe(cr, uw, link.clone()) => {}
                        _ = pipe(ur, cw, link.clone()) => {}
                        _ = async { let _ = link.wait_for(|l| *l == Link::Cut).await; } => {}
                    }
                });
            }
        });
        Ok(proxy)
    }

    /// Sets how connections are treated from now on.
    pub fn set(&self, link: Link) {
        self.link.send_replace(link);
    }
}

/// Copies one direction, delayed while the link is slow.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: watch::Receiver<Link>,
) {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let state = *link.borrow();
        if let Link::Slow(delay) = state {
            tokio::time::sleep(delay).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// One service process.
pub struct Proc {
    /// `orchestrator-1`, `tool-runner-2`, …
    pub name: String,
    /// The service it serves (`agentry serve SERVICE`).
    pub service: &'static str,
    /// Its own settings besides the fleet's.
    env: Vec<(String, String)>,
    child: Mutex<Option<Child>>,
    pub proxy: Arc<Proxy>,
    /// The file holding its clock's offset (`+0`, `+120`, `-60`), when its
    /// wall clock can be moved (a scheduler, with libfaketime installed).
    pub clock: Option<PathBuf>,
}

/// libfaketime (Debian `faketime`): moves a process's wall clock.
pub const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

impl Proc {
    /// The URL clients and other services use (its proxy).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.proxy.port)
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.child
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
    }
}

/// Every process of a soak.
pub struct Fleet {
    bin: PathBuf,
    /// The settings every process gets.
    env: Vec<(String, String)>,
    pub procs: Vec<Arc<Proc>>,
    /// Where the replicas of each service are reached together.
    pub urls: std::collections::BTreeMap<&'static str, String>,
    /// The balancers in front of replicated services.
    _balancers: Vec<Arc<Proxy>>,
    /// Each process's log (`NAME.log`, kept across restarts).
    pub logs: PathBuf,
    pub auth: Auth,
}

/// The processes of a layout: (service, how many).
pub type Layout = [(&'static str, usize)];

impl Fleet {
    /// Starts `layout`'s processes in order, each behind its proxy, with
    /// data under `data`, and waits until each answers.
    pub async fn start(
        bin: &Path,
        data: &Path,
        layout: &Layout,
        extra: Vec<(String, String)>,
    ) -> anyhow::Result<Fleet> {
        let mut env = extra;
        env.push(("AGENTRY_DATA_DIR".into(), data.display().to_string()));
        // Checkpoints every few turns, so that the loads after the faults
        // read from them (and from the whole log after a rewind past one).
        env.push((
            "AGENTRY_ORCHESTRATOR_CHECKPOINT_EVERY_EVENTS".into(),
            "20".into(),
        ));
        env.push((
            "AGENTRY_LOG".into(),
            std::env::var("AGENTRY_BENCH_LOG").unwrap_or_else(|_| "error".into()),
        ));
        let logs = data.with_file_name(format!(
            "{}-logs",
            data.file_name().and_then(|n| n.to_str()).unwrap_or("data")
        ));
        std::fs::create_dir_all(&logs)?;
        let mut procs = Vec::new();
        let mut service_urls = std::collections::BTreeMap::new();
        let mut balancers = Vec::new();
        for &(service, count) in layout {
            let mut urls = Vec::new();
            for i in 1..=count {
                let listen = free_port()?;
                let proxy = Proxy::start(vec![listen]).await?;
                let url = format!("http://127.0.0.1:{}", proxy.port);
                let v = var(service);
                let mut own = vec![(format!("AGENTRY_{v}_LISTEN"), format!("127.0.0.1:{listen}"))];
                if service == "orchestrator" {
                    // Each replica is reached by others at its own proxy.
                    own.push(("AGENTRY_ORCHESTRATOR_ADVERTISE_URL".into(), url.clone()));
                }
                if service == "tool-runner" {
                    own.push(("AGENTRY_RUNNER_ID".into(), format!("runner-{i}")));
                }
                // A scheduler's wall clock can jump (its timers, on the
                // monotonic clock, are left alone).
                let clock = (service == "scheduler" && Path::new(FAKETIME).exists())
                    .then(|| logs.join(format!("{service}-{i}.clock")));
                if let Some(clock) = &clock {
                    std::fs::write(clock, "+0\n")?;
                    own.push(("LD_PRELOAD".into(), FAKETIME.into()));
                    own.push((
                        "FAKETIME_TIMESTAMP_FILE".into(),
                        clock.display().to_string(),
                    ));
                    own.push(("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()));
                    own.push(("FAKETIME_CACHE_DURATION".into(), "1".into()));
                }
                urls.push(url);
                procs.push(Arc::new(Proc {
                    name: format!("{service}-{i}"),
                    service,
                    env: own,
                    child: Mutex::new(None),
                    proxy,
                    clock,
                }));
            }
            // Tool runners are listed (the orchestrator spreads calls over
            // them); other replicas are reached through a balancer, as a
            // cluster's service address would.
            let url = if service == "tool-runner" || count == 1 {
                urls.join(",")
            } else {
                let ports = procs
                    .iter()
                    .filter(|p: &&Arc<Proc>| p.service == service)
                    .map(|p| p.proxy.port)
                    .collect();
                let balancer = Proxy::start(ports).await?;
                let url = format!("http://127.0.0.1:{}", balancer.port);
                balancers.push(balancer);
                url
            };
            env.push((format!("AGENTRY_{}_URL", var(service)), url.clone()));
            service_urls.insert(service, url);
        }
        let mut fleet = Fleet {
            bin: bin.to_path_buf(),
            env,
            procs,
            urls: service_urls,
            _balancers: balancers,
            logs,
            auth: Auth::off(),
        };
        for proc in &fleet.procs {
            fleet.spawn(proc)?;
            fleet
                .until_serving(proc, Duration::from_secs(30))
                .await
                .with_context(|| format!("{} did not come up", proc.name))?;
        }
        let auth_dir = data.join("auth");
        fleet.auth = Auth::with_tokens(
            agentry_runtime::auth::read_token(&auth_dir.join("client.token"))?,
            agentry_runtime::auth::read_token(&auth_dir.join("service.token"))?,
        );
        Ok(fleet)
    }

    /// The processes serving `service`.
    pub fn of(&self, service: &str) -> impl Iterator<Item = &Arc<Proc>> {
        self.procs.iter().filter(move |p| p.service == service)
    }

    /// Starts `proc`'s process (again).
    pub fn spawn(&self, proc: &Proc) -> anyhow::Result<()> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(["serve", proc.service])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.log_path(proc))?,
            );
        for (k, v) in self.env.iter().chain(&proc.env) {
            cmd.env(k, v);
        }
        let child = cmd.spawn().with_context(|| {
            format!("cannot start {} serve {}", self.bin.display(), proc.service)
        })?;
        *proc.child.lock().unwrap_or_else(|e| e.into_inner()) = Some(child);
        Ok(())
    }

    /// Kills `proc`'s process at once (SIGKILL) and reaps it.
    pub fn kill(&self, proc: &Proc) {
        if let Some(mut child) = proc.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // A paused process is killed as well.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends `signal` to `proc`'s process.
    pub fn signal(&self, proc: &Proc, signal: nix::sys::signal::Signal) {
        if let Some(pid) = proc.pid() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }

    /// Waits until `proc` answers a health check through its proxy; how
    /// long it took.
    pub async fn until_serving(&self, proc: &Proc, limit: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let deadline = started + limit;
        loop {
            if let Some(child) = proc
                .child
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
                && let Some(status) = child.try_wait()?
            {
                anyhow::bail!(
                    "{} exited ({status}); the last lines of its log:\n{}",
                    proc.name,
                    self.log_tail(proc, 20)
                );
            }
            if self.serving(proc).await {
                return Ok(started.elapsed());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} does not answer after {limit:?}",
                proc.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether `proc` answers a health check through its proxy now.
    async fn serving(&self, proc: &Proc) -> bool {
        let Ok(endpoint) = self.auth.endpoint(&proc.url()) else {
            return false;
        };
        let endpoint = endpoint.connect_timeout(Duration::from_secs(1));
        let Ok(Ok(channel)) =
            tokio::time::timeout(Duration::from_secs(2), endpoint.connect()).await
        else {
            return false;
        };
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        matches!(
            tokio::time::timeout(
                Duration::from_secs(2),
                health.check(tonic_health::pb::HealthCheckRequest::default()),
            )
            .await,
            Ok(Ok(_))
        )
    }

    /// A channel to `url` with the person's token, connecting on first
    /// use and again after a failure.
    pub fn client_channel(&self, url: &str) -> anyhow::Result<agentry_testkit::cluster::Channel> {
        let client = Auth::client_with(self.auth.client_token().cloned());
        Ok(client.lazy_channel(url)?)
    }

    /// A channel to `url` with the services' token.
    pub fn service_channel(&self, url: &str) -> anyhow::Result<agentry_testkit::cluster::Channel> {
        Ok(self.auth.lazy_channel(url)?)
    }

    /// The last `lines` lines `proc` wrote to its log.
    pub fn log_tail(&self, proc: &Proc, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(proc)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn log_path(&self, proc: &Proc) -> PathBuf {
        self.logs.join(format!("{}.log", proc.name))
    }

    /// Stops every process (SIGKILL after SIGCONT), the clients of the
    /// others first.
    pub fn stop_all(&self) {
        for proc in self.procs.iter().rev() {
            self.signal(proc, nix::sys::signal::Signal::SIGCONT);
            self.kill(proc);
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop_all();
    }
}
