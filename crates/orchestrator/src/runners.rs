//! The tool runners: one or many replicas behind one configured address.
//!
//! `tool_runner.url` names one runner, or several separated by commas. A
//! URL whose host is a name (not an IP address, not `localhost`) is
//! resolved again every [`REFRESH`], and every address it resolves to is a
//! replica: under Docker Compose, `http://tool-runner:7743` finds each
//! container of a `--scale`d service as it comes and goes.
//!
//! Each call goes to the healthy replica with the fewest calls in flight
//! (ties take turns). A replica that answers UNAVAILABLE, fails its health
//! check or disappears from DNS is taken out for a while, and the calls in
//! flight on it are ended at once instead of waiting for TCP to notice.
//! What happens to such a call depends on what it does:
//! - a read-only call is retried on another replica;
//! - a call that provably never reached the runner (the connection was
//!   refused) is retried too;
//! - any other call is reported lost, with a clear error for the model: it
//!   may or may not have run, so it is never repeated behind its back.

use crate::errors::SettingError;
use agentry_proto::tools::v1::tool_runner_client::ToolRunnerClient;
use agentry_proto::tools::v1::{
    ExecuteRequest, ExecuteResult, ListToolsRequest, ListToolsResponse, OutputChunk,
    execute_response,
};
use agentry_runtime::Auth;
use agentry_runtime::telemetry::TracedChannel;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// How often names are resolved again and replicas checked.
pub const REFRESH: Duration = Duration::from_secs(2);
/// Longest wait for a health check's answer.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(3);
/// Consecutive failed health checks after which calls in flight are ended.
const LOST_AFTER_FAILURES: u32 = 2;
/// First and longest time a failed replica is passed over.
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A configured runner address.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// As configured.
    url: String,
    scheme: String,
    host: String,
    port: u16,
    /// Whether the host is resolved again and again (a DNS name).
    dynamic: bool,
}

impl Target {
    fn parse(url: &str) -> Result<Target, SettingError> {
        let url = url.trim().trim_end_matches('/');
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| format!("{url:?} is not an http(s) URL"))?;
        if scheme != "http" && scheme != "https" {
            return Err(format!("{url:?} is not an http(s) URL").into());
        }
        if rest.contains('/') {
            return Err(format!("{url:?} must not have a path").into());
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => {
                let port = port
                    .parse::<u16>()
                    .map_err(|_| format!("{url:?} has an invalid port {port:?}"))?;
                (host, port)
            }
            _ => (rest, if scheme == "https" { 443 } else { 80 }),
        };
        if host.is_empty() {
            return Err(format!("{url:?} has no host").into());
        }
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let dynamic = scheme == "http" && bare.parse::<IpAddr>().is_err() && bare != "localhost";
        Ok(Target {
            url: url.to_string(),
            scheme: scheme.to_string(),
            host: host.to_string(),
            port,
            dynamic,
        })
    }
}

/// Parses `tool_runner.url`: one URL or several separated by commas.
fn parse_targets(urls: &str) -> Result<Vec<Target>, SettingError> {
    let targets = urls
        .split(',')
        .filter(|u| !u.trim().is_empty())
        .map(Target::parse)
        .collect::<Result<Vec<_>, _>>()?;
    if targets.is_empty() {
        return Err("no tool runner URL is configured".into());
    }
    Ok(targets)
}

/// One tool runner process.
pub struct Replica {
    /// The address calls go to, e.g. `http://172.18.0.5:7743`.
    pub url: String,
    /// The configured URL it was found through.
    source: String,
    client: ToolRunnerClient<TracedChannel>,
    health: HealthClient<Channel>,
    in_flight: AtomicUsize,
    failures: AtomicU32,
    /// Consecutive failed health checks.
    health_failures: AtomicU32,
    down_until: Mutex<Option<Instant>>,
    /// Bumped each time the replica is declared lost; calls in flight watch it.
    lost: watch::Sender<u64>,
}

impl Replica {
    fn new(url: String, source: &str, auth: &Auth) -> Result<Replica, SettingError> {
        let channel = auth
            .endpoint(&url)
            .map_err(|e| format!("tool runner: {e}"))?
            .connect_lazy();
        Ok(Replica {
            url,
            source: source.to_string(),
            client: ToolRunnerClient::new(auth.wrap(channel.clone())),
            health: HealthClient::new(channel),
            in_flight: AtomicUsize::new(0),
            failures: AtomicU32::new(0),
            health_failures: AtomicU32::new(0),
            down_until: Mutex::new(None),
            lost: watch::channel(0).0,
        })
    }

    /// Calls in flight on it now.
    /// A client of this replica.
    pub fn client(&self) -> ToolRunnerClient<TracedChannel> {
        self.client.clone()
    }

    /// The number of calls in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    fn is_up(&self, now: Instant) -> bool {
        lock(&self.down_until).is_none_or(|until| until <= now)
    }

    fn mark_up(&self) {
        self.failures.store(0, Ordering::Relaxed);
        *lock(&self.down_until) = None;
    }

    /// Takes the replica out for a backoff that doubles with each failure.
    fn mark_down(&self, why: &str) {
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let backoff = BACKOFF_MIN
            .saturating_mul(1 << failures.min(6).saturating_sub(1))
            .min(BACKOFF_MAX);
        *lock(&self.down_until) = Some(Instant::now() + backoff);
        tracing::warn!(runner = %self.url, failures, backoff_ms = backoff.as_millis() as u64, why, "tool runner unavailable");
    }

    /// Ends the calls in flight on this replica.
    fn declare_lost(&self) {
        self.lost.send_modify(|generation| *generation += 1);
    }

    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    async fn check_health(&self) -> bool {
        let mut health = self.health.clone();
        let check = health.check(HealthCheckRequest {
            service: String::new(),
        });
        matches!(
            tokio::time::timeout(HEALTH_TIMEOUT, check).await,
            Ok(Ok(response)) if response.get_ref().status == 1
        )
    }
}

struct InFlight(Arc<Replica>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Why a call produced no result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallFailure {
    /// For the model and the person.
    pub message: String,
    /// The replica that lost or refused it, when one was reached.
    pub runner: String,
}

/// The replicas behind `tool_runner.url`.
pub struct RunnerPool {
    /// As configured, for messages.
    pub configured: String,
    targets: Vec<Target>,
    replicas: Mutex<Vec<Arc<Replica>>>,
    turn: AtomicUsize,
    refresher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    auth: Auth,
}

impl Drop for RunnerPool {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.refresher).take() {
            task.abort();
        }
    }
}

impl RunnerPool {
    /// A pool for `tool_runner.url`. Static addresses become replicas now;
    /// names are resolved on first use.
    pub fn new(urls: &str, auth: &Auth) -> Result<Arc<RunnerPool>, SettingError> {
        let targets = parse_targets(urls)?;
        let mut replicas = Vec::new();
        for target in targets.iter().filter(|t| !t.dynamic) {
            replicas.push(Arc::new(Replica::new(
                target.url.clone(),
                &target.url,
                auth,
            )?));
        }
        Ok(Arc::new(RunnerPool {
            configured: urls.to_string(),
            targets,
            replicas: Mutex::new(replicas),
            turn: AtomicUsize::new(0),
            refresher: Mutex::new(None),
            auth: auth.clone(),
        }))
    }

    /// The replicas known now.
    pub fn replicas(&self) -> Vec<Arc<Replica>> {
        lock(&self.replicas).clone()
    }

    /// Starts the background refresh (resolution and health checks) once.
    fn ensure_refresher(self: &Arc<Self>) {
        let mut refresher = lock(&self.refresher);
        if refresher.is_some() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = Arc::downgrade(self);
        *refresher = Some(runtime.spawn(refresh_loop(weak)));
    }

    /// Resolves the names again and brings the replica list up to date. A
    /// replica whose address no longer resolves is declared lost.
    pub async fn refresh(&self) {
        let dynamic: Vec<&Target> = self.targets.iter().filter(|t| t.dynamic).collect();
        if dynamic.is_empty() {
            return;
        }
        // Address → the configured URL it came from.
        let mut resolved: Vec<(String, String)> = Vec::new();
        let mut failed: BTreeSet<String> = BTreeSet::new();
        for target in dynamic {
            match tokio::net::lookup_host((target.host.as_str(), target.port)).await {
                Ok(addrs) => {
                    for addr in addrs {
                        let url = format!("{}://{addr}", target.scheme);
                        if !resolved.iter().any(|(u, _)| *u == url) {
                            resolved.push((url, target.url.clone()));
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(host = %target.host, error = %e, "cannot resolve tool runner name");
                    failed.insert(target.url.clone());
                }
            }
        }
        let mut replicas = lock(&self.replicas);
        replicas.retain(|r| {
            // Static addresses stay; a name that failed to resolve keeps its
            // replicas (a DNS hiccup must not end calls).
            let keep = self.targets.iter().any(|t| !t.dynamic && t.url == r.url)
                || failed.contains(&r.source)
                || resolved.iter().any(|(u, _)| *u == r.url);
            if !keep {
                tracing::warn!(runner = %r.url, "tool runner left the service; ending its calls");
                r.declare_lost();
            }
            keep
        });
        for (url, source) in resolved {
            if !replicas.iter().any(|r| r.url == url) {
                match Replica::new(url.clone(), &source, &self.auth) {
                    Ok(replica) => {
                        tracing::info!(runner = %url, "tool runner joined");
                        replicas.push(Arc::new(replica));
                    }
                    Err(e) => tracing::warn!(error = %e, "ignoring a tool runner address"),
                }
            }
        }
    }

    /// Checks every replica's health; a replica failing twice in a row has
    /// its calls in flight ended.
    pub async fn check_health(&self) {
        let replicas = self.replicas();
        let checks = replicas
            .iter()
            .map(|r| async move { (r, r.check_health().await) });
        for (replica, healthy) in futures::future::join_all(checks).await {
            if healthy {
                if !replica.is_up(Instant::now()) || replica.failures.load(Ordering::Relaxed) > 0 {
                    tracing::info!(runner = %replica.url, "tool runner healthy again");
                }
                replica.health_failures.store(0, Ordering::Relaxed);
                replica.mark_up();
            } else {
                replica.mark_down("health check failed");
                // Once per outage: calls in flight end when the runner has
                // stayed silent for this many checks in a row.
                let silent = replica.health_failures.fetch_add(1, Ordering::Relaxed) + 1;
                if silent == LOST_AFTER_FAILURES {
                    replica.declare_lost();
                }
            }
        }
    }

    /// The replica for the next call: healthy first, fewest calls in flight,
    /// ties taking turns; `exclude` lists replicas already tried.
    fn pick(&self, exclude: &[String]) -> Option<Arc<Replica>> {
        let replicas = lock(&self.replicas);
        let now = Instant::now();
        let candidates: Vec<&Arc<Replica>> = replicas
            .iter()
            .filter(|r| !exclude.contains(&r.url))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let healthy: Vec<&Arc<Replica>> = candidates
            .iter()
            .copied()
            .filter(|r| r.is_up(now))
            .collect();
        // With nothing healthy, try the rest anyway: one may be back.
        let pool = if healthy.is_empty() {
            candidates
        } else {
            healthy
        };
        // One reading of the counts: they change under our feet.
        let loads: Vec<(usize, &Arc<Replica>)> = pool
            .into_iter()
            .map(|r| (r.in_flight.load(Ordering::Relaxed), r))
            .collect();
        let least = loads.iter().map(|(n, _)| *n).min()?;
        let tied: Vec<&Arc<Replica>> = loads
            .into_iter()
            .filter(|(n, _)| *n == least)
            .map(|(_, r)| r)
            .collect();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        tied.get(turn % tied.len().max(1)).map(|r| (*r).clone())
    }

    async fn pick_or_refresh(self: &Arc<Self>, exclude: &[String]) -> Option<Arc<Replica>> {
        self.ensure_refresher();
        if let Some(replica) = self.pick(exclude) {
            return Some(replica);
        }
        self.refresh().await;
        self.pick(exclude)
    }

    fn no_runner(&self, tried: &[String], last_error: Option<&str>) -> CallFailure {
        let mut message = format!("error: no tool runner is reachable at {}", self.configured);
        if !tried.is_empty() {
            message.push_str(&format!(" (tried {})", tried.join(", ")));
        }
        if let Some(e) = last_error {
            message.push_str(&format!(": {e}"));
        }
        CallFailure {
            message,
            runner: tried.last().cloned().unwrap_or_default(),
        }
    }

    /// The tools of the first replica that answers.
    pub async fn list_tools(self: &Arc<Self>) -> Result<ListToolsResponse, Status> {
        self.on_any(|mut client| async move {
            client
                .list_tools(ListToolsRequest::default())
                .await
                .map(tonic::Response::into_inner)
        })
        .await
    }

    /// Sets a session's own MCP servers on every replica (any of them may
    /// run its calls); the first answer is the one given, with the errors
    /// of every replica that failed altogether.
    pub async fn set_session_servers(
        self: &Arc<Self>,
        request: agentry_proto::tools::v1::McpSessionServersRequest,
    ) -> Result<agentry_proto::tools::v1::McpSessionServersResponse, Status> {
        let _ = self.pick_or_refresh(&[]).await;
        let replicas = self.replicas();
        if replicas.is_empty() {
            return Err(Status::unavailable("no tool runner is reachable"));
        }
        let mut answer: Option<agentry_proto::tools::v1::McpSessionServersResponse> = None;
        let mut failed = Vec::new();
        for replica in replicas {
            let mut client = replica.client.clone();
            match client.mcp_session_servers(request.clone()).await {
                Ok(response) => {
                    answer.get_or_insert(response.into_inner());
                }
                Err(status) if status.code() == tonic::Code::InvalidArgument => return Err(status),
                Err(status) => failed.push(format!("{}: {}", replica.url, status.message())),
            }
        }
        let mut answer = answer.ok_or_else(|| {
            Status::unavailable(format!(
                "no tool runner took the servers: {}",
                failed.join("; ")
            ))
        })?;
        answer.errors.extend(
            failed
                .into_iter()
                .map(|f| format!("tool runner {f} (its calls of these tools fail)")),
        );
        Ok(answer)
    }

    /// Makes one unary call on the first replica that answers (a replica
    /// that is unavailable is marked down and the next one is tried).
    pub async fn on_any<T, F, Fut>(self: &Arc<Self>, call: F) -> Result<T, Status>
    where
        F: Fn(ToolRunnerClient<TracedChannel>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let mut tried = Vec::new();
        let mut last: Option<Status> = None;
        while let Some(replica) = self.pick_or_refresh(&tried).await {
            let _in_flight = replica.begin();
            match call(replica.client.clone()).await {
                Ok(response) => {
                    replica.mark_up();
                    return Ok(response);
                }
                Err(status) if status.code() == Code::Unavailable => {
                    replica.mark_down(status.message());
                    tried.push(replica.url.clone());
                    last = Some(status);
                }
                Err(status) => return Err(status),
            }
        }
        let failure = self.no_runner(&tried, last.as_ref().map(|s| s.message()));
        Err(Status::unavailable(failure.message))
    }

    /// Runs one call, passing its output chunks to `on_chunk` (which
    /// returns false when nobody listens any more). Read-only calls, and
    /// calls that never reached a runner, are retried on another replica.
    pub async fn execute<F>(
        self: &Arc<Self>,
        request: ExecuteRequest,
        read_only: bool,
        mut on_chunk: impl FnMut(OutputChunk) -> F,
    ) -> Result<ExecuteResult, CallFailure>
    where
        F: std::future::Future<Output = bool>,
    {
        let mut tried: Vec<String> = Vec::new();
        let mut last_error: Option<String> = None;
        loop {
            let Some(replica) = self.pick_or_refresh(&tried).await else {
                return Err(self.no_runner(&tried, last_error.as_deref()));
            };
            tried.push(replica.url.clone());
            let _in_flight = replica.begin();
            let mut lost = replica.lost.subscribe();
            lost.mark_unchanged();
            let mut client = replica.client.clone();
            let started = client.execute(request.clone());
            let response = tokio::select! {
                response = started => response,
                _ = lost.changed() => Err(Status::unavailable("the runner stopped answering")),
            };
            let mut stream = match response {
                Ok(response) => response.into_inner(),
                Err(status) if status.code() == Code::Unavailable => {
                    replica.mark_down(status.message());
                    if read_only || never_reached(&status) {
                        last_error = Some(status.message().to_string());
                        continue;
                    }
                    return Err(lost_call(&replica, &request.tool, status.message()));
                }
                Err(status) => {
                    return Err(CallFailure {
                        message: format!(
                            "error: the tool runner at {} could not run {}: {}",
                            replica.url,
                            request.tool,
                            status.message()
                        ),
                        runner: replica.url.clone(),
                    });
                }
            };
            let why = loop {
                let message = tokio::select! {
                    message = stream.message() => message,
                    _ = lost.changed() => break "the runner stopped answering".to_string(),
                };
                match message {
                    Ok(Some(message)) => match message.kind {
                        Some(execute_response::Kind::Chunk(chunk)) => {
                            let listening = on_chunk(chunk).await;
                            if !listening {
                                return Err(CallFailure {
                                    message: "error: cancelled".into(),
                                    runner: replica.url.clone(),
                                });
                            }
                        }
                        Some(execute_response::Kind::Result(result)) => {
                            replica.mark_up();
                            return Ok(result);
                        }
                        None => {}
                    },
                    Ok(None) => {
                        break "the runner ended the call without a result".to_string();
                    }
                    Err(status) => break status.message().to_string(),
                }
            };
            replica.mark_down(&why);
            if !read_only {
                return Err(lost_call(&replica, &request.tool, &why));
            }
            tracing::warn!(runner = %replica.url, tool = %request.tool, why, "read-only call lost with its runner; retrying on another");
            // Output already streamed is not taken back: say where it restarts.
            let marker = OutputChunk {
                stream: agentry_proto::sessions::v1::OutputStream::Stderr as i32,
                text: format!(
                    "\n[the tool runner {} was lost ({why}); running the call again on another runner]\n",
                    replica.url
                ),
            };
            if !on_chunk(marker).await {
                return Err(CallFailure {
                    message: "error: cancelled".into(),
                    runner: replica.url.clone(),
                });
            }
            last_error = Some(why);
        }
    }
}

fn lost_call(replica: &Replica, tool: &str, why: &str) -> CallFailure {
    CallFailure {
        message: format!(
            "error: lost the tool runner {} during the {tool} call ({why}); the call may or may not have completed. Check its effects before running it again.",
            replica.url
        ),
        runner: replica.url.clone(),
    }
}

/// Whether a failed call provably never reached a runner: the connection
/// could not even be made.
fn never_reached(status: &Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = source {
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable
                    | std::io::ErrorKind::AddrNotAvailable
            )
        {
            return true;
        }
        if error.to_string().starts_with("tcp connect error") {
            return true;
        }
        source = error.source();
    }
    false
}

async fn refresh_loop(pool: Weak<RunnerPool>) {
    let mut ticker = tokio::time::interval(REFRESH);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(pool) = pool.upgrade() else { return };
        pool.refresh().await;
        pool.check_health().await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn parses_targets() {
        let t = parse_targets("http://tool-runner:7743").unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].host, "tool-runner");
        assert_eq!(t[0].port, 7743);
        assert!(t[0].dynamic);

        let t = parse_targets("http://127.0.0.1:1, http://localhost:2/,http://[::1]:3").unwrap();
        assert_eq!(t.len(), 3);
        assert!(t.iter().all(|t| !t.dynamic), "{t:?}");
        assert_eq!(t[1].url, "http://localhost:2");
        assert_eq!(t[2].host, "[::1]");
        assert_eq!(t[2].port, 3);

        assert_eq!(parse_targets("http://runner").unwrap()[0].port, 80);
        assert!(parse_targets("").is_err());
        assert!(parse_targets("tool-runner:7743").is_err());
        assert!(parse_targets("ftp://x:1").is_err());
        assert!(parse_targets("http://x:notaport").is_err());
        assert!(parse_targets("http://x:1/path").is_err());
        assert!(parse_targets("http://:1").is_err());
    }

    #[tokio::test]
    async fn picks_the_least_loaded_and_takes_turns_on_ties() {
        let pool = RunnerPool::new(
            "http://127.0.0.1:1,http://127.0.0.1:2,http://127.0.0.1:3",
            &Auth::off(),
        )
        .unwrap();
        let mut seen = BTreeSet::new();
        for _ in 0..3 {
            seen.insert(pool.pick(&[]).unwrap().url.clone());
        }
        assert_eq!(seen.len(), 3, "ties take turns: {seen:?}");

        let replicas = pool.replicas();
        let _a = replicas[0].begin();
        let _b = replicas[1].begin();
        for _ in 0..4 {
            assert_eq!(pool.pick(&[]).unwrap().url, "http://127.0.0.1:3");
        }
        let _c = replicas[2].begin();
        let _d = replicas[2].begin();
        let picked = pool.pick(&[]).unwrap().url.clone();
        assert_ne!(picked, "http://127.0.0.1:3");
        // Excluded replicas are never picked.
        let all: Vec<String> = replicas.iter().map(|r| r.url.clone()).collect();
        assert!(pool.pick(&all).is_none());
    }

    #[tokio::test]
    async fn a_failed_replica_is_passed_over_until_its_backoff_ends() {
        let pool = RunnerPool::new("http://127.0.0.1:1,http://127.0.0.1:2", &Auth::off()).unwrap();
        let replicas = pool.replicas();
        replicas[0].mark_down("test");
        for _ in 0..4 {
            assert_eq!(pool.pick(&[]).unwrap().url, "http://127.0.0.1:2");
        }
        // With every replica down, one is still tried.
        replicas[1].mark_down("test");
        assert!(pool.pick(&[]).is_some());
        replicas[0].mark_up();
        assert_eq!(pool.pick(&[]).unwrap().url, "http://127.0.0.1:1");
    }

    #[tokio::test]
    async fn backoff_doubles_and_is_capped() {
        let replica = Replica::new("http://127.0.0.1:1".into(), "test", &Auth::off()).unwrap();
        let mut seconds = Vec::new();
        for _ in 0..8 {
            replica.mark_down("test");
            let until = lock(&replica.down_until).unwrap();
            let left = until.saturating_duration_since(Instant::now());
            seconds.push((left.as_millis() as f64 / 1000.0).round() as u64);
        }
        assert_eq!(seconds, vec![1, 2, 4, 8, 16, 30, 30, 30]);
        replica.mark_up();
        assert!(replica.is_up(Instant::now()));
        replica.mark_down("test");
        let until = lock(&replica.down_until).unwrap();
        assert!(until.saturating_duration_since(Instant::now()) <= BACKOFF_MIN);
    }
}
