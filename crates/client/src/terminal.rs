//! The one sanitizer between text the CLI did not write (the model's
//! answers and tool calls, tool output, files, MCP servers, reminders,
//! service errors) and the person's terminal.
//!
//! A terminal acts on some characters instead of showing them: escape
//! sequences move the cursor, erase lines, retitle the window, write the
//! clipboard (OSC 52) or draw links that hide their target (OSC 8); a
//! carriage return draws over the start of a line; bidirectional controls
//! make text read in another order than it runs. Every such character is
//! shown as a visible escape instead (`\e`, `\r`, `\x07`, `\u{202e}`), so
//! what is on screen is exactly what was sent. Line feeds and tabs stay
//! (and a carriage return just before a line feed is dropped).
//!
//! Every client prints untrusted text through [`visible`] or a
//! [`Visible`] writer; the full-screen chat cleans its own cells with the
//! same rules.

use std::borrow::Cow;
use std::io::Write;

/// Whether `c` acts on a terminal instead of being shown: C0 controls
/// other than line feed and tab, DEL, C1 controls, and the Unicode
/// characters that reorder or break lines (bidirectional embeddings,
/// overrides and isolates, the line and paragraph separators).
pub fn acts_on_terminal(c: char) -> bool {
    (c.is_control() && c != '\n' && c != '\t')
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// How a character that acts on a terminal is shown.
fn escape(c: char, out: &mut String) {
    match c {
        '\u{1b}' => out.push_str("\\e"),
        '\r' => out.push_str("\\r"),
        '\u{8}' => out.push_str("\\b"),
        '\u{7}' => out.push_str("\\a"),
        c if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
        c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
    }
}

/// `text` with every character that would act on a terminal shown as a
/// visible escape; line feeds and tabs are kept.
pub fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(acts_on_terminal) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        // A carriage return just before a line feed draws nothing (files
        // with Windows line ends).
        if c == '\r' && chars.peek() == Some(&'\n') {
            continue;
        }
        if acts_on_terminal(c) {
            escape(c, &mut out);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A writer that passes everything written to it through [`visible`]:
/// the streams the renderer of a session's events writes to.
pub struct Visible<W: Write> {
    inner: W,
    /// The start of a character split across writes.
    pending: Vec<u8>,
}

impl<W: Write> Visible<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            pending: Vec::new(),
        }
    }
}

impl<W: Write> Write for Visible<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            // An incomplete character at the end waits for the next write;
            // invalid bytes are written as the replacement character.
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let text = String::from_utf8_lossy(&self.pending[..valid]).into_owned();
        self.inner.write_all(visible(&text).as_bytes())?;
        self.pending.drain(..valid);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_are_shown_not_acted_on() {
        let hostile =
            "ok\r\u{1b}[2K\u{1b}[1A$ ls -la\u{1b}]52;c;ZXZpbA==\u{7}\u{9b}31m\u{202e}txt.exe";
        let shown = visible(hostile);
        assert_eq!(
            shown,
            "ok\\r\\e[2K\\e[1A$ ls -la\\e]52;c;ZXZpbA==\\a\\x9b31m\\u{202e}txt.exe"
        );
        assert!(!shown.chars().any(acts_on_terminal));
        // Plain text is untouched and not copied; Windows line ends are
        // line ends.
        assert!(matches!(visible("a\tb\nc"), Cow::Borrowed(_)));
        assert_eq!(visible("a\r\nb\r"), "a\nb\\r");
    }

    #[test]
    fn the_writer_cleans_text_split_anywhere() {
        let hostile = "é\u{1b}]0;title\u{7}ü\n";
        for split in 0..hostile.len() {
            let mut out = Visible::new(Vec::new());
            out.write_all(&hostile.as_bytes()[..split]).unwrap_or(());
            out.write_all(&hostile.as_bytes()[split..]).unwrap_or(());
            assert_eq!(
                String::from_utf8_lossy(&out.inner),
                "é\\e]0;title\\aü\n",
                "split at {split}"
            );
        }
    }
}
