//! The full-screen chat's state: what the session's events and the
//! person's keys make of it. No I/O here: keys and events go in, and
//! [`Action`]s come out for the loop in `mod.rs` to carry out, so every
//! behaviour can be driven in tests.
//!
//! Invariants: text from the session (answers, tool output, arguments)
//! is cleaned of control characters before it is kept, so nothing the
//! model or a tool prints can move the cursor or change the terminal; an
//! approval question never takes keys while the person is typing.

use crate::turn::Limits;
use agentry_client::view::SessionView;
pub use agentry_client::view::{Activity as Busy, CallState, Entry, NoteKind, ToolBlock};
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{self as spb, ApprovalDecision};
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use std::time::Instant;

pub use super::input::Editor;
pub use super::picker::{Picker, PickerRow, distinct_prefixes};
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

/// See [`App::answer_guard`].
pub const ANSWER_GUARD: std::time::Duration = std::time::Duration::from_millis(600);
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

/// The chat's state.
pub struct App {
    /// The styles.
    pub theme: Theme,
    /// The session shown.
    pub session_id: String,
    /// Where `@path` completes from (the session's directory, when it is
    /// on this machine).
    pub(super) files_root: Option<std::path::PathBuf>,
    /// The last message could not be sent because the orchestrator did
    /// not answer (the status line says so until something arrives).
    pub disconnected: bool,
    /// That message, sent again by itself while it stays in the input.
    pub resend: Option<String>,
    /// The connection broke while `resend` was being sent: it may have
    /// arrived after this event, and is looked for in the log before it is
    /// sent again.
    pub maybe_arrived_after: Option<u64>,
    /// The session as its events make it: transcript, figures, questions.
    pub view: SessionView,
    /// What runs.
    pub busy: Option<Busy>,
    /// When the current activity started.
    pub busy_since: Option<Instant>,
    /// What the person types.
    pub input: Editor,
    pub(super) history: Vec<String>,
    pub(super) history_at: Option<usize>,
    pub(super) draft: String,
    /// Questions waiting, the first one shown.
    pub approvals: Vec<Pending>,
    /// A question takes single keys only once it has been on screen this
    /// long and nothing was typed for as long (a key meant for a message
    /// never answers a question that just appeared).
    pub answer_guard: std::time::Duration,
    /// When a key was last typed into the input.
    pub(super) typed_at: Option<Instant>,
    /// The question was put aside (Esc); Ctrl+A brings it back.
    pub approval_hidden: bool,
    /// Lines the question is scrolled by.
    pub approval_scroll: u16,
    /// Typing the reason of a deny for this call.
    pub deny_reason: Option<String>,
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
        let mut view = SessionView::new(session_id, clean);
        view.model = model.to_string();
        view.context_window = context_window;
        App {
            theme,
            session_id: session_id.to_string(),
            files_root: None,
            disconnected: false,
            resend: None,
            maybe_arrived_after: None,
            view,
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
            scroll: 0,
            expanded: false,
            plan_mode: false,
            network,
            limits: Limits::default(),
            picker: None,
            spinner: 0,
            dirty: true,
        }
    }

    /// Adds a note to the transcript.
    pub fn note(&mut self, text: impl Into<String>, kind: NoteKind) {
        self.view.note(&text.into(), kind);
        self.dirty = true;
    }

    fn set_busy(&mut self, busy: Option<Busy>) {
        if self.busy != busy {
            self.busy_since = busy.as_ref().map(|_| Instant::now());
            self.busy = busy;
            self.dirty = true;
        }
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
        if event.kind.is_none() {
            return Vec::new();
        }
        self.disconnected = false;
        let relayed = agentry_client::relay::is_relayed(&self.view.session_id, event);
        let applied = self.view.apply(event);
        let mut actions = Vec::new();
        if let Some(mut request) = applied.asked {
            let id = request.call_id.clone();
            if !self.approvals.iter().any(|p| p.request.call_id == id) {
                request.matched_rule = clean(&request.matched_rule);
                let preview = if matches!(request.tool.as_str(), "write_file" | "edit_file")
                    && !request.outcome_unknown
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
                self.approval_scroll = 0;
                self.dirty = true;
            }
        }
        for id in &applied.resolved {
            self.resolved(id);
        }
        if applied.cleared {
            self.approvals.clear();
            self.deny_reason = None;
        }
        // A sub-agent's other events change nothing shown here.
        if !relayed {
            self.set_busy(self.view.activity.clone());
            self.dirty = true;
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
                if self.view.turn_open {
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
        // While a turn runs, the message steers it: the model gets it at
        // its next step (shown as pending until then).
        if self.view.turn_open {
            return vec![Action::Submit {
                text,
                plan: false,
                network: self.network,
                limits: Limits::default(),
                compact: false,
            }];
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
                if self.view.turn_open {
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
                if self.view.turn_open {
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
                if self.view.turn_open {
                    self.note(
                        "a turn is running: switch the model when it ends",
                        NoteKind::Error,
                    );
                    return Vec::new();
                }
                return vec![Action::SetModel(rest.to_string())];
            }
            "/model" => {
                let window = if self.view.context_window > 0 {
                    format!("{}-token context window", self.view.context_window)
                } else {
                    "context window unknown".to_string()
                };
                let model = self.view.model.clone();
                self.note(format!("model {model}, {window}"), NoteKind::Info);
            }
            "/compact" => {
                if self.view.turn_open {
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

    /// The kept message had arrived after all (found in the log): it is
    /// not sent again.
    pub fn arrived(&mut self, text: &str) {
        self.maybe_arrived_after = None;
        self.resend = None;
        self.disconnected = false;
        if self.input.text == text {
            self.input.take();
        }
        self.note(
            "the orchestrator answers again: the message had arrived".to_string(),
            NoteKind::Info,
        );
    }

    /// The message kept while the orchestrator did not answer, taken from
    /// the input to be sent again (nothing when the person changed it, or a
    /// turn runs).
    pub fn resend_now(&mut self) -> Vec<Action> {
        let Some(text) = self.resend.take() else {
            return Vec::new();
        };
        if self.view.turn_open || self.input.text != text {
            return Vec::new();
        }
        self.input.take();
        vec![self.submit(text, self.plan_mode, false)]
    }
}

/// Text from the session with every character that would act on a
/// terminal (escape sequences that could move the cursor or retitle the
/// terminal) shown as a visible escape, by the CLI's one sanitizer; tabs
/// become spaces.
pub fn clean(text: &str) -> String {
    agentry_client::terminal::visible(text).replace('\t', "    ")
}
