//! One view of a session for every client: [`SessionView::apply`] folds the
//! session's events, one at a time, into a transcript (what the person
//! said, the answers as they stream, tool calls as blocks with their output
//! and outcome, notes for everything else), the session's figures (model,
//! context, tokens, cost), whether a turn runs and what it waits for, and
//! the questions waiting for a person (the session's own and its
//! sub-agents', relayed).
//!
//! The plain CLI, the full-screen chat and the JSON output show what this
//! fold makes, each in its own medium: a new event kind is shown by all of
//! them once [`note_for`] says what it means. Text is kept as the session
//! sent it, through the front end's own filter (the terminal's sanitizer for
//! the chats); the view does no I/O and keeps no clock.

use crate::relay::{Relayed, relayed};
use crate::text::{images_shown, is_plan_tool, money, short_args, shorten, size};
use agentry_proto::sessions::v1::{self as pb, event::Kind};

/// The start of a result the orchestrator gives a call a cancel stopped.
pub const CANCELLED: &str = "error: cancelled before it finished";

/// The tool that hands a task to a sub-agent (its result keeps the
/// sub-agent's steps above its answer).
pub const DELEGATE: &str = agentry_agent::reducer::DELEGATE_TOOL;

/// Most output kept per tool call for showing (the log has all of it).
pub const MAX_KEPT_OUTPUT: usize = 64 * 1024;

/// How a note is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoteKind {
    /// Information.
    Info,
    /// Something went wrong.
    Error,
    /// A reminder or another event that arrived on its own.
    Arrived,
}

/// Where a tool call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallState {
    /// Asked for, being checked.
    Requested,
    /// Waiting for a person.
    Waiting,
    /// Running.
    Running,
    /// Finished.
    Done,
}

/// One tool call, shown as a block.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolBlock {
    /// The call's id.
    pub call_id: String,
    /// The tool.
    pub tool: String,
    /// Its arguments, short.
    pub summary: String,
    /// Output so far (capped).
    pub output: String,
    /// Where it is.
    pub state: CallState,
    /// Its result failed (or was refused).
    pub is_error: bool,
    /// How long it ran.
    pub duration_ms: u64,
    /// The runner that served it.
    pub runner: String,
    /// What a person decided, if asked.
    pub decision: String,
    /// When it was asked for (the event's time, in ms since the epoch): a
    /// call cancelled before its runner answered takes its duration from it.
    pub requested_ms: Option<i64>,
}

/// One item of the transcript.
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    /// What a person sent.
    User {
        /// The message.
        text: String,
        /// Who sent it, when it was not this install's own person (see
        /// [`crate::text::named`]); empty otherwise.
        by: String,
    },
    /// The model's answer (markdown), streaming until its message is logged.
    Answer {
        /// The text.
        text: String,
        /// Still streaming.
        streaming: bool,
    },
    /// A tool call.
    Tool(ToolBlock),
    /// Anything else worth a line.
    Note(String, NoteKind),
    /// A turn starts: its number, as `/rewind N` takes it.
    Turn(u32),
}

/// One step of the current plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanItem {
    /// What the step does.
    pub title: String,
    /// Where it is.
    pub status: pb::PlanStepStatus,
}

/// What runs now.
#[derive(Debug, Clone, PartialEq)]
pub enum Activity {
    /// The model is thinking.
    Model,
    /// A tool runs.
    Tool(String),
    /// A call waits for the person.
    Waiting,
}

/// What one event changed, beyond the transcript itself, for a front end
/// that acts on it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// A question for the person (the session's, or a sub-agent's relayed
    /// under the id [`crate::relay::question_id`] gives it).
    pub asked: Option<pb::ApprovalRequested>,
    /// Questions answered or gone, by id.
    pub resolved: Vec<String>,
    /// Every question is gone (the turn ended).
    pub cleared: bool,
    /// The note this event made, if any (also in the transcript).
    pub note: Option<(String, NoteKind)>,
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
            kind if agentry_agent::rewind::starts_turn(kind) && !event.turn_id.is_empty() => {
                self.starts.push(event.seq);
                Some(self.starts.len() as u32)
            }
            _ => None,
        }
    }
}

/// The view of one session (see the module's documentation).
#[derive(Debug, Clone)]
pub struct SessionView {
    /// The session shown.
    pub session_id: String,
    /// Make notes of details a person rarely needs (the skillset chosen).
    pub verbose: bool,
    /// How text from the session is kept (the front end's sanitizer).
    filter: fn(&str) -> String,
    /// The model's name.
    pub model: String,
    /// Its context window, in tokens (0: unknown).
    pub context_window: u32,
    /// Tokens the last model call used (its prompt and answer).
    pub context_used: u64,
    /// Tokens of the session's model calls (sub-agents' included).
    pub session_tokens: u64,
    /// What the session's turns cost.
    pub session_cost: f64,
    /// In which currency ("" before any priced turn).
    pub currency: String,
    /// The transcript.
    pub entries: Vec<Entry>,
    /// Each entry's revision (bumped when it changes: a renderer's cache
    /// key).
    pub revisions: Vec<u64>,
    /// Each entry was made by events a rewind took out of the
    /// conversation: history.
    pub rewound: Vec<bool>,
    /// Each entry's place in the log: the seq of the event that made it
    /// (streamed text: of the message it becomes).
    places: Vec<u64>,
    /// The seq of the last stored event seen.
    pub last_seq: u64,
    /// The place of what the event being applied makes.
    place: u64,
    turns: TurnCounter,
    revision: u64,
    /// A turn runs.
    pub turn_open: bool,
    /// What runs.
    pub activity: Option<Activity>,
    /// The questions waiting, in the order asked.
    pub questions: Vec<pb::ApprovalRequested>,
    /// The questions of MCP servers waiting for a person (elicitation),
    /// in the order asked.
    pub inputs: Vec<pb::McpInputRequested>,
    /// Messages sent during the running turn that the model has not got
    /// yet (shown as pending).
    pub steering: Vec<String>,
    /// The answer being streamed (notes may arrive after it meanwhile).
    streaming_at: Option<usize>,
    /// Token counts of the model calls of the current turn.
    step_tokens: Vec<u64>,
    /// The current plan's steps (plan mode), as they stand.
    pub plan: Vec<PlanItem>,
    /// What the priced turns seen so far cost, in one currency.
    priced: Option<(f64, String)>,
}

impl SessionView {
    /// The view of `session_id`, keeping the session's text through
    /// `filter`.
    pub fn new(session_id: &str, filter: fn(&str) -> String) -> SessionView {
        SessionView {
            session_id: session_id.to_string(),
            verbose: false,
            filter,
            model: String::new(),
            context_window: 0,
            context_used: 0,
            session_tokens: 0,
            session_cost: 0.0,
            currency: String::new(),
            entries: Vec::new(),
            revisions: Vec::new(),
            rewound: Vec::new(),
            places: Vec::new(),
            last_seq: 0,
            place: 0,
            turns: TurnCounter::default(),
            revision: 0,
            turn_open: false,
            activity: None,
            questions: Vec::new(),
            inputs: Vec::new(),
            steering: Vec::new(),
            streaming_at: None,
            step_tokens: Vec::new(),
            plan: Vec::new(),
            priced: None,
        }
    }

    fn push(&mut self, entry: Entry) {
        self.revision += 1;
        self.entries.push(entry);
        self.revisions.push(self.revision);
        self.rewound.push(false);
        self.places.push(self.place);
    }

    /// The seq of the stored event that made entry `index` (0: none).
    pub fn place(&self, index: usize) -> u64 {
        self.places.get(index).copied().unwrap_or_default()
    }

    /// The latest revision: it grows with every change of the transcript.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Marks entry `index` changed.
    pub fn touch(&mut self, index: usize) {
        self.revision += 1;
        if let Some(r) = self.revisions.get_mut(index) {
            *r = self.revision;
        }
    }

    /// The logged answer replaces what streamed of it (or is added, when
    /// nothing streamed).
    fn settle_answer(&mut self, text: String) {
        match self.streaming_at.take() {
            Some(at) => {
                if let Some(Entry::Answer { text: t, streaming }) = self.entries.get_mut(at) {
                    *t = text;
                    *streaming = false;
                }
                self.touch(at);
            }
            None if !text.trim().is_empty() => self.push(Entry::Answer {
                text,
                streaming: false,
            }),
            None => {}
        }
    }

    /// Adds a note the front end made (not from the log), after what is
    /// shown so far; blank notes are dropped.
    pub fn note(&mut self, text: &str, kind: NoteKind) {
        let text = (self.filter)(text);
        let text = text.trim_matches('\n');
        if !text.trim().is_empty() {
            self.push(Entry::Note(text.to_string(), kind));
        }
    }

    /// The entries made by events after `to_seq` and before `rewind_seq`
    /// (a rewind's marker) are history now.
    fn mark_rewound(&mut self, to_seq: u64, rewind_seq: u64) {
        for i in 0..self.entries.len() {
            let place = self.places[i];
            if place > to_seq && place < rewind_seq && !self.rewound[i] {
                self.rewound[i] = true;
                self.touch(i);
            }
        }
    }

    /// The last block of call `call_id`.
    pub fn block_mut(&mut self, call_id: &str) -> Option<(usize, &mut ToolBlock)> {
        self.entries
            .iter_mut()
            .enumerate()
            .rev()
            .find_map(|(i, e)| match e {
                Entry::Tool(b) if b.call_id == call_id => Some((i, b)),
                _ => None,
            })
    }

    fn resolve(&mut self, id: &str, applied: &mut Applied) {
        self.inputs.retain(|q| q.call_id != id);
        let before = self.questions.len();
        self.questions.retain(|q| q.call_id != id);
        if self.questions.len() != before {
            applied.resolved.push(id.to_string());
        }
    }

    /// The session's figures and the transcript after `event`; what it
    /// changed for the person.
    pub fn apply(&mut self, event: &pb::Event) -> Applied {
        let mut applied = Applied::default();
        let Some(kind) = &event.kind else {
            return applied;
        };
        // A sub-agent's question, relayed: asked here, answered there.
        // (A view with no session id takes every event as its own.)
        if let Some(relay) =
            relayed(&self.session_id, event).filter(|_| !self.session_id.is_empty())
        {
            match relay {
                Relayed::Asked(request) => {
                    if !self.questions.iter().any(|q| q.call_id == request.call_id) {
                        self.questions.push(request.clone());
                        applied.asked = Some(request);
                    }
                }
                Relayed::Answered(id) => self.resolve(&id, &mut applied),
                Relayed::Nothing => {}
            }
            return applied;
        }
        // Where what this event makes goes in the log.
        if event.live {
            self.place = self.last_seq + 1;
        } else {
            self.place = event.seq;
            self.last_seq = self.last_seq.max(event.seq);
        }
        if let Some(number) = self.turns.follow(event) {
            self.push(Entry::Turn(number));
        }
        if let Kind::SessionRewound(r) = kind {
            self.mark_rewound(r.to_seq, event.seq);
        }
        let filter = self.filter;
        match kind {
            Kind::UserMessage(m) => {
                let text = format!("{}{}", m.text, images_shown(m));
                self.push(Entry::User {
                    text: filter(&text),
                    by: crate::text::named(&event.by)
                        .map(filter)
                        .unwrap_or_default(),
                });
                self.turn_open = true;
                self.activity = Some(Activity::Model);
            }
            Kind::ModelTextDelta(d) => {
                let text = filter(&d.text);
                match self.streaming_at {
                    Some(at) => {
                        if let Some(Entry::Answer { text: t, .. }) = self.entries.get_mut(at) {
                            t.push_str(&text);
                        }
                        self.touch(at);
                    }
                    None => {
                        self.streaming_at = Some(self.entries.len());
                        self.push(Entry::Answer {
                            text,
                            streaming: true,
                        });
                    }
                }
            }
            Kind::ModelMessage(m) => {
                if let Some(u) = &m.usage {
                    self.context_used = u.prompt_tokens + u.completion_tokens;
                    self.session_tokens += u.total_tokens;
                }
                self.step_tokens
                    .push(m.usage.as_ref().map_or(0, |u| u.total_tokens));
                if m.context_window > 0 {
                    self.context_window = m.context_window;
                }
                if !m.model.is_empty() {
                    self.model = filter(&m.model);
                }
                self.settle_answer(filter(&m.text));
            }
            Kind::ToolCallUnreadable(u) => {
                if let Some(usage) = &u.usage {
                    self.session_tokens += usage.total_tokens;
                }
                // Shown as written; the note says why it did nothing.
                self.settle_answer(filter(&u.text));
            }
            // The plan's own calls show as the plan, not as blocks of JSON.
            Kind::ToolCallRequested(c) if is_plan_tool(&c.tool) => {}
            Kind::ToolCallRequested(c) => {
                self.push(Entry::Tool(ToolBlock {
                    call_id: c.call_id.clone(),
                    tool: filter(&c.tool),
                    summary: filter(&short_args(&c.tool, &c.arguments_json)),
                    output: String::new(),
                    state: CallState::Requested,
                    is_error: false,
                    duration_ms: 0,
                    runner: String::new(),
                    decision: String::new(),
                    requested_ms: event_ms(event),
                }));
            }
            Kind::ToolCallState(s) => {
                let phase = pb::ToolCallPhase::try_from(s.phase).unwrap_or_default();
                if phase != pb::ToolCallPhase::AwaitingApproval {
                    self.resolve(&s.call_id, &mut applied);
                }
                let state = match phase {
                    pb::ToolCallPhase::AwaitingApproval => Some(CallState::Waiting),
                    pb::ToolCallPhase::Executing => Some(CallState::Running),
                    _ => None,
                };
                if let Some(state) = state
                    && let Some((i, block)) = self.block_mut(&s.call_id)
                {
                    block.state = state;
                    let tool = block.tool.clone();
                    self.touch(i);
                    self.activity = Some(match state {
                        CallState::Running => Activity::Tool(tool),
                        _ => Activity::Waiting,
                    });
                }
            }
            Kind::McpInputRequested(asked) => {
                self.inputs.retain(|q| q.call_id != asked.call_id);
                self.inputs.push(asked.clone());
                self.activity = Some(Activity::Waiting);
            }
            Kind::McpInputProvided(given) => {
                self.inputs.retain(|q| q.call_id != given.call_id);
                if self.turn_open {
                    let tool = self
                        .block_mut(&given.call_id)
                        .map(|(_, b)| b.tool.clone())
                        .unwrap_or_default();
                    self.activity = Some(Activity::Tool(tool));
                }
            }
            Kind::ApprovalRequested(a) => {
                match self.questions.iter_mut().find(|q| q.call_id == a.call_id) {
                    // Asked again (edited arguments waiting for more people).
                    Some(q) => *q = a.clone(),
                    None => {
                        self.questions.push(a.clone());
                        applied.asked = Some(a.clone());
                    }
                }
                self.activity = Some(Activity::Waiting);
            }
            Kind::ApprovalDecided(d) => {
                let who = crate::text::named(&event.by)
                    .map(|by| format!(" by {}", filter(by)))
                    .unwrap_or_default();
                let decision = match pb::ApprovalDecision::try_from(d.decision).unwrap_or_default()
                {
                    pb::ApprovalDecision::Approve => format!("approved{who}"),
                    pb::ApprovalDecision::ApproveForSession => {
                        format!("approved for this session{who}")
                    }
                    pb::ApprovalDecision::Edit => format!("edited and approved{who}"),
                    pb::ApprovalDecision::Check => format!("to be checked{who}"),
                    pb::ApprovalDecision::Deny if d.reason.is_empty() => format!("denied{who}"),
                    pb::ApprovalDecision::Deny => format!("denied{who}: {}", filter(&d.reason)),
                    pb::ApprovalDecision::Unspecified => String::new(),
                };
                if d.approvals_missing > 0 {
                    // One of the people it needs: it still waits.
                    let decision = format!("{decision}; waits for {} more", d.approvals_missing);
                    if let Some((i, block)) = self.block_mut(&d.call_id) {
                        block.decision = decision;
                        self.touch(i);
                    }
                    return applied;
                }
                if let Some((i, block)) = self.block_mut(&d.call_id) {
                    block.decision = decision;
                    self.touch(i);
                }
                self.resolve(&d.call_id, &mut applied);
                if self.turn_open {
                    self.activity = Some(Activity::Model);
                }
            }
            Kind::ToolOutputChunk(c) => {
                if let Some((i, block)) = self.block_mut(&c.call_id) {
                    if block.output.len() < MAX_KEPT_OUTPUT {
                        block.output.push_str(&filter(&c.text));
                    }
                    self.touch(i);
                }
            }
            Kind::ToolResult(r) => {
                if let Some(u) = &r.sub_agent_usage {
                    self.session_tokens += u.total_tokens;
                }
                if !self.tool_result(event, r) && is_plan_tool(&r.tool) && r.is_error {
                    // A plan call has no block: what went wrong is a note.
                    self.note(&format!("  ✗ {}", shorten(&r.output, 120)), NoteKind::Error);
                    applied.note = self.last_note();
                }
                self.resolve(&r.call_id, &mut applied);
                if self.turn_open {
                    self.activity = Some(Activity::Model);
                }
            }
            Kind::SteeringQueued(q) => {
                self.push(Entry::User {
                    text: filter(&q.text),
                    by: crate::text::named(&event.by)
                        .map(filter)
                        .unwrap_or_default(),
                });
                self.steering.push(filter(&q.text));
            }
            Kind::SteeringDelivered(d) => {
                let count = (d.count as usize).min(self.steering.len());
                self.steering.drain(..count);
            }
            Kind::TurnFinished(t) => {
                self.turn_open = false;
                self.activity = None;
                self.questions.clear();
                self.inputs.clear();
                self.steering.clear();
                applied.cleared = true;
                if let Some(cost) = t.cost {
                    self.session_cost += cost;
                    self.currency = t.currency.clone();
                }
                if let Some(at) = self.streaming_at.take()
                    && let Some(Entry::Answer { streaming, .. }) = self.entries.get_mut(at)
                {
                    *streaming = false;
                    self.touch(at);
                }
            }
            Kind::ReminderDue(r) if r.reminder_kind() == pb::ReminderKind::Task => {
                self.turn_open = true;
                self.activity = Some(Activity::Model);
            }
            Kind::McpResourceUpdated(_) => {
                self.turn_open = true;
                self.activity = Some(Activity::Model);
            }
            Kind::ContextCompacted(c) if c.tokens_after > 0 => {
                self.context_used = c.tokens_after;
            }
            Kind::ModelChanged(m) if !m.model.is_empty() => {
                self.model = filter(&m.model);
            }
            _ => {}
        }
        if let Some((text, kind)) = note_for(self, kind) {
            self.note(&text, kind);
            applied.note = self.last_note();
        }
        applied
    }

    /// A tool call's result on its block; false when the call has none.
    fn tool_result(&mut self, event: &pb::Event, r: &pb::ToolResult) -> bool {
        let filter = self.filter;
        let Some((i, block)) = self.block_mut(&r.call_id) else {
            return false;
        };
        block.state = CallState::Done;
        block.is_error = r.is_error;
        block.duration_ms = r.duration_ms;
        // A call cancelled here has no runner's figure: the time from its
        // request to its end.
        if r.duration_ms == 0
            && let (Some(from), Some(to)) = (block.requested_ms, event_ms(event))
        {
            block.duration_ms = u64::try_from(to - from).unwrap_or(0);
        }
        block.runner = filter(&r.runner_id);
        if r.timed_out {
            block.runner.push_str(" · timed out");
        } else if r.truncated {
            block.runner.push_str(" · output cut");
        }
        // A sub-agent's tokens count here too, and its block says how many.
        if let Some(u) = &r.sub_agent_usage {
            block.runner = format!("sub-agent {} tok", tokens(u.total_tokens));
        }
        // The result is what the model sees: it replaces the live output,
        // but for a cancelled call, whose output so far stays above the
        // note, and for a sub-agent's task, whose steps stay above its
        // answer.
        let keeps_steps = r.output.starts_with(CANCELLED) || r.tool == DELEGATE;
        let mut output = if keeps_steps && !block.output.trim().is_empty() {
            format!("{}\n{}", block.output.trim_end(), filter(&r.output))
        } else {
            filter(&r.output)
        };
        if output.len() > MAX_KEPT_OUTPUT {
            let mut cut = MAX_KEPT_OUTPUT;
            while cut > 0 && !output.is_char_boundary(cut) {
                cut -= 1;
            }
            output.truncate(cut);
            output.push_str("\n[… shortened here; the log has it all]");
        }
        block.output = output;
        self.touch(i);
        true
    }

    fn last_note(&self) -> Option<(String, NoteKind)> {
        match self.entries.last() {
            Some(Entry::Note(text, kind)) => Some((text.clone(), *kind)),
            _ => None,
        }
    }

    /// ", $0.0012" for a turn, with the session's total so far once there
    /// was more than one priced turn in the same currency.
    fn cost_note(&mut self, cost: f64, currency: &str) -> String {
        let total = match self.priced.take() {
            Some((total, seen)) if seen == currency => Some(total + cost),
            _ => None,
        };
        self.priced = Some((total.unwrap_or(cost), currency.to_string()));
        match total {
            Some(total) => format!(
                ", {}; session {}",
                money(cost, currency),
                money(total, currency)
            ),
            None => format!(", {}", money(cost, currency)),
        }
    }
}

/// An event's time in milliseconds since the epoch.
fn event_ms(event: &pb::Event) -> Option<i64> {
    event
        .time
        .as_ref()
        .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
}

/// A token count, short: `950`, `12.3k`.
pub fn tokens(n: u64) -> String {
    if n >= 1000 {
        format!("{:.1}k", n as f64 / 1000.0)
    } else {
        n.to_string()
    }
}

/// What an event means to a person, as a note in the transcript: the one
/// place each kind of event that is not a message, an answer or a tool
/// call is put into words (the plain CLI prints it, the full-screen chat
/// shows it). `None`: the event makes no note.
pub fn note_for(view: &mut SessionView, kind: &Kind) -> Option<(String, NoteKind)> {
    use NoteKind::{Arrived, Error, Info};
    let note = match kind {
        Kind::UserMessage(_)
        | Kind::ModelTextDelta(_)
        | Kind::ModelMessage(_)
        | Kind::ToolCallRequested(_)
        | Kind::ToolCallState(_)
        | Kind::ApprovalRequested(_)
        | Kind::ApprovalDecided(_)
        | Kind::ToolOutputChunk(_)
        | Kind::ToolResult(_)
        // The turn's end says it, with what to do.
        | Kind::BudgetExceeded(_)
        | Kind::ToolsOffered(_) => return None,
        Kind::WorkspaceSnapshot(w) if !w.error.is_empty() => (
            format!(
                "  (the workspace could not be recorded: {}; a rewind to here cannot put the files back)",
                w.error
            ),
            Info,
        ),
        Kind::WorkspaceSnapshot(_) => return None,
        Kind::SkillsetChosen(s) if view.verbose && !s.skillset.is_empty() => {
            (format!("  (skillset: {})", s.skillset), Info)
        }
        Kind::SkillsetChosen(_) => return None,
        Kind::ReminderDue(r) => (format!("⏰ reminder: {}", r.message), Arrived),
        Kind::McpResourceUpdated(u) => (
            format!(
                "↻ {} changed on {}: {}",
                u.uri,
                u.server,
                shorten(&u.content, 120)
            ),
            Arrived,
        ),
        Kind::McpInputRequested(asked) => {
            let mut text = format!(
                "? the MCP server {} asks a person (call {}):",
                (view.filter)(&asked.server),
                asked.call_id
            );
            for q in &asked.questions {
                text.push_str(&format!("\n   {}: {}", q.key, (view.filter)(&q.message)));
                if q.mode == "url" {
                    text.push_str(&format!(" (visit {})", (view.filter)(&q.url)));
                }
            }
            text.push_str(&format!(
                "\n   answer with: agentry approvals reply {} {} --set FIELD=VALUE … (or --decline)",
                view.session_id, asked.call_id
            ));
            (text, Arrived)
        }
        Kind::McpInputProvided(given) => (
            format!("  (the MCP server's questions: {})", (view.filter)(&given.action)),
            Info,
        ),
        Kind::Error(e) => (format!("error: {}", e.message), Error),
        Kind::CancelRequested(_) => ("(cancelling…)".to_string(), Info),
        Kind::SteeringQueued(_) => (
            "  (pending: the model gets this at its next step in this turn)".to_string(),
            Info,
        ),
        Kind::SteeringDelivered(d) => (
            if d.count == 1 {
                "  (the model got your message)".to_string()
            } else {
                format!("  (the model got your {} messages)", d.count)
            },
            Info,
        ),
        Kind::TurnParked(p) => {
            let until = p
                .until
                .as_ref()
                .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, 0))
                .map(|t| {
                    t.with_timezone(&chrono::Local)
                        .format("%H:%M:%S")
                        .to_string()
                })
                .unwrap_or_else(|| "later".into());
            (
                format!(
                    "⏸ the model server asks to wait ({}); the turn goes on by itself at {until}, \
                     also after a restart (cancel it to stop)",
                    shorten(&(view.filter)(&p.message), 160)
                ),
                Info,
            )
        }
        Kind::TurnResumed(_) => ("▶ the wait is over; the model is asked again".to_string(), Info),
        Kind::TurnFinished(t) => (turn_finished(view, t), Info),
        Kind::ContextCompacted(c) => {
            let how = if c.summary.is_empty() {
                format!("left out: {}", c.note)
            } else {
                "summarised".to_string()
            };
            (
                format!(
                    "  (context compacted: {} earlier messages, events {}–{}, {how}; ~{} → ~{} tokens)",
                    c.messages, c.first_seq, c.last_seq, c.tokens_before, c.tokens_after
                ),
                Info,
            )
        }
        Kind::PlanSubmitted(p) => {
            let heading = if p.revision <= 1 {
                "plan:".to_string()
            } else {
                format!("revised plan (revision {}):", p.revision)
            };
            view.plan = p
                .steps
                .iter()
                .map(|s| PlanItem {
                    title: (view.filter)(&s.title),
                    status: pb::PlanStepStatus::try_from(s.status).unwrap_or_default(),
                })
                .collect();
            let mut text = format!("  {heading}");
            for (i, step) in p.steps.iter().enumerate() {
                let mark = match pb::PlanStepStatus::try_from(step.status) {
                    Ok(pb::PlanStepStatus::Completed) => "✓",
                    Ok(pb::PlanStepStatus::Failed) => "✗",
                    _ => " ",
                };
                text.push_str(&format!("\n   [{mark}] {}. {}", i + 1, step.title));
            }
            (text, Info)
        }
        Kind::PlanStepUpdated(u) => {
            let n = u.index + 1;
            if let Some(item) = view.plan.get_mut(u.index as usize) {
                item.status = pb::PlanStepStatus::try_from(u.status).unwrap_or_default();
            }
            let line = match pb::PlanStepStatus::try_from(u.status) {
                Ok(pb::PlanStepStatus::InProgress) => format!(
                    "  ▶ step {n}: {}",
                    view.plan
                        .get(u.index as usize)
                        .map_or("", |item| item.title.as_str())
                ),
                Ok(pb::PlanStepStatus::Completed) => {
                    format!("  ✓ step {n} done: {}", shorten(&u.summary, 200))
                }
                Ok(pb::PlanStepStatus::Failed) => {
                    format!("  ✗ step {n} failed: {}", shorten(&u.summary, 200))
                }
                _ => return None,
            };
            (line, Info)
        }
        Kind::LoopDetected(l) if l.no_progress => {
            let what = if l.stopped {
                "stopped the turn"
            } else {
                "told the model"
            };
            (
                format!(
                    "  (the last {} steps made no progress: {what})",
                    l.repeats
                ),
                Info,
            )
        }
        Kind::LoopDetected(l) => {
            let what = if l.stopped {
                "stopped the turn"
            } else {
                "told the model its result would not change"
            };
            (
                format!(
                    "  (the model asked for the same {} call {} times: {what})",
                    l.tool, l.repeats
                ),
                Info,
            )
        }
        Kind::SessionRewound(r) => {
            let files = if r.snapshot_id.is_empty() {
                "files left as they were".to_string()
            } else {
                format!(
                    "files put back: {} written, {} removed",
                    r.files_written, r.files_deleted
                )
            };
            (
                format!(
                    "── rewound to the end of turn {} (seq {}); {files} ──",
                    r.to_turn, r.to_seq
                ),
                Info,
            )
        }
        Kind::SessionForked(f) => (
            format!(
                "── forked from session {} at seq {} ──",
                f.from_session_id.chars().take(8).collect::<String>(),
                f.at_seq
            ),
            Info,
        ),
        Kind::ToolCallUnreadable(u) if u.attempt < 2 => (
            format!(
                "  (the model's tool call could not be read: {}; it is shown the format and asked again)",
                shorten(&u.error, 200)
            ),
            Info,
        ),
        Kind::ToolCallUnreadable(u) => (
            format!(
                "  (the model's tool call still could not be read: {})",
                shorten(&u.error, 200)
            ),
            Info,
        ),
        Kind::ModelChanged(m) => {
            let model = if m.model.is_empty() {
                "the configured model"
            } else {
                m.model.as_str()
            };
            (format!("  (model: {model} from here on)"), Info)
        }
        Kind::InstructionsLoaded(l) => {
            let lines: Vec<String> = l
                .files
                .iter()
                .map(|file| {
                    format!(
                        "  (instructions from {}, {}{})",
                        file.path,
                        size(file.size),
                        if file.truncated {
                            format!("; only the first {} given", size(file.text.len() as u64))
                        } else {
                            String::new()
                        }
                    )
                })
                .collect();
            if lines.is_empty() {
                return None;
            }
            (lines.join("\n"), Info)
        }
        Kind::HookRan(h) => {
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
                format!("  (hook {} says {}{reason})", shorten(&h.command, 80), h.decision)
            } else if !h.context.is_empty() {
                format!(
                    "  (hook {} added context: {})",
                    shorten(&h.command, 80),
                    shorten(&h.context, 120)
                )
            } else {
                return None;
            };
            (line, Info)
        }
    };
    Some(note)
}

/// A turn's end: how it ended (unless it completed), then its steps,
/// tokens per model call and cost.
fn turn_finished(view: &mut SessionView, t: &pb::TurnFinished) -> String {
    let steps = std::mem::take(&mut view.step_tokens);
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
        .map(|cost| view.cost_note(cost, &t.currency))
        .unwrap_or_default();
    let outcome = match pb::TurnOutcome::try_from(t.outcome) {
        Ok(pb::TurnOutcome::Cancelled) => "(turn cancelled)\n".to_string(),
        Ok(pb::TurnOutcome::StepLimit) => format!("(step limit reached: {})\n", t.message),
        Ok(pb::TurnOutcome::Budget) => format!("({})\n", t.message),
        Ok(pb::TurnOutcome::Failed) => format!("(turn failed: {})\n", t.message),
        Ok(pb::TurnOutcome::Completed | pb::TurnOutcome::Unspecified) | Err(_) => String::new(),
    };
    format!(
        "{outcome}  ({} step{}{usage}{cost})",
        t.steps,
        if t.steps == 1 { "" } else { "s" }
    )
}
