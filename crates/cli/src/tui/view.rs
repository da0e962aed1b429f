//! Drawing the chat: the transcript (answers as markdown, tool calls as
//! blocks, notes), the question waiting for the person, the input with
//! its suggestions, and the status line. Layout, top to bottom:
//! transcript · question · suggestions · input · status.

use super::app::{App, Busy, CallState, Entry, LIVE_LINES, NoteKind, Pending, Preview, ToolBlock};
use super::markdown;
use super::theme::Theme;
use agentry_client::view::tokens;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Position, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph};
use unicode_width::UnicodeWidthStr;

const SPINNER: &[&str] = &["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];
/// Most lines the input grows to.
const MAX_INPUT_LINES: usize = 6;

/// Lines of the transcript, cached per entry by its revision, the width
/// and whether calls are shown whole.
#[derive(Default)]
pub struct Cache {
    entries: Vec<(u64, u16, bool, Vec<Line<'static>>)>,
}

/// Draws the whole screen.
pub fn draw(frame: &mut Frame<'_>, app: &mut App, cache: &mut Cache) {
    let area = frame.area();
    let theme = app.theme;
    let input_lines = app.input.text.split('\n').count().clamp(1, MAX_INPUT_LINES);
    let suggestions = app.suggestions();
    let question = app
        .question()
        .map(|p| question_lines(p, &theme, area.width.saturating_sub(2)));
    let question_height = question.as_ref().map_or(0, |lines| {
        let room = area.height.saturating_sub(input_lines as u16 + 4).max(3);
        (lines.len() as u16 + 2).min(room * 3 / 4).max(3)
    });
    let [
        transcript_area,
        question_area,
        suggest_area,
        input_area,
        status_area,
    ] = Layout::vertical([
        Constraint::Min(1),
        Constraint::Length(question_height),
        Constraint::Length(suggestions.len().min(6) as u16),
        Constraint::Length(input_lines as u16 + 1),
        Constraint::Length(1),
    ])
    .areas(area);

    draw_transcript(frame, app, cache, transcript_area);
    if let Some(lines) = question {
        draw_question(frame, app, lines, question_area);
    }
    if !suggestions.is_empty() {
        let lines: Vec<Line<'_>> = suggestions
            .iter()
            .take(6)
            .map(|(c, what)| {
                Line::from(vec![
                    Span::styled(format!("  {c:<10} "), theme.tool()),
                    Span::styled(*what, theme.dim()),
                ])
            })
            .collect();
        frame.render_widget(Paragraph::new(lines), suggest_area);
    }
    draw_input(frame, app, input_area);
    frame.render_widget(
        Paragraph::new(status_line(app, status_area.width)),
        status_area,
    );
    if app.picker.is_some() {
        draw_picker(frame, app, area);
    }
}

fn draw_transcript(frame: &mut Frame<'_>, app: &mut App, cache: &mut Cache, area: Rect) {
    let width = area.width.saturating_sub(1).max(10);
    cache.entries.truncate(app.view.entries.len());
    let mut lines: Vec<Line<'static>> = Vec::new();
    for (i, entry) in app.view.entries.iter().enumerate() {
        let revision = app.view.revisions.get(i).copied().unwrap_or_default();
        let fresh = cache
            .entries
            .get(i)
            .is_some_and(|(r, w, e, _)| *r == revision && *w == width && *e == app.expanded);
        if !fresh {
            let mut rendered = entry_lines(entry, &app.theme, width, app.expanded, app.spinner);
            if app.view.rewound.get(i).copied().unwrap_or(false) {
                as_history(&mut rendered, &app.theme);
            }
            let item = (revision, width, app.expanded, rendered);
            if i < cache.entries.len() {
                cache.entries[i] = item;
            } else {
                cache.entries.push(item);
            }
        }
        // A running call's spinner moves every frame.
        if let Entry::Tool(b) = entry
            && b.state == CallState::Running
        {
            cache.entries[i].3 = entry_lines(entry, &app.theme, width, app.expanded, app.spinner);
            if app.view.rewound.get(i).copied().unwrap_or(false) {
                as_history(&mut cache.entries[i].3, &app.theme);
            }
        }
        lines.extend(cache.entries[i].3.iter().cloned());
    }
    let height = usize::from(area.height);
    let max_scroll = lines.len().saturating_sub(height);
    app.scroll = app.scroll.min(max_scroll);
    let start = lines.len().saturating_sub(height + app.scroll);
    let shown: Vec<Line<'static>> = lines.into_iter().skip(start).take(height).collect();
    frame.render_widget(Paragraph::new(shown), area);
    if app.scroll > 0 {
        let hint = format!(" ↓ {} more lines (PgDn) ", app.scroll);
        let w = hint.width() as u16;
        if area.width > w {
            let at = Rect::new(area.x + area.width - w, area.y + area.height - 1, w, 1);
            frame.render_widget(Paragraph::new(Span::styled(hint, app.theme.selected())), at);
        }
    }
}

/// Lines of a rewound turn: dimmed, and its header says so.
fn as_history(lines: &mut [Line<'static>], theme: &Theme) {
    for line in lines.iter_mut() {
        for span in line.spans.iter_mut() {
            if span.content.starts_with("── turn ") && span.content.ends_with(" ──") {
                let header = span.content.trim_end_matches(" ──").to_string();
                span.content = format!("{header} · rewound ──").into();
            }
            span.style = theme.dim();
        }
    }
}

/// The lines one entry takes at `width`.
pub fn entry_lines(
    entry: &Entry,
    theme: &Theme,
    width: u16,
    expanded: bool,
    spinner: usize,
) -> Vec<Line<'static>> {
    let mut out = Vec::new();
    match entry {
        Entry::User { text, by } => {
            // Another person's message says whose it is, on a line above.
            if !by.is_empty() {
                out.push(Line::from(Span::styled(format!("{by}:"), theme.dim())));
            }
            // Each line of a message on lines of its own (blank ones kept).
            let room = usize::from(width).saturating_sub(2);
            let pieces = text.split('\n').flat_map(|line| {
                let wrapped = wrap_plain(line, room);
                if wrapped.is_empty() {
                    vec![String::new()]
                } else {
                    wrapped
                }
            });
            for (i, piece) in pieces.enumerate() {
                let prefix = if i == 0 { "› " } else { "  " };
                out.push(Line::from(vec![
                    Span::styled(prefix, theme.user()),
                    Span::styled(piece, theme.user()),
                ]));
            }
            out.push(Line::default());
        }
        Entry::Answer { text, .. } => {
            out.extend(markdown::render(text, width, theme));
            out.push(Line::default());
        }
        Entry::Tool(block) => tool_lines(block, theme, width, expanded, spinner, &mut out),
        Entry::Turn(number) => {
            out.push(Line::from(Span::styled(
                format!("── turn {number} ──"),
                theme.dim(),
            )));
        }
        Entry::Note(text, kind) => {
            let style = match kind {
                NoteKind::Info => theme.dim(),
                NoteKind::Error => theme.error(),
                NoteKind::Arrived => theme.ask(),
            };
            for line in text.lines() {
                for piece in wrap_plain(line, usize::from(width)) {
                    out.push(Line::from(Span::styled(piece, style)));
                }
            }
            out.push(Line::default());
        }
    }
    out
}

fn tool_lines(
    block: &ToolBlock,
    theme: &Theme,
    width: u16,
    expanded: bool,
    spinner: usize,
    out: &mut Vec<Line<'static>>,
) {
    let (mark, mark_style) = match block.state {
        CallState::Requested => ("·", theme.dim()),
        CallState::Waiting => ("?", theme.ask()),
        CallState::Running => (SPINNER[spinner % SPINNER.len()], theme.tool()),
        CallState::Done if block.is_error => ("✗", theme.error()),
        CallState::Done => ("✓", theme.ok()),
    };
    let mut tail = String::new();
    if block.state == CallState::Done {
        tail.push_str(&format!("  {}", duration(block.duration_ms)));
        if !block.runner.is_empty() {
            tail.push_str(&format!(" · {}", block.runner));
        }
    }
    if !block.decision.is_empty() {
        tail.push_str(&format!(" · {}", block.decision));
    }
    let head_room = usize::from(width)
        .saturating_sub(block.tool.width() + 3 + tail.width())
        .max(8);
    out.push(Line::from(vec![
        Span::styled(format!("{mark} "), mark_style),
        Span::styled(block.tool.clone(), theme.tool()),
        Span::raw(" "),
        Span::styled(shorten(&block.summary, head_room), theme.text()),
        Span::styled(tail, theme.dim()),
    ]));
    let body_style = if block.is_error {
        theme.error()
    } else {
        theme.dim()
    };
    let room = usize::from(width).saturating_sub(4);
    let lines: Vec<&str> = block.output.lines().collect();
    let shown: Vec<&str> = match (block.state, expanded) {
        (_, true) => lines.clone(),
        (CallState::Done, false) => lines.iter().take(1).copied().collect(),
        _ => lines[lines.len().saturating_sub(LIVE_LINES)..].to_vec(),
    };
    for (i, line) in shown.iter().enumerate() {
        let prefix = if i == 0 { "  ⎿ " } else { "    " };
        let text = if expanded {
            line.to_string()
        } else {
            shorten(line, room)
        };
        for (j, piece) in wrap_plain(&text, room).into_iter().enumerate() {
            out.push(Line::from(vec![
                Span::styled(if j == 0 { prefix } else { "    " }, theme.dim()),
                Span::styled(piece, body_style),
            ]));
        }
    }
    if block.state == CallState::Done && !expanded && lines.len() > 1 {
        out.push(Line::from(Span::styled(
            format!("    … {} more lines (Ctrl+O shows them)", lines.len() - 1),
            theme.dim(),
        )));
    }
}

fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

/// At most `max` columns of `text`, with `…` where it was cut.
pub fn shorten(text: &str, max: usize) -> String {
    let first = text.lines().next().unwrap_or("");
    let more = text.lines().nth(1).is_some();
    if first.width() <= max && !more {
        return first.to_string();
    }
    let mut out = String::new();
    let mut used = 0;
    for ch in first.chars() {
        let w = unicode_width::UnicodeWidthChar::width(ch).unwrap_or(0);
        if used + w + 1 > max {
            break;
        }
        out.push(ch);
        used += w;
    }
    out.push('…');
    out
}

/// Plain text broken into pieces of at most `room` columns (at spaces
/// where it can).
fn wrap_plain(text: &str, room: usize) -> Vec<String> {
    let pieces = markdown::wrap(vec![Span::raw(text.to_string())], room, false);
    pieces
        .into_iter()
        .map(|spans| spans.into_iter().map(|s| s.content.into_owned()).collect())
        .collect()
}

/// The question's lines: who asks what, the change or the command, and
/// the keys.
pub fn question_lines(pending: &Pending, theme: &Theme, width: u16) -> Vec<Line<'static>> {
    let request = &pending.request;
    let mut out = Vec::new();
    let room = usize::from(width).max(10);
    // A sub-agent's question, relayed, names the sub-agent.
    let sub_agent = request
        .matched_rule
        .strip_prefix("sub-agent ")
        .and_then(|rest| rest.split_once(':'))
        .map(|(name, _)| format!("the sub-agent {name}"));
    let asker = sub_agent.as_deref().unwrap_or("the agent");
    let head = if request.outcome_unknown {
        format!(
            "the runtime restarted while this {} call was running: it may or may not have taken effect",
            request.tool
        )
    } else {
        format!("{asker} wants to run {}", request.tool)
    };
    for piece in wrap_plain(&super::app::clean(&head), room) {
        out.push(Line::from(Span::styled(piece, theme.ask())));
    }
    if !request.matched_rule.is_empty() && !request.outcome_unknown {
        for piece in wrap_plain(
            &format!(
                "asked by the policy: {}",
                super::app::clean(&request.matched_rule)
            ),
            room,
        ) {
            out.push(Line::from(Span::styled(piece, theme.dim())));
        }
    }
    let args: serde_json::Value =
        serde_json::from_str(&request.arguments_json).unwrap_or(serde_json::Value::Null);
    let shell = agentry_client::text::shell_command(&request.tool, &request.arguments_json);
    match (request.tool.as_str(), &pending.preview) {
        _ if shell.is_some() => {
            let command = shell.unwrap_or_default();
            for (i, line) in super::app::clean(&command).lines().enumerate() {
                for (j, piece) in wrap_plain(line, room.saturating_sub(2))
                    .into_iter()
                    .enumerate()
                {
                    let prefix = if i == 0 && j == 0 { "$ " } else { "  " };
                    out.push(Line::from(vec![
                        Span::styled(prefix, theme.dim()),
                        Span::styled(piece, theme.text()),
                    ]));
                }
            }
            if request.network {
                out.push(Line::from(Span::styled(
                    "with network: public hosts, through the tool runner's proxy",
                    theme.ask(),
                )));
            }
        }
        (_, Preview::Loading) => out.push(Line::from(Span::styled(
            "(working out the change…)",
            theme.dim(),
        ))),
        (_, Preview::Diff { diff, creates }) => {
            if *creates {
                out.push(Line::from(Span::styled("(a new file)", theme.dim())));
            }
            if diff.is_empty() {
                out.push(Line::from(Span::styled(
                    "(the file would not change)",
                    theme.dim(),
                )));
            }
            for line in diff.lines() {
                let style = if line.starts_with("+++") || line.starts_with("---") {
                    theme.tool()
                } else if line.starts_with('+') {
                    theme.added()
                } else if line.starts_with('-') {
                    theme.removed()
                } else if line.starts_with("@@") {
                    theme.hunk()
                } else {
                    theme.text()
                };
                for piece in wrap_plain(line, room) {
                    out.push(Line::from(Span::styled(piece, style)));
                }
            }
        }
        (_, Preview::Failed(why)) => {
            for piece in wrap_plain(&format!("(no preview: {why})"), room) {
                out.push(Line::from(Span::styled(piece, theme.error())));
            }
            arguments_lines(&args, request, theme, room, &mut out);
        }
        (_, Preview::None) => arguments_lines(&args, request, theme, room, &mut out),
    }
    if !request.outcome_unknown && !pending.edited {
        let covers = crate::approval::always_covers(request);
        for piece in wrap_plain(&super::app::clean(&covers), room) {
            out.push(Line::from(Span::styled(piece, theme.ask())));
        }
    }
    out
}

fn arguments_lines(
    args: &serde_json::Value,
    request: &agentry_proto::sessions::v1::ApprovalRequested,
    theme: &Theme,
    room: usize,
    out: &mut Vec<Line<'static>>,
) {
    let pretty =
        serde_json::to_string_pretty(args).unwrap_or_else(|_| request.arguments_json.clone());
    for line in super::app::clean(&pretty).lines() {
        for piece in wrap_plain(line, room) {
            out.push(Line::from(Span::styled(piece, theme.text())));
        }
    }
}

fn draw_question(frame: &mut Frame<'_>, app: &App, lines: Vec<Line<'static>>, area: Rect) {
    let theme = app.theme;
    let keys = if app.deny_reason.is_some() {
        " why not? type a reason for the agent (optional), Enter · Esc back ".to_string()
    } else if app.question().is_some_and(|p| p.request.outcome_unknown) {
        " [c]heck first · [r]un again · [s]kip ".to_string()
    } else if app.question().is_some_and(|p| p.edited) {
        " edited: run it as shown? [y]es · [n]o · [e]dit again · Esc later ".to_string()
    } else {
        let more = app.approvals.len().saturating_sub(1);
        let queue = if more > 0 {
            format!(" · {more} more waiting")
        } else {
            String::new()
        };
        format!(" allow? [y]es · [n]o · [a]lways this session · [e]dit · Esc later{queue} ")
    };
    let inner_height = usize::from(area.height.saturating_sub(2));
    let max_scroll = lines.len().saturating_sub(inner_height);
    let scroll = usize::from(app.approval_scroll).min(max_scroll);
    let title_bottom = if max_scroll > 0 {
        format!(
            " PgUp/PgDn: {}–{} of {} lines ",
            scroll + 1,
            (scroll + inner_height).min(lines.len()),
            lines.len()
        )
    } else {
        String::new()
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(theme.ask())
        .title(Span::styled(keys, theme.ask()))
        .title_bottom(Span::styled(title_bottom, theme.dim()));
    let shown: Vec<Line<'static>> = lines.into_iter().skip(scroll).take(inner_height).collect();
    frame.render_widget(Clear, area);
    frame.render_widget(Paragraph::new(shown).block(block), area);
}

fn draw_input(frame: &mut Frame<'_>, app: &App, area: Rect) {
    let theme = app.theme;
    let (label, label_style) = if app.deny_reason.is_some() {
        ("reason› ", theme.ask())
    } else {
        ("› ", theme.user())
    };
    let rule = Line::from(Span::styled(
        "─".repeat(usize::from(area.width)),
        theme.dim(),
    ));
    let mut lines = vec![rule];
    let text = &app.input.text;
    let all: Vec<&str> = text.split('\n').collect();
    // Keep the cursor's line in view.
    let cursor_line = text[..app.input.cursor].matches('\n').count();
    let first = (cursor_line + 1).saturating_sub(MAX_INPUT_LINES);
    for (i, line) in all.iter().enumerate().skip(first).take(MAX_INPUT_LINES) {
        let prefix = if i == 0 { label } else { "  " };
        lines.push(Line::from(vec![
            Span::styled(prefix, label_style),
            Span::raw(line.to_string()),
        ]));
    }
    if text.is_empty() && app.deny_reason.is_none() {
        let hint = if app.question().is_some() {
            "answer the question above, or type to write a message first"
        } else if app.view.turn_open && !app.view.steering.is_empty() {
            "sent; the model gets it at its next step · Ctrl+C cancels the turn"
        } else if app.view.turn_open {
            "working… Enter steers the turn · Ctrl+C cancels"
        } else {
            "message the agent · /help · Alt+Enter new line · Ctrl+D leaves"
        };
        lines[1] = Line::from(vec![
            Span::styled(label, label_style),
            Span::styled(hint, theme.dim()),
        ]);
    }
    frame.render_widget(Paragraph::new(lines), area);
    // The cursor.
    let line_start = text[..app.input.cursor].rfind('\n').map_or(0, |i| i + 1);
    let column = text[line_start..app.input.cursor].width();
    let prefix = if cursor_line == 0 { label.width() } else { 2 };
    let x = area.x + (prefix + column).min(usize::from(area.width.saturating_sub(1))) as u16;
    let y = area.y + 1 + (cursor_line - first) as u16;
    if y < area.y + area.height {
        frame.set_cursor_position(Position::new(x, y));
    }
}

/// The status line: model, context use, tokens and cost, session, and
/// what runs.
pub fn status_line(app: &App, width: u16) -> Line<'static> {
    let theme = app.theme;
    let style: Style = theme.status();
    let mut left = vec![format!(" {}", app.view.model)];
    if app.view.context_window > 0 {
        let percent = app.view.context_used as f64 * 100.0 / f64::from(app.view.context_window);
        left.push(format!(
            "ctx {}/{} ({percent:.0}%)",
            tokens(app.view.context_used),
            tokens(u64::from(app.view.context_window))
        ));
    } else {
        left.push(format!("ctx {}", tokens(app.view.context_used)));
    }
    left.push(format!("{} tok", tokens(app.view.session_tokens)));
    if !app.view.currency.is_empty() || app.view.session_cost > 0.0 {
        left.push(agentry_client::text::money(
            app.view.session_cost,
            &app.view.currency,
        ));
    }
    // Messages sent during the turn that the model has not got yet.
    if !app.view.steering.is_empty() {
        left.push(format!("{} pending", app.view.steering.len()));
    }
    // Ids of sessions made in the same minute share their first eight
    // characters; thirteen tell them apart (and are a prefix to type).
    left.push(app.session_id.chars().take(13).collect());
    if app.plan_mode {
        left.push("plan".to_string());
    }
    if app.network {
        left.push("net".to_string());
    }
    let right = match &app.busy {
        Some(busy) => {
            let what = match busy {
                Busy::Model => "thinking".to_string(),
                Busy::Tool(tool) => format!("running {tool}"),
                Busy::Waiting => "waiting for you".to_string(),
            };
            let secs = app.busy_since.map_or(0, |t| t.elapsed().as_secs());
            format!("{} {what} {secs}s ", SPINNER[app.spinner % SPINNER.len()])
        }
        None if app.disconnected => "disconnected ".to_string(),
        None => "ready ".to_string(),
    };
    let room = usize::from(width);
    // What runs is kept whole; the left part gives way.
    let mut left = left.join(" · ");
    if left.width() + right.width() + 1 > room {
        left = shorten(&left, room.saturating_sub(right.width() + 1));
    }
    let gap = room.saturating_sub(left.width() + right.width()).max(1);
    let text = format!("{left}{}{right}", " ".repeat(gap));
    Line::from(Span::styled(text, style))
}

fn draw_picker(frame: &mut Frame<'_>, app: &App, area: Rect) {
    let Some(picker) = &app.picker else { return };
    let theme = app.theme;
    let width = area.width.saturating_sub(4).min(100);
    let height = area.height.saturating_sub(4).min(20);
    let rect = Rect::new(
        area.x + (area.width - width) / 2,
        area.y + (area.height - height) / 2,
        width,
        height,
    );
    let block = Block::default()
        .borders(Borders::ALL)
        .title(" sessions: type to filter · ↑/↓ choose · Enter open · Esc close ");
    let mut inner = usize::from(height.saturating_sub(2));
    let mut lines: Vec<Line<'static>> = Vec::new();
    if !picker.filter.is_empty() {
        lines.push(Line::from(Span::styled(
            format!("filter: {}", picker.filter),
            theme.dim(),
        )));
        inner = inner.saturating_sub(1);
    }
    let visible = picker.visible();
    // Each id as far as it tells the session apart from the others.
    let ids: Vec<&str> = picker
        .rows
        .iter()
        .flatten()
        .map(|row| row.id.as_str())
        .collect();
    let prefixes = super::app::distinct_prefixes(&ids);
    let shown_id = |id: &str| {
        ids.iter()
            .position(|i| *i == id)
            .map_or(id, |at| prefixes[at])
            .to_string()
    };
    lines.extend(match &picker.rows {
        None => vec![Line::from(Span::styled("loading…", theme.dim()))],
        Some(rows) if rows.is_empty() => {
            vec![Line::from(Span::styled("no sessions yet", theme.dim()))]
        }
        Some(_) if visible.is_empty() => vec![Line::from(Span::styled(
            format!("no session matches {:?}", picker.filter),
            theme.dim(),
        ))],
        Some(_) => {
            let first = picker.selected.saturating_sub(inner.saturating_sub(1));
            visible
                .iter()
                .enumerate()
                .skip(first)
                .take(inner)
                .map(|(i, row)| {
                    let current = if row.id == app.session_id { "●" } else { " " };
                    let meta = format!(" {} · {} · {} events ", row.place, row.age, row.events);
                    let id = shown_id(&row.id);
                    let title = if row.name.is_empty() {
                        row.title.clone()
                    } else {
                        format!("[{}] {}", row.name, row.title)
                    };
                    let room = usize::from(width).saturating_sub(meta.width() + id.width() + 6);
                    let text = format!("{current} {id} {:<room$}{meta}", shorten(&title, room));
                    let style = if i == picker.selected {
                        theme.selected()
                    } else {
                        theme.text()
                    };
                    Line::from(Span::styled(text, style))
                })
                .collect()
        }
    });
    frame.render_widget(Clear, rect);
    frame.render_widget(Paragraph::new(lines).block(block), rect);
}
