//! The MCP servers' tools in the runner's registry: a toolbox whose tools
//! are those the servers list now. A server's word never makes a call
//! read-only: every MCP tool is changing and confirmed by default, whatever
//! its hints say (the hint is passed on for people to see).

use super::{Mcp, McpTool};
use crate::ToolError;
use crate::tools::{Call, Running, Source, Tool, ToolOutcome, ToolSpec};
use std::sync::Arc;

/// The servers' tools.
pub struct Toolbox {
    mcp: Mcp,
    max_output_bytes: usize,
}

impl Toolbox {
    /// The tools of `mcp`'s servers, their output capped at
    /// `max_output_bytes`.
    pub fn new(mcp: Mcp, max_output_bytes: usize) -> Toolbox {
        Toolbox {
            mcp,
            max_output_bytes,
        }
    }

    fn tool(&self, server: String, listed: McpTool) -> Arc<dyn Tool<Call>> {
        let spec = ToolSpec {
            source: Source::Mcp {
                server,
                read_only_hint: listed.read_only_hint,
            },
            ..ToolSpec::changing(&listed.exposed, &listed.description, listed.schema)
                .growing_workspace()
        };
        Arc::new(ServerTool {
            spec,
            mcp: self.mcp.clone(),
            max_output_bytes: self.max_output_bytes,
        })
    }
}

impl agentry_tool::Toolbox<Call> for Toolbox {
    fn tools(&self) -> Vec<Arc<dyn Tool<Call>>> {
        self.mcp
            .tools()
            .into_iter()
            .map(|(server, listed)| self.tool(server, listed))
            .collect()
    }

    /// A name under a configured server is the server's to answer, also
    /// while it starts or after it dropped the tool: its call then says why.
    fn find(&self, name: &str) -> Option<Arc<dyn Tool<Call>>> {
        let server = self.mcp.server_of(name)?;
        let listed = self
            .mcp
            .tools()
            .into_iter()
            .find(|(_, t)| t.exposed == name);
        Some(match listed {
            Some((server, listed)) => self.tool(server, listed),
            None => self.tool(
                server.config.name.clone(),
                McpTool {
                    exposed: name.to_string(),
                    original: String::new(),
                    description: String::new(),
                    schema: serde_json::json!({"type": "object"}),
                    read_only_hint: false,
                },
            ),
        })
    }
}

/// One server tool: a call to its server, in the session's place.
struct ServerTool {
    spec: ToolSpec,
    mcp: Mcp,
    max_output_bytes: usize,
}

impl Tool<Call> for ServerTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run<'a>(
        &'a self,
        call: &'a Call,
        arguments: &'a str,
    ) -> Running<'a, Result<ToolOutcome, ToolError>> {
        Box::pin(async move {
            let place = self.mcp.place_of(&call.workspace);
            self.mcp
                .call(
                    &self.spec.name,
                    arguments,
                    &place,
                    call.timeout,
                    self.max_output_bytes,
                    call.sink.clone(),
                )
                .await
        })
    }
}
