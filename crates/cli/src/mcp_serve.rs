//! `agentry mcp serve`: Agentry as an MCP server on stdin/stdout, so any
//! MCP host can hand it durable, sandboxed work (the tools are
//! `agentry_gateway::mcp`'s, also served over streamable HTTP at the
//! gateway's `/mcp`). The orchestrator is called with the person's token,
//! as every CLI command does.

use crate::autostart;
use agentry_runtime::Config;

/// Serves MCP on standard input and output until the host closes them.
/// The services are started for the host when none answer, as for a chat.
pub async fn serve(config: &Config) -> anyhow::Result<()> {
    let _services = autostart::ensure(config).await?;
    let client = crate::client::connect(config).await?;
    agentry_gateway::mcp::serve_stdio(client).await
}
