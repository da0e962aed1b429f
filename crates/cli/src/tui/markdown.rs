//! Answers as terminal lines: markdown (CommonMark with strikethrough, task
//! lists and tables) rendered to styled lines wrapped at a width. Headings,
//! emphasis, inline code, links (their address shown after the text when
//! it differs), lists (nested, numbered), block quotes, rules, tables
//! (columns aligned, cut to the width with `…`), and code blocks
//! highlighted by language ([`super::highlight`]).

use super::app::clean;
use super::highlight;
use super::theme::Theme;
use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

/// Renders `text` as lines at most `width` columns wide.
pub fn render(text: &str, width: u16, theme: &Theme) -> Vec<Line<'static>> {
    let mut r = Renderer {
        theme: *theme,
        width: usize::from(width.max(8)),
        lines: Vec::new(),
        spans: Vec::new(),
        styles: vec![theme.text()],
        lists: Vec::new(),
        marker: None,
        quote: 0,
        code: None,
        link: None,
        table: None,
    };
    let options =
        Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS | Options::ENABLE_TABLES;
    for event in Parser::new_ext(text, options) {
        r.event(event);
    }
    r.flush();
    while r.lines.last().is_some_and(|l| l.width() == 0) {
        r.lines.pop();
    }
    r.lines
}

struct Renderer {
    theme: Theme,
    width: usize,
    lines: Vec<Line<'static>>,
    /// The inline run being built (a paragraph, a heading, an item's text).
    spans: Vec<Span<'static>>,
    styles: Vec<Style>,
    /// Open lists: the next number of a numbered one, `None` for bullets.
    lists: Vec<Option<u64>>,
    /// The marker of a list item whose first line is not out yet.
    marker: Option<String>,
    quote: usize,
    /// An open code block: its language and text so far.
    code: Option<(String, String)>,
    /// An open link: its address.
    link: Option<String>,
    /// An open table: its rows so far (the head first), each a list of
    /// cells' text, and the row being read.
    table: Option<Table>,
}

#[derive(Default)]
struct Table {
    rows: Vec<Vec<String>>,
    row: Vec<String>,
    /// How many rows are the head.
    head: usize,
}

impl Renderer {
    fn style(&self) -> Style {
        self.styles.last().copied().unwrap_or_default()
    }

    fn push_style(&mut self, add: Style) {
        let style = self.style().patch(add);
        self.styles.push(style);
    }

    fn pop_style(&mut self) {
        if self.styles.len() > 1 {
            self.styles.pop();
        }
    }

    /// The indentation every line of the current block starts with.
    fn indent(&self) -> String {
        let mut s = "▌ ".repeat(self.quote);
        s.push_str(&"   ".repeat(self.lists.len().saturating_sub(1)));
        s
    }

    fn blank(&mut self) {
        if self.lines.last().is_some_and(|l| l.width() > 0) {
            let indent = self.indent().trim_end().to_string();
            self.lines
                .push(Line::from(Span::styled(indent, self.theme.dim())));
        }
    }

    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(text) => match &mut self.code {
                Some((_, code)) => code.push_str(&clean(&text)),
                None => {
                    // Entities are decoded by the parser: cleaned after it.
                    let style = self.style();
                    self.spans.push(Span::styled(clean(&text), style));
                }
            },
            Event::Code(code) => {
                let style = self.style().patch(self.theme.code());
                self.spans.push(Span::styled(clean(&code), style));
            }
            Event::SoftBreak => {
                let style = self.style();
                self.spans.push(Span::styled(" ", style));
            }
            Event::HardBreak => self.flush(),
            Event::Rule => {
                self.flush();
                self.blank();
                let rule = "─".repeat(self.width.min(40));
                self.lines
                    .push(Line::from(Span::styled(rule, self.theme.dim())));
                self.lines.push(Line::default());
            }
            Event::TaskListMarker(done) => {
                let mark = if done { "[x] " } else { "[ ] " };
                self.spans.push(Span::styled(mark, self.theme.dim()));
            }
            Event::Html(html) | Event::InlineHtml(html) => {
                let style = self.style();
                self.spans.push(Span::styled(clean(&html), style));
            }
            Event::FootnoteReference(_) | Event::InlineMath(_) | Event::DisplayMath(_) => {}
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Paragraph => {}
            Tag::Heading { level, .. } => {
                self.flush();
                self.blank();
                let mut style = self.theme.heading();
                if level == HeadingLevel::H1 {
                    style = style.add_modifier(Modifier::UNDERLINED);
                }
                self.push_style(style);
            }
            Tag::BlockQuote(_) => {
                self.flush();
                self.quote += 1;
                self.push_style(self.theme.dim().remove_modifier(Modifier::DIM));
            }
            Tag::CodeBlock(kind) => {
                self.flush();
                self.blank();
                let lang = match kind {
                    CodeBlockKind::Fenced(info) => {
                        info.split_whitespace().next().unwrap_or("").to_string()
                    }
                    CodeBlockKind::Indented => String::new(),
                };
                self.code = Some((lang, String::new()));
            }
            Tag::List(start) => {
                self.flush();
                if self.lists.is_empty() {
                    self.blank();
                }
                self.lists.push(start);
            }
            Tag::Item => {
                self.flush();
                let marker = match self.lists.last_mut() {
                    Some(Some(n)) => {
                        let m = format!("{n}. ");
                        *n += 1;
                        m
                    }
                    _ => "• ".to_string(),
                };
                self.marker = Some(marker);
            }
            Tag::Emphasis => self.push_style(Style::new().add_modifier(Modifier::ITALIC)),
            Tag::Strong => self.push_style(Style::new().add_modifier(Modifier::BOLD)),
            Tag::Strikethrough => self.push_style(Style::new().add_modifier(Modifier::CROSSED_OUT)),
            Tag::Link { dest_url, .. } => {
                self.link = Some(dest_url.into_string());
                self.push_style(self.theme.link());
            }
            Tag::Image { dest_url, .. } => {
                self.link = Some(dest_url.into_string());
                self.push_style(self.theme.link());
            }
            Tag::Table(_) => {
                self.flush();
                self.blank();
                self.table = Some(Table::default());
            }
            Tag::HtmlBlock
            | Tag::FootnoteDefinition(_)
            | Tag::DefinitionList
            | Tag::DefinitionListTitle
            | Tag::DefinitionListDefinition
            | Tag::TableHead
            | Tag::TableRow
            | Tag::TableCell
            | Tag::Superscript
            | Tag::Subscript
            | Tag::MetadataBlock(_) => {}
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Paragraph => {
                self.flush();
                // Paragraphs inside a tight list item stay together.
                if self.lists.is_empty() {
                    self.blank();
                }
            }
            TagEnd::Heading(_) => {
                self.flush();
                self.pop_style();
                self.blank();
            }
            TagEnd::BlockQuote(_) => {
                self.flush();
                // The quote's last blank line is the blank after it.
                if self.lines.last().is_some_and(|l| {
                    let text: String = l.spans.iter().map(|s| s.content.as_ref()).collect();
                    text.trim() == "▌"
                }) {
                    self.lines.pop();
                }
                self.quote = self.quote.saturating_sub(1);
                self.pop_style();
                self.blank();
            }
            TagEnd::CodeBlock => {
                if let Some((lang, code)) = self.code.take() {
                    self.code_block(&lang, &code);
                }
                self.blank();
            }
            TagEnd::List(_) => {
                self.flush();
                self.lists.pop();
                if self.lists.is_empty() {
                    self.blank();
                }
            }
            TagEnd::Item => self.flush(),
            TagEnd::Emphasis | TagEnd::Strong | TagEnd::Strikethrough => self.pop_style(),
            TagEnd::Link | TagEnd::Image => {
                self.pop_style();
                if let Some(url) = self.link.take() {
                    let text: String = self.spans.iter().map(|s| s.content.as_ref()).collect();
                    if !url.is_empty() && !text.ends_with(&url) {
                        self.spans
                            .push(Span::styled(format!(" ({url})"), self.theme.dim()));
                    }
                }
            }
            TagEnd::TableCell if self.table.is_some() => {
                let text: String = std::mem::take(&mut self.spans)
                    .iter()
                    .map(|s| s.content.as_ref())
                    .collect();
                if let Some(table) = &mut self.table {
                    table.row.push(text.trim().to_string());
                }
            }
            TagEnd::TableHead | TagEnd::TableRow if self.table.is_some() => {
                if let Some(table) = &mut self.table {
                    let row = std::mem::take(&mut table.row);
                    table.rows.push(row);
                    if tag == TagEnd::TableHead {
                        table.head = table.rows.len();
                    }
                }
            }
            TagEnd::Table => {
                if let Some(table) = self.table.take() {
                    self.table_lines(&table);
                }
                self.blank();
            }
            TagEnd::HtmlBlock
            | TagEnd::FootnoteDefinition
            | TagEnd::DefinitionList
            | TagEnd::DefinitionListTitle
            | TagEnd::DefinitionListDefinition
            | TagEnd::TableHead
            | TagEnd::TableRow
            | TagEnd::TableCell
            | TagEnd::Superscript
            | TagEnd::Subscript
            | TagEnd::MetadataBlock(_) => self.flush(),
        }
    }

    /// A table: columns as wide as their widest cell, shrunk from the
    /// widest until the table fits the width (cells cut with `…`), the head
    /// in bold and ruled off, columns divided by `│`.
    fn table_lines(&mut self, table: &Table) {
        let indent = self.indent();
        let columns = table.rows.iter().map(Vec::len).max().unwrap_or(0);
        if columns == 0 {
            return;
        }
        let mut widths = vec![1usize; columns];
        for row in &table.rows {
            for (i, cell) in row.iter().enumerate() {
                widths[i] = widths[i].max(cell.width());
            }
        }
        let separators = 3 * (columns - 1);
        let room = self
            .width
            .saturating_sub(indent.width() + separators)
            .max(columns);
        while widths.iter().sum::<usize>() > room {
            let Some(widest) = (0..columns).max_by_key(|&i| widths[i]) else {
                break;
            };
            if widths[widest] <= 1 {
                break;
            }
            widths[widest] -= 1;
        }
        for (r, row) in table.rows.iter().enumerate() {
            let style = if r < table.head {
                self.theme.text().add_modifier(Modifier::BOLD)
            } else {
                self.theme.text()
            };
            let mut spans = vec![Span::raw(indent.clone())];
            for (i, width) in widths.iter().enumerate() {
                if i > 0 {
                    spans.push(Span::styled(" │ ", self.theme.dim()));
                }
                let cell = row.get(i).map(String::as_str).unwrap_or("");
                spans.push(Span::styled(fit(cell, *width), style));
            }
            self.lines.push(Line::from(spans));
            if r + 1 == table.head {
                let rule: Vec<String> = widths.iter().map(|w| "─".repeat(*w)).collect();
                self.lines.push(Line::from(Span::styled(
                    format!("{indent}{}", rule.join("─┼─")),
                    self.theme.dim(),
                )));
            }
        }
    }

    /// A code block: highlighted, behind a gutter, long lines broken.
    fn code_block(&mut self, lang: &str, code: &str) {
        let indent = self.indent();
        let gutter = format!("{indent}│ ");
        let room = self.width.saturating_sub(gutter.width()).max(4);
        if !lang.is_empty() {
            self.lines.push(Line::from(Span::styled(
                format!("{indent}╭ {lang}"),
                self.theme.dim(),
            )));
        }
        for spans in highlight::block(code, lang, &self.theme) {
            for piece in wrap(spans, room, true) {
                let mut line = vec![Span::styled(gutter.clone(), self.theme.dim())];
                line.extend(piece);
                self.lines.push(Line::from(line));
            }
        }
    }

    /// Puts the inline run out as wrapped lines.
    fn flush(&mut self) {
        if self.spans.is_empty() {
            return;
        }
        let spans = std::mem::take(&mut self.spans);
        let indent = self.indent();
        let marker = self.marker.take();
        let first = format!("{indent}{}", marker.as_deref().unwrap_or(""));
        let hanging = format!(
            "{indent}{}",
            " ".repeat(marker.as_deref().map_or(0, UnicodeWidthStr::width))
        );
        let room = self.width.saturating_sub(first.width()).max(4);
        for (i, piece) in wrap(spans, room, false).into_iter().enumerate() {
            let prefix = if i == 0 { &first } else { &hanging };
            let mut line = Vec::new();
            if !prefix.is_empty() {
                line.push(Span::styled(prefix.clone(), self.theme.dim()));
            }
            line.extend(piece);
            self.lines.push(Line::from(line));
        }
    }
}

/// Wraps styled text at `room` columns: at spaces between words (or, for
/// code, anywhere), breaking words longer than a line.
pub fn wrap(spans: Vec<Span<'static>>, room: usize, hard: bool) -> Vec<Vec<Span<'static>>> {
    let room = room.max(1);
    let mut lines: Vec<Vec<Span<'static>>> = vec![Vec::new()];
    let mut used = 0usize;
    let push = |lines: &mut Vec<Vec<Span<'static>>>, text: &str, style: Style| {
        if let Some(line) = lines.last_mut() {
            match line.last_mut() {
                Some(last) if last.style == style => last.content.to_mut().push_str(text),
                _ => line.push(Span::styled(text.to_string(), style)),
            }
        }
    };
    for span in spans {
        let style = span.style;
        let text = span.content.as_ref();
        if hard {
            for ch in text.chars() {
                let w = ch.width().unwrap_or(0);
                if used + w > room && used > 0 {
                    lines.push(Vec::new());
                    used = 0;
                }
                let mut buf = [0u8; 4];
                push(&mut lines, ch.encode_utf8(&mut buf), style);
                used += w;
            }
            continue;
        }
        for token in split_keep_spaces(text) {
            let w = token.width();
            if token.trim().is_empty() {
                // A space at the start of a wrapped line is dropped (the
                // first line keeps its indentation).
                let first = lines.len() == 1;
                if (used > 0 || first) && used + w <= room {
                    push(&mut lines, token, style);
                    used += w;
                }
                continue;
            }
            if used + w > room && used > 0 {
                trim_end(&mut lines);
                lines.push(Vec::new());
                used = 0;
            }
            if w <= room {
                push(&mut lines, token, style);
                used += w;
                continue;
            }
            for ch in token.chars() {
                let cw = ch.width().unwrap_or(0);
                if used + cw > room && used > 0 {
                    lines.push(Vec::new());
                    used = 0;
                }
                let mut buf = [0u8; 4];
                push(&mut lines, ch.encode_utf8(&mut buf), style);
                used += cw;
            }
        }
    }
    trim_end(&mut lines);
    lines
}

fn trim_end(lines: &mut [Vec<Span<'static>>]) {
    if let Some(last) = lines.last_mut().and_then(|l| l.last_mut()) {
        let trimmed = last.content.trim_end().len();
        last.content.to_mut().truncate(trimmed);
    }
}

/// Splits text into words and runs of whitespace, keeping both.
fn split_keep_spaces(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut space: Option<bool> = None;
    for (i, ch) in text.char_indices() {
        let is_space = ch.is_whitespace();
        if space.is_some_and(|s| s != is_space) {
            out.push(&text[start..i]);
            start = i;
        }
        space = Some(is_space);
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// The plain text of rendered lines.
#[cfg(test)]
pub fn plain(lines: &[Line<'_>]) -> String {
    lines
        .iter()
        .map(|l| {
            l.spans
                .iter()
                .map(|s| s.content.as_ref())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` padded to `width` columns, or cut to it with `…`.
fn fit(text: &str, width: usize) -> String {
    let shown = text.width();
    if shown <= width {
        return format!("{text}{}", " ".repeat(width - shown));
    }
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = c.width().unwrap_or(0);
        if used + w + 1 > width {
            break;
        }
        out.push(c);
        used += w;
    }
    out.push('…');
    used += 1;
    out.push_str(&" ".repeat(width.saturating_sub(used)));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const THEME: Theme = Theme { color: true };

    #[test]
    fn emphasis_is_styled_not_starred() {
        let lines = render("Hello **bold** and *soft* `code`.", 80, &THEME);
        assert_eq!(plain(&lines), "Hello bold and soft code.");
        let bold = lines[0].spans.iter().find(|s| s.content == "bold").unwrap();
        assert!(bold.style.add_modifier.contains(Modifier::BOLD));
        let soft = lines[0].spans.iter().find(|s| s.content == "soft").unwrap();
        assert!(soft.style.add_modifier.contains(Modifier::ITALIC));
        let code = lines[0].spans.iter().find(|s| s.content == "code").unwrap();
        assert_eq!(code.style.fg, THEME.code().fg);
    }

    #[test]
    fn paragraphs_wrap_at_the_width_between_words() {
        let lines = render("one two three four five six seven", 12, &THEME);
        assert_eq!(plain(&lines), "one two\nthree four\nfive six\nseven");
        assert!(lines.iter().all(|l| l.width() <= 12));
        // A word longer than a line is broken.
        let lines = render("abcdefghijklmnop", 8, &THEME);
        assert_eq!(plain(&lines), "abcdefgh\nijklmnop");
    }

    #[test]
    fn lists_headings_quotes_and_links() {
        let text = "# Title\n\nSome text.\n\n- first item that wraps here\n- second\n  1. nested\n  2. again\n\n> quoted\n\n[docs](https://example.org/d)";
        let out = plain(&render(text, 24, &THEME));
        assert_eq!(
            out,
            "Title\n\nSome text.\n\n• first item that wraps\n  here\n• second\n   1. nested\n   2. again\n\n▌ quoted\n\ndocs\n(https://example.org/d)",
            "{out}"
        );
    }

    #[test]
    fn code_blocks_keep_their_lines_behind_a_gutter_with_highlighting() {
        let text = "Run:\n\n```rust\nfn main() {\n    println!(\"hi\");\n}\n```\n";
        let lines = render(text, 40, &THEME);
        assert_eq!(
            plain(&lines),
            "Run:\n\n╭ rust\n│ fn main() {\n│     println!(\"hi\");\n│ }"
        );
        let fn_kw = lines[3].spans.iter().find(|s| s.content == "fn").unwrap();
        assert_eq!(fn_kw.style, THEME.keyword());
        let string = lines[4]
            .spans
            .iter()
            .find(|s| s.content == "\"hi\"")
            .unwrap();
        assert_eq!(string.style, THEME.string());
    }

    #[test]
    fn without_colour_only_modifiers_remain() {
        let theme = Theme { color: false };
        let lines = render("**x** `y`\n\n```sh\necho hi # c\n```", 40, &theme);
        for span in lines.iter().flat_map(|l| l.spans.iter()) {
            assert_eq!(span.style.fg, None, "{span:?}");
            assert_eq!(span.style.bg, None, "{span:?}");
        }
    }
}

#[cfg(test)]
mod table_tests {
    use super::*;

    #[test]
    fn a_table_keeps_its_rows_and_columns() {
        let theme = Theme { color: false };
        let text = "Sizes:\n\n| crate | lines |\n|---|---:|\n| sandbox | 1,200 |\n| policy | 3,400 |\n\nDone.";
        let shown = plain(&render(text, 60, &theme));
        assert_eq!(
            shown,
            "Sizes:\n\ncrate   │ lines\n────────┼──────\nsandbox │ 1,200\npolicy  │ 3,400\n\nDone."
        );
        // Too wide for the screen: the widest column gives way.
        let wide = "| a | b |\n|---|---|\n| short | a very long cell that cannot fit |";
        let lines = render(wide, 24, &theme);
        for line in &lines {
            assert!(line.width() <= 24, "{:?}", plain(&lines));
        }
        assert!(plain(&lines).contains('…'), "{}", plain(&lines));
    }
}
