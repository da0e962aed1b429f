//! The runner's own failures that are told to a person or to the model as
//! a sentence (why calls cannot have network, why a snapshot or an MCP
//! server failed): each is its own type, so a function says which kind it
//! can fail with, and nothing decides by the text. Failures of a tool call
//! itself are [`crate::ToolError`]; the sandbox's set-up,
//! [`crate::sandbox::SandboxSetupError`].

use agentry_tool::sentence_error;

sentence_error!(
    /// Why calls cannot be granted network (no route to the proxy, no
    /// credential), or why the proxy cannot start.
    NoNetwork
);
sentence_error!(
    /// Why a workspace snapshot could not be taken, read or restored.
    SnapshotError
);
sentence_error!(
    /// Why the sandbox cannot serve the workspace or the network as
    /// configured.
    SandboxCheckError
);

/// Why an MCP server could not be reached, started or used.
pub use agentry_mcp::McpError;
