//! Skillsets: instructions for one kind of request, chosen per user message
//! by the intent its words show, and given to the model for that turn only.
//!
//! The skillsets are the built-in ones (`config/skillsets/*.md`, compiled
//! in), then the `*.md` files of the config directory's `skillsets/`, then
//! those of `agent.skillsets_dir`; a later file replaces an earlier one of
//! the same name. The intent named by a message picks the skillset of the
//! same name.

use std::collections::BTreeMap;
use std::path::Path;

/// Intents and the words that show them, in order of precedence on ties.
const INTENTS: &[(&str, &[&str])] = &[
    (
        "testing",
        &[
            "test",
            "tests",
            "testing",
            "unit test",
            "coverage",
            "assert",
            "pytest",
            "spec",
            "regression",
            "flaky",
        ],
    ),
    (
        "debugging",
        &[
            "debug",
            "bug",
            "error",
            "crash",
            "fails",
            "failing",
            "broken",
            "stack trace",
            "exception",
            "panic",
            "traceback",
            "why does",
            "not working",
        ],
    ),
    (
        "security",
        &[
            "security",
            "vulnerability",
            "vulnerable",
            "cve",
            "exploit",
            "injection",
            "xss",
            "secret",
            "secrets",
            "auth",
            "permission",
            "audit",
        ],
    ),
    (
        "devops",
        &[
            "deploy",
            "deployment",
            "docker",
            "kubernetes",
            "k8s",
            "ci",
            "pipeline",
            "nginx",
            "systemd",
            "terraform",
            "server",
            "infrastructure",
            "compose",
        ],
    ),
    (
        "research",
        &[
            "research",
            "find out",
            "look up",
            "search",
            "compare",
            "sources",
            "documentation",
            "what is the latest",
            "survey",
        ],
    ),
    (
        "analysis",
        &[
            "analyze",
            "analyse",
            "analysis",
            "statistics",
            "metrics",
            "measure",
            "data",
            "csv",
            "trend",
            "profile",
            "benchmark",
        ],
    ),
    (
        "explanation",
        &[
            "explain",
            "what does",
            "how does",
            "why is",
            "understand",
            "meaning",
            "describe",
            "walk me through",
        ],
    ),
    (
        "creation",
        &[
            "create",
            "new project",
            "scaffold",
            "generate",
            "draft",
            "design",
            "write a",
            "make a",
            "build a",
        ],
    ),
    (
        "coding",
        &[
            "code",
            "function",
            "implement",
            "refactor",
            "fix",
            "compile",
            "class",
            "method",
            "api",
            "rust",
            "python",
            "javascript",
            "typescript",
        ],
    ),
];

/// The built-in skillsets.
const BUILT_IN: &[(&str, &str)] = &[
    (
        "testing",
        include_str!("../../../config/skillsets/testing.md"),
    ),
    (
        "coding",
        include_str!("../../../config/skillsets/coding.md"),
    ),
    (
        "research",
        include_str!("../../../config/skillsets/research.md"),
    ),
    (
        "security",
        include_str!("../../../config/skillsets/security.md"),
    ),
    (
        "devops",
        include_str!("../../../config/skillsets/devops.md"),
    ),
    (
        "debugging",
        include_str!("../../../config/skillsets/debugging.md"),
    ),
    (
        "explanation",
        include_str!("../../../config/skillsets/explanation.md"),
    ),
    (
        "creation",
        include_str!("../../../config/skillsets/creation.md"),
    ),
    (
        "analysis",
        include_str!("../../../config/skillsets/analysis.md"),
    ),
];

/// The intent of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// Its name (`general` when no word matched).
    pub name: String,
    /// The words that matched.
    pub keywords: Vec<String>,
}

/// The skillsets known to the orchestrator.
#[derive(Debug, Clone, Default)]
pub struct Skillsets {
    enabled: bool,
    texts: BTreeMap<String, String>,
}

fn read_dir(dir: &Path, texts: &mut BTreeMap<String, String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("md") {
            continue;
        }
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        match std::fs::read_to_string(&path) {
            Ok(text) if !text.trim().is_empty() => {
                texts.insert(name.to_string(), text.trim().to_string());
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot read a skillset"),
        }
    }
}

/// Whether `word` occurs in `text` (lower case) on word boundaries.
fn contains_word(text: &str, word: &str) -> bool {
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(at) = text[from..].find(word) {
        let start = from + at;
        let end = start + word.len();
        let before = start == 0 || !bytes[start - 1].is_ascii_alphanumeric();
        let after = end == bytes.len() || !bytes[end].is_ascii_alphanumeric();
        if before && after {
            return true;
        }
        from = start + 1;
    }
    false
}

impl Skillsets {
    /// Built-in skillsets, then those of `config_dir/skillsets`, then
    /// `user_dir`; `enabled = false` chooses none.
    pub fn load(enabled: bool, config_dir: Option<&Path>, user_dir: Option<&Path>) -> Skillsets {
        let mut texts: BTreeMap<String, String> = BUILT_IN
            .iter()
            .map(|(name, text)| (name.to_string(), text.trim().to_string()))
            .collect();
        if let Some(dir) = config_dir {
            read_dir(&dir.join("skillsets"), &mut texts);
        }
        if let Some(dir) = user_dir {
            read_dir(dir, &mut texts);
        }
        Skillsets { enabled, texts }
    }

    /// Whether skillsets are chosen at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The intent a message shows: the one with the most matching words
    /// (earlier in the list on ties), else `general`.
    pub fn detect(text: &str) -> Intent {
        let lower = text.to_lowercase();
        let mut best: Option<Intent> = None;
        for (name, words) in INTENTS {
            let keywords: Vec<String> = words
                .iter()
                .filter(|w| contains_word(&lower, w))
                .map(|w| w.to_string())
                .collect();
            if !keywords.is_empty()
                && best
                    .as_ref()
                    .is_none_or(|b| keywords.len() > b.keywords.len())
            {
                best = Some(Intent {
                    name: name.to_string(),
                    keywords,
                });
            }
        }
        best.unwrap_or(Intent {
            name: "general".into(),
            keywords: Vec::new(),
        })
    }

    /// The intent of a message and the skillset it selects ("" for none).
    pub fn choose(&self, text: &str) -> Option<(Intent, String)> {
        if !self.enabled {
            return None;
        }
        let intent = Self::detect(text);
        let skillset = if self.texts.contains_key(&intent.name) {
            intent.name.clone()
        } else {
            String::new()
        };
        Some((intent, skillset))
    }

    /// A skillset's instructions.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.texts.get(name).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn intents_follow_the_words_of_the_message() {
        let cases = [
            (
                "Please write unit tests for the parser and check coverage",
                "testing",
            ),
            (
                "The build crashes with a panic, why does it fail?",
                "debugging",
            ),
            (
                "Is this login code vulnerable to SQL injection?",
                "security",
            ),
            ("Deploy it with docker compose on the server", "devops"),
            ("Explain what does this regex mean", "explanation"),
            ("Refactor this function into a class", "coding"),
            ("Hello there!", "general"),
        ];
        for (text, expected) in cases {
            assert_eq!(Skillsets::detect(text).name, expected, "{text}");
        }
        let intent = Skillsets::detect("add a test and a unit test");
        assert_eq!(intent.keywords, vec!["test", "unit test"]);
        // Words, not substrings: "latest" is not "test", "contest" neither.
        assert_eq!(
            Skillsets::detect("the latest contest results").name,
            "general"
        );
    }

    #[test]
    fn later_directories_replace_built_in_skillsets() {
        let config = tempfile::tempdir().unwrap();
        std::fs::create_dir(config.path().join("skillsets")).unwrap();
        std::fs::write(
            config.path().join("skillsets/testing.md"),
            "Team test rules.",
        )
        .unwrap();
        std::fs::write(config.path().join("skillsets/notes.txt"), "ignored").unwrap();
        let user = tempfile::tempdir().unwrap();
        std::fs::write(user.path().join("general.md"), "Be brief.\n").unwrap();
        let s = Skillsets::load(true, Some(config.path()), Some(user.path()));
        assert_eq!(s.text("testing"), Some("Team test rules."));
        assert_eq!(s.text("general"), Some("Be brief."));
        assert!(s.text("coding").unwrap().contains("conventions"));
        assert_eq!(s.text("notes"), None);
        let (intent, skillset) = s.choose("hi").unwrap();
        assert_eq!(
            (intent.name.as_str(), skillset.as_str()),
            ("general", "general")
        );

        let builtin = Skillsets::load(true, None, None);
        let (intent, skillset) = builtin.choose("hi").unwrap();
        assert_eq!((intent.name.as_str(), skillset.as_str()), ("general", ""));
        assert!(
            Skillsets::load(false, None, None)
                .choose("write tests")
                .is_none()
        );
    }
}
