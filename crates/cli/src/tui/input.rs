//! The person's input: the line editor, completion of slash commands and
//! `@paths`, and the history of what was sent.

use super::app::{App, NoteKind, clean};

/// The line editor.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Editor {
    /// The text (may hold newlines).
    pub text: String,
    /// The cursor, a byte offset at a character boundary.
    pub cursor: usize,
}

impl Editor {
    pub(super) fn insert(&mut self, s: &str) {
        self.text.insert_str(self.cursor, s);
        self.cursor += s.len();
    }
    pub(super) fn backspace(&mut self) {
        if let Some(c) = self.text[..self.cursor].chars().next_back() {
            self.cursor -= c.len_utf8();
            self.text.remove(self.cursor);
        }
    }
    pub(super) fn delete(&mut self) {
        if self.cursor < self.text.len() {
            self.text.remove(self.cursor);
        }
    }
    pub(super) fn left(&mut self) {
        if let Some(c) = self.text[..self.cursor].chars().next_back() {
            self.cursor -= c.len_utf8();
        }
    }
    pub(super) fn right(&mut self) {
        if let Some(c) = self.text[self.cursor..].chars().next() {
            self.cursor += c.len_utf8();
        }
    }
    pub(super) fn home(&mut self) {
        self.cursor = self.text[..self.cursor].rfind('\n').map_or(0, |i| i + 1);
    }
    pub(super) fn end(&mut self) {
        self.cursor = self.text[self.cursor..]
            .find('\n')
            .map_or(self.text.len(), |i| self.cursor + i);
    }
    pub(super) fn delete_word(&mut self) {
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
    pub(super) fn set(&mut self, text: String) {
        self.cursor = text.len();
        self.text = text;
    }
    pub(super) fn take(&mut self) -> String {
        self.cursor = 0;
        std::mem::take(&mut self.text)
    }
    /// Whether nothing is typed.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }
}

impl App {
    /// Where `@path` completes from: the session's directory when it is on
    /// this machine.
    pub fn set_files_root(&mut self, root: Option<std::path::PathBuf>) {
        self.files_root = root.filter(|r| r.is_dir());
    }

    /// Tab after `@` and part of a path: the path completed from the
    /// session's directory (as far as the names that fit agree; a
    /// directory gets its `/`, a file a space). `false` when the word at
    /// the cursor is no `@path` or there is nowhere to complete from.
    pub(super) fn complete_path(&mut self) -> bool {
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

    pub(super) fn complete(&mut self) {
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

    pub(super) fn history_back(&mut self) {
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

    pub(super) fn history_forward(&mut self) {
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
}
