//! What the generator puts in strings: a dictionary of values that have
//! broken parsers and path checks before, values shaped like each kind of
//! field (ids, paths, times, cron expressions, JSON), and the ids this run
//! has seen the services hand out.
//!
//! Safety: the fuzzer runs as whatever user starts it, maybe root. Values
//! that reach a process (a hook's or an MCP server's command, a bash
//! call's command) come only from [`COMMANDS`], all harmless; URLs point
//! only at closed loopback ports; paths that a writing tool is given stay
//! inside the run's temporary directories (see `generate.rs`).

use crate::rng::Rng;
use std::collections::{HashMap, VecDeque};

/// Interesting strings of no particular kind.
pub const GENERAL: &[&str] = &[
    "",
    " ",
    "a",
    "fuzz",
    "0",
    "-1",
    "18446744073709551616",
    "NaN",
    "1e309",
    "true",
    "null",
    "日本語のテキスト",
    "🦀🦀🦀",
    "e\u{301}\u{301}\u{301}",
    "\u{202e}gnp.exe",
    "\u{200b}\u{200d}\u{feff}",
    "\u{10ffff}",
    "a\0b",
    "\0",
    "\x01\x02\x1b[31mred\x1b[0m",
    "line\r\nInjected: header",
    "\n\n\n",
    "\t",
    "' OR 1=1 --",
    "%",
    "_",
    "%_%",
    "\\",
    "\"",
    "${HOME}",
    "$(true)",
    "`true`",
    "<script>alert(1)</script>",
    "{{template}}",
    "%s%s%s%n",
    "admin",
    "local",
    "Ⅻ",
    "İ",
    "ß",
];

/// Paths: traversal, absolute, odd components. (Read-only uses; the
/// project's own paths are added at run time.)
pub const PATHS: &[&str] = &[
    "",
    ".",
    "..",
    "./",
    "/",
    "README.md",
    "AGENTS.md",
    "notes.txt",
    "src/main.rs",
    "a/b/c.txt",
    "no-such-file",
    "../../etc/passwd",
    "../../../../../../../../etc/passwd",
    "/etc/passwd",
    "/etc/shadow",
    "/proc/self/environ",
    "/proc/self/status",
    "/root/.ssh/id_rsa",
    "~",
    "~/x",
    "//double//slash",
    "a/../../b",
    "..\\..\\windows",
    "C:\\Windows\\win.ini",
    "%2e%2e%2fetc%2fpasswd",
    "file\0name",
    "dir/",
    ".git/config",
    "*",
    "**/*",
    "[",
    "escape/secret.txt",
    "escape",
    "image.png",
    "/tmp",
];

/// JSON fragments (valid, broken, deep, huge numbers).
pub const JSON: &[&str] = &[
    "{}",
    "[]",
    "null",
    "\"string\"",
    "0",
    "{\"path\":\"README.md\"}",
    "{\"path\":\"../../etc/passwd\"}",
    "{\"path\":\"/etc/passwd\"}",
    "{\"command\":\"true\"}",
    "{\"command\":\"echo fuzz\",\"timeout_secs\":1}",
    "{\"path\":\".\",\"pattern\":\"(a+)+$\"}",
    "{\"pattern\":\"**/*\"}",
    "{\"a\":",
    "{\"a\":1e999}",
    "{\"a\":-0}",
    "{\"a\":18446744073709551616}",
    "{\"a\":\"\\ud800\"}",
    "{\"a\":1,\"a\":2}",
    "{'single':'quotes'}",
    "[1,2,",
    "{\"text\":\"\\u0000\"}",
    "{\"type\":\"object\",\"properties\":{}}",
    "{\"action\":\"accept\",\"content\":{}}",
    "\u{feff}{}",
];

/// Cron expressions, valid and not.
pub const CRON: &[&str] = &[
    "* * * * *",
    "*/1 * * * *",
    "0 9 * * MON-FRI",
    "30 2 * * *",
    "0 0 31 2 *",
    "0 0 29 2 *",
    "*/0 * * * *",
    "60 * * * *",
    "* 24 * * *",
    "1-0 * * * *",
    "@hourly",
    "@yearly",
    "@reboot",
    "0 0 0 * * * *",
    "* * * * * * * *",
    "",
    "*",
    "L * * * *",
    "0 0 ? * 7#5",
    "0/1000000000 * * * *",
];

/// Time zones, real and not.
pub const TIME_ZONES: &[&str] = &[
    "",
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kathmandu",
    "Pacific/Kiritimati",
    "Mars/Olympus_Mons",
    "+05:00",
    "../../etc/localtime",
    "utc",
];

/// Due times: RFC 3339 and durations.
pub const DUE: &[&str] = &[
    "",
    "in 1s",
    "in 2s",
    "in 10m",
    "in 0s",
    "in -5m",
    "in 1.5h",
    "in 99999999999d",
    "in 1y",
    "in",
    "10m",
    "now",
    "2025-01-01T00:00:00Z",
    "1970-01-01T00:00:00Z",
    "0000-01-01T00:00:00Z",
    "9999-12-31T23:59:59Z",
    "2016-12-31T23:59:60Z",
    "2025-02-30T00:00:00Z",
    "2030-03-30T02:30:00+01:00",
    "2030-01-01T00:00:00+14:00",
    "2030-01-01T00:00:00-12:00",
    "2030-01-01T00:00:00",
    "2030-01-01 00:00:00Z",
    "2030-13-01T00:00:00Z",
    "+275760-09-13T00:00:00Z",
];

/// URLs: only closed loopback ports, and things that are not URLs.
pub const URLS: &[&str] = &[
    "",
    "http://127.0.0.1:1/",
    "http://127.0.0.1:1/mcp",
    "https://127.0.0.1:1/",
    "http://[::1]:1/",
    "http://localhost:1/x?y=z#f",
    "http://0.0.0.0:1/",
    "http://[::ffff:127.0.0.1]:1/",
    "http://user:pass@127.0.0.1:1/",
    "http://127.0.0.1:0/",
    "http://127.0.0.1:99999/",
    "http://",
    "http:///",
    "file:///etc/passwd",
    "ftp://127.0.0.1:1/",
    "not a url",
    "//127.0.0.1:1",
    "http://127.0.0.1:1/\r\nHost: x",
];

/// Commands for hooks, bash calls and MCP servers: every one harmless.
pub const COMMANDS: &[&str] = &[
    "",
    " ",
    "true",
    "false",
    "exit 3",
    "echo fuzz",
    "printf '%s' fuzz",
    "cat",
    "cat >/dev/null",
    "pwd",
    "ls",
    "echo \"$HOME\" \"$PATH\"",
    "head -c 100000 /dev/zero | tr '\\0' x",
    "sleep 0.2",
    "kill -9 $$",
    "exec >&-; echo closed",
    "echo \u{202e}é\0",
    "ulimit -a",
    "/nonexistent/agentry-fuzz",
];

/// Tool names (for fields that name a tool without running it).
pub const TOOLS: &[&str] = &[
    "",
    "bash",
    "read_file",
    "write_file",
    "edit_file",
    "list_dir",
    "glob",
    "grep",
    "web_fetch",
    "web_search",
    "schedule_reminder",
    "list_reminders",
    "cancel_reminder",
    "task",
    "mcp__srv__tool",
    "no_such_tool",
    "../bash",
    "BASH",
];

/// Lines that make the fake model call a tool (`Fallback::Directed`):
/// what turns with tool calls and approvals look like. Harmless only.
pub const DIRECTED: &[&str] = &[
    "call read_file {\"path\":\"README.md\"}",
    "call list_dir {\"path\":\".\"}",
    "call bash {\"command\":\"true\"}",
    "call bash {\"command\":\"echo fuzz\"}",
    "call list_reminders {}",
    "call no_such_tool {}",
    "call read_file {\"path\":\"../../etc/passwd\"}",
    "call read_file not-json",
    "call grep {\"pattern\":\"(\",\"path\":\".\"}",
];

/// Header and environment names.
pub const NAMES: &[&str] = &[
    "",
    "PATH",
    "HOME",
    "LD_PRELOAD",
    "AGENTRY_TOKEN",
    "Authorization",
    "Content-Length",
    "X-Fuzz",
    "bad name",
    "a=b",
    "é",
];

/// A long string (up to 64 KiB) of one of several shapes.
pub fn long(rng: &mut Rng) -> String {
    let n = *rng.pick(&[65usize, 257, 4097, 65_536]);
    match rng.below(6) {
        0 => "a".repeat(n),
        1 => "é".repeat(n / 2),
        2 => "🦀".repeat(n / 4),
        3 => "../".repeat(n / 3),
        4 => "{\"a\":".repeat(n / 5),
        _ => "[".repeat(n),
    }
}

/// A short string of random characters (ASCII, control, any Unicode).
pub fn random_chars(rng: &mut Rng) -> String {
    let len = rng.range(0, 24);
    (0..len)
        .map(|_| match rng.below(4) {
            0 => char::from(rng.range(0x20, 0x7e) as u8),
            1 => char::from(rng.range(0, 0x1f) as u8),
            _ => char::from_u32(rng.below(0x11_0000) as u32).unwrap_or('\u{fffd}'),
        })
        .collect()
}

/// The kinds of id the services hand out, for inputs that name one that
/// exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IdKind {
    Session,
    Reminder,
    Snapshot,
    Turn,
    Call,
    Firing,
    Instance,
    Update,
}

impl IdKind {
    /// The kind of id a field of that name holds, if any.
    pub fn of_field(message: &str, field: &str) -> Option<IdKind> {
        let short = message.rsplit('.').next().unwrap_or(message);
        Some(match (short, field) {
            ("Session", "id") | ("SessionParent", "session_id") => IdKind::Session,
            ("Reminder", "id") => IdKind::Reminder,
            ("McpResourceUpdate", "id") => IdKind::Update,
            (_, "session_id" | "new_session_id" | "forked_from" | "sessions") => IdKind::Session,
            (_, "reminder_id") => IdKind::Reminder,
            (_, "snapshot_id") => IdKind::Snapshot,
            (_, "turn_id") => IdKind::Turn,
            (_, "call_id") => IdKind::Call,
            (_, "firing_id") => IdKind::Firing,
            (_, "instance_id" | "owner_instance_id") => IdKind::Instance,
            (_, "acks" | "gone") => IdKind::Update,
            _ => return None,
        })
    }
}

/// Ids that do not exist (well-formed and not).
pub const MISSING_IDS: &[&str] = &[
    "does-not-exist",
    "01900000-0000-7000-8000-000000000000",
    "00000000-0000-0000-0000-000000000000",
    "-",
    "_",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "with space",
    "UPPER",
    "../escape",
    ".tmp",
    ".projects",
    ".snapshots",
];

/// The most ids kept of each kind (the oldest are forgotten).
const POOL_SIZE: usize = 256;

/// Ids this run has seen, by kind.
#[derive(Debug, Default)]
pub struct Pools {
    ids: HashMap<IdKind, VecDeque<String>>,
}

impl Pools {
    /// Remembers `id` (once).
    pub fn add(&mut self, kind: IdKind, id: &str) {
        if id.is_empty() || id.len() > 200 {
            return;
        }
        let pool = self.ids.entry(kind).or_default();
        if pool.iter().any(|known| known == id) {
            return;
        }
        if pool.len() == POOL_SIZE {
            pool.pop_front();
        }
        pool.push_back(id.to_string());
    }

    /// One known id of `kind`, if any.
    pub fn pick(&self, kind: IdKind, rng: &mut Rng) -> Option<String> {
        let pool = self.ids.get(&kind)?;
        if pool.is_empty() {
            return None;
        }
        pool.get(rng.index(pool.len())).cloned()
    }

    /// How many ids of `kind` are known.
    pub fn count(&self, kind: IdKind) -> usize {
        self.ids.get(&kind).map_or(0, VecDeque::len)
    }

    /// The known ids of `kind`.
    pub fn all(&self, kind: IdKind) -> Vec<String> {
        self.ids
            .get(&kind)
            .map(|p| p.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Remembers every id in an encoded `message` (a response, an event).
    pub fn harvest(&mut self, schema: &crate::schema::Schema, message: &str, bytes: &[u8]) {
        crate::wire::strings(schema, message, bytes, 8, &mut |m, f, v| {
            if let Some(kind) = IdKind::of_field(m, f) {
                self.add(kind, v);
            }
        });
    }
}
