//! Shell command lines read into segments: every simple command found
//! anywhere in a line, with the words it was given.
//!
//! The parser is recursive, so command lines that may nest deeply are parsed
//! on a short-lived thread with a large stack, and those that may nest
//! beyond `MAX_NESTING` levels are not parsed at all. The walk over the
//! parsed line is in `walker`.

mod walker;
mod words;

use brush_parser::ast;

/// How deeply command strings and words may nest (`$( )` in `${ }` in
/// `bash -c` in `eval` ...) before the policy gives up and asks a person.
/// Every level costs a parse of its text.
const MAX_DEPTH: usize = 32;

/// One simple command found in a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Segment {
    /// The command's words, quotes removed, joined by single spaces.
    pub(crate) text: String,
    /// How to classify it.
    pub(crate) kind: SegmentKind,
    /// The command's words, for allow rules that check arguments; empty
    /// for redirections and doubtful segments.
    pub(crate) words: Vec<ShellWord>,
}

/// How a segment is classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SegmentKind {
    /// An ordinary simple command: rules, session rules, then the default.
    Command,
    /// Something the policy cannot read with confidence (the parser rejected
    /// it, its command name is computed, ...): at least confirm, with this
    /// explanation, unless a rule denies it.
    Doubtful(String),
    /// A guess at a command a wrapper may run (e.g. the words after an
    /// unknown option of `timeout`): only counts when a deny rule matches.
    DenyProbe,
}

/// A word after quote removal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShellWord {
    /// The word's text: quotes removed, expansions left as written.
    pub(crate) text: String,
    /// The word means exactly `text`: no expansion, substitution or
    /// globbing can change it.
    pub(crate) literal: bool,
}

/// An upper bound on how deeply shell source nests: every construct the
/// parser recurses into starts with one of these characters or keywords.
pub(crate) fn nesting_bound(source: &str) -> usize {
    let brackets = source
        .chars()
        .filter(|c| matches!(c, '(' | '{' | '[' | '`' | '!'))
        .count();
    let keywords = source
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| {
            matches!(
                *w,
                "if" | "while" | "until" | "for" | "select" | "case" | "function" | "coproc"
            )
        })
        .count();
    brackets + keywords
}

/// Command lines nesting at most this deeply are parsed on the caller's
/// stack.
const INLINE_NESTING: usize = 32;

/// Command lines that may nest more deeply than this are not parsed (the
/// parser is recursive): they are confirmed.
pub(crate) const MAX_NESTING: usize = 1500;

/// The stack of the thread that parses command lines that may nest deeply.
const PARSE_STACK_BYTES: usize = 64 << 20;

/// Every segment of a command line, in the order they appear.
pub(crate) fn segments_of(command: &str) -> Vec<Segment> {
    let walk = || {
        let mut walker = Walker {
            options: brush_parser::ParserOptions::default(),
            segments: Vec::new(),
            depth: 0,
            probe_depth: 0,
        };
        walker.source(command);
        walker.segments
    };
    let doubt = |why: String| {
        vec![Segment {
            text: command.trim().to_string(),
            kind: SegmentKind::Doubtful(why),
            words: Vec::new(),
        }]
    };
    let mut found = Vec::new();
    if let Some(name) = RISKY_NAMES.iter().find(|n| command.contains(**n)) {
        found.extend(doubt(format!(
            "it names {name}, which makes bash or a program run code the policy cannot see"
        )));
    }
    let nesting = nesting_bound(command);
    if nesting <= INLINE_NESTING {
        found.extend(walk());
        return found;
    }
    if nesting > MAX_NESTING {
        found.extend(doubt("the command is too complex to check".to_string()));
        return found;
    }
    // The recursive parser gets a stack deep enough for any command under
    // the bound.
    found.extend(std::thread::scope(
        |scope| match std::thread::Builder::new()
            .name("policy-parse".to_string())
            .stack_size(PARSE_STACK_BYTES)
            .spawn_scoped(scope, walk)
        {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|_| doubt("the shell parser failed".to_string())),
            Err(e) => doubt(format!("could not check the command: {e}")),
        },
    ));
    found
}

/// Most tails of a line's text that [`text_tails`] gives; a longer line is
/// confirmed instead of searched to its end.
pub(crate) const MAX_TEXT_TAILS: usize = 20_000;

/// The places in a line's raw text where a denied command may hide inside
/// a value bash evaluates later (`x='$(sudo id)'`, `y='a[$(rm -rf /)]'`):
/// the text is cut at shell punctuation, once as written and once with
/// quotes and backslashes taken out, blanks collapsed; every word of every
/// piece starts a tail, the rest of its piece. Each piece comes with the
/// byte offsets where its tails start. `None` when there would be more than
/// [`MAX_TEXT_TAILS`] tails.
pub(crate) fn text_tails(command: &str) -> Option<Vec<(String, Vec<usize>)>> {
    let cut = |c: char| ";&|()<>{}[]$`'\"\n=".contains(c);
    let unquoted: String = command
        .chars()
        .filter(|c| !matches!(c, '\'' | '"' | '\\'))
        .collect();
    let mut pieces = Vec::new();
    let mut count = 0;
    for text in [command, unquoted.as_str()] {
        for piece in text.split(cut) {
            let mut collapsed = String::new();
            let mut starts = Vec::new();
            for word in piece.split_whitespace() {
                if !collapsed.is_empty() {
                    collapsed.push(' ');
                }
                starts.push(collapsed.len());
                collapsed.push_str(word);
            }
            count += starts.len();
            if count > MAX_TEXT_TAILS {
                return None;
            }
            if !starts.is_empty() {
                pieces.push((collapsed, starts));
            }
        }
    }
    Some(pieces)
}

/// Names of variables and settings that make bash or the programs it
/// starts run code from a value (or undo the sandbox's git settings):
/// wherever they appear in a line, it is confirmed.
const RISKY_NAMES: &[&str] = &[
    "PROMPT_COMMAND",
    "BASH_ENV",
    "ENV=",
    "BASH_FUNC_",
    "SHELLOPTS",
    "BASHOPTS",
    "PS0",
    "PS1",
    "PS2",
    "PS3",
    "PS4",
    "LD_PRELOAD",
    "LD_AUDIT",
    "LD_LIBRARY_PATH",
    "GIT_CONFIG",
    "GIT_EXEC_PATH",
    "GIT_SSH",
    "GIT_EXTERNAL_DIFF",
    "PYTHONSTARTUP",
    "PERL5OPT",
    "NODE_OPTIONS",
];

/// The text to hand the shell parser, or `None` when a `<<` or `<<-` is
/// followed by an end word the parser cannot be trusted with: one that is
/// empty once its quotes are taken away (`<<''`), a comment or operator
/// instead of a word, or a word that opens a substitution (`<<$( `). On
/// such text the parser can loop without end and without bound on memory.
/// The blanks between `<<` and its word are dropped (they mean nothing to
/// the shell, but inside a substitution the parser takes them for the end
/// word). The scan starts at every `<<` whatever the quoting around it:
/// text that merely looks like a here-document is treated the same, which
/// at worst costs a question or drops a blank from quoted text.
fn for_parser(source: &str) -> Option<std::borrow::Cow<'_, str>> {
    let bytes = source.as_bytes();
    let mut kept = String::new();
    let mut copied = 0;
    let mut at = 0;
    while let Some(found) = source[at..].find("<<") {
        let mut i = at + found + 2;
        if bytes.get(i) == Some(&b'<') {
            // A here-string.
            at = i + 1;
            continue;
        }
        if bytes.get(i) == Some(&b'-') {
            i += 1;
        }
        let word = i + source[i..]
            .bytes()
            .take_while(|b| matches!(b, b' ' | b'\t'))
            .count();
        if !is_plain_here_tag(&bytes[word..]) {
            return None;
        }
        kept.push_str(&source[copied..i]);
        copied = word;
        at = word;
    }
    if copied == 0 {
        return Some(std::borrow::Cow::Borrowed(source));
    }
    kept.push_str(&source[copied..]);
    Some(std::borrow::Cow::Owned(kept))
}

/// Whether the word at the start of `rest` is an end word with at least
/// one letter besides quotes, backslashes and `$`, and nothing that opens
/// a nested construct (`(`, `{`, `[`, a backtick).
fn is_plain_here_tag(rest: &[u8]) -> bool {
    if rest.first() == Some(&b'#') {
        return false;
    }
    let mut quote = None;
    let mut letters = 0usize;
    let mut closed = false;
    let mut i = 0;
    while let Some(&c) = rest.get(i) {
        i += 1;
        // Single quotes keep everything literal; elsewhere these open a
        // substitution or a pattern.
        if quote != Some(b'\'') && matches!(c, b'(' | b'{' | b'[' | b'`') {
            return false;
        }
        match quote {
            Some(q) if c == q => quote = None,
            None if c == b'\'' || c == b'"' => quote = Some(c),
            None | Some(b'"') if c == b'\\' => {
                if !closed && rest.get(i).is_some_and(u8::is_ascii_alphanumeric) {
                    letters += 1;
                }
                i += 1;
            }
            None if c.is_ascii_whitespace() || b";&|<>".contains(&c) => break,
            // What closes a substitution the word may stand in ends it
            // there, or not: only letters before it count either way.
            None | Some(b'"') if b")}]".contains(&c) => closed = true,
            // The parser takes quotes away wherever they stand.
            _ if b"$\\'\")}]".contains(&c) || c.is_ascii_whitespace() || c.is_ascii_control() => {}
            _ if closed => {}
            _ => letters += 1,
        }
    }
    letters > 0
}

/// Whether every `(`, `{` and `[` of `text` has a closing partner and its
/// backticks pair up: counted, not matched, which is enough to keep
/// unclosed substitutions away from the word parser.
fn brackets_balance(text: &str) -> bool {
    let count = |c: char| text.matches(c).count();
    count('(') == count(')')
        && count('{') == count('}')
        && count('[') == count(']')
        && count('`') % 2 == 0
}

/// Parses shell source and walks its syntax tree, collecting segments.
struct Walker {
    options: brush_parser::ParserOptions,
    segments: Vec<Segment>,
    depth: usize,
    /// How many option values deep the walk is (deny probes).
    probe_depth: usize,
}

/// Whether unquoted text may be changed by brace expansion or globbing.
fn has_glob(text: &str) -> bool {
    text.contains(['*', '?', '('])
        || (text.contains('[') && text.contains(']'))
        || (text.contains('{') && text.contains('}'))
}

/// Whether a command name is a shell that runs code it is given.
fn is_shell(base: &str) -> bool {
    matches!(
        base,
        "bash" | "sh" | "zsh" | "dash" | "ksh" | "mksh" | "ash"
    )
}

/// The text after the last `/`.
fn basename(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// Joins words' texts with single spaces.
fn join(words: &[ShellWord]) -> String {
    words
        .iter()
        .map(|w| w.text.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// How deeply option values within option values are read for deny probes.
const MAX_PROBE_DEPTH: usize = 4;

/// How many tails of a wrapper's arguments are tried as deny probes.
const MAX_PROBES: usize = 16;

/// How a wrapper command's options are laid out, to find the command it
/// runs.
struct WrapperSyntax {
    /// Short options that take a value (`-u root`, `-uroot`).
    short_with_value: &'static str,
    /// Short options without a value.
    short_flags: &'static str,
    /// Long options (without `--`) that take a separate value.
    long_with_value: &'static [&'static str],
    /// Long options without a value (or with an attached `=value` only).
    long_flags: &'static [&'static str],
    /// Positional arguments before the command (the duration of `timeout`).
    positionals: usize,
    /// `NAME=value` words before the command are skipped (`env`).
    assignments: bool,
    /// `-N` numeric options are skipped (`nice -5`).
    numeric_options: bool,
}

/// A wrapper without options.
const NO_OPTIONS: WrapperSyntax = WrapperSyntax {
    short_with_value: "",
    short_flags: "",
    long_with_value: &[],
    long_flags: &[],
    positionals: 0,
    assignments: false,
    numeric_options: false,
};

/// The wrapper syntax of commands that run another command given as their
/// arguments.
fn wrapper_syntax(name: &str) -> Option<WrapperSyntax> {
    Some(match name {
        "env" => WrapperSyntax {
            short_with_value: "uCS",
            short_flags: "i0v",
            long_with_value: &["unset", "chdir", "split-string"],
            long_flags: &[
                "ignore-environment",
                "null",
                "debug",
                "block-signal",
                "default-signal",
                "ignore-signal",
                "list-signal-handling",
            ],
            assignments: true,
            ..NO_OPTIONS
        },
        "nohup" | "builtin" | "busybox" => NO_OPTIONS,
        "setsid" => WrapperSyntax {
            short_flags: "cfw",
            long_flags: &["ctty", "fork", "wait"],
            ..NO_OPTIONS
        },
        "exec" => WrapperSyntax {
            short_with_value: "a",
            short_flags: "cl",
            ..NO_OPTIONS
        },
        "command" => WrapperSyntax {
            short_flags: "pvV",
            ..NO_OPTIONS
        },
        "timeout" => WrapperSyntax {
            short_with_value: "sk",
            short_flags: "vp",
            long_with_value: &["signal", "kill-after"],
            long_flags: &["foreground", "preserve-status", "verbose"],
            positionals: 1,
            ..NO_OPTIONS
        },
        "xargs" => WrapperSyntax {
            short_with_value: "adEILnPs",
            // `-e`, `-i` and `-l` take only attached values.
            short_flags: "0oprtxeil",
            long_with_value: &[
                "arg-file",
                "delimiter",
                "max-args",
                "max-procs",
                "max-chars",
                "process-slot-var",
            ],
            long_flags: &[
                "null",
                "interactive",
                "no-run-if-empty",
                "verbose",
                "exit",
                "open-tty",
                "show-limits",
                "eof",
                "replace",
                "max-lines",
            ],
            ..NO_OPTIONS
        },
        "sudo" => WrapperSyntax {
            short_with_value: "gpuUCDhrtTR",
            short_flags: "AbEeHiKklnPSsVv",
            long_with_value: &[
                "group",
                "prompt",
                "user",
                "other-user",
                "close-from",
                "chdir",
                "host",
                "role",
                "type",
                "command-timeout",
                "chroot",
            ],
            long_flags: &[
                "askpass",
                "background",
                "preserve-env",
                "edit",
                "set-home",
                "login",
                "remove-timestamp",
                "reset-timestamp",
                "list",
                "non-interactive",
                "preserve-groups",
                "stdin",
                "shell",
                "validate",
            ],
            ..NO_OPTIONS
        },
        "doas" => WrapperSyntax {
            short_with_value: "uC",
            short_flags: "Lns",
            ..NO_OPTIONS
        },
        "nice" => WrapperSyntax {
            short_with_value: "n",
            long_with_value: &["adjustment"],
            numeric_options: true,
            ..NO_OPTIONS
        },
        "stdbuf" => WrapperSyntax {
            short_with_value: "ioe",
            long_with_value: &["input", "output", "error"],
            ..NO_OPTIONS
        },
        "time" => WrapperSyntax {
            short_with_value: "fo",
            short_flags: "apqvV",
            long_with_value: &["format", "output"],
            long_flags: &["append", "portability", "quiet", "verbose"],
            ..NO_OPTIONS
        },
        _ => return None,
    })
}

/// How a wrapper's arguments were read.
struct Wrapped {
    /// Where the wrapped command starts in the wrapper's arguments.
    start: usize,
    /// The value of `env -S`, if any.
    split_string: Option<String>,
    /// Every option was one the syntax knows: `start` is right.
    certain: bool,
}

/// Reads a wrapper's options to find the command it runs.
fn read_wrapper(syntax: &WrapperSyntax, args: &[ShellWord]) -> Wrapped {
    let mut i = 0;
    let mut split_string = None;
    let mut certain = true;
    while let Some(arg) = args.get(i) {
        let a = arg.text.as_str();
        if a == "--" {
            i += 1;
            break;
        }
        if syntax.assignments
            && let Some((name, _)) = a.split_once('=')
            && !name.is_empty()
            && !name.starts_with('-')
        {
            i += 1;
            continue;
        }
        if let Some(long) = a.strip_prefix("--") {
            match long.split_once('=') {
                Some((name, value)) => {
                    if name == "split-string" {
                        split_string = Some(value.to_string());
                    }
                    certain &=
                        syntax.long_with_value.contains(&name) || syntax.long_flags.contains(&name);
                    i += 1;
                }
                None if syntax.long_with_value.contains(&long) => {
                    if long == "split-string" {
                        split_string = args.get(i + 1).map(|w| w.text.clone());
                    }
                    i += 2;
                }
                None => {
                    certain &= syntax.long_flags.contains(&long);
                    i += 1;
                }
            }
            continue;
        }
        if let Some(cluster) = a.strip_prefix('-')
            && !cluster.is_empty()
        {
            if syntax.numeric_options && cluster.chars().all(|c| c.is_ascii_digit()) {
                i += 1;
                continue;
            }
            let mut value_option = None;
            for (at, c) in cluster.char_indices() {
                if syntax.short_with_value.contains(c) {
                    value_option = Some((at, c));
                    break;
                }
                certain &= syntax.short_flags.contains(c);
            }
            match value_option {
                Some((at, c)) => {
                    let attached = &cluster[at + c.len_utf8()..];
                    let value = if attached.is_empty() {
                        i += 2;
                        args.get(i - 1).map(|w| w.text.clone())
                    } else {
                        i += 1;
                        Some(attached.to_string())
                    };
                    if c == 'S' {
                        split_string = value;
                    }
                }
                None => i += 1,
            }
            continue;
        }
        break;
    }
    Wrapped {
        start: i.saturating_add(syntax.positionals),
        split_string,
        certain,
    }
}
