//! Showing a session's events to a person, line by line: the answer on
//! one stream as it streams, tool activity and notes on the other. What
//! the events mean is the shared view's ([`agentry_client::SessionView`]);
//! this is only how the plain CLI prints it.

use agentry_client::view::{Applied, SessionView};
use agentry_proto::sessions::v1::{self as pb, event::Kind};
use std::io::Write;

pub use agentry_client::event_json;
use agentry_client::text::shorten;
pub use agentry_client::text::{fixed_part, images_shown, is_plan_tool, short_args};
pub use agentry_client::view::TurnCounter;

/// Renders events for a person.
///
/// `answer` receives the model's text as it streams; `activity` receives tool
/// calls, results, errors, notes and turn summaries. For `agentry run` the
/// first is stdout and the second stderr, so stdout holds the answer alone.
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
    /// every request's fixed part takes, the skillset chosen).
    pub verbose: bool,
    /// What the events make: figures, the plan, notes.
    view: SessionView,
    /// Calls of MCP tools in flight, whose progress and log messages are
    /// shown as they come.
    mcp_calls: std::collections::HashSet<String>,
}

impl<A: Write, B: Write> Renderer<A, B> {
    /// A renderer writing to `answer` and `activity` (which sanitize what
    /// they are given: the text is the session's as it is).
    pub fn new(answer: A, activity: B) -> Self {
        Self {
            answer,
            activity,
            mid_line: false,
            streamed: String::new(),
            show_user: false,
            show_approvals: true,
            verbose: false,
            view: SessionView::new("", str::to_string),
            mcp_calls: std::collections::HashSet::new(),
        }
    }

    fn end_line(&mut self) {
        if self.mid_line {
            let _ = writeln!(self.answer);
            let _ = self.answer.flush();
            self.mid_line = false;
        }
    }

    /// A renderer of session `session_id`'s events: its sub-agents'
    /// questions, relayed, are folded (see [`Self::event`]), not printed.
    pub fn of_session(mut self, session_id: &str) -> Self {
        self.view = SessionView::new(session_id, str::to_string);
        self
    }

    /// Folds a past event into what the renderer knows (questions still
    /// waiting, the plan, costs) without printing it.
    pub fn fold(&mut self, event: &pb::Event) -> Applied {
        self.view.verbose = self.verbose;
        self.view.apply(event)
    }

    /// The questions waiting, as the events so far leave them.
    pub fn questions(&self) -> Vec<pb::ApprovalRequested> {
        self.view.questions.clone()
    }

    /// Marks the start of turn `number` (as `/rewind N` takes it).
    pub fn turn_header(&mut self, number: u32) {
        self.end_line();
        let _ = writeln!(self.activity, "── turn {number} ──");
    }

    /// Shows one event; what it changed for the person (a question asked
    /// or answered, the session's or a sub-agent's).
    pub fn event(&mut self, event: &pb::Event) -> Applied {
        let relayed = agentry_client::relay::is_relayed(&self.view.session_id, event)
            && !self.view.session_id.is_empty();
        let applied = self.fold(event);
        let Some(kind) = event.kind.as_ref().filter(|_| !relayed) else {
            return applied;
        };
        match kind {
            Kind::UserMessage(m) if self.show_user => {
                self.end_line();
                let who = agentry_client::text::named(&event.by).unwrap_or("you");
                let _ = writeln!(self.activity, "{who}> {}{}", m.text, images_shown(m));
            }
            Kind::ModelTextDelta(d) => {
                self.streamed.push_str(&d.text);
                let _ = write!(self.answer, "{}", d.text);
                let _ = self.answer.flush();
                self.mid_line = !d.text.ends_with('\n');
            }
            Kind::ModelMessage(m) => self.model_message(m),
            // The plan's own calls show as the plan (the view's notes), not
            // as calls.
            Kind::ToolCallRequested(c) if is_plan_tool(&c.tool) => {}
            Kind::ToolResult(r) if is_plan_tool(&r.tool) => {}
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
            Kind::ApprovalRequested(a) if self.show_approvals => {
                self.end_line();
                let _ = writeln!(
                    self.activity,
                    "  ? {} {} needs approval ({})",
                    a.tool,
                    short_args(&a.tool, &a.arguments_json),
                    a.matched_rule
                );
            }
            Kind::ApprovalDecided(a) => {
                let what = decided(a);
                self.end_line();
                match agentry_client::text::named(&event.by) {
                    Some(by) => {
                        let _ = writeln!(self.activity, "  ✓ {what} (by {by})");
                    }
                    None => {
                        let _ = writeln!(self.activity, "  ✓ {what}");
                    }
                }
            }
            // A call of an MCP tool streams its server's progress and log
            // messages; other tools' output shows with the result.
            Kind::ToolOutputChunk(c) if self.mcp_calls.contains(&c.call_id) => {
                self.end_line();
                for line in c.text.lines().filter(|l| !l.trim().is_empty()) {
                    let _ = writeln!(self.activity, "    │ {}", shorten(line, 160));
                }
            }
            Kind::ToolResult(r) => self.tool_result(r),
            // A failed call's text, or an ended turn's, is not the next
            // answer's start.
            Kind::Error(_) | Kind::TurnFinished(_) => self.streamed.clear(),
            _ => {}
        }
        // Everything else is the view's note. A cancel is said by whoever
        // asked for it.
        if let Some((text, _)) = &applied.note
            && !matches!(kind, Kind::CancelRequested(_))
        {
            self.end_line();
            let _ = writeln!(self.activity, "{text}");
        }
        if matches!(kind, Kind::CancelRequested(_)) {
            self.end_line();
        }
        if matches!(kind, Kind::TurnFinished(_)) {
            self.end_line();
            let _ = self.activity.flush();
        }
        applied
    }

    fn model_message(&mut self, m: &pb::ModelMessage) {
        let streamed = std::mem::take(&mut self.streamed);
        // What of the answer was not shown as it streamed: the rest when
        // its start was, nothing when it all was (a call written as text
        // and rewritten streams more than the answer), else (followed from
        // the middle, or fell behind) the whole answer on a line of its own.
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
        self.end_line();
        if self.verbose && m.fixed_tokens > 0 && m.context_window > 0 {
            let _ = writeln!(
                self.activity,
                "{}",
                fixed_part(m.fixed_tokens, m.context_window)
            );
        }
    }

    fn tool_result(&mut self, r: &pb::ToolResult) {
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
}

/// What a person decided about a call, in words.
fn decided(a: &pb::ApprovalDecided) -> String {
    let said = said(a);
    if a.approvals_missing > 0 {
        format!("{said}; waits for {} more", a.approvals_missing)
    } else {
        said
    }
}

fn said(a: &pb::ApprovalDecided) -> String {
    match pb::ApprovalDecision::try_from(a.decision) {
        Ok(pb::ApprovalDecision::Approve) => "approved".to_string(),
        Ok(pb::ApprovalDecision::ApproveForSession) => "approved for this session".to_string(),
        Ok(pb::ApprovalDecision::Deny) if a.reason.is_empty() => "denied".to_string(),
        Ok(pb::ApprovalDecision::Deny) => format!("denied: {}", a.reason),
        Ok(pb::ApprovalDecision::Edit) => {
            format!("edited to {}", shorten(&a.edited_arguments_json, 100))
        }
        Ok(pb::ApprovalDecision::Check) => {
            "not run again; the agent checks what it did".to_string()
        }
        Ok(pb::ApprovalDecision::Unspecified) | Err(_) => "decided".to_string(),
    }
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
    fn an_unreadable_call_ends_its_line_and_says_why_before_the_rewrite() {
        let delta = |text: &str| {
            event(Kind::ModelTextDelta(pb::ModelTextDelta {
                text: text.into(),
            }))
        };
        let events = [
            delta("TOOL:list_dir {"),
            event(Kind::ToolCallUnreadable(pb::ToolCallUnreadable {
                text: "TOOL:list_dir {".into(),
                error: "the arguments are not valid JSON".into(),
                usage: None,
                attempt: 1,
            })),
            delta("Listed."),
            event(Kind::ModelMessage(pb::ModelMessage {
                text: "Listed.".into(),
                ..Default::default()
            })),
        ];
        let (answer, activity) = both(&events);
        assert_eq!(answer, "TOOL:list_dir {\nListed.\n");
        assert_eq!(
            activity,
            "  (the model's tool call could not be read: the arguments are not valid JSON; it \
             is shown the format and asked again)\n"
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
                    step("write", pb::PlanStepStatus::Pending),
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
