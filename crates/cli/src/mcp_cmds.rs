//! `agentry mcp`: the MCP servers the tool runner connects to, and their
//! tools.

use crate::client::{connect, print_line, status_error};
use agentry_proto::orchestrator::v1 as pb;
use agentry_runtime::Config;

async fn list_tools(config: &Config) -> anyhow::Result<pb::ListToolsResponse> {
    let mut client = connect(config).await?;
    Ok(client
        .list_tools(pb::ListToolsRequest::default())
        .await
        .map_err(|s| status_error("cannot list the MCP servers", s))?
        .into_inner())
}

/// `agentry mcp list`: each server, its transport, state and tool count.
/// Fails (exit 1) when a server is not ready, so scripts can wait for it.
pub async fn list(config: &Config) -> anyhow::Result<bool> {
    let response = list_tools(config).await?;
    if response.mcp_servers.is_empty() {
        print_line(
            "no MCP servers are configured ([[mcp_servers]] or mcp.servers_file; see docs/mcp.md)",
        )?;
        return Ok(true);
    }
    print_line(format!(
        "{:<16} {:<6} {:<13} {:>5} {:>6} {:>6} {:>8}",
        "SERVER", "VIA", "STATE", "TOOLS", "CONNS", "CALLS", "FAILURES"
    ))?;
    let mut all_ready = true;
    for s in &response.mcp_servers {
        all_ready &= s.state == "ready";
        print_line(format!(
            "{:<16} {:<6} {:<13} {:>5} {:>6} {:>6} {:>8}",
            s.name, s.transport, s.state, s.tool_count, s.connections, s.calls, s.failures
        ))?;
        if !s.error.is_empty() {
            print_line(format!("    {}", s.error.replace('\n', "\n    ")))?;
        }
    }
    Ok(all_ready)
}

/// `agentry mcp tools [SERVER]`: the tools of every server (or one), as
/// the model is offered them.
pub async fn tools(config: &Config, server: Option<&str>) -> anyhow::Result<()> {
    let response = list_tools(config).await?;
    if let Some(name) = server
        && !response.mcp_servers.iter().any(|s| s.name == name)
    {
        return Err(no_server(
            name,
            response.mcp_servers.iter().map(|s| s.name.as_str()),
        ));
    }
    let mut shown = 0;
    for t in response
        .tools
        .iter()
        .filter(|t| !t.mcp_server.is_empty())
        .filter(|t| server.is_none_or(|s| t.mcp_server == s))
    {
        shown += 1;
        let hint = if t.read_only_hint {
            " [the server says read-only]"
        } else {
            ""
        };
        print_line(format!("{}{hint}\n    {}", t.name, t.description))?;
    }
    if shown == 0 {
        print_line("no MCP tools are offered now (see `agentry mcp list`)")?;
    }
    Ok(())
}

/// `agentry mcp login NAME`: signs in to a remote server with OAuth and
/// keeps the tokens where the tool runners read them.
pub async fn login(config: &Config, name: &str, wait: u64) -> anyhow::Result<()> {
    let servers = config.mcp_servers()?;
    let Some(server) = servers.iter().find(|s| s.name == name) else {
        return Err(no_server(name, servers.iter().map(|s| s.name.as_str())));
    };
    if server.url.trim().is_empty() {
        anyhow::bail!("{name} is a stdio server; OAuth applies to url servers");
    }
    if !server.bearer_token.is_empty() || !server.bearer_token_env.is_empty() {
        anyhow::bail!(
            "{name} has a bearer token configured, which the runners send instead of a sign-in; \
             remove bearer_token / bearer_token_env first"
        );
    }
    let state_dir = config
        .workspace_root()
        .join(agentry_tool_runner::workspace::TEMP_DIRS);
    let done = agentry_mcp::oauth::login(
        server,
        &state_dir,
        std::time::Duration::from_secs(wait.max(1)),
        |url| {
            let _ = print_line(format!(
                "Open this address in a browser and approve Agentry:\n\n  {url}\n\n\
                 waiting for the browser to come back (at most {wait}s)…"
            ));
        },
    )
    .await?;
    print_line(format!(
        "signed in to {name} as client {}{}; tokens kept in {} (refreshed as they expire). The \
         runners use them from the next connection: agentry mcp list shows the server's state.",
        done.client_id,
        if done.scopes.is_empty() {
            String::new()
        } else {
            format!(" with scopes {}", done.scopes.join(" "))
        },
        done.path.display()
    ))
}

/// There is no server `name`; the ones there are.
fn no_server<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> anyhow::Error {
    let known: Vec<&str> = known.collect();
    anyhow::anyhow!(
        "no MCP server is named {name:?} (configured: {})",
        if known.is_empty() {
            "none".to_string()
        } else {
            known.join(", ")
        }
    )
}
