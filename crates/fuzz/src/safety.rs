//! The last check before an input is sent: what can start a process or
//! write a file must hold only the harmless values the generator offers.
//! Raw mutations and saved inputs pass through here too, so a flipped
//! byte can never turn `true` into another command or a confined path
//! into one further out.

use crate::dict;
use crate::generate::{Places, WRITING_TOOLS, safe_write_paths};
use agentry_proto::orchestrator::v1 as orch;
use agentry_proto::tools::v1 as tools;
use prost::Message;

/// Why an input may not be sent, or `None` when it may. An input that
/// does not decode is harmless: the service refuses it before it acts.
pub fn refuse(input_type: &str, bytes: &[u8], places: &Places) -> Option<String> {
    match input_type {
        "agentry.tools.v1.ExecuteRequest" => {
            let req = tools::ExecuteRequest::decode(bytes).ok()?;
            tool_call(&req.tool, &req.arguments_json, places)
        }
        "agentry.tools.v1.PreviewRequest" => {
            let req = tools::PreviewRequest::decode(bytes).ok()?;
            tool_call(&req.tool, &req.arguments_json, places)
        }
        "agentry.tools.v1.RunHookRequest" => {
            let req = tools::RunHookRequest::decode(bytes).ok()?;
            command(&req.command)
        }
        "agentry.tools.v1.McpSessionServersRequest" => {
            let req = tools::McpSessionServersRequest::decode(bytes).ok()?;
            req.servers.iter().find_map(mcp_server)
        }
        "agentry.orchestrator.v1.SetSessionMcpServersRequest" => {
            let req = orch::SetSessionMcpServersRequest::decode(bytes).ok()?;
            req.servers.iter().find_map(mcp_server)
        }
        "agentry.orchestrator.v1.SubmitRequest" => {
            let req = orch::SubmitRequest::decode(bytes).ok()?;
            req.input.as_ref().and_then(model_input)
        }
        "agentry.orchestrator.v1.ChatRequest" => {
            let req = orch::ChatRequest::decode(bytes).ok()?;
            match req.kind? {
                orch::chat_request::Kind::Input(input) => model_input(&input),
                orch::chat_request::Kind::Attach(_) => None,
            }
        }
        "agentry.scheduler.v1.CreateReminderRequest" => {
            let req = agentry_proto::scheduler::v1::CreateReminderRequest::decode(bytes).ok()?;
            directed(&req.message)
        }
        _ => None,
    }
}

/// Whether a call with this input may start a process (a bash call, a
/// hook, an MCP server, a turn the model is directed to run bash in):
/// such calls are rate-limited.
pub fn starts_process(input_type: &str, bytes: &[u8]) -> bool {
    match input_type {
        "agentry.tools.v1.ExecuteRequest" => {
            tools::ExecuteRequest::decode(bytes).is_ok_and(|r| r.tool == "bash")
        }
        "agentry.tools.v1.RunHookRequest" => tools::RunHookRequest::decode(bytes)
            .is_ok_and(|r| !r.command.trim().is_empty() && r.timeout_secs > 0),
        "agentry.tools.v1.McpSessionServersRequest" => {
            tools::McpSessionServersRequest::decode(bytes)
                .is_ok_and(|r| r.servers.iter().any(|s| !s.command.is_empty()))
        }
        "agentry.orchestrator.v1.SetSessionMcpServersRequest" => {
            orch::SetSessionMcpServersRequest::decode(bytes)
                .is_ok_and(|r| r.servers.iter().any(|s| !s.command.is_empty()))
        }
        "agentry.orchestrator.v1.SubmitRequest"
        | "agentry.orchestrator.v1.ChatRequest"
        | "agentry.scheduler.v1.CreateReminderRequest" => {
            bytes.windows(9).any(|w| w == b"call bash")
        }
        _ => false,
    }
}

fn command(command: &str) -> Option<String> {
    (!dict::COMMANDS.contains(&command)).then(|| format!("command {command:?} is not a harmless one"))
}

fn mcp_server(server: &tools::McpSessionServer) -> Option<String> {
    command(&server.command).or_else(|| {
        server
            .args
            .iter()
            .find(|a| !["", "-v", "--help", "fuzz", "/etc/passwd", "\0"].contains(&a.as_str()))
            .map(|a| format!("MCP server argument {a:?} is not a harmless one"))
    })
}

/// What a person's input may make the fake model do: only the directed
/// calls of the dictionary; an edited bash call only a harmless command.
fn model_input(input: &orch::Input) -> Option<String> {
    use orch::input::Kind;
    match input.kind.as_ref()? {
        Kind::UserMessage(user) => directed(&user.text),
        Kind::Approval(approval) => edited_command(&approval.edited_arguments_json),
        Kind::Cancel(_)
        | Kind::Model(_)
        | Kind::McpAnswer(_)
        | Kind::RaiseBudget(_) => None,
    }
}

fn directed(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .filter(|line| line.starts_with("call "))
        .find(|line| !dict::DIRECTED.contains(line))
        .map(|line| format!("the model would be directed to {line:?}"))
}

fn edited_command(arguments: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(arguments).ok()?;
    match value.get("command") {
        None => None,
        Some(serde_json::Value::String(c)) => command(c),
        Some(other) => Some(format!("edited command {other} is not a harmless one")),
    }
}

fn tool_call(tool: &str, arguments: &str, places: &Places) -> Option<String> {
    let known = dict::TOOLS.contains(&tool)
        || WRITING_TOOLS.contains(&tool)
        || ["read_file", "list_dir", "glob", "grep", "web_fetch", "web_search"].contains(&tool);
    if !known {
        return Some(format!("tool {tool:?} is not one the fuzzer offers"));
    }
    let Ok(value) = serde_json::from_str::<serde_json::Value>(arguments) else {
        return None;
    };
    if WRITING_TOOLS.contains(&tool) {
        let allowed = safe_write_paths(places);
        return match value.get("path") {
            None => None,
            Some(serde_json::Value::String(p)) if allowed.contains(p) => None,
            Some(p) => Some(format!("{tool} path {p} is not a confined one")),
        };
    }
    if tool == "bash" {
        return match value.get("command") {
            None => None,
            Some(serde_json::Value::String(c)) => command(c),
            Some(other) => Some(format!("bash command {other} is not a harmless one")),
        };
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn only_harmless_commands_and_confined_writes_pass() {
        let places = Places::default();
        let exec = |tool: &str, args: &str| {
            tools::ExecuteRequest {
                tool: tool.into(),
                arguments_json: args.into(),
                ..Default::default()
            }
            .encode_to_vec()
        };
        let t = "agentry.tools.v1.ExecuteRequest";
        assert!(refuse(t, &exec("bash", r#"{"command":"true"}"#), &places).is_none());
        assert!(refuse(t, &exec("bash", r#"{"command":"rm -rf /"}"#), &places).is_some());
        assert!(refuse(t, &exec("write_file", r#"{"path":"notes.txt"}"#), &places).is_none());
        assert!(
            refuse(t, &exec("write_file", r#"{"path":"../../../etc/x"}"#), &places).is_some()
        );
        assert!(refuse(t, &exec("wrute_file", "{}"), &places).is_some());
        let hook = tools::RunHookRequest {
            command: "curl x | sh".into(),
            ..Default::default()
        };
        assert!(refuse("agentry.tools.v1.RunHookRequest", &hook.encode_to_vec(), &places).is_some());
        let submit = orch::SubmitRequest {
            session_id: "s".into(),
            input: Some(orch::Input {
                kind: Some(orch::input::Kind::UserMessage(orch::UserInput {
                    text: "hi\ncall bash {\"command\":\"reboot\"}".into(),
                    ..Default::default()
                })),
            }),
        };
        let submit = submit.encode_to_vec();
        assert!(refuse("agentry.orchestrator.v1.SubmitRequest", &submit, &places).is_some());
    }
}
