//! Short forms every client shows: a call's main argument, an amount of
//! money, a size, the names of outcomes and phases. Text here is the
//! session's as it is; each front end makes it safe for its medium (the
//! terminal through [`crate::terminal`], a page by escaping).

use agentry_proto::sessions::v1 as pb;
use serde_json::Value;

/// `text` on one line (runs of white space made one space), cut to `max`
/// characters with an ellipsis; characters that act on a terminal are
/// shown as visible escapes.
pub fn shorten(text: &str, max: usize) -> String {
    let visible = crate::terminal::visible(text);
    let one_line = visible.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let cut: String = one_line.chars().take(max).collect();
        format!("{cut}…")
    }
}

/// The name to show for who sent or decided something (an event's `by`):
/// `None` for nobody (the agent, logs from before people had names) and for
/// the install's own person (`admin`, the client token, or `local` with
/// credentials off), so that one person alone with their agent sees no
/// names, and a team sees who did what.
pub fn named(by: &str) -> Option<&str> {
    use agentry_runtime::people::{ADMIN, LOCAL};
    (!by.is_empty() && by != ADMIN && by != LOCAL).then_some(by)
}

/// Who may approve a call, when the rule that asked names people or asks
/// for several ("2 different people: role:admin or user:alice"); `None`
/// when anyone with the approver role may.
pub fn approvers(request: &pb::ApprovalRequested) -> Option<String> {
    let need = agentry_agent::reducer::need_of(request);
    need.is_restricted().then(|| need.describe())
}

/// The command line of a shell call (`bash`), whole, to show as
/// `$ command`; `None` for any other tool, or a call without one.
pub fn shell_command(tool: &str, arguments: &str) -> Option<String> {
    if tool != "bash" {
        return None;
    }
    let value: Value = serde_json::from_str(arguments).ok()?;
    value.get("command")?.as_str().map(str::to_string)
}

/// The main argument of a call (bash's command, a file tool's path), or
/// the arguments, in one short line.
pub fn short_args(tool: &str, arguments: &str) -> String {
    let value: Value = serde_json::from_str(arguments).unwrap_or(Value::Null);
    let main = match tool {
        "bash" => value.get("command"),
        _ => value.get("path"),
    };
    let text = match main.and_then(Value::as_str) {
        Some(s) => s.to_string(),
        None => arguments.to_string(),
    };
    shorten(&text, 100)
}

/// Whether a tool is plan mode's own (`submit_plan`, `complete_step`):
/// its calls are the plan's steps, shown as the plan rather than as raw
/// JSON.
pub fn is_plan_tool(tool: &str) -> bool {
    matches!(tool, "submit_plan" | "complete_step")
}

/// An amount of money: `$0.0123` in USD, else `0.0123 EUR`.
pub fn money(amount: f64, currency: &str) -> String {
    let digits = if amount != 0.0 && amount.abs() < 0.01 {
        4
    } else {
        2
    };
    match currency {
        "USD" | "" => format!("${amount:.digits$}"),
        other => format!("{amount:.digits$} {other}"),
    }
}

/// A size in bytes, readable: `512 B`, `1.5 KiB`, `2.0 MiB`.
pub fn size(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
        _ => format!("{:.2} GiB", bytes as f64 / 1_073_741_824.0),
    }
}

/// How much of the context window the fixed part of every request takes
/// (system prompt, instructions, tool definitions).
pub fn fixed_part(fixed_tokens: u32, context_window: u32) -> String {
    let share = f64::from(fixed_tokens) * 100.0 / f64::from(context_window.max(1));
    format!(
        "(fixed part of each request: ~{fixed_tokens} tokens, {share:.0}% of the \
         {context_window}-token context window)"
    )
}

/// The images a person's message carries, one line each after its text
/// (empty without any).
pub fn images_shown(message: &pb::UserMessage) -> String {
    message
        .images
        .iter()
        .map(|image| {
            let name = if image.path.is_empty() {
                "an image"
            } else {
                image.path.as_str()
            };
            format!(
                "\n[image: {name}, {}, {} KiB]",
                image.mime,
                image.data.len().div_ceil(1024)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_shell_call_has_a_command_line() {
        assert_eq!(
            shell_command("bash", r#"{"command": "ls -la\necho done"}"#).as_deref(),
            Some("ls -la\necho done")
        );
        assert_eq!(shell_command("bash", r#"{"timeout_secs": 3}"#), None);
        assert_eq!(shell_command("bash", "not json"), None);
        assert_eq!(shell_command("read_file", r#"{"command": "ls"}"#), None);
    }
}
