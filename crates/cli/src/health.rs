//! `agentry health`: asks services for their gRPC health (`grpc.health.v1`),
//! as container health checks and people do.

use crate::client::{innermost_cause, print_line};
use agentry_runtime::Auth;
use agentry_runtime::telemetry::TracedChannel;
use std::process::ExitCode;
use std::time::Duration;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Checks each URL; exits 0 when every one is SERVING, 1 otherwise, with
/// one line per service.
pub async fn check(
    auth: &Auth,
    urls: &[String],
    timeout: Duration,
    quiet: bool,
) -> anyhow::Result<ExitCode> {
    let mut healthy = true;
    for url in urls {
        let verdict = match tokio::time::timeout(timeout, check_one(auth, url)).await {
            Ok(Ok((ServingStatus::Serving, channel))) => {
                if !quiet {
                    print_line(format!("{url}: SERVING"))?;
                    // A tool runner also says how it confines commands, and
                    // how its MCP servers are (one that is down does not
                    // make the runner unhealthy: its other tools work).
                    let channel = auth.wrap(channel);
                    for line in model_lines(channel.clone(), timeout).await {
                        print_line(format!("  {line}"))?;
                    }
                    for line in runner_lines(channel, timeout).await {
                        print_line(format!("  {line}"))?;
                    }
                }
                Ok(())
            }
            Ok(Ok((status, _))) => Err(format!("reports {}", status.as_str_name())),
            Ok(Err(e)) => Err(format!("{e:#}")),
            Err(_) => Err(format!("no answer within {} s", timeout.as_secs_f32())),
        };
        match verdict {
            Ok(()) => {}
            Err(why) => {
                healthy = false;
                eprintln!("agentry health: {url}: {why}");
            }
        }
    }
    Ok(if healthy {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// What an orchestrator found wrong with the model server; nothing for
/// other services, or when nothing is wrong.
async fn model_lines(channel: TracedChannel, timeout: Duration) -> Vec<String> {
    use agentry_proto::orchestrator::v1::{
        ListToolsRequest, orchestrator_client::OrchestratorClient,
    };
    let mut client = OrchestratorClient::new(channel);
    match tokio::time::timeout(timeout, client.list_tools(ListToolsRequest::default())).await {
        Ok(Ok(r)) if !r.get_ref().model_problem.is_empty() => vec![format!(
            "model: {} (`agentry doctor` says how to fix it)",
            r.get_ref().model_problem
        )],
        _ => Vec::new(),
    }
}

/// The sandbox report and MCP servers of a tool runner; nothing for other
/// services.
async fn runner_lines(channel: TracedChannel, timeout: Duration) -> Vec<String> {
    use agentry_proto::tools::v1::{ListToolsRequest, tool_runner_client::ToolRunnerClient};
    let mut client = ToolRunnerClient::new(channel);
    let Ok(Ok(response)) =
        tokio::time::timeout(timeout, client.list_tools(ListToolsRequest::default())).await
    else {
        return Vec::new();
    };
    let response = response.into_inner();
    let mut lines: Vec<String> = response
        .sandbox
        .into_iter()
        .map(|l| format!("sandbox {l}"))
        .collect();
    for s in response.mcp_servers {
        let mut line = format!(
            "mcp {} ({}): {}, {} tools",
            s.name, s.transport, s.state, s.tool_count
        );
        if !s.error.is_empty() {
            line.push_str(&format!(
                " ({})",
                s.error.lines().next().unwrap_or_default()
            ));
        }
        lines.push(line);
    }
    lines
}

async fn check_one(
    auth: &Auth,
    url: &str,
) -> anyhow::Result<(ServingStatus, tonic::transport::Channel)> {
    let channel = auth
        .endpoint(url)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect ({})", innermost_cause(&e)))?;
    let response = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("health check failed: {} ({:?})", s.message(), s.code()))?;
    let status =
        ServingStatus::try_from(response.into_inner().status).unwrap_or(ServingStatus::Unknown);
    Ok((status, channel))
}
