//! The session picker (`/sessions`): the rows, the filter typed, the keys.

use super::app::{Action, App};
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

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

impl App {
    pub(super) fn picker_key(&mut self, key: KeyEvent) -> Vec<Action> {
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
