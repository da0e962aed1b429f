//! The full-screen chat driven end to end without a terminal: the
//! session's events and the person's keys go into [`App`], the screen is
//! drawn with [`view::draw`] on a [`TestBackend`], and what the person
//! would see is compared cell by cell.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::app::{Action, App, CallState, Entry, NoteKind, PickerRow, Preview};
use super::theme::Theme;
use super::view::{self, Cache};
use crate::turn::Limits;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{self as spb, ApprovalDecision, event::Kind};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::Position;
use ratatui::style::{Color, Modifier};

const SESSION: &str = "5f3c9a1e-7b2d-4c4e-9f00-123456789abc";
const MODEL: &str = "configured-model";

// ---------------------------------------------------------------- helpers

fn new_app(color: bool) -> App {
    let mut app = App::new(Theme { color }, SESSION, MODEL, 32768, false);
    // Keys are typed faster than any person: no guard.
    app.answer_guard = std::time::Duration::ZERO;
    app
}

fn logged(kind: Kind) -> spb::Event {
    spb::Event {
        session_id: SESSION.to_string(),
        seq: 1,
        turn_id: "turn-1".to_string(),
        kind: Some(kind),
        live: false,
        time: None,
        by: String::new(),
    }
}

fn live(kind: Kind) -> spb::Event {
    spb::Event {
        live: true,
        ..logged(kind)
    }
}

/// Feeds logged events; returns every action they asked for.
fn feed(app: &mut App, kinds: Vec<Kind>) -> Vec<Action> {
    kinds
        .into_iter()
        .flat_map(|kind| app.on_event(&logged(kind)))
        .collect()
}

fn user(text: &str) -> Kind {
    Kind::UserMessage(spb::UserMessage {
        text: text.to_string(),
        ..Default::default()
    })
}

fn delta(text: &str) -> Kind {
    Kind::ModelTextDelta(spb::ModelTextDelta {
        text: text.to_string(),
    })
}

fn message(text: &str, model: &str, usage: Option<(u64, u64)>) -> Kind {
    Kind::ModelMessage(spb::ModelMessage {
        text: text.to_string(),
        finish_reason: "stop".to_string(),
        usage: usage.map(|(prompt, completion)| spb::TokenUsage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            ..Default::default()
        }),
        model: model.to_string(),
        step: 1,
        ..Default::default()
    })
}

fn requested(call_id: &str, tool: &str, arguments_json: &str) -> Kind {
    Kind::ToolCallRequested(spb::ToolCallRequested {
        call_id: call_id.to_string(),
        tool: tool.to_string(),
        arguments_json: arguments_json.to_string(),
        ..Default::default()
    })
}

fn phase(call_id: &str, phase: spb::ToolCallPhase) -> Kind {
    Kind::ToolCallState(spb::ToolCallState {
        call_id: call_id.to_string(),
        phase: phase as i32,
        ..Default::default()
    })
}

fn chunk(call_id: &str, text: &str) -> Kind {
    Kind::ToolOutputChunk(spb::ToolOutputChunk {
        call_id: call_id.to_string(),
        stream: spb::OutputStream::Stdout as i32,
        text: text.to_string(),
    })
}

fn result(call_id: &str, tool: &str, output: &str, is_error: bool, duration_ms: u64) -> Kind {
    Kind::ToolResult(spb::ToolResult {
        truncated: false,
        timed_out: false,
        sub_agent_usage: None,
        call_id: call_id.to_string(),
        tool: tool.to_string(),
        output: output.to_string(),
        is_error,
        exit_code: Some(i32::from(is_error)),
        duration_ms,
        runner_id: "runner-a".to_string(),
        secrets_used: Vec::new(),
    })
}

fn approval(call_id: &str, tool: &str, arguments_json: &str, outcome_unknown: bool) -> Kind {
    Kind::ApprovalRequested(spb::ApprovalRequested {
        call_id: call_id.to_string(),
        tool: tool.to_string(),
        arguments_json: arguments_json.to_string(),
        matched_rule: format!("{tool} needs confirmation"),
        outcome_unknown,
        ..Default::default()
    })
}

fn decided(call_id: &str, decision: ApprovalDecision) -> Kind {
    Kind::ApprovalDecided(spb::ApprovalDecided {
        call_id: call_id.to_string(),
        decision: decision as i32,
        ..Default::default()
    })
}

fn finished(usage: Option<(u64, u64)>, cost: Option<f64>) -> Kind {
    Kind::TurnFinished(spb::TurnFinished {
        outcome: spb::TurnOutcome::Completed as i32,
        steps: 1,
        usage: usage.map(|(prompt, completion)| spb::TokenUsage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            ..Default::default()
        }),
        cost,
        currency: if cost.is_some() {
            "USD".to_string()
        } else {
            String::new()
        },
        ..Default::default()
    })
}

fn reminder(text: &str, kind: spb::ReminderKind) -> Kind {
    Kind::ReminderDue(spb::ReminderDue {
        reminder_id: "r1".to_string(),
        firing_id: "f1".to_string(),
        message: text.to_string(),
        kind: kind as i32,
        ..Default::default()
    })
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn ctrl(c: char) -> KeyEvent {
    KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)
}

fn press(app: &mut App, code: KeyCode) -> Vec<Action> {
    app.on_key(key(code))
}

/// Types `text` key by key; returns the actions the keys asked for.
fn type_text(app: &mut App, text: &str) -> Vec<Action> {
    text.chars()
        .flat_map(|c| app.on_key(key(KeyCode::Char(c))))
        .collect()
}

fn decision(call_id: &str, decision: ApprovalDecision, reason: &str) -> Action {
    Action::Decide(pb::ApprovalInput {
        call_id: call_id.to_string(),
        decision: decision as i32,
        reason: reason.to_string(),
        edited_arguments_json: String::new(),
    })
}

/// A terminal that stays between draws (so the view's cache is used as
/// in the real loop).
struct Screen {
    terminal: Terminal<TestBackend>,
    cache: Cache,
}

impl Screen {
    fn new(width: u16, height: u16) -> Screen {
        Screen {
            terminal: Terminal::new(TestBackend::new(width, height)).unwrap(),
            cache: Cache::default(),
        }
    }

    fn draw(&mut self, app: &mut App) -> Vec<String> {
        text_rows(&self.buffer(app))
    }

    fn buffer(&mut self, app: &mut App) -> Buffer {
        let cache = &mut self.cache;
        self.terminal
            .draw(|frame| view::draw(frame, app, cache))
            .unwrap();
        self.terminal.backend().buffer().clone()
    }

    fn cursor(&mut self) -> Position {
        self.terminal.get_cursor_position().unwrap()
    }
}

/// The screen of `app` at `width`×`height`, drawn once.
fn screen(app: &mut App, width: u16, height: u16) -> Vec<String> {
    Screen::new(width, height).draw(app)
}

/// Each row of the buffer, its cells' symbols joined.
fn text_rows(buffer: &Buffer) -> Vec<String> {
    let area = buffer.area;
    (area.top()..area.bottom())
        .map(|y| {
            (area.left()..area.right())
                .map(|x| buffer[(x, y)].symbol())
                .collect()
        })
        .collect()
}

/// `text` padded with spaces to `width` columns (narrow characters only).
fn pad(text: &str, width: usize) -> String {
    let used = text.chars().count();
    assert!(used <= width, "{text:?} is wider than {width}");
    format!("{text}{}", " ".repeat(width - used))
}

/// A row of the question's box: the text between two borders.
fn boxed(text: &str, width: usize) -> String {
    format!("│{}│", pad(text, width - 2))
}

fn find_row(rows: &[String], needle: &str) -> Option<usize> {
    rows.iter().position(|r| r.contains(needle))
}

fn shows(rows: &[String], needle: &str) -> bool {
    find_row(rows, needle).is_some()
}

fn dump(rows: &[String]) -> String {
    rows.iter()
        .enumerate()
        .map(|(i, r)| format!("{i:>2}|{r}|"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The status line's text at `width`, as `view::status_line` builds it.
fn status_text(app: &App, width: u16) -> String {
    view::status_line(app, width)
        .spans
        .iter()
        .map(|s| s.content.as_ref())
        .collect()
}

/// Where `needle` starts in `row`, in columns (narrow characters only).
fn column_of(row: &str, needle: &str) -> u16 {
    let byte = row.find(needle).unwrap();
    row[..byte].chars().count() as u16
}

// ------------------------------------------------------------------ tests

const ANSWER: &str = "Here is **bold** text.\n\n- one\n- two\n\n```rust\nfn main() {}\n```\n";

#[test]
fn a_streamed_answer_renders_as_markdown_with_the_status_line() {
    let mut app = new_app(true);
    let mut screen = Screen::new(80, 24);
    assert!(feed(&mut app, vec![user("show me some rust")]).is_empty());
    // The model streams; the screen shows what arrived so far.
    let pieces = [
        "Here is **bo",
        "ld** text.\n\n- one\n",
        "- two\n\n```rust\nfn main",
        "() {}\n```\n",
    ];
    for piece in &pieces[..2] {
        assert!(app.on_event(&live(delta(piece))).is_empty());
    }
    let rows = screen.draw(&mut app);
    assert_eq!(rows[0], pad("── turn 1 ──", 80), "{}", dump(&rows));
    assert_eq!(rows[1], pad("› show me some rust", 80), "{}", dump(&rows));
    assert_eq!(rows[3], pad("Here is bold text.", 80), "{}", dump(&rows));
    assert_eq!(rows[5], pad("• one", 80), "{}", dump(&rows));
    assert!(!shows(&rows, "• two"), "{}", dump(&rows));
    assert!(rows[23].contains("thinking"), "{}", dump(&rows));
    assert!(
        rows[22].starts_with("› working… Enter steers the turn · Ctrl+C cancels"),
        "{}",
        dump(&rows)
    );
    for piece in &pieces[2..] {
        app.on_event(&live(delta(piece)));
    }
    assert_eq!(pieces.concat(), ANSWER);
    // The logged message replaces the streamed text and brings the usage
    // and the model's own name.
    feed(
        &mut app,
        vec![
            message(ANSWER, "qwen3-coder", Some((1000, 200))),
            finished(Some((1000, 200)), None),
        ],
    );
    let buffer = screen.buffer(&mut app);
    let rows = text_rows(&buffer);
    let status = format!(
        "{}ready ",
        pad(
            " qwen3-coder · ctx 1.2k/32.8k (4%) · 1.2k tok · 5f3c9a1e-7b2d",
            74
        )
    );
    let mut expected: Vec<String> = [
        "── turn 1 ──",
        "› show me some rust",
        "",
        "Here is bold text.",
        "",
        "• one",
        "• two",
        "",
        "╭ rust",
        "│ fn main() {}",
        "",
        "  (1 step, 1200 tokens (1000 in, 200 out))",
        "",
    ]
    .iter()
    .map(|r| pad(r, 80))
    .collect();
    expected.resize(21, pad("", 80));
    expected.push("─".repeat(80));
    expected.push(pad(
        "› message the agent · /help · Alt+Enter new line · Ctrl+D leaves",
        80,
    ));
    expected.push(status);
    assert_eq!(rows, expected, "{}", dump(&rows));
    assert!(!rows.iter().any(|r| r.contains('*')));
    // Emphasis is a style, not asterisks; code is highlighted.
    for x in 8..12 {
        assert!(
            buffer[(x, 3)].modifier.contains(Modifier::BOLD),
            "cell {x} of {:?}",
            rows[3]
        );
    }
    assert!(!buffer[(0, 3)].modifier.contains(Modifier::BOLD));
    assert_eq!(buffer[(2, 9)].fg, Color::Magenta, "`fn` is a keyword");
    // The status line is one style across the width.
    assert_eq!(buffer[(0, 23)].bg, Color::DarkGray);
    assert_eq!(buffer[(79, 23)].bg, Color::DarkGray);
    assert_eq!(app.view.model, "qwen3-coder");
    assert!(!app.view.turn_open);
}

#[test]
fn an_answer_logged_without_streaming_shows_once() {
    let mut app = new_app(true);
    feed(
        &mut app,
        vec![
            user("hi"),
            message("Hello *there*.", "", Some((10, 5))),
            finished(None, None),
        ],
    );
    let rows = screen(&mut app, 80, 10);
    assert_eq!(
        rows.iter().filter(|r| r.contains("Hello there.")).count(),
        1,
        "{}",
        dump(&rows)
    );
    // No model name in the message keeps the configured one.
    assert!(rows[9].starts_with(" configured-model · ctx 15/32.8k (0%) · 15 tok"));
    // A streamed answer is not repeated by its logged message either.
    let mut app = new_app(true);
    app.on_event(&logged(user("hi")));
    app.on_event(&live(delta("Hello ")));
    app.on_event(&live(delta("*there*.")));
    app.on_event(&logged(message("Hello *there*.", "", None)));
    let answers = app
        .view
        .entries
        .iter()
        .filter(|e| matches!(e, Entry::Answer { .. }))
        .count();
    assert_eq!(answers, 1);
    assert_eq!(
        app.view.entries.last(),
        Some(&Entry::Answer {
            text: "Hello *there*.".to_string(),
            streaming: false
        })
    );
}

#[test]
fn an_unreadable_tool_call_shows_as_written_then_its_note_then_the_rewrite() {
    let mut app = new_app(false);
    app.on_event(&logged(user("list")));
    app.on_event(&live(delta("TOOL:list_dir {")));
    app.on_event(&logged(Kind::ToolCallUnreadable(spb::ToolCallUnreadable {
        text: "TOOL:list_dir {".into(),
        error: "the arguments are not valid JSON".into(),
        usage: Some(spb::TokenUsage {
            prompt_tokens: 10,
            completion_tokens: 2,
            total_tokens: 12,
            ..Default::default()
        }),
        attempt: 1,
    })));
    app.on_event(&live(delta("Listed.")));
    app.on_event(&logged(message("Listed.", "", Some((10, 3)))));
    let rows = screen(&mut app, 100, 12);
    let at = |needle: &str| {
        find_row(&rows, needle).unwrap_or_else(|| panic!("{needle}:\n{}", dump(&rows)))
    };
    let written = at("TOOL:list_dir {");
    let note =
        at("  (the model's tool call could not be read: the arguments are not valid JSON; it is");
    let answer = at("Listed.");
    assert!(written < note && note < answer, "{}", dump(&rows));
    // Both answers' tokens count.
    assert!(
        status_text(&app, 100).contains("25 tok"),
        "{}",
        status_text(&app, 100)
    );
}

#[test]
fn a_tool_block_shows_live_output_then_folds_its_result() {
    let mut app = new_app(true);
    let mut screen = Screen::new(80, 24);
    feed(
        &mut app,
        vec![
            user("list files"),
            requested("c1", "bash", r#"{"command":"echo hi"}"#),
        ],
    );
    let rows = screen.draw(&mut app);
    assert_eq!(rows[3], pad("· bash echo hi", 80), "{}", dump(&rows));
    feed(
        &mut app,
        vec![
            phase("c1", spb::ToolCallPhase::Executing),
            chunk("c1", "l1\nl2\nl3\n"),
            chunk("c1", "l4\nl5\nl6\nl7\nl8\n"),
        ],
    );
    // Running: the spinner and the last lines of the output.
    let rows = screen.draw(&mut app);
    let live_block: Vec<String> = [
        "⠋ bash echo hi",
        "  ⎿ l3",
        "    l4",
        "    l5",
        "    l6",
        "    l7",
        "    l8",
    ]
    .iter()
    .map(|r| pad(r, 80))
    .collect();
    assert_eq!(rows[3..10], live_block[..], "{}", dump(&rows));
    assert!(!shows(&rows, "l2"), "{}", dump(&rows));
    assert!(rows[23].contains("running bash"), "{}", dump(&rows));
    // The spinner moves although the block did not change.
    app.tick();
    let rows = screen.draw(&mut app);
    assert_eq!(rows[3], pad("⠙ bash echo hi", 80), "{}", dump(&rows));

    // The result replaces the live output, folded to its first line.
    feed(
        &mut app,
        vec![result(
            "c1",
            "bash",
            "hi\nsecond line\nthird line\n",
            false,
            1500,
        )],
    );
    let buffer = screen.buffer(&mut app);
    let rows = text_rows(&buffer);
    let folded: Vec<String> = [
        "✓ bash echo hi  1.5 s · runner-a",
        "  ⎿ hi",
        "    … 2 more lines (Ctrl+O shows them)",
        "",
    ]
    .iter()
    .map(|r| pad(r, 80))
    .collect();
    assert_eq!(rows[3..7], folded[..], "{}", dump(&rows));
    assert!(!shows(&rows, "second line"));
    assert!(!shows(&rows, "l8"), "the live output is gone");
    assert_eq!(buffer[(0, 3)].fg, Color::Green);
    // The model answers next.
    assert!(rows[23].contains("thinking"), "{}", dump(&rows));

    // Ctrl+O shows every line, and again folds them.
    assert!(app.on_key(ctrl('o')).is_empty());
    let rows = screen.draw(&mut app);
    let whole: Vec<String> = [
        "✓ bash echo hi  1.5 s · runner-a",
        "  ⎿ hi",
        "    second line",
        "    third line",
        "",
    ]
    .iter()
    .map(|r| pad(r, 80))
    .collect();
    assert_eq!(rows[3..8], whole[..], "{}", dump(&rows));
    assert!(!shows(&rows, "more lines"));
    app.on_key(ctrl('o'));
    let rows = screen.draw(&mut app);
    assert_eq!(rows[3..7], folded[..], "{}", dump(&rows));

    // A failed call is marked ✗, its output in the error style.
    feed(
        &mut app,
        vec![
            requested("c2", "bash", r#"{"command":"false"}"#),
            phase("c2", spb::ToolCallPhase::Executing),
            result("c2", "bash", "exit status 1", true, 12),
        ],
    );
    let buffer = screen.buffer(&mut app);
    let rows = text_rows(&buffer);
    let at = find_row(&rows, "✗ bash").expect("the failed call");
    assert_eq!(
        rows[at],
        pad("✗ bash false  12 ms · runner-a", 80),
        "{}",
        dump(&rows)
    );
    assert_eq!(rows[at + 1], pad("  ⎿ exit status 1", 80));
    assert_eq!(buffer[(0, at as u16)].fg, Color::Red);
    assert_eq!(buffer[(4, at as u16 + 1)].fg, Color::Red);
    assert!(matches!(
        app.view.entries.last(),
        Some(Entry::Tool(b)) if b.is_error && b.state == CallState::Done
    ));
}

#[test]
fn a_long_tool_output_line_is_cut_when_folded_and_wrapped_when_shown() {
    let mut app = new_app(false);
    let long = format!("{}{}", "a".repeat(30), "b".repeat(30));
    feed(
        &mut app,
        vec![
            user("go"),
            requested("c1", "bash", r#"{"command":"cat big"}"#),
            result("c1", "bash", &format!("{long}\nnext"), false, 5),
        ],
    );
    let rows = screen(&mut app, 40, 12);
    // 40 columns: the transcript keeps one free, the body four for its prefix.
    let at = find_row(&rows, "⎿").unwrap();
    assert_eq!(
        rows[at],
        pad(&format!("  ⎿ {}…", "a".repeat(30) + &"b".repeat(4)), 40),
        "{}",
        dump(&rows)
    );
    assert_eq!(
        rows[at + 1],
        pad("    … 1 more lines (Ctrl+O shows them)", 40)
    );
    app.on_key(ctrl('o'));
    let rows = screen(&mut app, 40, 12);
    let at = find_row(&rows, "⎿").unwrap();
    assert_eq!(
        rows[at],
        pad(&format!("  ⎿ {}", "a".repeat(30) + &"b".repeat(5)), 40),
        "{}",
        dump(&rows)
    );
    assert_eq!(rows[at + 1], pad(&format!("    {}", "b".repeat(25)), 40));
    assert_eq!(rows[at + 2], pad("    next", 40));
}

/// A turn with an edit waiting for approval, its diff fetched.
fn waiting_edit(color: bool) -> App {
    let mut app = new_app(color);
    let arguments = r#"{"path":"f","old":"old","new":"new"}"#;
    let actions = feed(
        &mut app,
        vec![
            user("fix f"),
            requested("c1", "edit_file", arguments),
            phase("c1", spb::ToolCallPhase::AwaitingApproval),
        ],
    );
    assert!(actions.is_empty());
    let actions = app.on_event(&logged(approval("c1", "edit_file", arguments, false)));
    assert_eq!(actions, vec![Action::Preview("c1".to_string())]);
    assert_eq!(app.question().map(|p| &p.preview), Some(&Preview::Loading));
    app.on_preview(
        "c1",
        Preview::Diff {
            diff: "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-old\n+new\n".to_string(),
            creates: false,
        },
    );
    app
}

const ALLOW: &str = " allow? [y]es · [n]o · [a]lways this session · [e]dit · Esc later ";

fn top_border(title: &str, width: usize) -> String {
    format!("┌{title}{}┐", "─".repeat(width - 2 - title.chars().count()))
}

#[test]
fn an_approval_shows_the_diff_and_takes_single_keys() {
    let mut app = new_app(true);
    let arguments = r#"{"path":"f","old":"old","new":"new"}"#;
    feed(
        &mut app,
        vec![
            user("fix f"),
            requested("c1", "edit_file", arguments),
            phase("c1", spb::ToolCallPhase::AwaitingApproval),
        ],
    );
    let actions = app.on_event(&logged(approval("c1", "edit_file", arguments, false)));
    assert_eq!(actions, vec![Action::Preview("c1".to_string())]);
    // While the diff is fetched.
    let rows = screen(&mut app, 80, 24);
    assert!(
        shows(&rows, "│(working out the change…)"),
        "{}",
        dump(&rows)
    );
    // A preview for another call changes nothing.
    app.on_preview("other", Preview::Failed("nope".to_string()));
    assert_eq!(app.question().unwrap().preview, Preview::Loading);
    app = waiting_edit(true);

    let mut screen = Screen::new(80, 24);
    let buffer = screen.buffer(&mut app);
    let rows = text_rows(&buffer);
    // 7 lines in a box of 9 rows above the input.
    let mut expected = vec![top_border(ALLOW, 80)];
    for line in [
        "the agent wants to run edit_file",
        "asked by the policy: edit_file needs confirmation",
        "--- a/f",
        "+++ b/f",
        "@@ -1 +1 @@",
        "-old",
        "+new",
        "[a]lways allows, for the rest of this session: edit_file of f",
    ] {
        expected.push(boxed(line, 80));
    }
    expected.push(format!("└{}┘", "─".repeat(78)));
    assert_eq!(rows[11..21], expected[..], "{}", dump(&rows));
    assert_eq!(
        rows[22],
        pad(
            "› answer the question above, or type to write a message first",
            80
        )
    );
    assert_eq!(rows[1], pad("› fix f", 80));
    assert_eq!(rows[3], pad("? edit_file f", 80), "{}", dump(&rows));
    assert!(rows[23].contains("waiting for you"), "{}", dump(&rows));
    // Removed lines red, added ones green.
    assert_eq!(buffer[(1, 17)].fg, Color::Red);
    assert_eq!(buffer[(1, 18)].fg, Color::Green);
    assert_eq!(buffer[(1, 16)].fg, Color::Cyan);

    // y approves (the question stays until the decision is logged).
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![decision("c1", ApprovalDecision::Approve, "")]
    );
    assert_eq!(
        press(&mut app, KeyCode::Char('A')),
        vec![decision("c1", ApprovalDecision::ApproveForSession, "")]
    );
    assert!(matches!(
        press(&mut app, KeyCode::Char('e')).as_slice(),
        [Action::EditArguments(r)] if r.call_id == "c1" && r.tool == "edit_file"
    ));
    // Other keys are no answer: they are typed.
    assert!(press(&mut app, KeyCode::Char('x')).is_empty());
    assert_eq!(app.input.text, "x");
    app.on_key(key(KeyCode::Backspace));
    assert!(app.input.is_empty());

    // The logged decision closes the question and marks the block.
    feed(
        &mut app,
        vec![
            decided("c1", ApprovalDecision::Approve),
            phase("c1", spb::ToolCallPhase::Executing),
            result("c1", "edit_file", "edited f", false, 3),
        ],
    );
    assert!(app.question().is_none());
    let rows = screen.draw(&mut app);
    assert!(!shows(&rows, "allow?"), "{}", dump(&rows));
    assert_eq!(
        rows[3],
        pad("✓ edit_file f  3 ms · runner-a · approved", 80),
        "{}",
        dump(&rows)
    );
    // Keys are plain typing again.
    assert!(press(&mut app, KeyCode::Char('y')).is_empty());
    assert_eq!(app.input.text, "y");
}

#[test]
fn a_denial_takes_a_reason() {
    let mut app = waiting_edit(true);
    assert!(press(&mut app, KeyCode::Char('n')).is_empty());
    assert_eq!(app.deny_reason.as_deref(), Some("c1"));
    let rows = screen(&mut app, 80, 24);
    let title = " why not? type a reason for the agent (optional), Enter · Esc back ";
    assert_eq!(rows[11], top_border(title, 80), "{}", dump(&rows));
    assert_eq!(rows[22], pad("reason›", 80), "{}", dump(&rows));
    // y and n are now part of the reason, not answers.
    assert!(type_text(&mut app, "  not yet, try again ").is_empty());
    let rows = screen(&mut app, 80, 24);
    assert_eq!(rows[22], pad("reason›   not yet, try again", 80));
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        vec![decision("c1", ApprovalDecision::Deny, "not yet, try again")]
    );
    assert!(app.deny_reason.is_none());
    assert!(app.input.is_empty());

    // Esc while typing a reason goes back to the question.
    press(&mut app, KeyCode::Char('n'));
    assert!(app.deny_reason.is_some());
    press(&mut app, KeyCode::Esc);
    assert!(app.deny_reason.is_none());
    assert!(app.question().is_some(), "not put aside");
    let rows = screen(&mut app, 80, 24);
    assert_eq!(rows[11], top_border(ALLOW, 80));

    // An empty reason denies without one.
    press(&mut app, KeyCode::Char('n'));
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        vec![decision("c1", ApprovalDecision::Deny, "")]
    );
}

#[test]
fn typing_a_message_first_does_not_answer_the_question() {
    let mut app = waiting_edit(true);
    // A key that is no answer is typed.
    assert!(press(&mut app, KeyCode::Char(' ')).is_empty());
    assert_eq!(app.input.text, " ");
    app.on_key(key(KeyCode::Backspace));
    assert!(app.input.is_empty());
    // Ctrl and Alt keys never answer.
    assert!(app.on_key(ctrl('y')).is_empty());
    assert!(
        app.on_key(KeyEvent::new(KeyCode::Char('y'), KeyModifiers::ALT))
            .is_empty()
    );
    // Once something is typed (here pasted), y, n, a and e are text.
    let mut app = waiting_edit(true);
    app.on_paste("add");
    assert!(type_text(&mut app, " tests y n a e").is_empty());
    assert_eq!(app.input.text, "add tests y n a e");
    assert!(app.deny_reason.is_none());
    let mut app = waiting_edit(true);
    // Typed: the first key is no answer ('d'), so the 'a' after it is text.
    assert!(type_text(&mut app, "dda").is_empty());
    assert_eq!(app.input.text, "dda");
    assert!(app.deny_reason.is_none());
    assert_eq!(app.approvals.len(), 1);
    let rows = screen(&mut app, 80, 24);
    assert_eq!(rows[22], pad("› dda", 80), "{}", dump(&rows));
    assert_eq!(rows[11], top_border(ALLOW, 80), "still shown");
    // Enter while the turn runs sends the message to steer it.
    let sent = press(&mut app, KeyCode::Enter);
    assert!(
        matches!(sent.as_slice(), [Action::Submit { text, plan: false, compact: false, .. }] if text == "dda"),
        "{sent:?}"
    );
    assert!(app.input.text.is_empty());
}

#[test]
fn a_question_is_put_aside_with_esc_and_brought_back_with_ctrl_a() {
    let mut app = waiting_edit(true);
    let mut screen = Screen::new(80, 24);
    assert!(press(&mut app, KeyCode::Esc).is_empty());
    assert!(app.question().is_none());
    let rows = screen.draw(&mut app);
    assert!(!shows(&rows, "allow?"), "{}", dump(&rows));
    assert!(!shows(&rows, "+new"), "{}", dump(&rows));
    // Put aside, the keys are typing: y is no answer.
    assert!(press(&mut app, KeyCode::Char('y')).is_empty());
    assert_eq!(app.input.text, "y");
    app.on_key(key(KeyCode::Backspace));
    assert!(app.on_key(ctrl('a')).is_empty());
    assert!(app.question().is_some());
    let rows = screen.draw(&mut app);
    assert_eq!(rows[11], top_border(ALLOW, 80), "{}", dump(&rows));
    assert!(shows(&rows, "│+new"));
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![decision("c1", ApprovalDecision::Approve, "")]
    );
}

#[test]
fn a_second_question_waits_behind_the_first() {
    let mut app = waiting_edit(true);
    let actions = feed(
        &mut app,
        vec![
            requested("c2", "bash", r#"{"command":"rm -rf build"}"#),
            approval("c2", "bash", r#"{"command":"rm -rf build"}"#, false),
        ],
    );
    assert!(actions.is_empty(), "bash has nothing to preview");
    // (At 80 columns the keys' title is cut before the count.)
    let rows = screen(&mut app, 100, 24);
    assert!(
        shows(&rows, "Esc later · 1 more waiting "),
        "{}",
        dump(&rows)
    );
    // The same request again is not asked twice.
    app.on_event(&logged(approval(
        "c2",
        "bash",
        r#"{"command":"rm -rf build"}"#,
        false,
    )));
    assert_eq!(app.approvals.len(), 2);
    feed(&mut app, vec![decided("c1", ApprovalDecision::Approve)]);
    let rows = screen(&mut app, 80, 24);
    assert!(
        shows(&rows, "│the agent wants to run bash"),
        "{}",
        dump(&rows)
    );
    assert!(shows(&rows, "│$ rm -rf build"), "{}", dump(&rows));
    assert!(!shows(&rows, "more waiting"));
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![decision("c2", ApprovalDecision::Approve, "")]
    );
}

#[test]
fn an_approval_with_an_unknown_outcome_answers_check_run_or_skip() {
    let mut app = new_app(true);
    let arguments = r#"{"command":"make deploy"}"#;
    let actions = feed(
        &mut app,
        vec![
            user("deploy"),
            requested("c9", "bash", arguments),
            approval("c9", "bash", arguments, true),
        ],
    );
    assert!(actions.is_empty());
    let rows = screen(&mut app, 80, 24);
    let at = find_row(&rows, "┌ [c]heck first · [r]un again · [s]kip ─").unwrap();
    assert_eq!(
        rows[at + 1..at + 4],
        [
            boxed(
                "the runtime restarted while this bash call was running: it may or may not have",
                80
            ),
            boxed("taken effect", 80),
            boxed("$ make deploy", 80),
        ],
        "{}",
        dump(&rows)
    );
    assert!(!shows(&rows, "asked by the policy"));
    for (c, expected) in [
        ('c', ApprovalDecision::Check),
        ('r', ApprovalDecision::Approve),
        ('s', ApprovalDecision::Deny),
    ] {
        assert_eq!(
            press(&mut app, KeyCode::Char(c)),
            vec![decision("c9", expected, "")]
        );
    }
    // y and n are no answers here.
    assert!(press(&mut app, KeyCode::Char('n')).is_empty());
    assert!(app.deny_reason.is_none());
    assert_eq!(app.input.text, "n");
}

#[test]
fn a_long_question_scrolls_inside_its_box() {
    let mut app = new_app(true);
    let arguments = r#"{"path":"big.txt","content":"x"}"#;
    feed(
        &mut app,
        vec![
            user("write"),
            requested("c1", "write_file", arguments),
            approval("c1", "write_file", arguments, false),
        ],
    );
    let diff: String = (1..=40).map(|i| format!("+line {i}\n")).collect();
    app.on_preview(
        "c1",
        Preview::Diff {
            diff,
            creates: true,
        },
    );
    let rows = screen(&mut app, 80, 24);
    assert!(shows(&rows, "│(a new file)"), "{}", dump(&rows));
    assert!(shows(&rows, "PgUp/PgDn: 1–"), "{}", dump(&rows));
    assert!(!shows(&rows, "+line 40"));
    app.on_key(key(KeyCode::PageDown));
    app.on_key(key(KeyCode::PageDown));
    app.on_key(key(KeyCode::PageDown));
    app.on_key(key(KeyCode::PageDown));
    let rows = screen(&mut app, 80, 24);
    assert!(shows(&rows, "│+line 40 "), "{}", dump(&rows));
    assert!(shows(&rows, "of 44 lines"), "{}", dump(&rows));
    // The status line is still the last row.
    assert!(rows[23].starts_with(" configured-model"), "{}", dump(&rows));
}

#[test]
fn enter_sends_and_alt_enter_breaks_the_line() {
    let mut app = new_app(true);
    assert!(type_text(&mut app, "  hello there ").is_empty());
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        vec![Action::Submit {
            text: "hello there".to_string(),
            plan: false,
            network: false,
            limits: Limits::default(),
            compact: false,
        }]
    );
    assert!(app.input.is_empty());
    // Enter on nothing sends nothing.
    assert!(press(&mut app, KeyCode::Enter).is_empty());

    type_text(&mut app, "first line");
    assert!(
        app.on_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::ALT))
            .is_empty()
    );
    type_text(&mut app, "second");
    app.on_key(ctrl('j'));
    type_text(&mut app, "third");
    assert_eq!(app.input.text, "first line\nsecond\nthird");
    let mut screen = Screen::new(60, 12);
    let rows = screen.draw(&mut app);
    assert_eq!(
        rows[7..],
        [
            "─".repeat(60),
            pad("› first line", 60),
            pad("  second", 60),
            pad("  third", 60),
            rows[11].clone(),
        ],
        "{}",
        dump(&rows)
    );
    assert!(rows[11].starts_with(" configured-model"));
    assert_eq!(screen.cursor(), Position::new(7, 10));
    app.on_key(key(KeyCode::Home));
    app.on_key(key(KeyCode::Up)); // no history walk in a multi-line input
    assert_eq!(app.input.text, "first line\nsecond\nthird");
    screen.draw(&mut app);
    assert_eq!(screen.cursor(), Position::new(2, 10));
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        vec![Action::Submit {
            text: "first line\nsecond\nthird".to_string(),
            plan: false,
            network: false,
            limits: Limits::default(),
            compact: false,
        }]
    );
    let rows = screen.draw(&mut app);
    assert_eq!(rows[9], "─".repeat(60), "{}", dump(&rows));
    assert!(rows[10].starts_with("› message the agent"));
}

#[test]
fn the_line_editor_moves_and_deletes() {
    let mut app = new_app(true);
    type_text(&mut app, "héllo wörld");
    app.on_key(key(KeyCode::Left));
    app.on_key(key(KeyCode::Left));
    app.on_key(key(KeyCode::Backspace));
    assert_eq!(app.input.text, "héllo wöld");
    app.on_key(key(KeyCode::Delete));
    assert_eq!(app.input.text, "héllo wöd");
    app.on_key(key(KeyCode::Home));
    type_text(&mut app, ">");
    assert_eq!(app.input.text, ">héllo wöd");
    app.on_key(ctrl('e'));
    app.on_key(ctrl('w'));
    assert_eq!(app.input.text, ">héllo ");
    // Ctrl+D deletes under the cursor when there is text.
    app.on_key(key(KeyCode::Home));
    assert!(app.on_key(ctrl('d')).is_empty());
    assert_eq!(app.input.text, "héllo ");
    app.on_key(ctrl('u'));
    assert!(app.input.is_empty());
    // Pasted text keeps its lines, without carriage returns.
    app.on_paste("one\r\ntwo\rthree");
    assert_eq!(app.input.text, "one\ntwo\nthree");
}

#[test]
fn up_and_down_walk_the_history() {
    let mut app = new_app(true);
    for text in ["first", "second", "second"] {
        type_text(&mut app, text);
        assert_eq!(press(&mut app, KeyCode::Enter).len(), 1);
    }
    type_text(&mut app, "draft");
    press(&mut app, KeyCode::Up);
    assert_eq!(app.input.text, "second");
    press(&mut app, KeyCode::Up);
    assert_eq!(app.input.text, "first", "repeats are kept once");
    press(&mut app, KeyCode::Up);
    assert_eq!(app.input.text, "first");
    let rows = screen(&mut app, 40, 8);
    assert_eq!(rows[6], pad("› first", 40), "{}", dump(&rows));
    press(&mut app, KeyCode::Down);
    assert_eq!(app.input.text, "second");
    press(&mut app, KeyCode::Down);
    assert_eq!(app.input.text, "draft", "back to what was being typed");
    press(&mut app, KeyCode::Down);
    assert_eq!(app.input.text, "draft");
    // A recalled message is sent as it is.
    app.on_key(ctrl('u'));
    press(&mut app, KeyCode::Up);
    assert!(matches!(
        press(&mut app, KeyCode::Enter).as_slice(),
        [Action::Submit { text, .. }] if text == "second"
    ));
}

#[test]
fn slash_commands_are_suggested_and_completed() {
    let mut app = new_app(true);
    type_text(&mut app, "/");
    assert_eq!(app.suggestions().len(), super::app::COMMANDS.len());
    let rows = screen(&mut app, 80, 24);
    // Six suggestions above the input.
    assert_eq!(
        rows[15..21],
        [
            pad("  /help      this list", 80),
            pad(
                "  /plan      plan mode for every message on or off; `/plan MESSAGE` for one",
                80
            ),
            pad(
                "  /network   outbound network for the agent's commands on or off",
                80
            ),
            pad("  /session   this session's id", 80),
            pad("  /sessions  pick another session", 80),
            pad(
                "  /model     the model and its context window; `/model NAME` switches it",
                80
            ),
        ],
        "{}",
        dump(&rows)
    );
    assert_eq!(rows[22], pad("› /", 80));
    assert!(rows[23].starts_with(" configured-model"));

    type_text(&mut app, "se");
    let rows = screen(&mut app, 80, 24);
    assert_eq!(
        rows[19..21],
        [
            pad("  /session   this session's id", 80),
            pad("  /sessions  pick another session", 80),
        ],
        "{}",
        dump(&rows)
    );
    assert!(!shows(&rows, "/help"));
    // Tab: the prefix the options share, then the one left and a space.
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.input.text, "/session");
    assert_eq!(app.suggestions(), vec![super::app::COMMANDS[4]]);
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.input.text, "/sessions ");
    assert!(app.suggestions().is_empty());
    let rows = screen(&mut app, 80, 24);
    assert!(!shows(&rows, "pick another session"), "{}", dump(&rows));
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.input.text, "/sessions ");

    // One match completes at once; no match changes nothing.
    app.on_key(ctrl('u'));
    type_text(&mut app, "/he");
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.input.text, "/help ");
    app.on_key(ctrl('u'));
    type_text(&mut app, "/zz");
    assert!(app.suggestions().is_empty());
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.input.text, "/zz");
    // Text that is not a command has no suggestions.
    app.on_key(ctrl('u'));
    type_text(&mut app, "he/");
    assert!(app.suggestions().is_empty());
}

#[test]
fn commands_change_the_chat_or_say_they_are_unknown() {
    let mut app = new_app(true);
    type_text(&mut app, "/foo bar");
    assert!(press(&mut app, KeyCode::Enter).is_empty());
    assert_eq!(
        app.view.entries.last(),
        Some(&Entry::Note(
            "unknown command /foo; /help lists them".to_string(),
            NoteKind::Error
        ))
    );
    let buffer = Screen::new(80, 24).buffer(&mut app);
    let rows = text_rows(&buffer);
    assert_eq!(
        rows[0],
        pad("unknown command /foo; /help lists them", 80),
        "{}",
        dump(&rows)
    );
    assert_eq!(buffer[(0, 0)].fg, Color::Red);

    type_text(&mut app, "/plan");
    press(&mut app, KeyCode::Enter);
    type_text(&mut app, "/network");
    press(&mut app, KeyCode::Enter);
    assert!(app.plan_mode && app.network);
    let rows = screen(&mut app, 80, 24);
    assert!(
        rows[23].starts_with(
            " configured-model · ctx 0/32.8k (0%) · 0 tok · 5f3c9a1e-7b2d · plan · net "
        ),
        "{}",
        dump(&rows)
    );
    type_text(&mut app, "/budget tokens 5000");
    press(&mut app, KeyCode::Enter);
    type_text(&mut app, "go");
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        vec![Action::Submit {
            text: "go".to_string(),
            plan: true,
            network: true,
            limits: Limits {
                turn_tokens: 5000,
                ..Limits::default()
            },
            compact: false,
        }]
    );
    // The limits go with one message only.
    type_text(&mut app, "again");
    assert!(matches!(
        press(&mut app, KeyCode::Enter).as_slice(),
        [Action::Submit { limits, .. }] if *limits == Limits::default()
    ));
    type_text(&mut app, "/budget tokens lots");
    press(&mut app, KeyCode::Enter);
    assert!(matches!(
        app.view.entries.last(),
        Some(Entry::Note(text, NoteKind::Error)) if text.contains("not a positive number")
    ));
    type_text(&mut app, "/plan just this");
    app.on_key(ctrl('o')); // no effect on the input
    assert!(matches!(
        press(&mut app, KeyCode::Enter).as_slice(),
        [Action::Submit { text, plan: true, .. }] if text == "just this"
    ));
    type_text(&mut app, "/rewind 2");
    assert_eq!(press(&mut app, KeyCode::Enter), vec![Action::Rewind(2)]);
    type_text(&mut app, "/rewind two");
    assert!(press(&mut app, KeyCode::Enter).is_empty());
    type_text(&mut app, "/session");
    press(&mut app, KeyCode::Enter);
    assert_eq!(
        app.view.entries.last(),
        Some(&Entry::Note(format!("session {SESSION}"), NoteKind::Info))
    );
    type_text(&mut app, "/model");
    press(&mut app, KeyCode::Enter);
    assert_eq!(
        app.view.entries.last(),
        Some(&Entry::Note(
            "model configured-model, 32768-token context window".to_string(),
            NoteKind::Info
        ))
    );
    type_text(&mut app, "/compact");
    assert!(matches!(
        press(&mut app, KeyCode::Enter).as_slice(),
        [Action::Submit { compact: true, .. }]
    ));
    type_text(&mut app, "/help");
    press(&mut app, KeyCode::Enter);
    let rows = screen(&mut app, 100, 40);
    assert!(shows(&rows, "/rewind    `/rewind N`"), "{}", dump(&rows));
    type_text(&mut app, "/exit");
    assert_eq!(press(&mut app, KeyCode::Enter), vec![Action::Quit]);
}

#[test]
fn ctrl_c_cancels_a_turn_and_ctrl_d_leaves() {
    let mut app = new_app(true);
    // No turn: Ctrl+C clears the input.
    type_text(&mut app, "half a thought");
    assert!(app.on_key(ctrl('c')).is_empty());
    assert!(app.input.is_empty());
    feed(&mut app, vec![user("run the tests")]);
    assert!(app.view.turn_open);
    let rows = screen(&mut app, 80, 24);
    assert_eq!(
        rows[22],
        pad("› working… Enter steers the turn · Ctrl+C cancels", 80)
    );
    assert_eq!(app.on_key(ctrl('c')), vec![Action::Cancel]);
    // A message while the turn runs steers it; it shows as pending until
    // the model gets it.
    type_text(&mut app, "and then?");
    let sent = press(&mut app, KeyCode::Enter);
    assert!(
        matches!(sent.as_slice(), [Action::Submit { text, plan: false, .. }] if text == "and then?"),
        "{sent:?}"
    );
    feed(
        &mut app,
        vec![Kind::SteeringQueued(spb::SteeringQueued {
            text: "and then?".into(),
        })],
    );
    let rows = screen(&mut app, 80, 24);
    assert!(shows(&rows, "› and then?"), "{}", dump(&rows));
    assert!(
        shows(&rows, "pending: the model gets this"),
        "{}",
        dump(&rows)
    );
    assert!(shows(&rows, "1 pending"), "{}", dump(&rows));
    feed(
        &mut app,
        vec![Kind::SteeringDelivered(spb::SteeringDelivered { count: 1 })],
    );
    let rows = screen(&mut app, 80, 24);
    assert!(!shows(&rows, "1 pending"), "{}", dump(&rows));
    assert!(
        shows(&rows, "the model got your message"),
        "{}",
        dump(&rows)
    );
    feed(
        &mut app,
        vec![
            Kind::CancelRequested(spb::CancelRequested::default()),
            Kind::TurnFinished(spb::TurnFinished {
                outcome: spb::TurnOutcome::Cancelled as i32,
                steps: 1,
                ..Default::default()
            }),
        ],
    );
    assert!(!app.view.turn_open);
    let rows = screen(&mut app, 80, 24);
    assert!(shows(&rows, "(cancelling…)"), "{}", dump(&rows));
    assert!(shows(&rows, "(turn cancelled)"), "{}", dump(&rows));
    assert!(rows[23].ends_with("ready "), "{}", dump(&rows));
    // Ctrl+D leaves on an empty input.
    assert_eq!(app.on_key(ctrl('d')), vec![Action::Quit]);
    // Key releases are ignored.
    let mut release = ctrl('d');
    release.kind = ratatui::crossterm::event::KeyEventKind::Release;
    assert!(app.on_key(release).is_empty());
}

#[test]
fn the_session_picker_lists_and_opens_sessions() {
    let mut app = new_app(true);
    type_text(&mut app, "/sessions");
    assert_eq!(press(&mut app, KeyCode::Enter), vec![Action::ListSessions]);
    let rows = screen(&mut app, 80, 24);
    assert!(
        shows(
            &rows,
            "sessions: type to filter · ↑/↓ choose · Enter open · Esc close"
        ),
        "{}",
        dump(&rows)
    );
    assert!(shows(&rows, "│loading…"), "{}", dump(&rows));
    let row = |id: &str, title: &str| PickerRow {
        id: id.to_string(),
        title: title.to_string(),
        age: "2 min ago".to_string(),
        events: 12,
        name: String::new(),
        place: "scratch".to_string(),
    };
    app.on_sessions(vec![
        row(SESSION, "this one"),
        row("aaaaaaaa-other", "another one"),
    ]);
    let buffer = Screen::new(80, 24).buffer(&mut app);
    let rows = text_rows(&buffer);
    let at = find_row(&rows, "● 5f3c9a1e this one").expect("the current session");
    assert!(
        rows[at].contains(" scratch · 2 min ago · 12 events "),
        "{}",
        dump(&rows)
    );
    assert!(
        rows[at + 1].contains("  aaaaaaaa another one"),
        "{}",
        dump(&rows)
    );
    // The selected row is reversed.
    let x = column_of(&rows[at], "●");
    assert!(buffer[(x, at as u16)].modifier.contains(Modifier::REVERSED));
    assert!(
        !buffer[(x, at as u16 + 1)]
            .modifier
            .contains(Modifier::REVERSED)
    );
    // Enter on this session closes the picker only.
    assert!(press(&mut app, KeyCode::Enter).is_empty());
    assert!(app.picker.is_none());
    type_text(&mut app, "/sessions");
    press(&mut app, KeyCode::Enter);
    app.on_sessions(vec![row(SESSION, "this one"), row("aaaaaaaa-other", "x")]);
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Down);
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        vec![Action::OpenSession("aaaaaaaa-other".to_string())]
    );
    // Esc closes it; keys do not reach the input meanwhile.
    type_text(&mut app, "/sessions");
    press(&mut app, KeyCode::Enter);
    type_text(&mut app, "abc");
    assert!(app.input.is_empty());
    press(&mut app, KeyCode::Esc);
    assert!(app.picker.is_none());
}

/// A chat with something of everything: an answer with code, a folded
/// call, a failed call, notes, a question with a diff and suggestions.
fn busy_app(color: bool) -> App {
    let mut app = waiting_edit(color);
    feed(
        &mut app,
        vec![
            requested("c0", "bash", r#"{"command":"ls"}"#),
            phase("c0", spb::ToolCallPhase::Executing),
            chunk("c0", "a\nb\n"),
            result("c0", "bash", "a\nb\nc", false, 20),
            requested("c2", "bash", r#"{"command":"false"}"#),
            result("c2", "bash", "failed", true, 20),
            message(ANSWER, "qwen3-coder", Some((20000, 500))),
            Kind::Error(spb::Error {
                message: "the model server is slow".to_string(),
                ..Default::default()
            }),
            reminder("stand up", spb::ReminderKind::Notify),
        ],
    );
    app.on_event(&live(delta(
        "more *text* with `code` and a [link](https://x.org)",
    )));
    app.on_event(&logged(finished(None, Some(0.5))));
    // The turn's end cleared the question: ask again.
    feed(
        &mut app,
        vec![
            user("again"),
            requested("c3", "edit_file", r#"{"path":"g"}"#),
            approval("c3", "edit_file", r#"{"path":"g"}"#, false),
        ],
    );
    app.on_preview(
        "c3",
        Preview::Diff {
            diff: "--- a/g\n+++ b/g\n@@ -1 +1 @@\n-x\n+y\n".to_string(),
            creates: false,
        },
    );
    type_text(&mut app, "/");
    app
}

#[test]
fn every_size_draws_with_the_status_line_last() {
    for (width, height) in [(80, 24), (120, 40), (40, 10), (20, 5), (12, 4)] {
        let mut app = busy_app(true);
        let rows = screen(&mut app, width, height);
        assert_eq!(rows.len(), usize::from(height));
        // The status line, as wide as the window allows.
        let status: String = status_text(&app, width)
            .chars()
            .take(usize::from(width))
            .collect();
        let last = rows.last().unwrap();
        assert_eq!(*last, status, "{width}x{height}\n{}", dump(&rows));
        if width >= 40 {
            assert!(last.starts_with(" qwen3"), "{width}x{height}: {last:?}");
        }
        if width >= 20 {
            assert!(
                last.contains("waiting for you"),
                "{width}x{height}: {last:?}"
            );
        }
        // The picker over everything, too.
        app.picker = Some(super::app::Picker {
            rows: Some(vec![PickerRow {
                id: "abcdefgh-1".to_string(),
                title: "a session with a long title that will not fit".to_string(),
                age: "1 h ago".to_string(),
                events: 3,
                name: "named".to_string(),
                place: "~/code/agentry".to_string(),
            }]),
            selected: 0,
            filter: "ab".to_string(),
        });
        let rows = screen(&mut app, width, height);
        assert_eq!(rows.len(), usize::from(height));
    }
    // Tiny windows draw without a panic; an idle chat keeps its status
    // line last down to three rows.
    for (width, height) in [(5, 3), (80, 3), (80, 2), (1, 1), (0, 0), (3, 0), (0, 3)] {
        let mut app = busy_app(true);
        assert_eq!(screen(&mut app, width, height).len(), usize::from(height));
        let mut app = new_app(true);
        let rows = screen(&mut app, width, height);
        if height >= 3 && width > 0 {
            let status: String = status_text(&app, width)
                .chars()
                .take(usize::from(width))
                .collect();
            assert_eq!(*rows.last().unwrap(), status, "{width}x{height}");
        }
    }
    // Wide enough, the status line carries everything.
    let app = busy_app(true);
    let status = status_text(&app, 120);
    assert!(
        status.starts_with(
            " qwen3-coder · ctx 20.5k/32.8k (63%) · 20.5k tok · $0.50 · 5f3c9a1e-7b2d "
        ),
        "{status:?}"
    );
    assert!(status.contains(" waiting for you "), "{status:?}");
    assert_eq!(status.chars().count(), 120);
    // Narrower, the left part gives way to what runs.
    let status = status_text(&app, 80);
    assert!(
        status.starts_with(
            " qwen3-coder · ctx 20.5k/32.8k (63%) · 20.5k tok · $0.50 … ⠋ waiting for you "
        ),
        "{status:?}"
    );
    assert_eq!(status.chars().count(), 80);
}

#[test]
fn a_scrolled_transcript_says_how_far_it_is_from_the_end() {
    let mut app = new_app(true);
    for i in 0..30 {
        app.note(format!("note {i}"), NoteKind::Info);
    }
    let mut screen = Screen::new(40, 12);
    let rows = screen.draw(&mut app);
    // 60 lines (each note and a blank), 9 rows: the end shows.
    assert_eq!(rows[7], pad("note 29", 40), "{}", dump(&rows));
    assert_eq!(rows[8], pad("", 40));
    app.on_key(key(KeyCode::PageUp));
    let rows = screen.draw(&mut app);
    assert_eq!(rows[1], pad("note 21", 40), "{}", dump(&rows));
    assert_eq!(rows[7], pad("note 24", 40), "{}", dump(&rows));
    assert_eq!(
        rows[8],
        format!("{} ↓ 10 more lines (PgDn) ", " ".repeat(16)),
        "{}",
        dump(&rows)
    );
    // Scrolling past the start stops at the first line.
    app.scroll_by(1000);
    let rows = screen.draw(&mut app);
    assert_eq!(rows[0], pad("note 0", 40), "{}", dump(&rows));
    assert_eq!(app.scroll, 60 - 9);
    app.on_key(key(KeyCode::PageDown));
    assert_eq!(app.scroll, 60 - 9 - 10);
    // Sending a message goes back to the end.
    type_text(&mut app, "hi");
    press(&mut app, KeyCode::Enter);
    assert_eq!(app.scroll, 0);
    let rows = screen.draw(&mut app);
    assert!(!shows(&rows, "PgDn"), "{}", dump(&rows));
}

#[test]
fn without_colour_no_cell_has_one() {
    for width in [80, 40] {
        let mut app = busy_app(false);
        let buffer = Screen::new(width, 30).buffer(&mut app);
        let rows = text_rows(&buffer);
        // The screen has what the colours would mark.
        assert!(shows(&rows, "│-x"), "{}", dump(&rows));
        assert!(shows(&rows, "/help"), "{}", dump(&rows));
        for cell in &buffer.content {
            assert_eq!(cell.fg, Color::Reset, "{cell:?}\n{}", dump(&rows));
            assert_eq!(cell.bg, Color::Reset, "{cell:?}\n{}", dump(&rows));
        }
        // The status line stands out by reverse video instead.
        let y = buffer.area.height - 1;
        assert!(buffer[(0, y)].modifier.contains(Modifier::REVERSED));
    }
    let mut app = new_app(false);
    app.on_event(&logged(message(ANSWER, "", None)));
    let buffer = Screen::new(80, 24).buffer(&mut app);
    assert!(
        buffer[(8, 0)].modifier.contains(Modifier::BOLD),
        "bold stays"
    );

    let mut app = busy_app(true);
    let buffer = Screen::new(80, 30).buffer(&mut app);
    let colours: std::collections::HashSet<Color> = buffer
        .content
        .iter()
        .flat_map(|c| [c.fg, c.bg])
        .filter(|c| *c != Color::Reset)
        .collect();
    for colour in [Color::Red, Color::Green, Color::Yellow, Color::DarkGray] {
        assert!(colours.contains(&colour), "{colour:?} in {colours:?}");
    }
}

#[test]
fn reminders_and_costs_show_as_notes_and_in_the_status_line() {
    let mut app = new_app(true);
    let mut screen = Screen::new(80, 24);
    // A reminder while nothing runs.
    let actions = feed(
        &mut app,
        vec![reminder("stand up", spb::ReminderKind::Notify)],
    );
    assert!(actions.is_empty());
    assert!(!app.view.turn_open);
    let buffer = screen.buffer(&mut app);
    let rows = text_rows(&buffer);
    assert!(rows[0].starts_with("⏰"), "{}", dump(&rows));
    assert!(rows[0].contains(" reminder: stand up"), "{}", dump(&rows));
    assert_eq!(buffer[(0, 0)].fg, Color::LightRed, "an arrived note");
    assert!(rows[23].ends_with("ready "));
    assert!(!rows[23].contains('$'), "no cost before a priced turn");

    // A priced turn adds to the session's cost.
    feed(
        &mut app,
        vec![
            user("one"),
            message("first", "", Some((100, 20))),
            finished(Some((100, 20)), Some(0.0012)),
        ],
    );
    let rows = screen.draw(&mut app);
    assert!(
        shows(&rows, "  (1 step, 120 tokens (100 in, 20 out), $0.0012)"),
        "{}",
        dump(&rows)
    );
    assert!(
        rows[23]
            .starts_with(" configured-model · ctx 120/32.8k (0%) · 120 tok · $0.0012 · 5f3c9a1e"),
        "{}",
        dump(&rows)
    );
    feed(
        &mut app,
        vec![
            user("two"),
            message("second", "", Some((200, 30))),
            finished(None, Some(0.003)),
        ],
    );
    let rows = screen.draw(&mut app);
    assert!(
        shows(&rows, "  (1 step, $0.0030; session $0.0042)"),
        "{}",
        dump(&rows)
    );
    assert!(
        rows[23]
            .starts_with(" configured-model · ctx 230/32.8k (1%) · 350 tok · $0.0042 · 5f3c9a1e"),
        "{}",
        dump(&rows)
    );
    assert!((app.view.session_cost - 0.0042).abs() < 1e-12);
    assert_eq!(app.view.currency, "USD");

    // A task reminder starts a turn.
    feed(
        &mut app,
        vec![reminder("check the build", spb::ReminderKind::Task)],
    );
    assert!(app.view.turn_open);
    let rows = screen.draw(&mut app);
    assert!(shows(&rows, "reminder: check the build"), "{}", dump(&rows));
    assert!(rows[23].contains("thinking"), "{}", dump(&rows));
    // Errors are notes too.
    feed(
        &mut app,
        vec![Kind::Error(spb::Error {
            message: "model unreachable".to_string(),
            ..Default::default()
        })],
    );
    assert_eq!(
        app.view.entries.last(),
        Some(&Entry::Note(
            "error: model unreachable".to_string(),
            NoteKind::Error
        ))
    );
}

#[test]
fn other_currencies_show_their_code() {
    let mut app = new_app(true);
    feed(
        &mut app,
        vec![
            user("one"),
            Kind::TurnFinished(spb::TurnFinished {
                outcome: spb::TurnOutcome::Completed as i32,
                steps: 2,
                cost: Some(1.5),
                currency: "EUR".to_string(),
                ..Default::default()
            }),
        ],
    );
    let rows = screen(&mut app, 80, 24);
    assert!(rows[23].contains(" · 1.50 EUR · "), "{}", dump(&rows));
    assert!(shows(&rows, "  (2 steps, 1.50 EUR)"), "{}", dump(&rows));
}

/// Whether the buffer holds a control character anywhere.
fn has_control(buffer: &Buffer) -> bool {
    buffer
        .content
        .iter()
        .any(|c| c.symbol().chars().any(char::is_control))
}

#[test]
fn control_characters_never_reach_the_screen() {
    let mut app = new_app(true);
    let evil = "\x1b[2J\x1b]0;owned\x07";
    feed(&mut app, vec![user(&format!("hi{evil}"))]);
    app.on_event(&live(delta(&format!("answer{evil}"))));
    let buffer = Screen::new(80, 24).buffer(&mut app);
    assert!(!has_control(&buffer));
    feed(
        &mut app,
        vec![
            message(&format!("answer{evil} done\r\n\tindented"), "", None),
            requested(
                "c1",
                "bash",
                &format!(r#"{{"command":"printf '{}'"}}"#, "\\u001b[2J"),
            ),
            phase("c1", spb::ToolCallPhase::Executing),
            chunk("c1", &format!("live{evil}\r\n")),
        ],
    );
    let buffer = Screen::new(80, 24).buffer(&mut app);
    let rows = text_rows(&buffer);
    assert!(!has_control(&buffer), "{}", dump(&rows));
    assert!(shows(&rows, "› hi\\e[2J\\e]0;owned\\a"), "{}", dump(&rows));
    assert!(
        shows(&rows, "answer\\e[2J\\e]0;owned\\a done"),
        "{}",
        dump(&rows)
    );
    // The tab became spaces (a paragraph's continuation, so trimmed).
    assert!(shows(&rows, "owned\\a done indented"), "{}", dump(&rows));
    assert!(shows(&rows, "printf '\\e[2J'"), "{}", dump(&rows));
    assert!(
        shows(&rows, "  ⎿ live\\e[2J\\e]0;owned\\a"),
        "{}",
        dump(&rows)
    );
    feed(
        &mut app,
        vec![
            result("c1", "bash", &format!("out{evil}\nline two\x08"), true, 1),
            Kind::Error(spb::Error {
                message: format!("bad{evil}"),
                ..Default::default()
            }),
            reminder(&format!("ring{evil}"), spb::ReminderKind::Notify),
        ],
    );
    app.on_key(ctrl('o'));
    let arguments = format!(r#"{{"path":"x{}","content":"y"}}"#, "\\u0007");
    feed(
        &mut app,
        vec![
            requested("c2", "write_file", &arguments),
            approval("c2", "write_file", &arguments, false),
        ],
    );
    app.on_preview(
        "c2",
        Preview::Diff {
            diff: format!("--- a/x\n+++ b/x\n+y{evil}\n"),
            creates: true,
        },
    );
    app.on_paste("pasted\x1b[31m");
    let buffer = Screen::new(80, 40).buffer(&mut app);
    let rows = text_rows(&buffer);
    assert!(!has_control(&buffer), "{}", dump(&rows));
    for needle in [
        "  ⎿ out\\e[2J\\e]0;owned\\a",
        "    line two\\b",
        "error: bad\\e[2J\\e]0;owned\\a",
        "reminder: ring\\e[2J\\e]0;owned\\a",
        "│+y\\e[2J\\e]0;owned\\a",
        "› pasted\\e[31m",
    ] {
        assert!(shows(&rows, needle), "{needle:?}\n{}", dump(&rows));
    }
    // What the app keeps is clean as well, not only what ratatui draws.
    for entry in &app.view.entries {
        let text = match entry {
            Entry::User { text: t, .. } | Entry::Note(t, _) | Entry::Answer { text: t, .. } => {
                t.clone()
            }
            Entry::Tool(b) => format!("{}{}{}", b.tool, b.summary, b.output),
            Entry::Turn(n) => n.to_string(),
        };
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{entry:?}"
        );
    }
    assert!(!app.input.text.chars().any(char::is_control));
}

#[test]
fn a_key_typed_as_a_question_appears_goes_to_the_message() {
    // The guard people have: a question just shown takes no single key.
    let mut app = App::new(Theme { color: true }, SESSION, MODEL, 32768, false);
    assert_eq!(app.answer_guard, super::app::ANSWER_GUARD);
    app.on_event(&logged(Kind::ApprovalRequested(spb::ApprovalRequested {
        call_id: "b1".into(),
        tool: "bash".into(),
        arguments_json: r#"{"command":"ls"}"#.into(),
        ..Default::default()
    })));
    let typed = app.on_key(KeyEvent::new(KeyCode::Char('a'), KeyModifiers::NONE));
    assert_eq!(typed, Vec::new());
    assert_eq!(app.input.text, "a");
}

#[test]
fn a_sub_agents_question_is_kept_apart_from_the_parents_and_answered_to_its_session() {
    let mut app = new_app(true);
    let ask = |tool: &str, args: &str, rule: &str| {
        Kind::ApprovalRequested(spb::ApprovalRequested {
            call_id: "call_1".into(),
            tool: tool.into(),
            arguments_json: args.into(),
            matched_rule: rule.into(),
            ..Default::default()
        })
    };
    let relayed = |kind: Kind| spb::Event {
        session_id: "sub-0011".into(),
        seq: 4,
        turn_id: "child-turn".into(),
        kind: Some(kind),
        live: true,
        time: None,
        by: String::new(),
    };
    // The child's write (relayed) and the parent's own call, same call id.
    let actions = app.on_event(&relayed(ask(
        "write_file",
        r#"{"path":"a.txt","content":"x"}"#,
        "sub-agent builder: default for write_file: confirm",
    )));
    let child_id = agentry_client::relay::question_id(SESSION, "sub-0011", "call_1");
    assert_eq!(actions, vec![Action::Preview(child_id.clone())]);
    app.on_event(&logged(ask(
        "bash",
        r#"{"command":"ls"}"#,
        "default for bash: confirm",
    )));
    assert_eq!(app.approvals.len(), 2, "both questions wait");
    assert_eq!(
        agentry_client::relay::answer_to(SESSION, &child_id),
        ("sub-0011".to_string(), "call_1".to_string())
    );
    // The first is the child's: it names the sub-agent, and `y` answers it.
    let lines = view::question_lines(app.question().unwrap(), &Theme { color: false }, 78);
    let text: Vec<String> = lines
        .iter()
        .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
        .collect();
    assert_eq!(text[0], "the sub-agent builder wants to run write_file");
    let actions = app.on_key(KeyEvent::new(KeyCode::Char('y'), KeyModifiers::NONE));
    let [Action::Decide(decision)] = actions.as_slice() else {
        panic!("{actions:?}");
    };
    assert_eq!(decision.call_id, child_id);
    // The child's call moving on clears only its question.
    app.on_event(&relayed(Kind::ToolCallState(spb::ToolCallState {
        call_id: "call_1".into(),
        phase: spb::ToolCallPhase::Scheduled as i32,
        detail: String::new(),
        allowed_by: 0,
    })));
    assert_eq!(app.approvals.len(), 1);
    assert_eq!(app.approvals[0].request.call_id, "call_1");
    assert_eq!(app.approvals[0].request.tool, "bash");
}

#[test]
fn a_message_of_several_lines_keeps_them() {
    let mut app = new_app(true);
    feed(
        &mut app,
        vec![user("first line\nsecond line\n\nafter a blank")],
    );
    let rows = screen(&mut app, 80, 24);
    let at = rows
        .iter()
        .position(|r| r.starts_with("› first line"))
        .unwrap_or_else(|| panic!("{}", dump(&rows)));
    assert_eq!(rows[at + 1], pad("  second line", 80), "{}", dump(&rows));
    assert_eq!(rows[at + 2], pad("  ", 80), "{}", dump(&rows));
    assert_eq!(rows[at + 3], pad("  after a blank", 80), "{}", dump(&rows));
}

#[test]
fn slash_new_starts_a_fresh_session_unless_a_turn_runs() {
    let mut app = new_app(true);
    type_text(&mut app, "/new");
    assert_eq!(press(&mut app, KeyCode::Enter), vec![Action::NewSession]);
    app.view.turn_open = true;
    type_text(&mut app, "/new");
    assert!(press(&mut app, KeyCode::Enter).is_empty());
    let rows = screen(&mut app, 80, 24);
    assert!(
        shows(&rows, "cancel it (Ctrl+C) or wait"),
        "{}",
        dump(&rows)
    );
}

#[test]
fn a_cancelled_call_keeps_its_output_and_shows_how_long_it_ran() {
    let mut app = new_app(false);
    let at = |kind: Kind, seconds: i64, nanos: i32| {
        let mut event = logged(kind);
        event.time = Some(prost_types::Timestamp { seconds, nanos });
        event
    };
    for event in [
        at(requested("c1", "bash", r#"{"command":"make"}"#), 1_000, 0),
        at(
            phase("c1", spb::ToolCallPhase::Executing),
            1_000,
            100_000_000,
        ),
        at(chunk("c1", "compiling a\ncompiling b\n"), 1_001, 0),
        at(
            result("c1", "bash", "error: cancelled before it finished", true, 0),
            1_002,
            500_000_000,
        ),
    ] {
        app.on_event(&event);
    }
    let Some(Entry::Tool(block)) = app.view.entries.last() else {
        panic!("{:?}", app.view.entries)
    };
    assert_eq!(block.duration_ms, 2_500);
    assert_eq!(
        block.output,
        "compiling a\ncompiling b\nerror: cancelled before it finished"
    );
}

#[test]
fn the_picker_filters_as_you_type_and_shows_ids_as_far_as_they_differ() {
    let mut app = new_app(false);
    type_text(&mut app, "/sessions");
    press(&mut app, KeyCode::Enter);
    let row = |id: &str, title: &str, name: &str| PickerRow {
        id: id.to_string(),
        title: title.to_string(),
        age: "1 min ago".to_string(),
        events: 3,
        name: name.to_string(),
        place: "~/code/app".to_string(),
    };
    app.on_sessions(vec![
        row(
            "01a21e25-40bb-71d8-a60b-5dba139fb221",
            "fix the login",
            "login",
        ),
        row("01a21e25-7aa0-7000-8000-000000000001", "write the docs", ""),
        row("99999999-0000-7000-8000-000000000002", "unrelated", ""),
    ]);
    let rows = screen(&mut app, 100, 24);
    // Made in the same minute: shown as far as they differ.
    assert!(
        shows(&rows, "01a21e25-4 [login] fix the login"),
        "{}",
        dump(&rows)
    );
    assert!(shows(&rows, "01a21e25-7 write the docs"), "{}", dump(&rows));
    assert!(shows(&rows, "99999999 unrelated"), "{}", dump(&rows));
    // Typing filters (name, title, id, place); Enter opens the one left.
    type_text(&mut app, "DOCS");
    let rows = screen(&mut app, 100, 24);
    assert!(shows(&rows, "filter: DOCS"), "{}", dump(&rows));
    assert!(!shows(&rows, "fix the login"), "{}", dump(&rows));
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        vec![Action::OpenSession(
            "01a21e25-7aa0-7000-8000-000000000001".to_string()
        )]
    );
    type_text(&mut app, "/sessions");
    press(&mut app, KeyCode::Enter);
    app.on_sessions(vec![row(
        "01a21e25-40bb-71d8-a60b-5dba139fb221",
        "x",
        "login",
    )]);
    type_text(&mut app, "zzz");
    let rows = screen(&mut app, 100, 24);
    assert!(
        shows(&rows, "no session matches \"zzz\""),
        "{}",
        dump(&rows)
    );
    assert!(press(&mut app, KeyCode::Enter).is_empty());
    // Backspace widens it again.
    type_text(&mut app, "/sessions");
    press(&mut app, KeyCode::Enter);
    app.on_sessions(vec![row(
        "01a21e25-40bb-71d8-a60b-5dba139fb221",
        "x",
        "login",
    )]);
    type_text(&mut app, "lox");
    press(&mut app, KeyCode::Backspace);
    press(&mut app, KeyCode::Backspace);
    assert_eq!(
        press(&mut app, KeyCode::Enter),
        vec![Action::OpenSession(
            "01a21e25-40bb-71d8-a60b-5dba139fb221".to_string()
        )]
    );
}

#[test]
fn tab_completes_an_at_path_from_the_session_s_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("src/parser")).unwrap();
    std::fs::write(dir.path().join("src/main.rs"), "").unwrap();
    std::fs::write(dir.path().join("src/parser/mod.rs"), "").unwrap();
    std::fs::write(dir.path().join("src/parser/lexer.rs"), "").unwrap();
    std::fs::write(dir.path().join(".hidden"), "").unwrap();
    let mut app = new_app(false);
    app.set_files_root(Some(dir.path().to_path_buf()));
    type_text(&mut app, "explain @sr");
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.input.text, "explain @src/");
    type_text(&mut app, "p");
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.input.text, "explain @src/parser/");
    press(&mut app, KeyCode::Tab);
    // Two names and nothing in common: they are shown, nothing is added.
    assert_eq!(app.input.text, "explain @src/parser/");
    assert!(matches!(
        app.view.entries.last(),
        Some(Entry::Note(text, NoteKind::Info)) if text.contains("lexer.rs") && text.contains("mod.rs")
    ));
    type_text(&mut app, "l");
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.input.text, "explain @src/parser/lexer.rs ");
    // No way out of the directory; slash commands still complete.
    app.input = Default::default();
    type_text(&mut app, "@../");
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.input.text, "@../");
    app.input = Default::default();
    type_text(&mut app, "/sess");
    press(&mut app, KeyCode::Tab);
    assert_eq!(app.input.text, "/session");
}

#[test]
fn a_message_not_sent_goes_back_to_the_input_and_the_status_says_disconnected() {
    let mut app = new_app(false);
    type_text(&mut app, "hello there");
    let sent = press(&mut app, KeyCode::Enter);
    assert!(matches!(&sent[..], [Action::Submit { text, .. }] if text == "hello there"));
    assert!(app.input.is_empty());
    app.not_sent("hello there".into(), "connection refused", true);
    assert_eq!(app.input.text, "hello there");
    let rows = screen(&mut app, 80, 24);
    assert!(rows[23].ends_with("disconnected "), "{}", dump(&rows));
    assert!(
        shows(&rows, "the message stays in the input and is sent once"),
        "{}",
        dump(&rows)
    );
    // It is sent again by itself, once per try, saying so only once.
    let again = app.resend_now();
    assert!(matches!(&again[..], [Action::Submit { text, .. }] if text == "hello there"));
    assert!(app.input.is_empty());
    let notes = app.view.entries.len();
    app.not_sent("hello there".into(), "connection refused", true);
    assert_eq!(app.view.entries.len(), notes, "a failed retry is quiet");
    assert_eq!(app.input.text, "hello there");
    // A message the person changed is theirs to send.
    type_text(&mut app, "!");
    assert!(app.resend_now().is_empty());
    assert_eq!(app.input.text, "hello there!");
    // Anything arriving from the session means it answers again.
    app.on_event(&logged(user("hello there")));
    let rows = screen(&mut app, 80, 24);
    assert!(!rows[23].contains("disconnected"), "{}", dump(&rows));
}

#[test]
fn a_kept_message_found_in_the_log_is_not_sent_again() {
    let mut app = new_app(false);
    app.not_sent("hello there".into(), "operation was canceled", true);
    app.maybe_arrived_after = Some(7);
    assert_eq!(app.resend.as_deref(), Some("hello there"));
    app.arrived("hello there");
    assert!(app.input.is_empty());
    assert_eq!(app.resend, None);
    assert_eq!(app.maybe_arrived_after, None);
    assert!(app.resend_now().is_empty());
    let rows = screen(&mut app, 80, 24);
    assert!(
        shows(
            &rows,
            "the orchestrator answers again: the message had arrived"
        ),
        "{}",
        dump(&rows)
    );
    assert!(!rows[23].contains("disconnected"), "{}", dump(&rows));
}

#[test]
fn an_edited_call_is_shown_again_and_runs_only_once_confirmed() {
    let mut app = new_app(false);
    let ask = spb::ApprovalRequested {
        call_id: "c1".into(),
        tool: "bash".into(),
        arguments_json: r#"{"command":"rm -rf build"}"#.into(),
        matched_rule: "default for bash: confirm".into(),
        ..Default::default()
    };
    feed(&mut app, vec![Kind::ApprovalRequested(ask.clone())]);
    let asked = press(&mut app, KeyCode::Char('e'));
    assert!(matches!(&asked[..], [Action::EditArguments(r)] if r.call_id == "c1"));
    app.edited("c1", r#"{"command":"rm -rf build/tmp"}"#.into());
    let rows = screen(&mut app, 80, 24);
    assert!(shows(&rows, "$ rm -rf build/tmp"), "{}", dump(&rows));
    assert!(shows(&rows, "edited: run it as shown?"), "{}", dump(&rows));
    // "Always" means nothing for a one-off edit.
    assert!(press(&mut app, KeyCode::Char('a')).is_empty());
    assert_eq!(
        press(&mut app, KeyCode::Char('y')),
        vec![Action::Decide(pb::ApprovalInput {
            call_id: "c1".into(),
            decision: ApprovalDecision::Edit as i32,
            reason: String::new(),
            edited_arguments_json: r#"{"command":"rm -rf build/tmp"}"#.into(),
        })]
    );
}

#[test]
fn turns_carry_their_numbers_and_a_rewound_turn_shows_as_history() {
    let mut app = new_app(false);
    let mut screen = Screen::new(80, 24);
    let mut seq = 0;
    let mut event = |turn: &str, kind: Kind| {
        seq += 1;
        spb::Event {
            seq,
            turn_id: turn.to_string(),
            ..logged(kind)
        }
    };
    let log = vec![
        event("t1", user("first")),
        event("t1", message("one", MODEL, None)),
        event("t1", finished(None, None)),
        event("t2", user("second")),
        event("t2", message("two", MODEL, None)),
        event("t2", finished(None, None)),
        event(
            "",
            Kind::SessionRewound(spb::SessionRewound {
                to_turn: 1,
                to_seq: 3,
                ..Default::default()
            }),
        ),
        event("t3", user("third")),
    ];
    for e in &log {
        app.on_event(e);
    }
    let rows = screen.draw(&mut app);
    let at = |needle: &str| {
        rows.iter()
            .position(|r| r.starts_with(needle))
            .unwrap_or_else(|| panic!("{needle:?} not shown:\n{}", dump(&rows)))
    };
    // The second turn is history now; the next one takes its number.
    assert!(at("── turn 1 ──") < at("› first"));
    assert!(at("── turn 2 · rewound ──") < at("› second"));
    assert!(at("› second") < at("── turn 2 ──"));
    assert!(at("── turn 2 ──") < at("› third"));
    let rewound: Vec<String> = app
        .view
        .entries
        .iter()
        .zip(&app.view.rewound)
        .filter(|(_, r)| **r)
        .map(|(e, _)| format!("{e:?}"))
        .collect();
    assert_eq!(rewound.len(), 4, "{rewound:?}");
    assert!(
        rewound[1].contains("second") && rewound[2].contains("two"),
        "{rewound:?}"
    );
    assert!(
        !app.view.rewound[app.view.entries.len() - 1],
        "the new turn is live"
    );
}

#[test]
fn a_sub_agents_steps_stay_folded_under_its_call_and_its_tokens_count() {
    let mut app = new_app(false);
    let mut screen = Screen::new(80, 24);
    feed(
        &mut app,
        vec![
            user("ask the researcher"),
            requested(
                "d1",
                "delegate",
                r#"{"agent":"researcher","task":"read notes"}"#,
            ),
            phase("d1", spb::ToolCallPhase::Executing),
            chunk("d1", "[researcher] read notes\n"),
            chunk("d1", "[researcher] read_file {\"path\":\"notes.txt\"}\n"),
            chunk("d1", "[researcher] ← hello\n"),
        ],
    );
    let tokens_before = app.view.session_tokens;
    let Kind::ToolResult(mut done) = result("d1", "delegate", "notes say hello", false, 900) else {
        unreachable!()
    };
    done.sub_agent_usage = Some(spb::TokenUsage {
        prompt_tokens: 1000,
        completion_tokens: 234,
        total_tokens: 1234,
        ..Default::default()
    });
    feed(&mut app, vec![Kind::ToolResult(done)]);
    assert_eq!(app.view.session_tokens, tokens_before + 1234);
    let rows = screen.draw(&mut app);
    assert!(shows(&rows, "sub-agent 1.2k tok"), "{}", dump(&rows));
    // Folded: the first steps show, the rest is a Ctrl+O away; the answer
    // is kept below them.
    assert!(shows(&rows, "[researcher] read notes"), "{}", dump(&rows));
    app.expanded = true;
    app.dirty = true;
    let rows = screen.draw(&mut app);
    assert!(shows(&rows, "[researcher] ← hello"), "{}", dump(&rows));
    assert!(shows(&rows, "notes say hello"), "{}", dump(&rows));
}

#[test]
fn another_persons_message_and_approval_show_their_name() {
    let mut app = new_app(false);
    let mut screen = Screen::new(80, 24);
    app.on_event(&spb::Event {
        by: "otto".into(),
        ..logged(user("deploy it"))
    });
    app.on_event(&logged(requested(
        "c1",
        "write_file",
        r#"{"path":"a.txt","content":"x"}"#,
    )));
    app.on_event(&spb::Event {
        by: "abe".into(),
        ..logged(decided("c1", ApprovalDecision::Approve))
    });
    let rows = screen.draw(&mut app);
    let at = find_row(&rows, "otto:").unwrap_or_else(|| panic!("{}", dump(&rows)));
    assert_eq!(rows[at + 1], pad("› deploy it", 80), "{}", dump(&rows));
    assert!(shows(&rows, "approved by abe"), "{}", dump(&rows));
}
