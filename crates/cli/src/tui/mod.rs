//! `agentry chat` on a terminal: a full-screen chat (ratatui on
//! crossterm). The session's events come from a task of their own (the
//! whole log first, then live ones; a broken stream reconnects), keys from
//! a reader thread, and both reach [`app::App`] through channels, so no
//! request ever blocks the keys. What the person asks for goes to the
//! session through [`crate::turn::Driver`], as from `agentry run` and the
//! line chat. Answers render as markdown, tool calls as
//! blocks, approvals as a focused question with the diff of a file change.
//!
//! The terminal is restored however the chat ends (an error, a panic,
//! Ctrl+D), and while the person edits a call's arguments in their editor.

pub mod app;
pub mod highlight;
pub mod input;
pub mod markdown;
pub mod picker;
pub mod theme;
pub mod view;

#[cfg(test)]
mod tests;

use crate::client::connect;
use crate::turn::{Follower, Mode, open_session, user_input};
use crate::{Approve, approval};
use agentry_proto::orchestrator::v1::{self as pb, orchestrator_client::OrchestratorClient};
use agentry_proto::sessions::v1 as spb;
use agentry_runtime::Config;
use agentry_runtime::telemetry::TracedChannel;
use app::{Action, App, NoteKind, PickerRow, Preview};
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::{self, event, execute, terminal};
use std::io::Stdout;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// How often the spinner moves while something runs.
const TICK: Duration = Duration::from_millis(120);

/// What the background work reports.
enum Report {
    Event(Box<spb::Event>),
    StreamLost(String),
    Preview(String, Preview),
    Sessions(Result<Vec<PickerRow>, String>),
}

/// How one session's chat ended.
enum End {
    /// The person left; this many questions still wait for an answer.
    Leave(usize),
    Switch(String),
    /// A fresh session, where this one was started.
    New,
}

/// `agentry chat` full-screen; `pick` opens the session picker first.
pub async fn chat(
    config: &Config,
    session: Option<String>,
    place: &crate::turn::Place,
    network: bool,
    pick: bool,
) -> anyhow::Result<ExitCode> {
    let mut client = connect(config).await?;
    // The window the orchestrator plans for (shown before the first answer).
    let (window, model_problem) = client
        .list_tools(pb::ListToolsRequest::default())
        .await
        .map(|r| {
            let r = r.into_inner();
            (r.context_window, r.model_problem)
        })
        .unwrap_or_default();
    let mut screen = Screen::enter()?;
    let keys = KeyReader::start();
    let mut next = session;
    let mut pick = pick && next.is_none();
    let mut last_session = None;
    let mut waiting = 0;
    let result = loop {
        let session = if pick {
            pick = false;
            match pick_first(&mut client, &mut screen, &keys, config).await? {
                Picked::Session(id) => Some(id),
                Picked::New => next.take(),
                Picked::Quit => break Ok(ExitCode::SUCCESS),
            }
        } else {
            next.take()
        };
        let (session, note) = match open_session(&mut client, session, place).await {
            Ok(opened) => opened,
            Err(e) => break Err(e),
        };
        last_session = Some(session.id.clone());
        let mut app = App::new(
            theme::Theme::from_env(),
            &session.id,
            &config.llm.model,
            window,
            network,
        );
        if !session.project_dir.is_empty() {
            app.note(
                format!("working in {}", session.project_dir),
                app::NoteKind::Info,
            );
            app.set_files_root(Some(std::path::PathBuf::from(&session.project_dir)));
        }
        if let Some(note) = note {
            app.note(note, app::NoteKind::Info);
        }
        if !model_problem.is_empty() {
            app.note(
                format!("{model_problem}; `agentry doctor` says how to fix it"),
                app::NoteKind::Error,
            );
        }
        let mut driver = crate::turn::Driver {
            client: client.clone(),
            session,
        };
        match run_session(&mut driver, &mut screen, &keys, &mut app).await {
            Ok(End::Leave(questions)) => {
                waiting = questions;
                break Ok(ExitCode::SUCCESS);
            }
            Ok(End::Switch(id)) => next = Some(id),
            Ok(End::New) => next = None,
            Err(e) => break Err(e),
        }
    };
    keys.stop();
    drop(screen);
    if let Some(id) = last_session {
        if waiting > 0 {
            eprintln!(
                "{waiting} question{} of this session wait{} for an answer in `agentry \
                 approvals`; the turn goes on once answered (there, or here again).",
                if waiting == 1 { "" } else { "s" },
                if waiting == 1 { "s" } else { "" }
            );
        }
        eprintln!("bye. Resume with: agentry chat --session {id}");
    }
    result
}

/// What the picker before any session gave.
enum Picked {
    Session(String),
    New,
    Quit,
}

/// The picker before any session: the chosen one, a new one (Esc), or
/// none at all (Ctrl+C, Ctrl+D).
async fn pick_first(
    client: &mut OrchestratorClient<TracedChannel>,
    screen: &mut Screen,
    keys: &KeyReader,
    config: &Config,
) -> anyhow::Result<Picked> {
    let mut app = App::new(theme::Theme::from_env(), "", &config.llm.model, 0, false);
    app.note("choose a session, or Esc for a new one", NoteKind::Info);
    app.picker = Some(app::Picker::default());
    app.on_sessions(list_sessions(client).await.unwrap_or_default());
    let mut cache = view::Cache::default();
    loop {
        screen.draw(&mut app, &mut cache)?;
        let Some(key) = keys.next().await else {
            return Ok(Picked::Quit);
        };
        if let event::Event::Key(key) = key {
            for action in app.on_key(key) {
                match action {
                    Action::OpenSession(id) => return Ok(Picked::Session(id)),
                    Action::Quit => return Ok(Picked::Quit),
                    _ => {}
                }
            }
            if app.picker.is_none() {
                return Ok(Picked::New);
            }
        }
    }
}

async fn list_sessions(
    client: &mut OrchestratorClient<TracedChannel>,
) -> Result<Vec<PickerRow>, String> {
    let response = client
        .list_sessions(spb::ListSessionsRequest {
            limit: 50,
            offset: 0,
            only_open_turns: false,
        })
        .await
        .map_err(|s| s.message().to_string())?;
    Ok(response
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| PickerRow {
            title: app::clean(if s.title.is_empty() {
                &s.preview
            } else {
                &s.title
            }),
            age: crate::session_cmds::ago(s.updated_at.as_ref()),
            events: s.event_count,
            name: app::clean(&s.name),
            place: app::clean(&crate::session_cmds::place_of(&s.project_dir, 24)),
            id: s.id,
        })
        .collect())
}

async fn run_session(
    driver: &mut crate::turn::Driver,
    screen: &mut Screen,
    keys: &KeyReader,
    app: &mut App,
) -> anyhow::Result<End> {
    let (reports_tx, mut reports) = mpsc::unbounded_channel::<Report>();
    // The whole log, then live events.
    let mut start = driver.session.clone();
    start.event_count = 0;
    let mut follower = Follower::new(&driver.client, &start).await?;
    follower.quiet = true;
    let events_tx = reports_tx.clone();
    let follow = tokio::spawn(async move {
        loop {
            match follower.next().await {
                Ok(event) => {
                    if events_tx.send(Report::Event(Box::new(event))).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = events_tx.send(Report::StreamLost(format!("{e:#}")));
                    return;
                }
            }
        }
    });
    let _follow = AbortOnDrop(follow);
    let mut cache = view::Cache::default();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut resend = tokio::time::interval(RESEND_EVERY);
    resend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        if app.dirty {
            screen.draw(app, &mut cache)?;
            app.dirty = false;
        }
        let mut actions = Vec::new();
        tokio::select! {
            key = keys.next() => match key {
                Some(event::Event::Key(key)) => actions = app.on_key(key),
                Some(event::Event::Paste(text)) => app.on_paste(&text),
                Some(event::Event::Mouse(mouse)) => match mouse.kind {
                    event::MouseEventKind::ScrollUp => app.scroll_by(3),
                    event::MouseEventKind::ScrollDown => app.scroll_by(-3),
                    _ => {}
                },
                Some(event::Event::Resize(_, _)) => app.dirty = true,
                Some(_) => {}
                None => return Ok(End::Leave(0)),
            },
            report = reports.recv() => {
                let mut next = report;
                // Everything already there is taken before drawing once.
                while let Some(report) = next {
                    match report {
                        Report::Event(event) => actions.extend(app.on_event(&event)),
                        Report::StreamLost(why) => {
                            anyhow::bail!("lost the session's event stream: {why}")
                        }
                        Report::Preview(call_id, preview) => app.on_preview(&call_id, preview),
                        Report::Sessions(Ok(rows)) => app.on_sessions(rows),
                        Report::Sessions(Err(why)) => {
                            app.picker = None;
                            app.note(format!("cannot list sessions: {why}"), NoteKind::Error);
                        }
                    }
                    next = reports.try_recv().ok();
                }
            }
            _ = tick.tick(), if app.busy.is_some() => app.tick(),
            _ = resend.tick(), if app.resend.is_some() => actions = app.resend_now(),
        }
        for action in actions {
            if let Some(end) = perform(action, driver, screen, keys, app, &reports_tx).await? {
                return Ok(end);
            }
        }
    }
}

/// How often a message kept while the orchestrator did not answer is sent
/// again.
const RESEND_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Carries out one action; `Some` when the chat of this session ends.
async fn perform(
    action: Action,
    driver: &mut crate::turn::Driver,
    screen: &mut Screen,
    keys: &KeyReader,
    app: &mut App,
    reports: &mpsc::UnboundedSender<Report>,
) -> anyhow::Result<Option<End>> {
    let said = |app: &mut App, status: tonic::Status| {
        app.note(format!("agentry: {}", status.message()), NoteKind::Error);
    };
    match action {
        Action::Submit {
            text,
            plan,
            network,
            limits,
            compact,
        } => {
            // A message whose sending was cut off may have arrived.
            if let Some(after) = app.maybe_arrived_after {
                match driver.arrived(&text, after).await {
                    Ok(true) => {
                        app.arrived(&text);
                        return Ok(None);
                    }
                    Ok(false) => app.maybe_arrived_after = None,
                    Err(status) => {
                        app.not_sent(text, status.message(), true);
                        return Ok(None);
                    }
                }
            }
            let seen = app.view.last_seq;
            let sent_text = text.clone();
            let mut input = user_input(
                text,
                Mode {
                    approve: Approve::Policy,
                    plan,
                    network,
                    limits,
                    verbose: false,
                },
            );
            if let Some(pb::input::Kind::UserMessage(m)) = &mut input.kind {
                m.compact = compact;
            }
            if let Err(status) = driver.submit(input).await {
                let unreachable = crate::turn::unanswered(&status);
                if unreachable && status.code() != tonic::Code::Unavailable {
                    app.maybe_arrived_after = Some(seen);
                }
                app.not_sent(sent_text, status.message(), unreachable);
            }
        }
        Action::Decide(decision) => {
            if let Err(status) = driver.decide(decision).await {
                said(app, status);
            }
        }
        Action::EditArguments(request) => {
            keys.pause();
            screen.suspend()?;
            let edited = approval::edit_arguments(&request.arguments_json).await;
            screen.resume()?;
            keys.resume();
            app.dirty = true;
            // The call as edited is shown again; it runs once the person
            // says yes to it.
            match edited {
                Ok(arguments) => app.edited(&request.call_id, arguments),
                Err(e) => app.note(format!("{e:#}"), NoteKind::Error),
            }
        }
        Action::Cancel => {
            if let Err(status) = driver.cancel().await {
                said(app, status);
            }
        }
        // A question answered meanwhile (a log replayed) needs none.
        Action::Preview(call_id) if !app.approvals.iter().any(|p| p.request.call_id == call_id) => {
        }
        Action::Preview(call_id) => {
            let mut driver = driver.clone();
            let reports = reports.clone();
            tokio::spawn(async move {
                let preview = match driver.preview(&call_id).await {
                    Ok(r) if r.error.is_empty() => Preview::Diff {
                        diff: r.diff,
                        creates: r.creates,
                    },
                    Ok(r) => Preview::Failed(r.error),
                    Err(status) => Preview::Failed(status.message().to_string()),
                };
                let _ = reports.send(Report::Preview(call_id, preview));
            });
        }
        Action::ListSessions => {
            let mut client = driver.client.clone();
            let reports = reports.clone();
            tokio::spawn(async move {
                let rows = list_sessions(&mut client).await;
                let _ = reports.send(Report::Sessions(rows));
            });
        }
        Action::OpenSession(id) => return Ok(Some(End::Switch(id))),
        Action::NewSession => return Ok(Some(End::New)),
        Action::Rewind(to_turn) => {
            if let Err(status) = driver.rewind(to_turn).await {
                said(app, status);
            }
        }
        Action::SetModel(name) => {
            if let Err(status) = driver.set_model(name).await {
                said(app, status);
            }
        }
        Action::Quit => {
            // A question waiting for an answer stays in the inbox: leaving
            // does not decide it, and the turn waits for it.
            if !app.approvals.is_empty() {
                return Ok(Some(End::Leave(app.approvals.len())));
            }
            if app.view.turn_open {
                let _ = driver.cancel_because("the person left the chat").await;
            }
            return Ok(Some(End::Leave(0)));
        }
    }
    Ok(None)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The terminal in full-screen mode; dropping it restores the terminal.
struct Screen {
    terminal: Terminal<CrosstermBackend<Stdout>>,
    enhanced: bool,
}

impl Screen {
    fn enter() -> anyhow::Result<Screen> {
        // A panic restores the terminal before its message is printed.
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore(true);
            previous(info);
        }));
        let enhanced = matches!(terminal::supports_keyboard_enhancement(), Ok(true));
        let mut screen = Screen {
            terminal: Terminal::new(CrosstermBackend::new(std::io::stdout()))?,
            enhanced,
        };
        screen.resume()?;
        Ok(screen)
    }

    fn resume(&mut self) -> anyhow::Result<()> {
        terminal::enable_raw_mode()?;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            event::EnableBracketedPaste,
            event::EnableMouseCapture
        )?;
        if self.enhanced {
            // Shift+Enter is told apart from Enter where the terminal can.
            execute!(
                std::io::stdout(),
                event::PushKeyboardEnhancementFlags(
                    event::KeyboardEnhancementFlags::DISAMBIGUATE_ESCAPE_CODES
                )
            )?;
        }
        self.terminal.clear()?;
        Ok(())
    }

    fn suspend(&mut self) -> anyhow::Result<()> {
        restore(self.enhanced);
        Ok(())
    }

    fn draw(&mut self, app: &mut App, cache: &mut view::Cache) -> anyhow::Result<()> {
        self.terminal.draw(|frame| view::draw(frame, app, cache))?;
        Ok(())
    }
}

fn restore(enhanced: bool) {
    let mut out = std::io::stdout();
    if enhanced {
        let _ = execute!(out, event::PopKeyboardEnhancementFlags);
    }
    let _ = execute!(
        out,
        event::DisableMouseCapture,
        event::DisableBracketedPaste,
        terminal::LeaveAlternateScreen,
        crossterm::cursor::Show
    );
    let _ = terminal::disable_raw_mode();
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore(self.enhanced);
    }
}

/// Reads terminal events on a thread of its own; paused while an editor
/// owns the terminal (so it gets every key).
struct KeyReader {
    events: tokio::sync::Mutex<mpsc::Receiver<event::Event>>,
    paused: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
}

impl KeyReader {
    fn start() -> KeyReader {
        let (tx, rx) = mpsc::channel(256);
        let paused = Arc::new(AtomicBool::new(false));
        let stopped = Arc::new(AtomicBool::new(false));
        let (p, s) = (paused.clone(), stopped.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if p.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                match event::poll(Duration::from_millis(50)) {
                    Ok(true) => match event::read() {
                        Ok(ev) => {
                            if tx.blocking_send(ev).is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    },
                    Ok(false) => {}
                    Err(_) => return,
                }
            }
        });
        KeyReader {
            events: tokio::sync::Mutex::new(rx),
            paused,
            stopped,
        }
    }

    async fn next(&self) -> Option<event::Event> {
        self.events.lock().await.recv().await
    }

    fn pause(&self) {
        self.paused.store(true, Ordering::Relaxed);
        // Let a poll in progress end.
        std::thread::sleep(Duration::from_millis(60));
    }

    fn resume(&self) {
        self.paused.store(false, Ordering::Relaxed);
    }

    fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }
}

/// Whether this process can run the full-screen chat: both standard input
/// and output are terminals, and the terminal is not `dumb`.
pub fn available() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal()
        && std::io::stdout().is_terminal()
        && !std::env::var("TERM").is_ok_and(|t| t == "dumb")
}
