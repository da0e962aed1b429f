//! `agentry approvals` (the calls waiting for a person, across sessions,
//! and answering them) and `agentry policy suggest`.

use crate::client::{connect, print_line, status_error};
use crate::session_cmds::ago;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1 as spb;
use agentry_runtime::Config;

/// What a call would do, in one line.
fn what(tool: &str, arguments_json: &str) -> String {
    match agentry_client::text::shell_command(tool, arguments_json) {
        Some(command) => format!("$ {}", agentry_client::text::shorten(&command, 100)),
        None => crate::render::short_args(tool, arguments_json),
    }
}

/// `agentry approvals`: every call waiting for a person.
pub async fn list(config: &Config, json: bool) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let inbox = client
        .list_approvals(pb::ListApprovalsRequest::default())
        .await
        .map_err(|s| status_error("cannot list pending approvals", s))?
        .into_inner();
    let (approvals, parked) = (inbox.approvals, inbox.parked);
    if json {
        for p in &parked {
            let exceeded = p.exceeded.clone().unwrap_or_default();
            print_line(serde_json::json!({
                "parked": {
                    "session_id": p.session_id, "session_title": p.session_title,
                    "turn_id": p.turn_id, "message": p.message,
                    "parked_at": p.parked_at.map(|t| t.seconds),
                    "scope": exceeded.scope, "measure": exceeded.measure,
                    "used": exceeded.used, "limit": exceeded.limit,
                    "currency": exceeded.currency,
                }
            }))?;
        }
        for a in &approvals {
            print_line(serde_json::json!({
                "session_id": a.session_id, "session_title": a.session_title,
                "turn_id": a.turn_id, "call_id": a.call_id, "tool": a.tool,
                "arguments": a.arguments_json, "matched_rule": a.matched_rule,
                "network": a.network, "asked_at": a.asked_at.map(|t| t.seconds),
                "approvers": a.approvers, "approved_by": a.approved_by,
                "question": a.question.as_ref().map(|q| serde_json::json!({
                    "server": q.server,
                    "questions": q.questions.iter().map(|q| serde_json::json!({
                        "key": q.key, "mode": q.mode, "message": q.message,
                        "schema": serde_json::from_str::<serde_json::Value>(&q.schema_json)
                            .unwrap_or(serde_json::Value::Null),
                        "url": q.url,
                    })).collect::<Vec<_>>(),
                })),
            }))?;
        }
        return Ok(());
    }
    for p in &parked {
        let exceeded = p.exceeded.clone().unwrap_or_default();
        let flag = match (exceeded.scope.as_str(), exceeded.measure.as_str()) {
            ("turn", "tokens") => "--turn-tokens",
            ("session", "tokens") => "--session-tokens",
            ("turn", _) => "--turn-cost",
            _ => "--session-cost",
        };
        let higher = if exceeded.measure == "tokens" {
            format!("{}", (exceeded.limit * 2.0).ceil() as u64)
        } else {
            format!("{:.2}", exceeded.limit * 2.0)
        };
        print_line(format!(
            "{}  paused at a spending limit (parked {})\n    session {} \"{}\"\n    {}\n    \
             let it go on: agentry approvals raise {} {flag} {higher}",
            p.session_id,
            ago(p.parked_at.as_ref()),
            p.session_id,
            p.session_title,
            p.message,
            p.session_id,
        ))?;
    }
    if approvals.is_empty() {
        if parked.is_empty() {
            return print_line("no tool call is waiting for a decision");
        }
        return Ok(());
    }
    for a in approvals.iter().filter(|a| a.question.is_some()) {
        let Some(asked) = &a.question else { continue };
        print_line(format!(
            "{}  {}  the MCP server {} asks (call {} {}; asked {})\n    session {} \"{}\"",
            a.session_id,
            a.call_id,
            asked.server,
            a.tool,
            what(&a.tool, &a.arguments_json),
            ago(a.asked_at.as_ref()),
            a.session_id,
            a.session_title,
        ))?;
        for q in &asked.questions {
            let text = agentry_agent::questions::describe(q);
            print_line(format!("    {}", text.replace('\n', "\n    ")))?;
        }
        print_line(format!(
            "    reply with: agentry approvals reply {} {} {}",
            a.session_id,
            a.call_id,
            if asked.questions.iter().all(|q| q.mode == "url") {
                "(once visited) | --decline".to_string()
            } else {
                "--set FIELD=VALUE … | --decline".to_string()
            }
        ))?;
    }
    if approvals.iter().all(|a| a.question.is_some()) {
        return Ok(());
    }
    for a in approvals.iter().filter(|a| a.question.is_none()) {
        print_line(format!(
            "{}  {}  {} {}  ({}; asked {})\n    session {} \"{}\"{}",
            a.session_id,
            a.call_id,
            a.tool,
            what(&a.tool, &a.arguments_json),
            a.matched_rule,
            ago(a.asked_at.as_ref()),
            a.session_id,
            a.session_title,
            if a.network {
                "; it would get outbound network"
            } else {
                ""
            },
        ))?;
        if !a.approvers.is_empty() {
            let so_far = if a.approved_by.is_empty() {
                String::new()
            } else {
                format!("; approved so far by {}", a.approved_by.join(", "))
            };
            print_line(format!("    approved by: {}{so_far}", a.approvers))?;
        }
    }
    print_line(
        "answer with: agentry approvals answer SESSION CALL approve|deny|session [--reason TEXT] \
         (a call of unknown outcome: check, approve to run it again, deny to skip it)",
    )
}

/// `agentry approvals raise SESSION --turn-tokens N …`: raises the limits
/// of a turn parked at one; it goes on.
pub async fn raise(config: &Config, session_id: &str, budget: spb::Budget) -> anyhow::Result<()> {
    if budget == spb::Budget::default() {
        anyhow::bail!(
            "say which limit to raise: --turn-tokens, --session-tokens, --turn-cost or --session-cost"
        );
    }
    let mut client = connect(config).await?;
    client
        .submit(pb::SubmitRequest {
            session_id: session_id.to_string(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::RaiseBudget(pb::RaiseBudgetInput {
                    budget: Some(budget),
                })),
            }),
        })
        .await
        .map_err(|s| status_error("cannot raise the limit", s))?;
    print_line(format!(
        "raised; the turn of session {session_id} goes on (or parks again if another limit is reached)"
    ))
}

/// The decisions `agentry approvals answer` takes.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Answer {
    /// Run it.
    Approve,
    /// Refuse it (the reason goes to the model).
    Deny,
    /// Run it, and calls like it for the rest of the session.
    Session,
    /// For a call whose outcome is unknown after a restart: do not run it
    /// again; the agent checks what it did (approve runs it again, deny
    /// skips it).
    Check,
}

/// `agentry approvals answer SESSION CALL DECISION`.
pub async fn answer(
    config: &Config,
    session_id: &str,
    call_id: &str,
    decision: Answer,
    reason: Option<String>,
) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let decision = match decision {
        Answer::Approve => spb::ApprovalDecision::Approve,
        Answer::Deny => spb::ApprovalDecision::Deny,
        Answer::Session => spb::ApprovalDecision::ApproveForSession,
        Answer::Check => spb::ApprovalDecision::Check,
    };
    client
        .submit(pb::SubmitRequest {
            session_id: session_id.to_string(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::Approval(pb::ApprovalInput {
                    call_id: call_id.to_string(),
                    decision: decision as i32,
                    reason: reason.unwrap_or_default(),
                    edited_arguments_json: String::new(),
                })),
            }),
        })
        .await
        .map_err(|s| status_error("cannot answer the approval", s))?;
    print_line(format!(
        "{call_id}: {}",
        decision.as_str_name().to_lowercase()
    ))
}

/// How `agentry approvals reply` answers.
pub struct Reply {
    /// FIELD=VALUE pairs for the only question.
    pub set: Vec<String>,
    /// The answers as JSON.
    pub json: Option<String>,
    /// Refuse to answer.
    pub decline: bool,
    /// Dismiss without an answer.
    pub cancel: bool,
}

/// `agentry approvals reply SESSION CALL …`: answers an MCP server's
/// questions.
pub async fn reply(
    config: &Config,
    session_id: &str,
    call_id: &str,
    reply: Reply,
) -> anyhow::Result<()> {
    let action = match (reply.decline, reply.cancel) {
        (true, _) => "decline",
        (_, true) => "cancel",
        _ => "accept",
    };
    let content_json = match reply.json {
        Some(json) => json,
        None => {
            let mut fields = serde_json::Map::new();
            for pair in &reply.set {
                let Some((field, value)) = pair.split_once('=') else {
                    anyhow::bail!("--set takes FIELD=VALUE, not {pair:?}");
                };
                fields.insert(
                    field.trim().to_string(),
                    serde_json::Value::String(value.to_string()),
                );
            }
            if fields.is_empty() {
                String::new()
            } else {
                serde_json::Value::Object(fields).to_string()
            }
        }
    };
    let mut client = connect(config).await?;
    client
        .submit(pb::SubmitRequest {
            session_id: session_id.to_string(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::McpAnswer(pb::McpAnswerInput {
                    call_id: call_id.to_string(),
                    action: action.to_string(),
                    content_json,
                })),
            }),
        })
        .await
        .map_err(|s| status_error("cannot answer the MCP server's questions", s))?;
    print_line(format!("{call_id}: {action}ed"))
}

/// `agentry policy suggest`: rules that would have saved the prompts
/// people approved, allowing nothing they denied.
pub async fn suggest(config: &Config, sessions: u32, min_saves: usize) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let response = client
        .list_decisions(pb::ListDecisionsRequest { sessions })
        .await
        .map_err(|s| status_error("cannot read past decisions", s))?
        .into_inner();
    let decided: Vec<agentry_policy::suggest::Decided> = response
        .decisions
        .iter()
        .map(|d| agentry_policy::suggest::Decided {
            tool: d.tool.clone(),
            arguments_json: d.arguments_json.clone(),
            approved: d.approved,
        })
        .collect();
    let approved = decided.iter().filter(|d| d.approved).count();
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    print_line(format!(
        "# {} in {}: {approved} approved, {} denied",
        plural(decided.len(), "decision"),
        plural(response.sessions as usize, "session"),
        decided.len() - approved
    ))?;
    let suggestions = agentry_policy::suggest::suggest(&decided, min_saves);
    if suggestions.is_empty() {
        return print_line(format!(
            "# no rule would have saved {min_saves} or more prompts without allowing a denied call"
        ));
    }
    let local = config
        .config_dir
        .as_ref()
        .map(|dir| dir.join("local.toml").display().to_string())
        .unwrap_or_else(|| "config/local.toml (set AGENTRY_CONFIG_DIR)".to_string());
    print_line(format!(
        "# Paste these into {local}: they are added to the rules already there, which stay \
         (the default deny rules included). Each allows only calls like ones a person \
         approved, and none a person denied; deny rules still win."
    ))?;
    for s in suggestions {
        print_line(format!("\n{}", s.to_toml().trim_end()))?;
    }
    Ok(())
}
