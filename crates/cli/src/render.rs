//! Showing session events to a person, and as JSON lines for scripts.

use agentry_proto::sessions::v1::{self as pb, event::Kind};
use serde_json::{Value, json};
use std::io::Write;

fn time_of(event: &pb::Event) -> Value {
    event
        .time
        .as_ref()
        .map(|t| json!(t.seconds as f64 + f64::from(t.nanos) / 1e9))
        .unwrap_or(Value::Null)
}

fn usage_json(u: Option<&pb::TokenUsage>) -> Value {
    u.map(|u| {
        json!({
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "total_tokens": u.total_tokens,
            "cached_prompt_tokens": u.cached_prompt_tokens,
            "cache_write_prompt_tokens": u.cache_write_prompt_tokens,
        })
    })
    .unwrap_or(Value::Null)
}

/// An enum value's plain name: its protobuf name without the type's
/// prefix, in lower case (`OUTPUT_STREAM_STDOUT` → `stdout`); the number
/// when this build does not know it.
fn enum_name<E: TryFrom<i32>>(
    value: i32,
    prefix: &str,
    name: impl Fn(E) -> &'static str,
) -> String {
    E::try_from(value)
        .map(|e| {
            let full = name(e);
            full.strip_prefix(prefix)
                .unwrap_or(full)
                .to_ascii_lowercase()
        })
        .unwrap_or_else(|_| value.to_string())
}

/// The version of the JSON form of events (`"version"` in each object):
/// raised when a field changes meaning or goes away; new fields may come
/// without it.
pub const JSON_VERSION: u32 = 2;

/// One event as a JSON object: `session_id`, `seq`, `turn_id`, `time`
/// (seconds since the epoch), `type`, and the kind's own fields; `live`:
/// true for streamed text, which the log does not keep (its `seq` is that
/// of the logged event before it).
pub fn event_json(event: &pb::Event) -> Value {
    let mut out = json!({
        "version": JSON_VERSION,
        "session_id": event.session_id,
        "seq": event.seq,
        "turn_id": event.turn_id,
        "time": time_of(event),
    });
    if event.live {
        out["live"] = json!(true);
    }
    let body = match &event.kind {
        None => json!({"type": "unknown"}),
        Some(kind) => match kind {
            Kind::UserMessage(m) if m.compact => json!({
                "type": "user_message", "text": m.text, "compact": true,
            }),
            Kind::UserMessage(m) => json!({
                "type": "user_message", "text": m.text, "plan": m.plan, "network": m.network,
                "images": m.images.iter().map(|i| json!({
                    "path": i.path, "mime": i.mime, "bytes": i.data.len(),
                })).collect::<Vec<_>>(),
            }),
            Kind::ModelTextDelta(d) => json!({"type": "model_text_delta", "text": d.text}),
            Kind::ModelMessage(m) => json!({
                "type": "model_message", "text": m.text, "finish_reason": m.finish_reason,
                "usage": usage_json(m.usage.as_ref()), "model": m.model, "step": m.step,
                "fixed_tokens": m.fixed_tokens, "context_window": m.context_window,
            }),
            Kind::ToolCallRequested(c) => json!({
                "type": "tool_call_requested", "call_id": c.call_id, "tool": c.tool,
                "arguments": c.arguments_json,
            }),
            Kind::ApprovalRequested(a) => json!({
                "type": "approval_requested", "call_id": a.call_id, "tool": a.tool,
                "arguments": a.arguments_json, "matched_rule": a.matched_rule,
                "network": a.network, "outcome_unknown": a.outcome_unknown,
            }),
            Kind::ApprovalDecided(a) => json!({
                "type": "approval_decided", "call_id": a.call_id,
                "decision": enum_name(a.decision, "APPROVAL_DECISION_", |d: pb::ApprovalDecision| {
                    d.as_str_name()
                }),
                "reason": a.reason, "edited_arguments": a.edited_arguments_json,
            }),
            Kind::ToolOutputChunk(c) => json!({
                "type": "tool_output_chunk", "call_id": c.call_id,
                "stream": enum_name(c.stream, "OUTPUT_STREAM_", |s: pb::OutputStream| s.as_str_name()),
                "text": c.text,
            }),
            Kind::ToolResult(r) => json!({
                "type": "tool_result", "call_id": r.call_id, "tool": r.tool, "output": r.output,
                "is_error": r.is_error, "exit_code": r.exit_code, "duration_ms": r.duration_ms,
                "runner_id": r.runner_id, "sub_agent_usage": usage_json(r.sub_agent_usage.as_ref()),
                "truncated": r.truncated, "timed_out": r.timed_out,
            }),
            Kind::WorkspaceSnapshot(w) => json!({
                "type": "workspace_snapshot", "snapshot_id": w.snapshot_id,
                "point": snapshot_point_name(w.point), "files": w.files, "bytes": w.bytes,
                "new_bytes": w.new_bytes, "skipped": w.skipped, "error": w.error,
            }),
            Kind::SessionRewound(r) => json!({
                "type": "session_rewound", "to_turn": r.to_turn, "to_seq": r.to_seq,
                "snapshot_id": r.snapshot_id, "before_snapshot_id": r.before_snapshot_id,
                "files_written": r.files_written, "files_deleted": r.files_deleted,
                "files_left_alone": r.files_left_alone,
            }),
            Kind::McpResourceUpdated(u) => json!({
                "type": "mcp_resource_updated", "server": u.server, "uri": u.uri,
                "update_id": u.update_id, "content": u.content,
            }),
            Kind::ReminderDue(r) => json!({
                "type": "reminder_due", "reminder_id": r.reminder_id, "firing_id": r.firing_id,
                "message": r.message, "kind": reminder_kind_name(r.reminder_kind()),
                "late_ms": r.late_ms,
            }),
            Kind::Error(e) => json!({
                "type": "error",
                "source": enum_name(e.source, "ERROR_SOURCE_", |s: pb::ErrorSource| s.as_str_name()),
                "message": e.message, "retryable": e.retryable,
            }),
            Kind::TurnFinished(t) => json!({
                "type": "turn_finished",
                "outcome": outcome_name(t.outcome),
                "message": t.message, "steps": t.steps, "usage": usage_json(t.usage.as_ref()),
                "cost": t.cost, "currency": t.currency,
            }),
            Kind::CancelRequested(c) => json!({"type": "cancel_requested", "reason": c.reason}),
            Kind::SkillsetChosen(s) => json!({
                "type": "skillset_chosen", "intent": s.intent, "skillset": s.skillset,
                "keywords": s.keywords,
            }),
            Kind::ToolCallState(t) => json!({
                "type": "tool_call_state", "call_id": t.call_id,
                "phase": phase_name(t.phase), "detail": t.detail,
            }),
            Kind::BudgetExceeded(b) => json!({
                "type": "budget_exceeded", "scope": b.scope, "measure": b.measure,
                "used": b.used, "limit": b.limit, "currency": b.currency,
            }),
            Kind::LoopDetected(l) => json!({
                "type": "loop_detected", "tool": l.tool, "arguments": l.arguments_json,
                "repeats": l.repeats, "stopped": l.stopped, "no_progress": l.no_progress,
            }),
            Kind::ToolsOffered(t) => json!({
                "type": "tools_offered",
                "tools": t.tools.iter().map(|tool| json!({
                    "name": tool.name, "read_only": tool.read_only,
                    "parallel_safe": tool.parallel_safe,
                })).collect::<Vec<_>>(),
            }),
            Kind::ContextCompacted(c) => json!({
                "type": "context_compacted", "first_seq": c.first_seq, "last_seq": c.last_seq,
                "summary": c.summary, "messages": c.messages,
                "tokens_before": c.tokens_before, "tokens_after": c.tokens_after, "note": c.note,
            }),
            Kind::PlanSubmitted(p) => json!({
                "type": "plan_submitted", "revision": p.revision, "reason": p.reason,
                "steps": p.steps.iter().map(|s| json!({
                    "title": s.title, "detail": s.detail,
                    "status": step_status_name(s.status), "summary": s.summary,
                })).collect::<Vec<_>>(),
            }),
            Kind::ModelChanged(m) => json!({"type": "model_changed", "model": m.model}),
            Kind::InstructionsLoaded(l) => json!({
                "type": "instructions_loaded",
                "files": l.files.iter().map(|f| json!({
                    "path": f.path, "size": f.size, "truncated": f.truncated, "text": f.text,
                })).collect::<Vec<_>>(),
            }),
            Kind::HookRan(h) => json!({
                "type": "hook_ran", "event": h.event, "command": h.command,
                "call_id": h.call_id, "tool": h.tool, "decision": h.decision,
                "reason": h.reason, "context": h.context, "error": h.error,
                "stderr": h.stderr, "duration_ms": h.duration_ms, "outcome": h.outcome,
            }),
            Kind::PlanStepUpdated(u) => json!({
                "type": "plan_step_updated", "index": u.index,
                "status": step_status_name(u.status), "summary": u.summary, "started": u.started,
            }),
        },
    };
    if let (Value::Object(out), Value::Object(body)) = (&mut out, body) {
        out.extend(body);
    }
    out
}

/// Where a snapshot was taken, as the JSON output names it.
fn snapshot_point_name(point: i32) -> &'static str {
    match pb::SnapshotPoint::try_from(point) {
        Ok(pb::SnapshotPoint::BeforeChange) => "before_change",
        Ok(pb::SnapshotPoint::TurnEnd) => "turn_end",
        Ok(pb::SnapshotPoint::BeforeRewind) => "before_rewind",
        Ok(pb::SnapshotPoint::Fork) => "fork",
        Ok(pb::SnapshotPoint::Unspecified) | Err(_) => "unspecified",
    }
}

/// A plan step status's short name.
pub fn step_status_name(status: i32) -> &'static str {
    match pb::PlanStepStatus::try_from(status) {
        Ok(pb::PlanStepStatus::InProgress) => "in_progress",
        Ok(pb::PlanStepStatus::Completed) => "completed",
        Ok(pb::PlanStepStatus::Failed) => "failed",
        Ok(pb::PlanStepStatus::Unspecified) | Err(_) => "pending",
    }
}

/// A reminder's kind as the JSON output names it.
fn reminder_kind_name(kind: pb::ReminderKind) -> &'static str {
    match kind {
        pb::ReminderKind::Notify => "notify",
        pb::ReminderKind::Task => "task",
        pb::ReminderKind::Unspecified => "unspecified",
    }
}

/// A tool call phase's short name.
pub fn phase_name(phase: i32) -> &'static str {
    match pb::ToolCallPhase::try_from(phase) {
        Ok(pb::ToolCallPhase::Validating) => "validating",
        Ok(pb::ToolCallPhase::AwaitingApproval) => "awaiting_approval",
        Ok(pb::ToolCallPhase::Scheduled) => "scheduled",
        Ok(pb::ToolCallPhase::Executing) => "executing",
        Ok(pb::ToolCallPhase::Success) => "success",
        Ok(pb::ToolCallPhase::Error) => "error",
        Ok(pb::ToolCallPhase::Cancelled) => "cancelled",
        Ok(pb::ToolCallPhase::Unspecified) | Err(_) => "unknown",
    }
}

/// The outcome's short name: completed, cancelled, failed or step_limit.
pub fn outcome_name(outcome: i32) -> &'static str {
    match pb::TurnOutcome::try_from(outcome) {
        Ok(pb::TurnOutcome::Completed) => "completed",
        Ok(pb::TurnOutcome::Cancelled) => "cancelled",
        Ok(pb::TurnOutcome::Failed) => "failed",
        Ok(pb::TurnOutcome::StepLimit) => "step_limit",
        Ok(pb::TurnOutcome::Budget) => "budget",
        Ok(pb::TurnOutcome::Unspecified) | Err(_) => "unknown",
    }
}

/// A one-line summary of a tool's arguments.
/// The main argument of a call (bash's command, a file tool's path), or
/// the arguments, in one short line.
pub(crate) fn short_args(tool: &str, arguments: &str) -> String {
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

fn shorten(text: &str, max: usize) -> String {
    // Control characters (escape sequences that could move the cursor,
    // rewrite earlier lines or reach the clipboard) never reach the
    // terminal from a tool, a server or a page.
    let visible = crate::terminal::visible(text);
    let one_line = visible.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let cut: String = one_line.chars().take(max).collect();
        format!("{cut}…")
    }
}

/// Whether a tool is plan mode's own (`submit_plan`, `complete_step`):
/// its calls are the plan's steps, shown as the plan rather than as raw
/// JSON.
pub(crate) fn is_plan_tool(tool: &str) -> bool {
    matches!(tool, "submit_plan" | "complete_step")
}

/// Renders events for a person.
///
/// How much of the context window the fixed part of every request takes
/// (system prompt, instructions, tool definitions).
pub fn fixed_part(fixed_tokens: u32, context_window: u32) -> String {
    let share = f64::from(fixed_tokens) * 100.0 / f64::from(context_window.max(1));
    format!(
        "(fixed part of each request: ~{fixed_tokens} tokens, {share:.0}% of the \
         {context_window}-token context window)"
    )
}

/// `answer` receives the model's text as it streams; `activity` receives tool
/// calls, results, errors and turn summaries. For `agentry run` the first is
/// stdout and the second stderr, so stdout holds the answer alone.
pub struct Renderer<A: Write, B: Write> {
    answer: A,
    activity: B,
    /// Whether the answer stream ended mid-line.
    mid_line: bool,
    /// The text streamed since the last model message: the message shows
    /// what was not (all of it when reading a log, where streamed text is
    /// not kept).
    streamed: String,
    /// Show user messages (when replaying a session).
    pub show_user: bool,
    /// Show approval requests (off where the caller asks the question itself).
    pub show_approvals: bool,
    /// Show details a person rarely needs (how much of the context window
    /// every request's fixed part takes).
    pub verbose: bool,
    /// Token counts of the model calls of the current turn.
    step_tokens: Vec<u64>,
    /// The titles of the current plan's steps.
    plan: Vec<String>,
    /// What the turns seen so far cost, and in which currency.
    session_cost: Option<(f64, String)>,
    /// Calls of MCP tools in flight, whose progress and log messages are
    /// shown as they come.
    mcp_calls: std::collections::HashSet<String>,
}

/// An amount of money: `$0.0123` in USD, else `0.0123 EUR`.
pub(crate) fn money(amount: f64, currency: &str) -> String {
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

impl Renderer<Vec<u8>, Vec<u8>> {
    /// What was written to each stream since the last call.
    pub fn take_output(&mut self) -> (Vec<u8>, Vec<u8>) {
        (
            std::mem::take(&mut self.answer),
            std::mem::take(&mut self.activity),
        )
    }
}

impl<A: Write, B: Write> Renderer<A, B> {
    /// ", $0.0012" for a turn, with the session's total so far once there
    /// was more than one priced turn.
    fn cost_note(&mut self, cost: f64, currency: &str) -> String {
        let total = match self.session_cost.take() {
            Some((total, seen)) if seen == currency => Some(total + cost),
            _ => None,
        };
        self.session_cost = Some((total.unwrap_or(cost), currency.to_string()));
        match total {
            Some(total) => format!(
                ", {}; session {}",
                money(cost, currency),
                money(total, currency)
            ),
            None => format!(", {}", money(cost, currency)),
        }
    }

    /// A renderer writing to `answer` and `activity`.
    pub fn new(answer: A, activity: B) -> Self {
        Self {
            answer,
            activity,
            mid_line: false,
            streamed: String::new(),
            show_user: false,
            show_approvals: true,
            verbose: false,
            step_tokens: Vec::new(),
            session_cost: None,
            mcp_calls: std::collections::HashSet::new(),
            plan: Vec::new(),
        }
    }

    fn end_line(&mut self) {
        if self.mid_line {
            let _ = writeln!(self.answer);
            let _ = self.answer.flush();
            self.mid_line = false;
        }
    }

    /// Marks the start of turn `number` (as `/rewind N` takes it).
    pub fn turn_header(&mut self, number: u32) {
        self.end_line();
        let _ = writeln!(self.activity, "── turn {number} ──");
    }

    /// Shows one event.
    pub fn event(&mut self, event: &pb::Event) {
        let Some(kind) = &event.kind else { return };
        match kind {
            Kind::UserMessage(m) => {
                if self.show_user {
                    self.end_line();
                    let _ = writeln!(self.activity, "you> {}{}", m.text, images_shown(m));
                }
            }
            Kind::ModelTextDelta(d) => {
                self.streamed.push_str(&d.text);
                let _ = write!(self.answer, "{}", d.text);
                let _ = self.answer.flush();
                self.mid_line = !d.text.ends_with('\n');
            }
            Kind::ModelMessage(m) => {
                let streamed = std::mem::take(&mut self.streamed);
                // What of the answer was not shown as it streamed: the
                // rest when its start was, nothing when it all was (a call
                // written as text and rewritten streams more than the
                // answer), else (followed from the middle, or fell behind)
                // the whole answer on a line of its own.
                let missing = match m.text.strip_prefix(streamed.as_str()) {
                    Some(rest) => rest,
                    None if streamed.ends_with(m.text.as_str()) => "",
                    None => {
                        self.end_line();
                        m.text.as_str()
                    }
                };
                if !missing.is_empty() {
                    let _ = write!(self.answer, "{missing}");
                    let _ = self.answer.flush();
                    self.mid_line = !missing.ends_with('\n');
                }
                self.step_tokens
                    .push(m.usage.as_ref().map(|u| u.total_tokens).unwrap_or(0));
                self.end_line();
                if self.verbose && m.fixed_tokens > 0 && m.context_window > 0 {
                    let _ = writeln!(
                        self.activity,
                        "{}",
                        fixed_part(m.fixed_tokens, m.context_window)
                    );
                }
            }
            // The plan's own calls show as the plan (below), not as calls.
            Kind::ToolCallRequested(c) if is_plan_tool(&c.tool) => {}
            Kind::ToolResult(r) if is_plan_tool(&r.tool) && !r.is_error => {}
            Kind::ToolCallRequested(c) => {
                self.end_line();
                if c.tool.contains("__") {
                    self.mcp_calls.insert(c.call_id.clone());
                }
                let _ = writeln!(
                    self.activity,
                    "  → {} {}",
                    c.tool,
                    short_args(&c.tool, &c.arguments_json)
                );
            }
            Kind::ApprovalRequested(a) => {
                if self.show_approvals {
                    self.end_line();
                    let _ = writeln!(
                        self.activity,
                        "  ? {} {} needs approval ({})",
                        a.tool,
                        short_args(&a.tool, &a.arguments_json),
                        a.matched_rule
                    );
                }
            }
            Kind::ApprovalDecided(a) => {
                let what = match pb::ApprovalDecision::try_from(a.decision) {
                    Ok(pb::ApprovalDecision::Approve) => "approved".to_string(),
                    Ok(pb::ApprovalDecision::ApproveForSession) => {
                        "approved for this session".to_string()
                    }
                    Ok(pb::ApprovalDecision::Deny) if a.reason.is_empty() => "denied".to_string(),
                    Ok(pb::ApprovalDecision::Deny) => format!("denied: {}", a.reason),
                    Ok(pb::ApprovalDecision::Edit) => {
                        format!("edited to {}", shorten(&a.edited_arguments_json, 100))
                    }
                    Ok(pb::ApprovalDecision::Check) => {
                        "not run again; the agent checks what it did".to_string()
                    }
                    Ok(pb::ApprovalDecision::Unspecified) | Err(_) => "decided".to_string(),
                };
                self.end_line();
                let _ = writeln!(self.activity, "  ✓ {what}");
            }
            // A call of an MCP tool streams its server's progress and log
            // messages; other tools' output shows with the result.
            Kind::ToolOutputChunk(c) if self.mcp_calls.contains(&c.call_id) => {
                self.end_line();
                for line in c.text.lines().filter(|l| !l.trim().is_empty()) {
                    let _ = writeln!(self.activity, "    │ {}", shorten(line, 160));
                }
            }
            Kind::ToolOutputChunk(_) => {}
            Kind::ToolResult(r) => {
                self.mcp_calls.remove(&r.call_id);
                let mark = if r.is_error { "✗" } else { "←" };
                let runner = match (&r.sub_agent_usage, r.runner_id.is_empty()) {
                    (Some(u), _) => format!(
                        "  [{} ms, the sub-agent used {} tokens]",
                        r.duration_ms, u.total_tokens
                    ),
                    (None, true) => String::new(),
                    (None, false) => format!("  [{} ms on {}]", r.duration_ms, r.runner_id),
                };
                let runner = match (r.timed_out, r.truncated) {
                    (true, _) => format!("{runner} (timed out)"),
                    (false, true) => format!("{runner} (output cut to the runner's limit)"),
                    (false, false) => runner,
                };
                let _ = writeln!(
                    self.activity,
                    "  {mark} {}{runner}",
                    shorten(&r.output, 120)
                );
            }
            Kind::ReminderDue(r) => {
                self.end_line();
                let _ = writeln!(self.activity, "⏰ reminder: {}", r.message);
            }
            Kind::McpResourceUpdated(u) => {
                self.end_line();
                let _ = writeln!(
                    self.activity,
                    "↻ {} changed on {}: {}",
                    u.uri,
                    u.server,
                    shorten(&u.content, 120)
                );
            }
            Kind::Error(e) => {
                // A failed call's text is not the next answer's start.
                self.streamed.clear();
                self.end_line();
                let _ = writeln!(self.activity, "error: {}", e.message);
            }
            Kind::TurnFinished(t) => {
                self.streamed.clear();
                self.end_line();
                // Tokens per model call, then the turn's total.
                let steps = std::mem::take(&mut self.step_tokens);
                let usage = t
                    .usage
                    .as_ref()
                    .filter(|u| u.total_tokens > 0)
                    .map(|u| {
                        let per_step = if steps.len() > 1 && steps.len() == t.steps as usize {
                            format!(
                                " = {}",
                                steps
                                    .iter()
                                    .map(u64::to_string)
                                    .collect::<Vec<_>>()
                                    .join(" + ")
                            )
                        } else {
                            String::new()
                        };
                        format!(
                            ", {} tokens{per_step} ({} in, {} out)",
                            u.total_tokens, u.prompt_tokens, u.completion_tokens
                        )
                    })
                    .unwrap_or_default();
                let cost = t
                    .cost
                    .map(|cost| self.cost_note(cost, &t.currency))
                    .unwrap_or_default();
                match pb::TurnOutcome::try_from(t.outcome) {
                    Ok(pb::TurnOutcome::Completed) => {}
                    Ok(pb::TurnOutcome::Cancelled) => {
                        let _ = writeln!(self.activity, "(turn cancelled)");
                    }
                    Ok(pb::TurnOutcome::StepLimit) => {
                        let _ = writeln!(self.activity, "(step limit reached: {})", t.message);
                    }
                    Ok(pb::TurnOutcome::Budget) => {
                        let _ = writeln!(self.activity, "({})", t.message);
                    }
                    Ok(pb::TurnOutcome::Failed) => {
                        let _ = writeln!(self.activity, "(turn failed: {})", t.message);
                    }
                    Ok(pb::TurnOutcome::Unspecified) | Err(_) => {}
                }
                let _ = writeln!(
                    self.activity,
                    "  ({} step{}{usage}{cost})",
                    t.steps,
                    if t.steps == 1 { "" } else { "s" }
                );
                let _ = self.activity.flush();
            }
            Kind::CancelRequested(_) => {
                self.end_line();
            }
            Kind::SkillsetChosen(s) if self.verbose && !s.skillset.is_empty() => {
                let _ = writeln!(self.activity, "  (skillset: {})", s.skillset);
            }
            Kind::ContextCompacted(c) => {
                self.end_line();
                let how = if c.summary.is_empty() {
                    format!("left out: {}", c.note)
                } else {
                    "summarised".to_string()
                };
                let _ = writeln!(
                    self.activity,
                    "  (context compacted: {} earlier messages, events {}–{}, {how}; ~{} → ~{} tokens)",
                    c.messages, c.first_seq, c.last_seq, c.tokens_before, c.tokens_after
                );
            }
            Kind::PlanSubmitted(p) => {
                self.end_line();
                let heading = if p.revision <= 1 {
                    "plan:".to_string()
                } else {
                    format!("revised plan (revision {}):", p.revision)
                };
                let _ = writeln!(self.activity, "  {heading}");
                self.plan = p.steps.iter().map(|s| s.title.clone()).collect();
                for (i, step) in p.steps.iter().enumerate() {
                    let mark = match pb::PlanStepStatus::try_from(step.status) {
                        Ok(pb::PlanStepStatus::Completed) => "✓",
                        Ok(pb::PlanStepStatus::Failed) => "✗",
                        _ => " ",
                    };
                    let _ = writeln!(self.activity, "   [{mark}] {}. {}", i + 1, step.title);
                }
            }
            Kind::PlanStepUpdated(u) => {
                self.end_line();
                let n = u.index + 1;
                let line = match pb::PlanStepStatus::try_from(u.status) {
                    Ok(pb::PlanStepStatus::InProgress) => format!(
                        "  ▶ step {n}: {}",
                        self.plan.get(u.index as usize).map_or("", String::as_str)
                    ),
                    Ok(pb::PlanStepStatus::Completed) => {
                        format!("  ✓ step {n} done: {}", shorten(&u.summary, 200))
                    }
                    Ok(pb::PlanStepStatus::Failed) => {
                        format!("  ✗ step {n} failed: {}", shorten(&u.summary, 200))
                    }
                    _ => return,
                };
                let _ = writeln!(self.activity, "{line}");
            }
            Kind::LoopDetected(l) if l.no_progress => {
                self.end_line();
                let what = if l.stopped {
                    "stopped the turn"
                } else {
                    "told the model"
                };
                let _ = writeln!(
                    self.activity,
                    "  (the last {} steps made no progress: {what})",
                    l.repeats
                );
            }
            Kind::LoopDetected(l) => {
                self.end_line();
                let what = if l.stopped {
                    "stopped the turn"
                } else {
                    "told the model its result would not change"
                };
                let _ = writeln!(
                    self.activity,
                    "  (the model asked for the same {} call {} times: {what})",
                    l.tool, l.repeats
                );
            }
            Kind::WorkspaceSnapshot(w) if !w.error.is_empty() => {
                self.end_line();
                let _ = writeln!(
                    self.activity,
                    "  (the workspace could not be recorded: {}; a rewind to here cannot put the files back)",
                    w.error
                );
            }
            Kind::SessionRewound(r) => {
                self.end_line();
                let files = if r.snapshot_id.is_empty() {
                    "files left as they were".to_string()
                } else {
                    format!(
                        "files put back: {} written, {} removed",
                        r.files_written, r.files_deleted
                    )
                };
                let _ = writeln!(
                    self.activity,
                    "── rewound to the end of turn {} (seq {}); {files} ──",
                    r.to_turn, r.to_seq
                );
            }
            Kind::ModelChanged(m) => {
                self.end_line();
                let model = if m.model.is_empty() {
                    "the configured model".to_string()
                } else {
                    m.model.clone()
                };
                let _ = writeln!(self.activity, "  (model: {model} from here on)");
            }
            Kind::InstructionsLoaded(l) => {
                self.end_line();
                for file in &l.files {
                    let _ = writeln!(
                        self.activity,
                        "  (instructions from {}, {}{})",
                        file.path,
                        crate::session_cmds::size(file.size),
                        if file.truncated {
                            format!(
                                "; only the first {} given",
                                crate::session_cmds::size(file.text.len() as u64)
                            )
                        } else {
                            String::new()
                        }
                    );
                }
            }
            Kind::HookRan(h) => {
                self.end_line();
                let line = if !h.error.is_empty() {
                    let stderr = h.stderr.lines().rev().find(|l| !l.trim().is_empty());
                    format!(
                        "  (hook {} failed: {}{}; the policy decides alone)",
                        shorten(&h.command, 80),
                        shorten(&h.error, 200),
                        stderr
                            .map(|l| format!(": {}", shorten(l, 200)))
                            .unwrap_or_default()
                    )
                } else if !h.decision.is_empty() {
                    let reason = if h.reason.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", shorten(&h.reason, 200))
                    };
                    format!(
                        "  (hook {} says {}{reason})",
                        shorten(&h.command, 80),
                        h.decision
                    )
                } else if !h.context.is_empty() {
                    format!(
                        "  (hook {} added context: {})",
                        shorten(&h.command, 80),
                        shorten(&h.context, 120)
                    )
                } else {
                    return;
                };
                let _ = writeln!(self.activity, "{line}");
            }
            // The turn's end says it, with what to do.
            Kind::WorkspaceSnapshot(_)
            | Kind::BudgetExceeded(_)
            | Kind::ToolCallState(_)
            | Kind::SkillsetChosen(_)
            | Kind::ToolsOffered(_) => {}
        }
    }
}

/// Turn numbers as `/rewind N` and `agentry sessions show` give them,
/// followed one stored event at a time: a rewind takes the turns after its
/// point out of the count.
#[derive(Debug, Default, Clone)]
pub struct TurnCounter {
    /// Where each turn of the conversation starts (seq).
    starts: Vec<u64>,
}

impl TurnCounter {
    /// Follows `event` of the session: the number of the turn it starts,
    /// if it starts one.
    pub fn follow(&mut self, event: &pb::Event) -> Option<u32> {
        if event.live {
            return None;
        }
        match event.kind.as_ref()? {
            Kind::SessionRewound(r) => {
                let kept = self.starts.partition_point(|seq| *seq <= r.to_seq);
                self.starts.truncate(kept);
                None
            }
            kind if agentry_orchestrator::rewind::starts_turn(kind)
                && !event.turn_id.is_empty() =>
            {
                self.starts.push(event.seq);
                Some(self.starts.len() as u32)
            }
            _ => None,
        }
    }
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
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn event(kind: Kind) -> pb::Event {
        pb::Event {
            seq: 7,
            kind: Some(kind),
            ..Default::default()
        }
    }

    /// What the answer and the activity streams show for these events.
    fn both(events: &[pb::Event]) -> (String, String) {
        let mut answer = Vec::new();
        let mut activity = Vec::new();
        let mut r = Renderer::new(&mut answer, &mut activity);
        for e in events {
            r.event(e);
        }
        drop(r);
        (
            String::from_utf8(answer).unwrap(),
            String::from_utf8(activity).unwrap(),
        )
    }

    fn rendered(events: &[pb::Event]) -> String {
        both(events).1
    }

    fn answered(events: &[pb::Event]) -> String {
        both(events).0
    }

    #[test]
    fn json_events_carry_the_version_and_plain_enum_names() {
        let chunk = event_json(&event(Kind::ToolOutputChunk(pb::ToolOutputChunk {
            call_id: "c1".into(),
            stream: pb::OutputStream::Stdout as i32,
            text: "hi".into(),
        })));
        assert_eq!(chunk["version"], JSON_VERSION);
        assert_eq!(chunk["stream"], "stdout");
        let decided = event_json(&event(Kind::ApprovalDecided(pb::ApprovalDecided {
            call_id: "c1".into(),
            decision: pb::ApprovalDecision::ApproveForSession as i32,
            ..Default::default()
        })));
        assert_eq!(decided["decision"], "approve_for_session");
        let error = event_json(&event(Kind::Error(pb::Error {
            source: pb::ErrorSource::Model as i32,
            message: "down".into(),
            retryable: true,
        })));
        assert_eq!(error["source"], "model");
        // A value this build does not know stays a number.
        let unknown = event_json(&event(Kind::Error(pb::Error {
            source: 99,
            ..Default::default()
        })));
        assert_eq!(unknown["source"], "99");
    }

    #[test]
    fn plan_calls_and_skillsets_are_not_shown_as_activity() {
        let call = |tool: &str, args: &str| {
            event(Kind::ToolCallRequested(pb::ToolCallRequested {
                call_id: format!("{tool}-1"),
                tool: tool.into(),
                arguments_json: args.into(),
                ..Default::default()
            }))
        };
        let result = |tool: &str, is_error: bool| {
            event(Kind::ToolResult(pb::ToolResult {
                call_id: format!("{tool}-1"),
                tool: tool.into(),
                output: "step 2 is still in progress".into(),
                is_error,
                ..Default::default()
            }))
        };
        let skillset = event(Kind::SkillsetChosen(pb::SkillsetChosen {
            skillset: "files".into(),
            ..Default::default()
        }));
        let shown = rendered(&[
            skillset.clone(),
            call("submit_plan", r#"{"steps":[{"title":"one"}]}"#),
            result("submit_plan", false),
            call("complete_step", r#"{"status":"completed"}"#),
            result("complete_step", true),
        ]);
        assert!(!shown.contains("skillset"), "{shown}");
        assert!(!shown.contains("submit_plan"), "{shown}");
        assert!(!shown.contains(r#"{"status""#), "{shown}");
        // A plan call that failed still says why.
        assert!(shown.contains("step 2 is still in progress"), "{shown}");
        // Verbose, the skillset shows.
        let mut activity = Vec::new();
        let mut r = Renderer::new(Vec::new(), &mut activity);
        r.verbose = true;
        r.event(&skillset);
        drop(r);
        assert!(
            String::from_utf8(activity)
                .unwrap()
                .contains("(skillset: files)")
        );
    }

    #[test]
    fn an_answer_shows_once_whether_it_streamed_or_comes_from_the_log() {
        let delta = |text: &str| {
            event(Kind::ModelTextDelta(pb::ModelTextDelta {
                text: text.into(),
            }))
        };
        let message = |text: &str| {
            event(Kind::ModelMessage(pb::ModelMessage {
                text: text.into(),
                ..Default::default()
            }))
        };
        // Streamed live, then the logged message: shown once.
        assert_eq!(
            answered(&[delta("Hel"), delta("lo"), message("Hello")]),
            "Hello\n"
        );
        // Read from a log, which keeps no streamed text: the message shows it.
        assert_eq!(answered(&[message("Hello")]), "Hello\n");
        // Its start streamed, then the reader fell behind: the rest comes
        // with the message.
        assert_eq!(answered(&[delta("Hel"), message("Hello")]), "Hello\n");
        // Followed from the middle: the whole answer on a line of its own.
        assert_eq!(answered(&[delta("lo"), message("Hello")]), "lo\nHello\n");
        // A call written as text, rewritten: both streamed, nothing more.
        assert_eq!(
            answered(&[delta("<call>"), delta("Hello"), message("Hello")]),
            "<call>Hello\n"
        );
        // The next answer starts afresh.
        assert_eq!(
            answered(&[delta("a"), message("a"), message("b")]),
            "a\nb\n"
        );
    }

    #[test]
    fn a_detected_loop_is_one_line() {
        let mut answer = Vec::new();
        let mut activity = Vec::new();
        let mut renderer = Renderer::new(&mut answer, &mut activity);
        for stopped in [false, true] {
            renderer.event(&pb::Event {
                kind: Some(Kind::LoopDetected(pb::LoopDetected {
                    tool: "bash".into(),
                    arguments_json: r#"{"command":"ls"}"#.into(),
                    repeats: if stopped { 4 } else { 3 },
                    stopped,
                    no_progress: false,
                })),
                ..Default::default()
            });
        }
        drop(renderer);
        let text = String::from_utf8(activity).unwrap();
        assert_eq!(
            text,
            "  (the model asked for the same bash call 3 times: told the model its result would \
             not change)\n  (the model asked for the same bash call 4 times: stopped the turn)\n"
        );
    }

    #[test]
    fn mcp_progress_shows_live_and_updates_show_in_place() {
        let requested = |id: &str, tool: &str| {
            event(Kind::ToolCallRequested(pb::ToolCallRequested {
                call_id: id.into(),
                tool: tool.into(),
                arguments_json: "{}".into(),
                ..Default::default()
            }))
        };
        let chunk = |id: &str, text: &str| {
            event(Kind::ToolOutputChunk(pb::ToolOutputChunk {
                call_id: id.into(),
                stream: pb::OutputStream::Stderr as i32,
                text: text.into(),
            }))
        };
        let text = rendered(&[
            requested("m1", "fx__slow"),
            chunk(
                "m1",
                "[progress 1/3] step 1/3\n[info] fixture: slow: step 1/3\n",
            ),
            requested("b1", "bash"),
            chunk("b1", "compiling...\n"),
            event(Kind::McpResourceUpdated(pb::McpResourceUpdated {
                server: "fx".into(),
                uri: "watch://file".into(),
                update_id: "u1".into(),
                content: "the build is green".into(),
            })),
        ]);
        assert!(
            text.contains("    │ [progress 1/3] step 1/3\n    │ [info] fixture: slow: step 1/3\n"),
            "{text}"
        );
        assert!(
            !text.contains("compiling"),
            "bash output shows with its result: {text}"
        );
        assert!(
            text.contains("↻ watch://file changed on fx: the build is green"),
            "{text}"
        );
        // A server cannot steer the terminal.
        let text = rendered(&[
            requested("m2", "fx__evil"),
            chunk(
                "m2",
                "\u{1b}[1A\u{1b}[2K  ✓ approved\u{1b}]52;c;ZXZpbA==\u{7}\n",
            ),
        ]);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
    }

    #[test]
    fn compactions_are_one_visible_line() {
        let compacted = pb::ContextCompacted {
            first_seq: 1,
            last_seq: 40,
            summary: "the gist".into(),
            messages: 12,
            tokens_before: 27_000,
            tokens_after: 9_000,
            note: String::new(),
        };
        let text = rendered(&[event(Kind::ContextCompacted(compacted.clone()))]);
        assert_eq!(
            text,
            "  (context compacted: 12 earlier messages, events 1–40, summarised; ~27000 → ~9000 tokens)\n"
        );
        let dropped = pb::ContextCompacted {
            summary: String::new(),
            note: "summarising failed (timeout)".into(),
            ..compacted.clone()
        };
        let text = rendered(&[event(Kind::ContextCompacted(dropped))]);
        assert!(
            text.contains("left out: summarising failed (timeout)"),
            "{text}"
        );
        let json = event_json(&event(Kind::ContextCompacted(compacted)));
        assert_eq!(json["type"], "context_compacted");
        assert_eq!(json["last_seq"], 40);
        assert_eq!(json["summary"], "the gist");
    }

    #[test]
    fn plans_show_their_steps_and_progress() {
        let step = |title: &str, status: pb::PlanStepStatus| pb::PlanStep {
            title: title.into(),
            status: status as i32,
            ..Default::default()
        };
        let events = [
            event(Kind::PlanSubmitted(pb::PlanSubmitted {
                steps: vec![
                    step("read", pb::PlanStepStatus::Completed),
                    step("write", pb::PlanStepStatus::Unspecified),
                ],
                revision: 2,
                reason: "disk full".into(),
            })),
            event(Kind::PlanStepUpdated(pb::PlanStepUpdated {
                index: 1,
                status: pb::PlanStepStatus::InProgress as i32,
                summary: String::new(),
                started: 3,
            })),
            event(Kind::PlanStepUpdated(pb::PlanStepUpdated {
                index: 1,
                status: pb::PlanStepStatus::Failed as i32,
                summary: "still full".into(),
                started: 3,
            })),
        ];
        assert_eq!(
            rendered(&events),
            "  revised plan (revision 2):\n   [✓] 1. read\n   [ ] 2. write\n  ▶ step 2: write\n  ✗ step 2 failed: still full\n"
        );
        let json = event_json(&events[0]);
        assert_eq!(json["type"], "plan_submitted");
        assert_eq!(json["steps"][0]["status"], "completed");
        assert_eq!(json["steps"][1]["status"], "pending");
        assert_eq!(event_json(&events[2])["status"], "failed");
    }

    #[test]
    fn a_priced_turn_shows_its_cost_and_the_session_total() {
        let finished = |cost: Option<f64>, currency: &str| {
            event(Kind::TurnFinished(pb::TurnFinished {
                outcome: pb::TurnOutcome::Completed as i32,
                message: "ok".into(),
                steps: 1,
                usage: Some(pb::TokenUsage {
                    prompt_tokens: 900,
                    completion_tokens: 100,
                    total_tokens: 1_000,
                    cached_prompt_tokens: 300,
                    cache_write_prompt_tokens: 0,
                }),
                cost,
                currency: currency.into(),
            }))
        };
        let text = rendered(&[finished(Some(0.0012), "USD")]);
        assert!(
            text.contains("1000 tokens (900 in, 100 out), $0.0012)"),
            "{text}"
        );
        let text = rendered(&[finished(Some(0.0012), "USD"), finished(Some(0.5), "USD")]);
        assert!(text.contains(", $0.50; session $0.50)"), "{text}");
        let text = rendered(&[finished(Some(2.0), "EUR")]);
        assert!(text.contains(", 2.00 EUR)"), "{text}");
        let text = rendered(&[finished(None, "")]);
        assert!(!text.contains('$'), "{text}");
        let json = event_json(&finished(Some(0.0012), "USD"));
        assert_eq!(json["cost"], 0.0012);
        assert_eq!(json["currency"], "USD");
        assert_eq!(json["usage"]["cached_prompt_tokens"], 300);
    }
}
