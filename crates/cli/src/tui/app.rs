//! The full-screen chat's state: what the session's events and the
//! person's keys make of it. No I/O here: keys and events go in, and
//! [`Action`]s come out for the loop in `mod.rs` to carry out, so every
//! behaviour can be driven in tests.
//!
//! Invariants: text from the session (answers, tool output, arguments)
//! is cleaned of control characters before it is kept, so nothing the
//! model or a tool prints can move the cursor or change the terminal; an
//! approval question never takes keys while the person is typing.

use crate::render::Renderer;
use crate::turn::Limits;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{self as spb, ApprovalDecision, event::Kind};
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use std::time::Instant;

use super::theme::Theme;

/// The slash commands, with what each does (for /help and completion).
pub const COMMANDS: &[(&str, &str)] = &[
    ("/help", "this list"),
    (
        "/plan",
        "plan mode for every message on or off; `/plan MESSAGE` for one",
    ),
    (
        "/network",
        "outbound network for the agent's commands on or off",
    ),
    ("/session", "this session's id"),
    ("/sessions", "pick another session"),
    (
        "/model",
        "the model and its context window; `/model NAME` switches it",
    ),
    ("/compact", "summarise the conversation now to free context"),
    (
        "/rewind",
        "`/rewind N`: back to the end of turn N, files included",
    ),
    (
        "/budget",
        "`/budget tokens|session-tokens|cost|session-cost VALUE`",
    ),
    ("/new", "start a fresh session (in the same directory)"),
    ("/exit", "leave (also Ctrl+D)"),
];

/// The start of a result the orchestrator gives a call a cancel stopped.
const CANCELLED: &str = "error: cancelled before it finished";

/// An event's time in milliseconds since the epoch.
fn event_ms(event: &spb::Event) -> Option<i64> {
    event
        .time
        .as_ref()
        .map(|t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
}

/// See [`App::answer_guard`].
pub const ANSWER_GUARD: std::time::Duration = std::time::Duration::from_millis(600);
/// Most output kept per tool call for showing (the log has all of it).
const MAX_KEPT_OUTPUT: usize = 64 * 1024;
/// Lines of a running call's output shown live.
pub const LIVE_LINES: usize = 6;

/// Something the loop must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send a message.
    Submit {
        /// The text.
        text: String,
        /// Run it in plan mode.
        plan: bool,
        /// Outbound network for its bash calls.
        network: bool,
        /// Limits raised with it.
        limits: Limits,
        /// Summarise the conversation instead of answering it.
        compact: bool,
    },
    /// Send a decision.
    Decide(pb::ApprovalInput),
    /// Open the call's arguments in the editor, then send them as an edit.
    EditArguments(spb::ApprovalRequested),
    /// Cancel the running turn.
    Cancel,
    /// Fetch what a call waiting for approval would change.
    Preview(String),
    /// Fetch the sessions for the picker.
    ListSessions,
    /// Open another session.
    OpenSession(String),
    /// Start a fresh session.
    NewSession,
    /// Switch the session's model.
    SetModel(String),
    /// Go back to the end of a turn.
    Rewind(u32),
    /// Leave.
    Quit,
}

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
    /// What the person sent.
    User(String),
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

/// What a call waiting for approval would change.
#[derive(Debug, Clone, PartialEq)]
pub enum Preview {
    /// Nothing to fetch (not a file change).
    None,
    /// Being fetched.
    Loading,
    /// The change as a unified diff.
    Diff {
        /// The diff.
        diff: String,
        /// The file is created.
        creates: bool,
    },
    /// It could not be worked out (the reason).
    Failed(String),
}

/// A question for the person.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// The request.
    pub request: spb::ApprovalRequested,
    /// The change it would make, for writes and edits.
    pub preview: Preview,
    /// When it was asked (as seen here).
    pub shown_at: Instant,
    /// The person edited the arguments (now in `request`): shown again,
    /// and run as shown only once they say yes.
    pub edited: bool,
}

/// A session in the picker.
#[derive(Debug, Clone, PartialEq)]
pub struct PickerRow {
    /// Its id.
    pub id: String,
    /// Its title (or first message).
    pub title: String,
    /// How long ago it changed, readable.
    pub age: String,
    /// Its events.
    pub events: u64,
    /// Its name, if it has one.
    pub name: String,
    /// Where it works (its project directory, short), or "scratch".
    pub place: String,
}

/// The session picker.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Picker {
    /// The sessions, most recent first (`None` while loading).
    pub rows: Option<Vec<PickerRow>>,
    /// The selected row, among those the filter lets through.
    pub selected: usize,
    /// What was typed: rows whose id, name, title or place hold it (in
    /// any case) are shown.
    pub filter: String,
}

impl Picker {
    /// The rows the filter lets through.
    pub fn visible(&self) -> Vec<&PickerRow> {
        let wanted = self.filter.to_lowercase();
        self.rows
            .iter()
            .flatten()
            .filter(|row| {
                wanted.is_empty()
                    || [&row.id, &row.name, &row.title, &row.place]
                        .iter()
                        .any(|field| field.to_lowercase().contains(&wanted))
            })
            .collect()
    }
}

/// How much of each id tells it apart from the others: the shortest
/// prefix (8 characters at least) no other id shares.
pub fn distinct_prefixes<'a>(ids: &[&'a str]) -> Vec<&'a str> {
    ids.iter()
        .map(|id| {
            let shared = ids
                .iter()
                .filter(|other| *other != id)
                .map(|other| {
                    id.chars()
                        .zip(other.chars())
                        .take_while(|(a, b)| a == b)
                        .count()
                })
                .max()
                .unwrap_or(0);
            let keep = (shared + 1).max(8).min(id.chars().count());
            let end = id.char_indices().nth(keep).map_or(id.len(), |(i, _)| i);
            &id[..end]
        })
        .collect()
}

/// What runs now, for the status line.
#[derive(Debug, Clone, PartialEq)]
pub enum Busy {
    /// The model is thinking.
    Model,
    /// A tool runs.
    Tool(String),
    /// A call waits for the person.
    Waiting,
}

/// The line editor.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Editor {
    /// The text (may hold newlines).
    pub text: String,
    /// The cursor, a byte offset at a character boundary.
    pub cursor: usize,
}

impl Editor {
    fn insert(&mut self, s: &str) {
        self.text.insert_str(self.cursor, s);
        self.cursor += s.len();
    }
    fn backspace(&mut self) {
        if let Some(c) = self.text[..self.cursor].chars().next_back() {
            self.cursor -= c.len_utf8();
            self.text.remove(self.cursor);
        }
    }
    fn delete(&mut self) {
        if self.cursor < self.text.len() {
            self.text.remove(self.cursor);
        }
    }
    fn left(&mut self) {
        if let Some(c) = self.text[..self.cursor].chars().next_back() {
            self.cursor -= c.len_utf8();
        }
    }
    fn right(&mut self) {
        if let Some(c) = self.text[self.cursor..].chars().next() {
            self.cursor += c.len_utf8();
        }
    }
    fn home(&mut self) {
        self.cursor = self.text[..self.cursor].rfind('\n').map_or(0, |i| i + 1);
    }
    fn end(&mut self) {
        self.cursor = self.text[self.cursor..]
            .find('\n')
            .map_or(self.text.len(), |i| self.cursor + i);
    }
    fn delete_word(&mut self) {
        let before = &self.text[..self.cursor];
        let trimmed = before.trim_end();
        let start = trimmed
            .char_indices()
            .rev()
            .find(|(_, c)| c.is_whitespace())
            .map_or(0, |(i, c)| i + c.len_utf8());
        self.text.replace_range(start..self.cursor, "");
        self.cursor = start;
    }
    fn set(&mut self, text: String) {
        self.cursor = text.len();
        self.text = text;
    }
    fn take(&mut self) -> String {
        self.cursor = 0;
        std::mem::take(&mut self.text)
    }
    /// Whether nothing is typed.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

/// The chat's state.
pub struct App {
    /// The styles.
    pub theme: Theme,
    /// The session shown.
    pub session_id: String,
    /// Where `@path` completes from (the session's directory, when it is
    /// on this machine).
    files_root: Option<std::path::PathBuf>,
    /// The last message could not be sent because the orchestrator did
    /// not answer (the status line says so until something arrives).
    pub disconnected: bool,
    /// That message, sent again by itself while it stays in the input.
    pub resend: Option<String>,
    /// The model's name.
    pub model: String,
    /// Its context window, in tokens (0: unknown).
    pub context_window: u32,
    /// Tokens the last model call used (its prompt and answer).
    pub context_used: u64,
    /// Tokens of the session's model calls.
    pub session_tokens: u64,
    /// What the session's turns cost.
    pub session_cost: f64,
    /// In which currency ("" before any priced turn).
    pub currency: String,
    /// The transcript.
    pub entries: Vec<Entry>,
    /// Each entry's revision (bumped when it changes: the view's cache key).
    pub revisions: Vec<u64>,
    /// Each entry was made by events a rewind took out of the
    /// conversation: shown dimmed, as history.
    pub rewound: Vec<bool>,
    /// Each entry's place in the log: the seq of the event that made it
    /// (streamed text: of the message it becomes).
    places: Vec<u64>,
    /// The seq of the last stored event seen.
    last_seq: u64,
    /// The place of what the event being shown makes.
    place: u64,
    /// The turn numbers.
    turns: crate::render::TurnCounter,
    revision: u64,
    /// A turn runs.
    pub turn_open: bool,
    /// What runs.
    pub busy: Option<Busy>,
    /// When the current activity started.
    pub busy_since: Option<Instant>,
    /// What the person types.
    pub input: Editor,
    history: Vec<String>,
    history_at: Option<usize>,
    draft: String,
    /// Questions waiting, the first one shown.
    pub approvals: Vec<Pending>,
    /// A question takes single keys only once it has been on screen this
    /// long and nothing was typed for as long (a key meant for a message
    /// never answers a question that just appeared).
    pub answer_guard: std::time::Duration,
    /// When a key was last typed into the input.
    typed_at: Option<Instant>,
    /// The question was put aside (Esc); Ctrl+A brings it back.
    pub approval_hidden: bool,
    /// Lines the question is scrolled by.
    pub approval_scroll: u16,
    /// Typing the reason of a deny for this call.
    pub deny_reason: Option<String>,
    /// The answer being streamed (notes may arrive after it meanwhile).
    streaming_at: Option<usize>,
    /// Lines the transcript is scrolled up from its end.
    pub scroll: usize,
    /// Tool blocks shown whole.
    pub expanded: bool,
    /// Plan mode for every message.
    pub plan_mode: bool,
    /// Network for every message.
    pub network: bool,
    limits: Limits,
    /// The session picker, when open.
    pub picker: Option<Picker>,
    /// The spinner's frame.
    pub spinner: usize,
    /// Something changed since the last draw.
    pub dirty: bool,
    /// Formats the events shown as notes, as the line chat does.
    notes: Renderer<Vec<u8>, Vec<u8>>,
}

impl App {
    /// A chat on `session_id` with `model`.
    pub fn new(
        theme: Theme,
        session_id: &str,
        model: &str,
        context_window: u32,
        network: bool,
    ) -> App {
        let mut notes = Renderer::new(Vec::new(), Vec::new());
        notes.show_approvals = false;
        App {
            theme,
            session_id: session_id.to_string(),
            files_root: None,
            disconnected: false,
            resend: None,
            model: model.to_string(),
            context_window,
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
            turns: crate::render::TurnCounter::default(),
            revision: 0,
            turn_open: false,
            busy: None,
            busy_since: None,
            input: Editor::default(),
            history: Vec::new(),
            history_at: None,
            draft: String::new(),
            approvals: Vec::new(),
            answer_guard: ANSWER_GUARD,
            typed_at: None,
            approval_hidden: false,
            approval_scroll: 0,
            deny_reason: None,
            streaming_at: None,
            scroll: 0,
            expanded: false,
            plan_mode: false,
            network,
            limits: Limits::default(),
            picker: None,
            spinner: 0,
            dirty: true,
            notes,
        }
    }

    fn push(&mut self, entry: Entry) {
        self.revision += 1;
        self.entries.push(entry);
        self.revisions.push(self.revision);
        self.rewound.push(false);
        self.places.push(self.place);
        self.dirty = true;
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

    fn touch(&mut self, index: usize) {
        self.revision += 1;
        if let Some(r) = self.revisions.get_mut(index) {
            *r = self.revision;
        }
        self.dirty = true;
    }

    /// Adds a note to the transcript.
    pub fn note(&mut self, text: impl Into<String>, kind: NoteKind) {
        let text = clean(&text.into());
        let text = text.trim_matches('\n').to_string();
        if !text.trim().is_empty() {
            self.push(Entry::Note(text, kind));
        }
    }

    fn set_busy(&mut self, busy: Option<Busy>) {
        if self.busy != busy {
            self.busy_since = busy.as_ref().map(|_| Instant::now());
            self.busy = busy;
            self.dirty = true;
        }
    }

    fn block_mut(&mut self, call_id: &str) -> Option<(usize, &mut ToolBlock)> {
        self.entries
            .iter_mut()
            .enumerate()
            .rev()
            .find_map(|(i, e)| match e {
                Entry::Tool(b) if b.call_id == call_id => Some((i, b)),
                _ => None,
            })
    }

    /// The question shown now, if any.
    pub fn question(&self) -> Option<&Pending> {
        if self.approval_hidden {
            None
        } else {
            self.approvals.first()
        }
    }

    /// Takes one of the session's events; returns what to fetch for it.
    pub fn on_event(&mut self, event: &spb::Event) -> Vec<Action> {
        let Some(kind) = &event.kind else {
            return Vec::new();
        };
        self.disconnected = false;
        let mut actions = Vec::new();
        // A sub-agent's question, relayed: asked here, answered there.
        if let Some(relayed) = crate::approval::relayed(&self.session_id, event) {
            match relayed {
                crate::approval::Relayed::Asked(mut request) => {
                    let id = request.call_id.clone();
                    let known = self.approvals.iter().any(|p| p.request.call_id == id);
                    if !known {
                        request.matched_rule = clean(&request.matched_rule);
                        let preview = if matches!(request.tool.as_str(), "write_file" | "edit_file")
                        {
                            actions.push(Action::Preview(id));
                            Preview::Loading
                        } else {
                            Preview::None
                        };
                        self.approval_hidden = false;
                        self.approvals.push(Pending {
                            request,
                            preview,
                            shown_at: Instant::now(),
                            edited: false,
                        });
                        self.dirty = true;
                    }
                }
                crate::approval::Relayed::Answered(id) => {
                    let before = self.approvals.len();
                    self.approvals.retain(|p| p.request.call_id != id);
                    if before != self.approvals.len() {
                        self.approval_hidden = false;
                        self.dirty = true;
                    }
                }
                crate::approval::Relayed::Nothing => {}
            }
            return actions;
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
        // The line renderer keeps the state its notes need (per-step
        // tokens, the plan's titles, the session's cost so far).
        self.notes.event(event);
        let (answer, activity) = self.notes.take_output();
        let formatted = format!(
            "{}{}",
            String::from_utf8_lossy(&answer),
            String::from_utf8_lossy(&activity)
        );
        self.dirty = true;
        match kind {
            Kind::UserMessage(m) => {
                let text = format!("{}{}", m.text, crate::render::images_shown(m));
                self.push(Entry::User(clean(&text)));
                self.turn_open = true;
                self.set_busy(Some(Busy::Model));
            }
            Kind::ModelTextDelta(d) => {
                let text = clean(&d.text);
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
                if m.context_window > 0 {
                    self.context_window = m.context_window;
                }
                if !m.model.is_empty() {
                    self.model = clean(&m.model);
                }
                let text = clean(&m.text);
                // The logged answer replaces what streamed of it.
                match self.streaming_at.take() {
                    Some(at) => {
                        if let Some(Entry::Answer { text: t, streaming }) = self.entries.get_mut(at)
                        {
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
            // The plan's own calls show as the plan, not as blocks of JSON.
            Kind::ToolCallRequested(c) if crate::render::is_plan_tool(&c.tool) => {}
            Kind::ToolCallRequested(c) => {
                self.push(Entry::Tool(ToolBlock {
                    call_id: c.call_id.clone(),
                    tool: clean(&c.tool),
                    summary: clean(&crate::render::short_args(&c.tool, &c.arguments_json)),
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
                let phase = spb::ToolCallPhase::try_from(s.phase).unwrap_or_default();
                if phase != spb::ToolCallPhase::AwaitingApproval {
                    self.resolved(&s.call_id);
                }
                let state = match phase {
                    spb::ToolCallPhase::AwaitingApproval => Some(CallState::Waiting),
                    spb::ToolCallPhase::Executing => Some(CallState::Running),
                    _ => None,
                };
                if let Some(state) = state
                    && let Some((i, block)) = self.block_mut(&s.call_id)
                {
                    block.state = state;
                    let tool = block.tool.clone();
                    self.touch(i);
                    self.set_busy(Some(match state {
                        CallState::Running => Busy::Tool(tool),
                        _ => Busy::Waiting,
                    }));
                }
            }
            Kind::ApprovalRequested(a) => {
                if !self
                    .approvals
                    .iter()
                    .any(|p| p.request.call_id == a.call_id)
                {
                    let preview = if matches!(a.tool.as_str(), "write_file" | "edit_file")
                        && !a.outcome_unknown
                    {
                        actions.push(Action::Preview(a.call_id.clone()));
                        Preview::Loading
                    } else {
                        Preview::None
                    };
                    self.approval_hidden = false;
                    self.approvals.push(Pending {
                        request: a.clone(),
                        preview,
                        shown_at: Instant::now(),
                        edited: false,
                    });
                    self.approval_scroll = 0;
                }
                self.set_busy(Some(Busy::Waiting));
            }
            Kind::ApprovalDecided(d) => {
                let decision = match ApprovalDecision::try_from(d.decision).unwrap_or_default() {
                    ApprovalDecision::Approve => "approved".to_string(),
                    ApprovalDecision::ApproveForSession => "approved for this session".to_string(),
                    ApprovalDecision::Edit => "edited and approved".to_string(),
                    ApprovalDecision::Check => "to be checked".to_string(),
                    ApprovalDecision::Deny if d.reason.is_empty() => "denied".to_string(),
                    ApprovalDecision::Deny => format!("denied: {}", clean(&d.reason)),
                    ApprovalDecision::Unspecified => String::new(),
                };
                if let Some((i, block)) = self.block_mut(&d.call_id) {
                    block.decision = decision;
                    self.touch(i);
                }
                self.resolved(&d.call_id);
                if self.turn_open {
                    self.set_busy(Some(Busy::Model));
                }
            }
            Kind::ToolOutputChunk(c) => {
                if let Some((i, block)) = self.block_mut(&c.call_id) {
                    if block.output.len() < MAX_KEPT_OUTPUT {
                        block.output.push_str(&clean(&c.text));
                    }
                    self.touch(i);
                }
            }
            Kind::ToolResult(r) => {
                if let Some(u) = &r.sub_agent_usage {
                    self.session_tokens += u.total_tokens;
                }
                if let Some((i, block)) = self.block_mut(&r.call_id) {
                    block.state = CallState::Done;
                    block.is_error = r.is_error;
                    block.duration_ms = r.duration_ms;
                    // A call cancelled here has no runner's figure: the
                    // time from its request to its end.
                    if r.duration_ms == 0
                        && let (Some(from), Some(to)) = (block.requested_ms, event_ms(event))
                    {
                        block.duration_ms = u64::try_from(to - from).unwrap_or(0);
                    }
                    block.runner = clean(&r.runner_id);
                    if r.timed_out {
                        block.runner.push_str(" · timed out");
                    } else if r.truncated {
                        block.runner.push_str(" · output cut");
                    }
                    // A sub-agent's tokens count here too, and its block
                    // says how many.
                    if let Some(u) = &r.sub_agent_usage {
                        block.runner =
                            format!("sub-agent {} tok", super::view::tokens(u.total_tokens));
                    }
                    // The result is what the model sees: it replaces the
                    // live output, but for a cancelled call, whose output so
                    // far stays above the note, and for a sub-agent's task,
                    // whose steps stay above its answer (folded like any
                    // output).
                    let cancelled = r.output.starts_with(CANCELLED);
                    let keeps_steps = cancelled || r.tool == agentry_orchestrator::agents::DELEGATE;
                    let mut output = if keeps_steps && !block.output.trim().is_empty() {
                        format!("{}\n{}", block.output.trim_end(), clean(&r.output))
                    } else {
                        clean(&r.output)
                    };
                    if output.len() > MAX_KEPT_OUTPUT {
                        let cut = floor_boundary(&output, MAX_KEPT_OUTPUT);
                        output.truncate(cut);
                        output.push_str("\n[… shortened here; the log has it all]");
                    }
                    block.output = output;
                    self.touch(i);
                } else if crate::render::is_plan_tool(&r.tool) && r.is_error {
                    // A plan call has no block: what went wrong is a note.
                    self.note(formatted, NoteKind::Error);
                }
                self.resolved(&r.call_id);
                if self.turn_open {
                    self.set_busy(Some(Busy::Model));
                }
            }
            Kind::TurnFinished(t) => {
                self.turn_open = false;
                self.set_busy(None);
                self.approvals.clear();
                self.deny_reason = None;
                if let Some(cost) = t.cost {
                    self.session_cost += cost;
                    self.currency = t.currency.clone();
                }
                if let Some(at) = self.streaming_at.take()
                    && let Some(Entry::Answer { streaming, .. }) = self.entries.get_mut(at)
                {
                    *streaming = false;
                }
                self.note(formatted, NoteKind::Info);
            }
            Kind::ReminderDue(_) | Kind::McpResourceUpdated(_) => {
                self.note(formatted, NoteKind::Arrived);
                if matches!(kind, Kind::McpResourceUpdated(_))
                    || matches!(kind, Kind::ReminderDue(r) if r.reminder_kind() == spb::ReminderKind::Task)
                {
                    self.turn_open = true;
                    self.set_busy(Some(Busy::Model));
                }
            }
            Kind::Error(_) => self.note(formatted, NoteKind::Error),
            Kind::ContextCompacted(c) => {
                if c.tokens_after > 0 {
                    self.context_used = c.tokens_after;
                }
                self.note(formatted, NoteKind::Info);
            }
            Kind::CancelRequested(_) => self.note("(cancelling…)", NoteKind::Info),
            Kind::SkillsetChosen(_)
            | Kind::PlanSubmitted(_)
            | Kind::PlanStepUpdated(_)
            | Kind::LoopDetected(_)
            | Kind::WorkspaceSnapshot(_)
            | Kind::SessionRewound(_)
            | Kind::BudgetExceeded(_)
            | Kind::HookRan(_)
            | Kind::InstructionsLoaded(_)
            | Kind::ToolsOffered(_) => self.note(formatted, NoteKind::Info),
            Kind::ModelChanged(m) => {
                if !m.model.is_empty() {
                    self.model = m.model.clone();
                }
                self.note(formatted, NoteKind::Info);
            }
        }
        actions
    }

    /// A question is answered or gone.
    fn resolved(&mut self, call_id: &str) {
        let before = self.approvals.len();
        self.approvals.retain(|p| p.request.call_id != call_id);
        if self.approvals.len() != before {
            self.approval_scroll = 0;
            self.approval_hidden = false;
            if self.deny_reason.as_deref() == Some(call_id) {
                self.deny_reason = None;
            }
            self.dirty = true;
        }
    }

    /// A preview arrived.
    pub fn on_preview(&mut self, call_id: &str, preview: Preview) {
        let preview = match preview {
            Preview::Diff { diff, creates } => Preview::Diff {
                diff: clean(&diff),
                creates,
            },
            Preview::Failed(why) => Preview::Failed(clean(&why)),
            other => other,
        };
        if let Some(pending) = self
            .approvals
            .iter_mut()
            .find(|p| p.request.call_id == call_id)
        {
            pending.preview = preview;
            self.dirty = true;
        }
    }

    /// The picker's sessions arrived.
    pub fn on_sessions(&mut self, rows: Vec<PickerRow>) {
        if let Some(picker) = &mut self.picker {
            picker.rows = Some(rows);
            picker.selected = 0;
            self.dirty = true;
        }
    }

    /// The spinner moves on (only while something runs).
    pub fn tick(&mut self) {
        if self.busy.is_some() {
            self.spinner = self.spinner.wrapping_add(1);
            self.dirty = true;
        }
    }

    /// Pasted text goes into the input as it is.
    pub fn on_paste(&mut self, text: &str) {
        let text = text.replace("\r\n", "\n").replace('\r', "\n");
        self.input.insert(&clean(&text));
        self.dirty = true;
    }

    /// Scrolls the transcript by `lines` (up is positive).
    pub fn scroll_by(&mut self, lines: isize) {
        self.scroll = self.scroll.saturating_add_signed(lines);
        self.dirty = true;
    }

    /// Takes one key; returns what to do.
    pub fn on_key(&mut self, key: KeyEvent) -> Vec<Action> {
        if key.kind == KeyEventKind::Release {
            return Vec::new();
        }
        self.dirty = true;
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        let alt = key.modifiers.contains(KeyModifiers::ALT);
        let shift = key.modifiers.contains(KeyModifiers::SHIFT);
        if self.picker.is_some() {
            return self.picker_key(key);
        }
        // Keys that work everywhere.
        match key.code {
            KeyCode::Char('c') if ctrl => {
                if self.turn_open {
                    self.approvals.clear();
                    self.deny_reason = None;
                    return vec![Action::Cancel];
                }
                self.input.take();
                return Vec::new();
            }
            KeyCode::Char('d') if ctrl => {
                if self.input.is_empty() {
                    return vec![Action::Quit];
                }
                self.input.delete();
                return Vec::new();
            }
            KeyCode::Char('o') if ctrl => {
                self.expanded = !self.expanded;
                return Vec::new();
            }
            KeyCode::Char('a') if ctrl => {
                self.approval_hidden = false;
                return Vec::new();
            }
            KeyCode::PageUp => {
                if self.question().is_some() {
                    self.approval_scroll = self.approval_scroll.saturating_sub(10);
                } else {
                    self.scroll_by(10);
                }
                return Vec::new();
            }
            KeyCode::PageDown => {
                if self.question().is_some() {
                    self.approval_scroll = self.approval_scroll.saturating_add(10);
                } else {
                    self.scroll_by(-10);
                }
                return Vec::new();
            }
            KeyCode::Esc => {
                if self.deny_reason.take().is_some() {
                    self.input.take();
                } else if !self.approvals.is_empty() {
                    self.approval_hidden = true;
                }
                return Vec::new();
            }
            _ => {}
        }
        // A question takes single keys only when nothing is being typed.
        let settled = |at: Option<Instant>| at.is_none_or(|t| t.elapsed() >= self.answer_guard);
        if self.deny_reason.is_none()
            && self.input.is_empty()
            && !ctrl
            && !alt
            && settled(self.typed_at)
            && let (Some(pending), KeyCode::Char(c)) = (self.question(), key.code)
            && settled(Some(pending.shown_at))
        {
            let request = pending.request.clone();
            if let Some(actions) = self.answer_key(&request, c) {
                return actions;
            }
        }
        match key.code {
            KeyCode::Enter if alt || shift => self.input.insert("\n"),
            KeyCode::Char('j') if ctrl => self.input.insert("\n"),
            KeyCode::Enter => return self.enter(),
            KeyCode::Char('u') if ctrl => {
                self.input.home();
                let end = self.input.text[self.input.cursor..]
                    .find('\n')
                    .map_or(self.input.text.len(), |i| self.input.cursor + i);
                self.input.text.replace_range(self.input.cursor..end, "");
            }
            KeyCode::Char('w') if ctrl => self.input.delete_word(),
            KeyCode::Char('e') if ctrl => self.input.end(),
            KeyCode::Char(c) if !ctrl => {
                let mut buf = [0u8; 4];
                self.input.insert(c.encode_utf8(&mut buf));
                self.history_at = None;
                self.typed_at = Some(Instant::now());
            }
            KeyCode::Backspace => self.input.backspace(),
            KeyCode::Delete => self.input.delete(),
            KeyCode::Left => self.input.left(),
            KeyCode::Right => self.input.right(),
            KeyCode::Home => self.input.home(),
            KeyCode::End => self.input.end(),
            KeyCode::Up => self.history_back(),
            KeyCode::Down => self.history_forward(),
            KeyCode::Tab => self.complete(),
            _ => {}
        }
        Vec::new()
    }

    /// A single key answering the question; `None` when it is no answer.
    fn answer_key(&mut self, request: &spb::ApprovalRequested, c: char) -> Option<Vec<Action>> {
        let decide = |decision: ApprovalDecision| {
            vec![Action::Decide(pb::ApprovalInput {
                call_id: request.call_id.clone(),
                decision: decision as i32,
                reason: String::new(),
                edited_arguments_json: String::new(),
            })]
        };
        let c = c.to_ascii_lowercase();
        if request.outcome_unknown {
            return match c {
                'c' => Some(decide(ApprovalDecision::Check)),
                'r' => Some(decide(ApprovalDecision::Approve)),
                's' => Some(decide(ApprovalDecision::Deny)),
                _ => None,
            };
        }
        let edited = self
            .approvals
            .iter()
            .any(|p| p.edited && p.request.call_id == request.call_id);
        if edited {
            // The call as edited: run as shown, refused, or edited again.
            return match c {
                'y' => Some(vec![Action::Decide(pb::ApprovalInput {
                    call_id: request.call_id.clone(),
                    decision: ApprovalDecision::Edit as i32,
                    reason: String::new(),
                    edited_arguments_json: request.arguments_json.clone(),
                })]),
                'n' => {
                    self.deny_reason = Some(request.call_id.clone());
                    Some(Vec::new())
                }
                'e' => Some(vec![Action::EditArguments(request.clone())]),
                // "Always" means nothing for a one-off edit.
                'a' => Some(Vec::new()),
                _ => None,
            };
        }
        match c {
            'y' => Some(decide(ApprovalDecision::Approve)),
            'a' => Some(decide(ApprovalDecision::ApproveForSession)),
            'n' => {
                self.deny_reason = Some(request.call_id.clone());
                Some(Vec::new())
            }
            'e' => Some(vec![Action::EditArguments(request.clone())]),
            _ => None,
        }
    }

    fn enter(&mut self) -> Vec<Action> {
        if let Some(call_id) = self.deny_reason.take() {
            let reason = self.input.take();
            return vec![Action::Decide(crate::approval::deny(&call_id, &reason))];
        }
        let text = self.input.text.trim().to_string();
        if text.is_empty() {
            return Vec::new();
        }
        self.input.take();
        if self.history.last() != Some(&text) {
            self.history.push(text.clone());
        }
        self.history_at = None;
        self.scroll = 0;
        if text.starts_with('/') {
            return self.command(&text);
        }
        if self.turn_open {
            self.note(
                "a turn is running: wait for it, or Ctrl+C to cancel it",
                NoteKind::Error,
            );
            self.input.set(text);
            return Vec::new();
        }
        vec![self.submit(text, self.plan_mode, false)]
    }

    fn submit(&mut self, text: String, plan: bool, compact: bool) -> Action {
        // Raised limits go with the next real message.
        let limits = if compact {
            Limits::default()
        } else {
            std::mem::take(&mut self.limits)
        };
        Action::Submit {
            text,
            plan,
            network: self.network,
            limits,
            compact,
        }
    }

    fn command(&mut self, text: &str) -> Vec<Action> {
        let (name, rest) = text.split_once(char::is_whitespace).unwrap_or((text, ""));
        let rest = rest.trim();
        match name {
            "/help" => {
                let mut help: Vec<String> = COMMANDS
                    .iter()
                    .map(|(c, what)| format!("{c:<10} {what}"))
                    .collect();
                help.push(
                    "keys: Enter send · Alt+Enter new line · ↑/↓ history · Tab complete · \
                     PgUp/PgDn scroll · Ctrl+O show calls in full · Ctrl+C cancel · Ctrl+D leave · \
                     approvals: y/n/a/e, Esc put aside, Ctrl+A back"
                        .to_string(),
                );
                self.note(help.join("\n"), NoteKind::Info);
            }
            "/plan" if rest.is_empty() => {
                self.plan_mode = !self.plan_mode;
                let state = if self.plan_mode {
                    "on: every message is planned, then executed step by step"
                } else {
                    "off"
                };
                self.note(format!("plan mode {state}"), NoteKind::Info);
            }
            "/plan" => {
                if self.turn_open {
                    self.note("a turn is running: wait for it, or Ctrl+C to cancel it", NoteKind::Error);
                    return Vec::new();
                }
                return vec![self.submit(rest.to_string(), true, false)];
            }
            "/network" => {
                self.network = !self.network;
                let state = if self.network {
                    "on: the agent's commands reach public hosts through the tool runner's proxy"
                } else {
                    "off"
                };
                self.note(format!("network {state}"), NoteKind::Info);
            }
            "/session" => {
                let id = self.session_id.clone();
                self.note(format!("session {id}"), NoteKind::Info);
            }
            "/new" => {
                if self.turn_open {
                    self.note(
                        "a turn is running here: cancel it (Ctrl+C) or wait, then /new",
                        NoteKind::Error,
                    );
                    return Vec::new();
                }
                return vec![Action::NewSession];
            }
            "/sessions" => {
                self.picker = Some(Picker::default());
                return vec![Action::ListSessions];
            }
            "/model" if !rest.is_empty() => {
                if self.turn_open {
                    self.note(
                        "a turn is running: switch the model when it ends",
                        NoteKind::Error,
                    );
                    return Vec::new();
                }
                return vec![Action::SetModel(rest.to_string())];
            }
            "/model" => {
                let window = if self.context_window > 0 {
                    format!("{}-token context window", self.context_window)
                } else {
                    "context window unknown".to_string()
                };
                let model = self.model.clone();
                self.note(format!("model {model}, {window}"), NoteKind::Info);
            }
            "/compact" => {
                if self.turn_open {
                    self.note("a turn is running: wait for it, or Ctrl+C to cancel it", NoteKind::Error);
                    return Vec::new();
                }
                let text = if rest.is_empty() {
                    "/compact".to_string()
                } else {
                    rest.to_string()
                };
                return vec![self.submit(text, false, true)];
            }
            "/rewind" => match rest.parse::<u32>() {
                Ok(turn) => return vec![Action::Rewind(turn)],
                Err(_) => self.note(
                    "/rewind N: the turn to go back to (0: the start), as `agentry sessions show` numbers them",
                    NoteKind::Error,
                ),
            },
            "/budget" => match self.limits.set(rest) {
                Ok(()) => self.note("(limits raised with your next message)", NoteKind::Info),
                Err(e) => self.note(e, NoteKind::Error),
            },
            "/exit" | "/quit" => return vec![Action::Quit],
            other => {
                self.note(
                    format!("unknown command {other}; /help lists them"),
                    NoteKind::Error,
                );
            }
        }
        Vec::new()
    }

    /// The commands the input could complete to.
    pub fn suggestions(&self) -> Vec<(&'static str, &'static str)> {
        let text = &self.input.text;
        if !text.starts_with('/') || text.contains(char::is_whitespace) {
            return Vec::new();
        }
        COMMANDS
            .iter()
            .filter(|(c, _)| c.starts_with(text.as_str()) && *c != text)
            .copied()
            .collect()
    }

    /// The person edited a waiting call's arguments: the question shows
    /// the call as edited, to be run only once they say yes.
    pub fn edited(&mut self, call_id: &str, arguments_json: String) {
        if let Some(pending) = self
            .approvals
            .iter_mut()
            .find(|p| p.request.call_id == call_id)
        {
            pending.request.arguments_json = arguments_json;
            pending.edited = true;
            // A diff of the original arguments would mislead.
            pending.preview = Preview::None;
            pending.shown_at = Instant::now();
            self.approval_hidden = false;
            self.dirty = true;
        }
    }

    /// A message was not sent: it goes back into the input (unless
    /// something was typed meanwhile), with why, to be sent again with
    /// Enter; `unreachable`: the orchestrator did not answer.
    pub fn not_sent(&mut self, text: String, why: &str, unreachable: bool) {
        // Said once: tries while it stays unreachable are quiet.
        let told = self.disconnected && unreachable;
        self.disconnected = unreachable;
        let restored = self.input.text.is_empty();
        if restored {
            self.input.set(text.clone());
        }
        // Sent again by itself once the orchestrator answers, unless the
        // person changes it first.
        self.resend = (restored && unreachable).then_some(text);
        if told {
            self.dirty = true;
            return;
        }
        self.note(
            format!(
                "not sent: {why}{}",
                match (restored, unreachable) {
                    (true, true) =>
                        "; the message stays in the input and is sent once the orchestrator answers (Enter tries now)",
                    (true, false) => "; the message is back in the input: Enter sends it again",
                    (false, _) => "",
                }
            ),
            NoteKind::Error,
        );
    }

    /// The message kept while the orchestrator did not answer, taken from
    /// the input to be sent again (nothing when the person changed it, or a
    /// turn runs).
    pub fn resend_now(&mut self) -> Vec<Action> {
        let Some(text) = self.resend.take() else {
            return Vec::new();
        };
        if self.turn_open || self.input.text != text {
            return Vec::new();
        }
        self.input.take();
        vec![self.submit(text, self.plan_mode, false)]
    }

    /// Where `@path` completes from: the session's directory when it is on
    /// this machine.
    pub fn set_files_root(&mut self, root: Option<std::path::PathBuf>) {
        self.files_root = root.filter(|r| r.is_dir());
    }

    /// Tab after `@` and part of a path: the path completed from the
    /// session's directory (as far as the names that fit agree; a
    /// directory gets its `/`, a file a space). `false` when the word at
    /// the cursor is no `@path` or there is nowhere to complete from.
    fn complete_path(&mut self) -> bool {
        let Some(root) = self.files_root.clone() else {
            return false;
        };
        let before = &self.input.text[..self.input.cursor];
        let word = before
            .rsplit(char::is_whitespace)
            .next()
            .unwrap_or_default();
        let Some(partial) = word.strip_prefix('@') else {
            return false;
        };
        if partial.contains(':') {
            return false;
        }
        let (dir, base) = match partial.rfind('/') {
            Some(at) => (&partial[..=at], &partial[at + 1..]),
            None => ("", partial),
        };
        let rel = std::path::Path::new(dir);
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return true;
        }
        let Ok(entries) = std::fs::read_dir(root.join(rel)) else {
            return true;
        };
        let mut names: Vec<(String, bool)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let fits =
                    name.starts_with(base) && (base.starts_with('.') || !name.starts_with('.'));
                fits.then(|| (name, e.file_type().is_ok_and(|t| t.is_dir())))
            })
            .collect();
        names.sort();
        let Some((first, first_dir)) = names.first().cloned() else {
            return true;
        };
        let mut common = first.clone();
        for (name, _) in &names[1..] {
            while !name.starts_with(&common) {
                common.pop();
            }
        }
        if names.len() == 1 {
            common.push(if first_dir { '/' } else { ' ' });
        }
        if common.len() > base.len() {
            self.input.insert(&clean(&common[base.len()..]));
        } else if names.len() > 1 {
            let shown: Vec<String> = names
                .iter()
                .take(12)
                .map(|(n, d)| format!("{n}{}", if *d { "/" } else { "" }))
                .collect();
            self.note(
                format!(
                    "@{dir}: {}{}",
                    shown.join("  "),
                    if names.len() > 12 { "  …" } else { "" }
                ),
                NoteKind::Info,
            );
        }
        true
    }

    fn complete(&mut self) {
        if self.complete_path() {
            return;
        }
        let options = self.suggestions();
        let Some(first) = options.first() else {
            return;
        };
        // The longest prefix the options share.
        let mut common = first.0.to_string();
        for (c, _) in &options[1..] {
            while !c.starts_with(&common) {
                common.pop();
            }
        }
        if options.len() == 1 {
            common.push(' ');
        }
        if common.len() > self.input.text.len() {
            self.input.set(common);
        }
    }

    fn history_back(&mut self) {
        if self.history.is_empty() || self.input.text.contains('\n') {
            return;
        }
        let at = match self.history_at {
            None => {
                self.draft = self.input.text.clone();
                self.history.len() - 1
            }
            Some(0) => 0,
            Some(i) => i - 1,
        };
        self.history_at = Some(at);
        self.input.set(self.history[at].clone());
    }

    fn history_forward(&mut self) {
        let Some(at) = self.history_at else { return };
        if at + 1 < self.history.len() {
            self.history_at = Some(at + 1);
            self.input.set(self.history[at + 1].clone());
        } else {
            self.history_at = None;
            let draft = std::mem::take(&mut self.draft);
            self.input.set(draft);
        }
    }

    fn picker_key(&mut self, key: KeyEvent) -> Vec<Action> {
        let Some(picker) = &mut self.picker else {
            return Vec::new();
        };
        let count = picker.visible().len();
        match key.code {
            KeyCode::Esc => self.picker = None,
            KeyCode::Char('c') | KeyCode::Char('d')
                if key.modifiers.contains(KeyModifiers::CONTROL) =>
            {
                self.picker = None;
                return vec![Action::Quit];
            }
            KeyCode::Up => picker.selected = picker.selected.saturating_sub(1),
            KeyCode::Down => picker.selected = (picker.selected + 1).min(count.saturating_sub(1)),
            // Typing filters.
            KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
                picker.filter.push(c);
                picker.selected = 0;
            }
            KeyCode::Backspace => {
                picker.filter.pop();
                picker.selected = 0;
            }
            KeyCode::Enter => {
                let chosen = picker
                    .visible()
                    .get(picker.selected)
                    .map(|row| row.id.clone());
                self.picker = None;
                if let Some(id) = chosen
                    && id != self.session_id
                {
                    return vec![Action::OpenSession(id)];
                }
            }
            _ => {}
        }
        Vec::new()
    }
}

/// Text from the session with every character that would act on a
/// terminal (escape sequences that could move the cursor or retitle the
/// terminal) shown as a visible escape, by the CLI's one sanitizer; tabs
/// become spaces.
pub fn clean(text: &str) -> String {
    crate::terminal::visible(text).replace('\t', "    ")
}

/// The largest char boundary at or below `at`.
fn floor_boundary(text: &str, mut at: usize) -> usize {
    while at > 0 && !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}
