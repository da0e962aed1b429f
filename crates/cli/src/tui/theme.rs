//! Colours of the full-screen chat, and their absence: `NO_COLOR` (any
//! value) or `TERM=dumb` leave only bold, italic, underline and reverse,
//! which every terminal shows.

use ratatui::style::{Color, Modifier, Style};

/// The styles the chat draws with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Theme {
    /// Whether colours are used at all.
    pub color: bool,
}

impl Theme {
    /// Colours unless the environment asks for none.
    pub fn from_env() -> Theme {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let dumb = std::env::var("TERM").is_ok_and(|t| t == "dumb");
        Theme {
            color: !(no_color || dumb),
        }
    }

    fn fg(&self, color: Color) -> Style {
        if self.color {
            Style::new().fg(color)
        } else {
            Style::new()
        }
    }

    /// Plain text.
    pub fn text(&self) -> Style {
        Style::new()
    }
    /// Secondary text: hints, durations, folded output.
    pub fn dim(&self) -> Style {
        self.fg(Color::DarkGray).add_modifier(Modifier::DIM)
    }
    /// What the person typed, in the transcript.
    pub fn user(&self) -> Style {
        self.fg(Color::Cyan).add_modifier(Modifier::BOLD)
    }
    /// A tool's name.
    pub fn tool(&self) -> Style {
        self.fg(Color::Yellow).add_modifier(Modifier::BOLD)
    }
    /// Errors.
    pub fn error(&self) -> Style {
        self.fg(Color::Red).add_modifier(Modifier::BOLD)
    }
    /// Success marks.
    pub fn ok(&self) -> Style {
        self.fg(Color::Green)
    }
    /// Headings in answers.
    pub fn heading(&self) -> Style {
        self.fg(Color::Magenta).add_modifier(Modifier::BOLD)
    }
    /// Inline code in answers.
    pub fn code(&self) -> Style {
        self.fg(Color::LightYellow)
    }
    /// Links in answers.
    pub fn link(&self) -> Style {
        self.fg(Color::Blue).add_modifier(Modifier::UNDERLINED)
    }
    /// Lines a diff adds.
    pub fn added(&self) -> Style {
        self.fg(Color::Green)
    }
    /// Lines a diff removes.
    pub fn removed(&self) -> Style {
        self.fg(Color::Red)
    }
    /// Hunk headers of a diff.
    pub fn hunk(&self) -> Style {
        self.fg(Color::Cyan)
    }
    /// Keywords in code.
    pub fn keyword(&self) -> Style {
        self.fg(Color::Magenta).add_modifier(Modifier::BOLD)
    }
    /// String literals in code.
    pub fn string(&self) -> Style {
        self.fg(Color::Green)
    }
    /// Comments in code.
    pub fn comment(&self) -> Style {
        self.fg(Color::DarkGray).add_modifier(Modifier::ITALIC)
    }
    /// Numbers in code.
    pub fn number(&self) -> Style {
        self.fg(Color::Cyan)
    }
    /// The status line.
    pub fn status(&self) -> Style {
        if self.color {
            Style::new().fg(Color::White).bg(Color::DarkGray)
        } else {
            Style::new().add_modifier(Modifier::REVERSED)
        }
    }
    /// The question of an approval.
    pub fn ask(&self) -> Style {
        self.fg(Color::LightRed).add_modifier(Modifier::BOLD)
    }
    /// The selected row of a list.
    pub fn selected(&self) -> Style {
        Style::new().add_modifier(Modifier::REVERSED)
    }
}
