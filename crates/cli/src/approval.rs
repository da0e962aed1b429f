//! Asking a person about a tool call that needs approval.

use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{self as spb, ApprovalDecision};
use serde_json::Value;
use std::io::Write;

/// What the person answered.
pub enum Answer {
    /// A decision to submit.
    Decide(pb::ApprovalInput),
    /// A deny: ask for the optional reason next.
    DenyAskReason,
    /// The input was not understood; ask again.
    Again(String),
    /// The person edited the arguments (these): show the call again and
    /// ask, and run it as edited only once they say yes.
    Edited(String),
}

/// A readable description of the call: the command for bash, a diff-like
/// view of the new content for writes, pretty JSON otherwise. Everything
/// that would act on a terminal is shown as a visible escape (`\e`, `\r`).
pub fn describe(request: &spb::ApprovalRequested) -> String {
    crate::terminal::visible(&describe_raw(request)).into_owned()
}

/// What answering "always in this session" would allow from then on, in
/// one line: the commands of a bash line, a file tool's path, or every
/// call of the tool.
pub fn always_covers(request: &spb::ApprovalRequested) -> String {
    let rules = agentry_policy::session_rules_for(&request.tool, &request.arguments_json);
    let parts: Vec<String> = rules
        .iter()
        .map(|r| match (&r.command, &r.path) {
            (Some(command), _) => format!("`{command}`"),
            (None, Some(path)) => format!("{} of {path}", r.tool),
            (None, None) => format!("every {} call", r.tool),
        })
        .collect();
    if parts.is_empty() {
        "[a]lways adds nothing it could match again: it answers this call only".to_string()
    } else {
        format!(
            "[a]lways allows, for the rest of this session: {}",
            parts.join(", ")
        )
    }
}

fn describe_raw(request: &spb::ApprovalRequested) -> String {
    let args: Value = serde_json::from_str(&request.arguments_json).unwrap_or(Value::Null);
    let mut out = if request.outcome_unknown {
        format!(
            "\n  the runtime restarted while this {} call was running: it may or may not have \
             taken effect",
            request.tool
        )
    } else {
        // A sub-agent's question, relayed, names the sub-agent.
        let asker = request
            .matched_rule
            .strip_prefix("sub-agent ")
            .and_then(|rest| rest.split_once(':'))
            .map_or_else(
                || "the agent".to_string(),
                |(name, _)| format!("the sub-agent {name}"),
            );
        format!("\n  {asker} wants to run {}", request.tool)
    };
    if request.outcome_unknown {
        out.push('\n');
        return out + &describe_arguments(request, &args);
    }
    if !request.matched_rule.is_empty() {
        out.push_str(&format!("  ({})", request.matched_rule));
    }
    out.push('\n');
    if let Some(who) = agentry_client::text::approvers(request) {
        // Only the people the rule names approve; "always" does not apply.
        return out + &describe_arguments(request, &args) + &format!("    approved by: {who}\n");
    }
    out + &describe_arguments(request, &args) + &format!("    {}\n", always_covers(request))
}

/// The call's arguments, readable: the command for bash, a diff-like view
/// for writes, pretty JSON otherwise.
fn describe_arguments(request: &spb::ApprovalRequested, args: &Value) -> String {
    let mut out = String::new();
    let shell = agentry_client::text::shell_command(&request.tool, &request.arguments_json);
    match (request.tool.as_str(), args) {
        (_, Value::Object(_)) if shell.is_some() => {
            // The whole command, every line of it, never cut; lines after
            // the first are marked, so none can pass for a line of ours.
            let command = shell.unwrap_or_default();
            for (i, line) in command.split('\n').enumerate() {
                let mark = if i == 0 { '$' } else { '>' };
                out.push_str(&format!("    {mark} {line}\n"));
            }
            if request.network {
                out.push_str("    with network: public hosts, through the tool runner's proxy\n");
            }
        }
        ("write_file", Value::Object(map)) => {
            let path = map.get("path").and_then(Value::as_str).unwrap_or("?");
            let content = map.get("content").and_then(Value::as_str).unwrap_or("");
            out.push_str(&format!("    --- {path} (replaced)\n    +++ {path}\n"));
            let lines: Vec<&str> = content.lines().collect();
            for line in lines.iter().take(40) {
                out.push_str(&format!("    +{line}\n"));
            }
            if lines.len() > 40 {
                out.push_str(&format!("    … {} more lines\n", lines.len() - 40));
            }
        }
        ("edit_file", Value::Object(map)) => {
            let path = map.get("path").and_then(Value::as_str).unwrap_or("?");
            out.push_str(&format!("    --- {path}\n    +++ {path}\n"));
            for (key, sign) in [("old_string", '-'), ("new_string", '+')] {
                let text = map.get(key).and_then(Value::as_str).unwrap_or("");
                for line in text.lines() {
                    out.push_str(&format!("    {sign}{line}\n"));
                }
            }
        }
        _ => {
            let pretty = serde_json::to_string_pretty(&args)
                .unwrap_or_else(|_| request.arguments_json.clone());
            for line in pretty.lines() {
                out.push_str(&format!("    {line}\n"));
            }
        }
    }
    out
}

/// The question after the description.
pub const QUESTION: &str = "  Allow? [y]es / [n]o / [a]lways in this session / [e]dit: ";

/// The question about a call whose outcome is unknown after a restart.
pub const UNKNOWN_QUESTION: &str =
    "  [c]heck first (the agent looks at what it did) / [r]un it again / [s]kip it: ";

/// The question to ask about `request`.
pub fn question(request: &spb::ApprovalRequested) -> &'static str {
    if request.outcome_unknown {
        UNKNOWN_QUESTION
    } else {
        QUESTION
    }
}

fn decision(call_id: &str, decision: ApprovalDecision) -> pb::ApprovalInput {
    pb::ApprovalInput {
        call_id: call_id.to_string(),
        decision: decision as i32,
        reason: String::new(),
        edited_arguments_json: String::new(),
    }
}

/// Interprets one line typed at the question; `edited`: the person edited
/// the call (its arguments are the edited ones), which then runs as shown
/// on a yes.
pub async fn answer(request: &spb::ApprovalRequested, line: &str, edited: bool) -> Answer {
    if request.outcome_unknown {
        return match line.trim().to_lowercase().as_str() {
            "c" | "check" => Answer::Decide(decision(&request.call_id, ApprovalDecision::Check)),
            "r" | "run" | "run again" => {
                Answer::Decide(decision(&request.call_id, ApprovalDecision::Approve))
            }
            "s" | "skip" => Answer::Decide(decision(&request.call_id, ApprovalDecision::Deny)),
            _ => Answer::Again("please answer c, r or s".to_string()),
        };
    }
    match line.trim().to_lowercase().as_str() {
        "y" | "yes" if edited => Answer::Decide(pb::ApprovalInput {
            edited_arguments_json: request.arguments_json.clone(),
            ..decision(&request.call_id, ApprovalDecision::Edit)
        }),
        "a" | "always" if edited => Answer::Again(
            "an edited call runs once, as shown: answer y to run it, n, or e to edit it again"
                .to_string(),
        ),
        "y" | "yes" => Answer::Decide(decision(&request.call_id, ApprovalDecision::Approve)),
        "a" | "always" => Answer::Decide(decision(
            &request.call_id,
            ApprovalDecision::ApproveForSession,
        )),
        "n" | "no" => Answer::DenyAskReason,
        "e" | "edit" => match edit_arguments(&request.arguments_json).await {
            Ok(edited) => Answer::Edited(edited),
            Err(e) => Answer::Again(format!("{e:#}")),
        },
        _ => Answer::Again("please answer y, n, a or e".to_string()),
    }
}

/// The question about a call the person edited (`edited` arguments), shown
/// again before it runs.
pub fn ask_edited(request: &mut spb::ApprovalRequested, edited: String) -> String {
    request.arguments_json = edited;
    format!(
        "  The call as edited:\n{}  Run it as shown? [y]es / [n]o / [e]dit again: ",
        describe(request)
    )
}

/// A deny with the reason typed (may be empty).
pub fn deny(call_id: &str, reason: &str) -> pb::ApprovalInput {
    pb::ApprovalInput {
        reason: reason.trim().to_string(),
        ..decision(call_id, ApprovalDecision::Deny)
    }
}

/// Opens the arguments (pretty JSON) in `$VISUAL`/`$EDITOR` (default `vi`)
/// and returns them edited, checked to be a JSON object.
pub(crate) async fn edit_arguments(arguments_json: &str) -> anyhow::Result<String> {
    let value: Value = serde_json::from_str(arguments_json).unwrap_or(Value::Null);
    let pretty = serde_json::to_string_pretty(&value)?;
    let dir = std::env::temp_dir().join(format!("agentry-edit-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("arguments.json");
    std::fs::write(&path, pretty.as_bytes())?;
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".to_string());
    let _ = std::io::stderr().flush();
    let status = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(&path)
        .status()
        .await
        .map_err(|e| anyhow::anyhow!("cannot start the editor {editor:?}: {e}"))?;
    let edited = std::fs::read_to_string(&path)?;
    let _ = std::fs::remove_dir_all(&dir);
    if !status.success() {
        anyhow::bail!("the editor {editor:?} exited with {status}; nothing changed");
    }
    match serde_json::from_str::<Value>(&edited) {
        Ok(Value::Object(map)) => Ok(Value::Object(map).to_string()),
        Ok(_) => anyhow::bail!("the edited arguments must be a JSON object"),
        Err(e) => anyhow::bail!("the edited arguments are not valid JSON: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bash_call_with_network_says_so_before_the_person_answers() {
        let mut request = spb::ApprovalRequested {
            call_id: "c1".into(),
            tool: "bash".into(),
            arguments_json: r#"{"command":"curl https://example.org"}"#.into(),
            matched_rule: r#"rule 1 (bash "curl *")"#.into(),
            network: false,
            outcome_unknown: false,
            approvers: Vec::new(),
            approvals_required: 0,
        };
        let without = describe(&request);
        assert!(without.contains("$ curl https://example.org"), "{without}");
        assert!(!without.contains("network"), "{without}");
        request.network = true;
        let with = describe(&request);
        assert!(
            with.contains("with network: public hosts, through the tool runner's proxy"),
            "{with}"
        );
    }

    #[tokio::test]
    async fn a_call_of_unknown_outcome_offers_check_run_again_and_skip() {
        let request = spb::ApprovalRequested {
            call_id: "w1".into(),
            tool: "bash".into(),
            arguments_json: r#"{"command":"git push"}"#.into(),
            matched_rule: "outcome unknown: the runtime restarted while this bash call was running"
                .into(),
            network: false,
            outcome_unknown: true,
            approvers: Vec::new(),
            approvals_required: 0,
        };
        let shown = describe(&request);
        assert!(
            shown.contains("may or may not have taken effect"),
            "{shown}"
        );
        assert!(shown.contains("$ git push"), "{shown}");
        assert_eq!(question(&request), UNKNOWN_QUESTION);
        for (typed, expected) in [
            ("c", ApprovalDecision::Check),
            ("run again", ApprovalDecision::Approve),
            ("s", ApprovalDecision::Deny),
        ] {
            match answer(&request, typed, false).await {
                Answer::Decide(input) => assert_eq!(input.decision, expected as i32, "{typed}"),
                _ => panic!("{typed} was not understood"),
            }
        }
        assert!(matches!(
            answer(&request, "y", false).await,
            Answer::Again(_)
        ));
    }
}

#[cfg(test)]
mod covers_tests {
    use super::*;

    fn request(tool: &str, arguments: serde_json::Value) -> spb::ApprovalRequested {
        spb::ApprovalRequested {
            tool: tool.to_string(),
            arguments_json: arguments.to_string(),
            ..Default::default()
        }
    }

    #[test]
    fn a_call_a_rule_names_approvers_for_says_who_and_offers_no_always() {
        let mut deploy = request("bash", serde_json::json!({"command": "deploy prod"}));
        deploy.approvers = vec![spb::Approvers {
            any_of: vec!["role:admin".into(), "user:alice".into()],
        }];
        deploy.approvals_required = 2;
        let shown = describe(&deploy);
        assert!(
            shown.contains("approved by: 2 different people: role:admin or user:alice"),
            "{shown}"
        );
        assert!(!shown.contains("[a]lways"), "{shown}");
    }

    #[test]
    fn the_prompt_says_what_always_would_allow() {
        let bash = request(
            "bash",
            serde_json::json!({"command": "make release && ls -la"}),
        );
        assert_eq!(
            always_covers(&bash),
            "[a]lways allows, for the rest of this session: `make release`, `ls -la`"
        );
        assert!(describe(&bash).contains("`make release`, `ls -la`"));
        let write = request(
            "write_file",
            serde_json::json!({"path": "notes.txt", "content": "x"}),
        );
        assert!(always_covers(&write).ends_with("write_file of notes.txt"));
        let mcp = request("time__now", serde_json::json!({}));
        assert!(always_covers(&mcp).ends_with("every time__now call"));
        // A line the policy cannot read gives nothing to match again.
        let computed = request("bash", serde_json::json!({"command": "$CMD"}));
        assert!(always_covers(&computed).contains("this call only"));
    }
}
