//! `agentry up` from the start of its process until every service answers
//! its gRPC health check SERVING, with the model server up (the
//! orchestrator asks it for its context window at start) and down (it is
//! asked again in the background, and nothing waits for it).

use agentry_testkit::fake_model::FakeModel;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Starts of each kind.
const RUNS: usize = 7;

pub async fn startup(bin: &Path) -> anyhow::Result<Value> {
    println!("\n== startup: agentry up → all four services SERVING");
    println!(
        "{:>14} {:>6} {:>9} {:>9} {:>9}",
        "model server", "runs", "p50 ms", "max ms", "min ms"
    );
    let model = FakeModel::start().await?;
    model.forget_requests();
    let down = format!("http://127.0.0.1:{}/v1", free_port()?);
    let mut figures = serde_json::Map::new();
    for (label, url) in [("up", model.base_url()), ("down", down)] {
        let mut times = Vec::with_capacity(RUNS);
        for _ in 0..RUNS {
            times.push(once(bin, &url).await?);
        }
        let min = times.iter().copied().fold(f64::INFINITY, f64::min);
        let (p50, _, max) = crate::stats::summary(&mut times);
        println!("{label:>14} {RUNS:>6} {p50:>9.1} {max:>9.1} {min:>9.1}");
        figures.insert(
            label.to_string(),
            json!({"runs": RUNS, "p50_ms": p50, "max_ms": max, "min_ms": min}),
        );
    }
    Ok(Value::Object(figures))
}

fn free_port() -> anyhow::Result<u16> {
    crate::stack::free_port()
}

/// One start: milliseconds until every service serves.
async fn once(bin: &Path, model_url: &str) -> anyhow::Result<f64> {
    let data = tempfile::tempdir()?;
    let config = tempfile::tempdir()?;
    let mut cmd = Command::new(bin);
    cmd.arg("up")
        .env_remove("RUST_LOG")
        .env("AGENTRY_CONFIG_DIR", config.path())
        .env("AGENTRY_DATA_DIR", data.path())
        .env("AGENTRY_LLM_BASE_URL", model_url)
        .env("AGENTRY_LLM_MODEL", "fake-model")
        .env("AGENTRY_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut urls = Vec::new();
    for service in ["ORCHESTRATOR", "SESSION_STORE", "TOOL_RUNNER", "SCHEDULER"] {
        let port = free_port()?;
        cmd.env(
            format!("AGENTRY_{service}_LISTEN"),
            format!("127.0.0.1:{port}"),
        );
        cmd.env(
            format!("AGENTRY_{service}_URL"),
            format!("http://127.0.0.1:{port}"),
        );
        urls.push(format!("http://127.0.0.1:{port}"));
    }
    let started = Instant::now();
    let mut child = cmd.spawn()?;
    let deadline = started + Duration::from_secs(20);
    let mut waiting = urls;
    while !waiting.is_empty() {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("agentry up exited ({status}) before its services served");
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "agentry up: not all services served within 20 s"
        );
        let mut still = Vec::new();
        for url in waiting {
            if !serving(&url).await {
                still.push(url);
            }
        }
        waiting = still;
        if !waiting.is_empty() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let took = started.elapsed().as_secs_f64() * 1000.0;
    // Stopped as people stop it, so that it cleans up.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id())?);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let _ = child.wait();
    Ok(took)
}

async fn serving(url: &str) -> bool {
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared(url.to_string()) else {
        return false;
    };
    let Ok(channel) = endpoint
        .connect_timeout(Duration::from_millis(200))
        .connect()
        .await
    else {
        return false;
    };
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .is_ok_and(|r| r.into_inner().status == ServingStatus::Serving as i32)
}
