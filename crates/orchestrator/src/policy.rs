//! The tool-call security policy: every tool call the model makes is
//! classified [`Decision::Allow`], [`Decision::Deny`] or
//! [`Decision::Confirm`] (ask a person) by a [`Policy`] built from the
//! `[policy]` section of the configuration.
//!
//! Pure: no I/O. Shell commands given to `bash` are parsed with a real shell
//! parser (`brush-parser`); every simple command found anywhere in the line
//! (pipelines, lists, subshells, groups, command substitutions, compound
//! commands, function bodies, `bash -c` strings, `eval` arguments, commands
//! run by wrappers such as `env` or `sudo`) is a *segment*, classified on its
//! own; the call is only as permissive as its strictest segment. Anything
//! the policy cannot read with confidence (the parser rejects it, the command
//! name is computed, it nests too deeply) is at least confirmed.
//!
//! The parser is recursive, so command lines that may nest deeply are parsed
//! on a short-lived thread with a large stack, and those that may nest
//! beyond `MAX_NESTING` levels are not parsed at all.

use agentry_runtime::config::{PolicyConfig, PolicyRule};
use brush_parser::ast;
use brush_parser::word::{self, Parameter, ParameterExpr, WordPiece, WordPieceWithSource};
use globset::{GlobBuilder, GlobMatcher};
use std::collections::BTreeMap;

pub use agentry_runtime::config::PolicyDecision as Decision;

/// The tool whose calls are shell command lines.
const BASH: &str = "bash";

/// How deeply command strings and words may nest (`$( )` in `${ }` in
/// `bash -c` in `eval` ...) before the policy gives up and asks a person.
/// Every level costs a parse of its text.
const MAX_DEPTH: usize = 32;

/// A compiled tool-call policy.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The default decision per tool name.
    tools: BTreeMap<String, Decision>,
    /// The rules, in configuration order.
    rules: Vec<CompiledRule>,
    /// Every call is allowed (tests, trusted set-ups).
    allow_all: bool,
    /// Every bash call gets network.
    network: bool,
}

/// What the policy decided about one call, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// Allow, confirm or deny.
    pub decision: Decision,
    /// Human-readable: which rule decided, e.g. `rule 2 (bash "sudo *"): no
    /// privilege escalation`, `default for bash: confirm`, `session rule:
    /// bash "make test"` or `could not parse the command: ...`.
    pub rule: String,
    /// For bash: the segment (simple command) that decided, the strictest
    /// one, if any.
    pub segment: Option<String>,
}

/// An "approve for this session" allowance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionRule {
    /// The tool name.
    pub tool: String,
    /// For bash: the exact text of one simple command.
    pub command: Option<String>,
    /// For file tools: the exact path.
    pub path: Option<String>,
}

/// Why a policy configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A rule is malformed.
    #[error("policy rule {index}: {reason}")]
    InvalidRule {
        /// The rule's position in the configuration, counting from 1.
        index: usize,
        /// What is wrong with it.
        reason: String,
    },
}

/// One rule, ready to match.
#[derive(Debug, Clone)]
struct CompiledRule {
    /// The tool name, or `*`.
    tool: String,
    /// What the rule matches besides the tool.
    matcher: Matcher,
    /// What happens when it matches.
    decision: Decision,
    /// How verdicts name it, e.g. `rule 2 (bash "sudo *"): no privilege escalation`.
    label: String,
    /// An allow rule checks the arguments of the commands it knows.
    check_arguments: bool,
    /// Commands it decides (and does not deny) get network.
    network: bool,
}

/// What a rule matches besides the tool.
#[derive(Debug, Clone)]
enum Matcher {
    /// Every call of the tool (every segment, for bash).
    Any,
    /// Bash segments whose text matches the glob.
    Command(GlobMatcher),
    /// Calls whose `path` argument matches the glob.
    Path(GlobMatcher),
}

impl CompiledRule {
    fn applies_to(&self, tool: &str) -> bool {
        self.tool == "*" || self.tool == tool
    }

    /// Whether the rule matches one bash segment.
    fn matches_segment(&self, text: &str) -> bool {
        self.applies_to(BASH)
            && match &self.matcher {
                Matcher::Any => true,
                Matcher::Command(glob) => glob.is_match(text),
                Matcher::Path(_) => false,
            }
    }

    /// Whether the rule matches a call of a tool other than bash. `paths`
    /// are the call's path argument as given and normalized.
    fn matches_call(&self, tool: &str, paths: &[String]) -> bool {
        self.applies_to(tool)
            && match &self.matcher {
                Matcher::Any => true,
                Matcher::Command(_) => false,
                Matcher::Path(glob) => paths.iter().any(|p| glob.is_match(p)),
            }
    }
}

/// The lowercase name of a decision, as in the configuration.
fn decision_name(decision: Decision) -> &'static str {
    match decision {
        Decision::Allow => "allow",
        Decision::Confirm => "confirm",
        Decision::Deny => "deny",
    }
}

/// The strictest of the rules `matches` accepts; the first such rule when
/// several are equally strict.
fn strictest<'a>(
    rules: impl Iterator<Item = &'a CompiledRule>,
    mut matches: impl FnMut(&CompiledRule) -> bool,
) -> Option<&'a CompiledRule> {
    let mut best: Option<&CompiledRule> = None;
    for rule in rules {
        if matches(rule) && best.is_none_or(|b| rule.decision > b.decision) {
            best = Some(rule);
        }
    }
    best
}

fn compile_rule(index: usize, rule: &PolicyRule) -> Result<CompiledRule, PolicyError> {
    let invalid = |reason: String| PolicyError::InvalidRule { index, reason };
    let tool = rule.tool.trim();
    if tool.is_empty() {
        return Err(invalid("the tool name is empty".to_string()));
    }
    let glob = |pattern: &str, what: &str, literal_separator: bool| {
        if pattern.is_empty() {
            return Err(invalid(format!("the {what} glob is empty")));
        }
        GlobBuilder::new(pattern)
            .literal_separator(literal_separator)
            .build()
            .map(|g| g.compile_matcher())
            .map_err(|e| invalid(format!("invalid {what} glob {pattern:?}: {e}")))
    };
    let (matcher, shown) = match (&rule.command, &rule.path) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "a rule may have a command or a path, not both".to_string(),
            ));
        }
        (Some(command), None) => {
            if tool != BASH && tool != "*" {
                return Err(invalid(format!(
                    "a command glob only applies to bash, not to {tool:?}"
                )));
            }
            (
                Matcher::Command(glob(command, "command", false)?),
                format!("{tool} \"{command}\""),
            )
        }
        (None, Some(path)) => {
            if tool == BASH {
                return Err(invalid(
                    "a path glob never matches bash; use a command glob".to_string(),
                ));
            }
            (
                Matcher::Path(glob(path, "path", true)?),
                format!("{tool} path \"{path}\""),
            )
        }
        (None, None) => (Matcher::Any, tool.to_string()),
    };
    let label = match rule.reason.as_deref().map(str::trim) {
        Some(reason) if !reason.is_empty() => format!("rule {index} ({shown}): {reason}"),
        _ => format!("rule {index} ({shown})"),
    };
    Ok(CompiledRule {
        tool: tool.to_string(),
        matcher,
        decision: rule.decision,
        label,
        check_arguments: rule.check_arguments,
        network: rule.network,
    })
}

impl Policy {
    /// Compiles the configured policy. Rules are rejected when their tool is
    /// empty, when they have both a command and a path glob, a command glob
    /// on a tool other than bash (or `*`), a path glob on bash, or a glob
    /// that does not compile.
    pub fn from_config(cfg: &PolicyConfig) -> Result<Policy, PolicyError> {
        let rules = cfg
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| compile_rule(i + 1, rule))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Policy {
            tools: cfg.tools.clone(),
            rules,
            allow_all: false,
            network: cfg.network,
        })
    }

    /// A policy that allows every call.
    pub fn allow_all() -> Policy {
        Policy {
            tools: BTreeMap::new(),
            rules: Vec::new(),
            allow_all: true,
            network: false,
        }
    }

    /// Whether a call runs with outbound network (through the tool
    /// runner's proxy). Only bash calls do: every one when the
    /// configuration says `network = true`, else those whose every command
    /// is decided by a rule with `network = true`. A line the policy cannot
    /// read command by command gets none.
    pub fn network(&self, tool: &str, arguments_json: &str) -> bool {
        if tool != BASH {
            return false;
        }
        if self.network {
            return true;
        }
        let Some(command) = serde_json::from_str::<serde_json::Value>(arguments_json)
            .ok()
            .and_then(|v| {
                v.get("command")
                    .and_then(|c| c.as_str())
                    .map(str::to_string)
            })
        else {
            return false;
        };
        let mut commands = 0;
        for segment in segments_of(&command) {
            match segment.kind {
                SegmentKind::DenyProbe => {}
                SegmentKind::Doubtful(_) => return false,
                SegmentKind::Command => {
                    commands += 1;
                    let rule = strictest(self.rules.iter(), |r| r.matches_segment(&segment.text));
                    if !rule.is_some_and(|r| r.network && r.decision != Decision::Deny) {
                        return false;
                    }
                }
            }
        }
        commands > 0
    }

    /// The decision for a call no rule matches. `read_only` is the tool's
    /// flag from the tool runner: tools without a configured default are
    /// allowed when read-only, else confirmed.
    fn default_for(&self, tool: &str, read_only: bool) -> Decision {
        match self.tools.get(tool) {
            Some(decision) => *decision,
            None if read_only => Decision::Allow,
            None => Decision::Confirm,
        }
    }

    /// Classifies one tool call. `arguments_json` is the call's arguments as
    /// the model wrote them; `read_only` is the tool's flag from the tool
    /// runner; `session_rules` are the allowances a person granted for this
    /// session (they only turn a `confirm` into `allow`, never
    /// override a matching rule).
    pub fn check(
        &self,
        tool: &str,
        arguments_json: &str,
        read_only: bool,
        session_rules: &[SessionRule],
    ) -> Verdict {
        if self.allow_all {
            return Verdict {
                decision: Decision::Allow,
                rule: "allow all".to_string(),
                segment: None,
            };
        }
        let default = self.default_for(tool, read_only);
        let arguments = serde_json::from_str::<serde_json::Value>(arguments_json).ok();
        let string_arg = |name: &str| {
            arguments
                .as_ref()
                .and_then(|a| a.get(name))
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        };
        if tool == BASH {
            match string_arg("command") {
                Some(command) => self.check_bash(&command, default, session_rules),
                None => Verdict {
                    decision: default,
                    rule: format!(
                        "default for bash: {} (no command argument)",
                        decision_name(default)
                    ),
                    segment: None,
                },
            }
        } else {
            self.check_call(tool, string_arg("path"), default, session_rules)
        }
    }

    /// A call of a tool other than bash.
    fn check_call(
        &self,
        tool: &str,
        path: Option<String>,
        default: Decision,
        session_rules: &[SessionRule],
    ) -> Verdict {
        let paths: Vec<String> = match &path {
            Some(p) => {
                let normalized = normalize_path(p);
                if normalized == *p {
                    vec![p.clone()]
                } else {
                    vec![p.clone(), normalized]
                }
            }
            None => Vec::new(),
        };
        let (decision, rule) = match strictest(self.rules.iter(), |r| r.matches_call(tool, &paths))
        {
            Some(rule) => (rule.decision, rule.label.clone()),
            None => (
                default,
                format!("default for {tool}: {}", decision_name(default)),
            ),
        };
        // A person's standing approval answers what would ask them; it
        // never lifts a deny.
        if decision == Decision::Confirm
            && let Some(session) = session_rules.iter().find(|s| {
                s.tool == tool && s.command.is_none() && (s.path.is_none() || s.path == path)
            })
        {
            return Verdict {
                decision: Decision::Allow,
                rule: session_label(session),
                segment: None,
            };
        }
        Verdict {
            decision,
            rule,
            segment: None,
        }
    }

    /// A bash call: the strictest of its segments.
    fn check_bash(
        &self,
        command: &str,
        default: Decision,
        session_rules: &[SessionRule],
    ) -> Verdict {
        let segments = segments_of(command);
        // The strictest segment; of equally strict ones the first, except
        // that an explanation of doubt beats a plain default.
        let mut best: Option<(Decision, bool, String, String)> = None;
        for segment in &segments {
            let Some((decision, rule)) = self.classify_segment(segment, default, session_rules)
            else {
                continue;
            };
            let doubtful =
                matches!(segment.kind, SegmentKind::Doubtful(_)) && decision == Decision::Confirm;
            if best.as_ref().is_none_or(|(d, was_doubtful, _, _)| {
                decision > *d || (decision == *d && doubtful && !was_doubtful)
            }) {
                best = Some((decision, doubtful, rule, segment.text.clone()));
            }
        }
        match best {
            Some((decision, _, rule, segment)) => Verdict {
                decision,
                rule,
                segment: Some(segment),
            },
            // Nothing to run (empty, comments, bare assignments): the
            // default for bash.
            None => match session_rules
                .iter()
                .find(|s| s.tool == BASH && s.command.is_none() && s.path.is_none())
            {
                Some(session) if default == Decision::Confirm => Verdict {
                    decision: Decision::Allow,
                    rule: session_label(session),
                    segment: None,
                },
                _ => Verdict {
                    decision: default,
                    rule: format!("default for bash: {}", decision_name(default)),
                    segment: None,
                },
            },
        }
    }

    /// One segment's decision and why; `None` for a deny probe no deny
    /// rule matches.
    fn classify_segment(
        &self,
        segment: &Segment,
        default: Decision,
        session_rules: &[SessionRule],
    ) -> Option<(Decision, String)> {
        let rule = strictest(self.rules.iter(), |r| r.matches_segment(&segment.text));
        match &segment.kind {
            SegmentKind::DenyProbe => rule
                .filter(|r| r.decision == Decision::Deny)
                .map(|r| (r.decision, r.label.clone())),
            SegmentKind::Doubtful(why) => Some(match rule {
                Some(r) if r.decision == Decision::Deny => (Decision::Deny, r.label.clone()),
                _ => (Decision::Confirm, why.clone()),
            }),
            SegmentKind::Command => {
                let (decision, label) = match rule {
                    // An allow rule passes the arguments it knows to be
                    // harmless; anything else is confirmed.
                    Some(r) if r.decision == Decision::Allow && r.check_arguments => {
                        let words: Vec<crate::policy_args::Word<'_>> = segment
                            .words
                            .iter()
                            .map(|w| crate::policy_args::Word {
                                text: &w.text,
                                literal: w.literal,
                            })
                            .collect();
                        match crate::policy_args::vet(&words) {
                            Ok(()) => (r.decision, r.label.clone()),
                            Err(why) => {
                                (Decision::Confirm, format!("{} matches, but {why}", r.label))
                            }
                        }
                    }
                    Some(r) => (r.decision, r.label.clone()),
                    None => (
                        default,
                        format!("default for bash: {}", decision_name(default)),
                    ),
                };
                // A standing approval answers a confirm, never a deny.
                let session = session_rules.iter().find(|s| {
                    s.tool == BASH
                        && s.path.is_none()
                        && s.command.as_ref().is_none_or(|c| *c == segment.text)
                });
                Some(match session {
                    Some(s) if decision == Decision::Confirm => (Decision::Allow, session_label(s)),
                    _ => (decision, label),
                })
            }
        }
    }
}

/// How verdicts name a session rule.
fn session_label(rule: &SessionRule) -> String {
    match (&rule.command, &rule.path) {
        (Some(command), _) => format!("session rule: {} \"{command}\"", rule.tool),
        (None, Some(path)) => format!("session rule: {} path \"{path}\"", rule.tool),
        (None, None) => format!("session rule: {}", rule.tool),
    }
}

/// The allowance "approve for this session" adds for this call: for bash,
/// one rule per simple command of the line (so the same commands pass
/// later; commands the policy cannot read, such as `$CMD x`, are left out);
/// for tools with a `path` argument, that tool and path; otherwise the tool
/// alone (any call of it). Bash calls without a readable `command`, and
/// calls with an empty path, give nothing.
pub fn session_rules_for(tool: &str, arguments_json: &str) -> Vec<SessionRule> {
    let arguments = serde_json::from_str::<serde_json::Value>(arguments_json).ok();
    let string_arg = |name: &str| {
        arguments
            .as_ref()
            .and_then(|a| a.get(name))
            .and_then(serde_json::Value::as_str)
    };
    if tool == BASH {
        let Some(command) = string_arg("command") else {
            return Vec::new();
        };
        let mut rules: Vec<SessionRule> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for segment in segments_of(command) {
            if matches!(segment.kind, SegmentKind::Command) && seen.insert(segment.text.clone()) {
                rules.push(SessionRule {
                    tool: BASH.to_string(),
                    command: Some(segment.text),
                    path: None,
                });
            }
        }
        return rules;
    }
    match string_arg("path") {
        Some("") => Vec::new(),
        Some(path) => vec![SessionRule {
            tool: tool.to_string(),
            command: None,
            path: Some(path.to_string()),
        }],
        None => vec![SessionRule {
            tool: tool.to_string(),
            command: None,
            path: None,
        }],
    }
}

/// Lexically normalizes a relative or absolute path: drops `.` components
/// and empty components, resolves `..` against earlier components where it
/// can. `./secrets/../secrets/key` becomes `secrets/key`.
fn normalize_path(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => match parts.last() {
                Some(&last) if last != ".." => {
                    parts.pop();
                }
                _ if absolute => {}
                _ => parts.push(".."),
            },
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    if absolute {
        format!("/{joined}")
    } else {
        joined
    }
}

// ---------------------------------------------------------------------------
// Shell command lines: segments.

/// One simple command found in a command line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    /// The command's words, quotes removed, joined by single spaces.
    text: String,
    /// How to classify it.
    kind: SegmentKind,
    /// The command's words, for allow rules that check arguments; empty
    /// for redirections and doubtful segments.
    words: Vec<ShellWord>,
}

/// How a segment is classified.
#[derive(Debug, Clone, PartialEq, Eq)]
enum SegmentKind {
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
struct ShellWord {
    /// The word's text: quotes removed, expansions left as written.
    text: String,
    /// The word means exactly `text`: no expansion, substitution or
    /// globbing can change it.
    literal: bool,
}

/// An upper bound on how deeply shell source nests: every construct the
/// parser recurses into starts with one of these characters or keywords.
fn nesting_bound(source: &str) -> usize {
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
const MAX_NESTING: usize = 1500;

/// The stack of the thread that parses command lines that may nest deeply.
const PARSE_STACK_BYTES: usize = 64 << 20;

/// Every segment of a command line, in the order they appear.
fn segments_of(command: &str) -> Vec<Segment> {
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
    let nesting = nesting_bound(command);
    if nesting <= INLINE_NESTING {
        return walk();
    }
    if nesting > MAX_NESTING {
        return doubt("the command is too complex to check".to_string());
    }
    // The recursive parser gets a stack deep enough for any command under
    // the bound.
    std::thread::scope(|scope| {
        match std::thread::Builder::new()
            .name("policy-parse".to_string())
            .stack_size(PARSE_STACK_BYTES)
            .spawn_scoped(scope, walk)
        {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|_| doubt("the shell parser failed".to_string())),
            Err(e) => doubt(format!("could not check the command: {e}")),
        }
    })
}

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
                if rest.get(i).is_some_and(u8::is_ascii_alphanumeric) {
                    letters += 1;
                }
                i += 1;
            }
            None if c.is_ascii_whitespace() || b";&|<>".contains(&c) => break,
            // The parser takes quotes away wherever they stand; what closes
            // a substitution the word may stand in ends it there, or not:
            // neither way does it count.
            _ if b"$\\'\")}]".contains(&c) || c.is_ascii_whitespace() || c.is_ascii_control() => {}
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

impl Walker {
    fn doubt(&mut self, text: &str, why: String) {
        self.segments.push(Segment {
            text: text.trim().to_string(),
            kind: SegmentKind::Doubtful(why),
            words: Vec::new(),
        });
    }

    /// Parses shell source (a command line, a `$( )` body, a `bash -c`
    /// string) and walks it.
    fn source(&mut self, source: &str) {
        if self.depth >= MAX_DEPTH {
            self.doubt(source, "the command nests too deeply to check".to_string());
            return;
        }
        let Some(text) = for_parser(source) else {
            self.doubt(
                source,
                "a here-document has no end word to check it by".to_string(),
            );
            return;
        };
        let options = self.options.clone();
        let parsed = std::panic::catch_unwind(|| {
            brush_parser::Parser::new(std::io::Cursor::new(text.as_bytes()), &options)
                .parse_program()
                .map_err(|e| e.to_string())
        })
        .unwrap_or_else(|_| Err("the shell parser failed".to_string()));
        match parsed {
            Ok(program) => {
                self.depth += 1;
                for list in &program.complete_commands {
                    self.compound_list(list);
                }
                self.depth -= 1;
            }
            Err(e) => self.doubt(source, format!("could not parse the command: {e}")),
        }
    }

    fn compound_list(&mut self, list: &ast::CompoundList) {
        for ast::CompoundListItem(and_or, _) in &list.0 {
            self.pipeline(&and_or.first);
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p),
                }
            }
        }
    }

    fn pipeline(&mut self, pipeline: &ast::Pipeline) {
        for command in &pipeline.seq {
            self.command(command);
        }
    }

    fn command(&mut self, command: &ast::Command) {
        match command {
            ast::Command::Simple(simple) => self.simple_command(simple),
            ast::Command::Compound(compound, redirects) => {
                self.compound(compound);
                self.redirect_list(redirects.as_ref());
            }
            ast::Command::Function(function) => {
                self.compound(&function.body.0);
                self.redirect_list(function.body.1.as_ref());
            }
            ast::Command::ExtendedTest(test, redirects) => {
                self.extended_test(&test.expr);
                self.redirect_list(redirects.as_ref());
            }
        }
    }

    fn compound(&mut self, compound: &ast::CompoundCommand) {
        match compound {
            ast::CompoundCommand::Arithmetic(a) => self.arithmetic(&a.expr.value),
            ast::CompoundCommand::ArithmeticForClause(f) => {
                for expr in [&f.initializer, &f.condition, &f.updater]
                    .into_iter()
                    .flatten()
                {
                    self.arithmetic(&expr.value);
                }
                self.compound_list(&f.body.list);
            }
            ast::CompoundCommand::BraceGroup(b) => self.compound_list(&b.list),
            ast::CompoundCommand::Subshell(s) => self.compound_list(&s.list),
            ast::CompoundCommand::ForClause(f) => {
                for value in f.values.iter().flatten() {
                    self.word(&value.value);
                }
                self.compound_list(&f.body.list);
            }
            ast::CompoundCommand::CaseClause(c) => {
                self.word(&c.value.value);
                for case in &c.cases {
                    for pattern in &case.patterns {
                        self.word(&pattern.value);
                    }
                    if let Some(list) = &case.cmd {
                        self.compound_list(list);
                    }
                }
            }
            ast::CompoundCommand::IfClause(i) => {
                self.compound_list(&i.condition);
                self.compound_list(&i.then);
                for clause in i.elses.iter().flatten() {
                    if let Some(condition) = &clause.condition {
                        self.compound_list(condition);
                    }
                    self.compound_list(&clause.body);
                }
            }
            ast::CompoundCommand::WhileClause(w) | ast::CompoundCommand::UntilClause(w) => {
                self.compound_list(&w.0);
                self.compound_list(&w.1.list);
            }
            ast::CompoundCommand::Coprocess(c) => self.command(&c.body),
        }
    }

    fn extended_test(&mut self, expr: &ast::ExtendedTestExpr) {
        match expr {
            ast::ExtendedTestExpr::And(a, b) | ast::ExtendedTestExpr::Or(a, b) => {
                self.extended_test(a);
                self.extended_test(b);
            }
            ast::ExtendedTestExpr::Not(e) | ast::ExtendedTestExpr::Parenthesized(e) => {
                self.extended_test(e);
            }
            ast::ExtendedTestExpr::UnaryTest(_, w) => {
                self.word(&w.value);
            }
            ast::ExtendedTestExpr::BinaryTest(_, a, b) => {
                self.word(&a.value);
                self.word(&b.value);
            }
        }
    }

    fn redirect_list(&mut self, redirects: Option<&ast::RedirectList>) {
        for redirect in redirects.iter().flat_map(|r| r.0.iter()) {
            self.redirect(redirect);
        }
    }

    /// A redirection: the commands in its words, and, when it writes to a
    /// file, a segment such as `> out.txt` (a file write is not made safe
    /// by the command it follows: `echo x > ~/.bashrc`).
    fn redirect(&mut self, redirect: &ast::IoRedirect) {
        match redirect {
            ast::IoRedirect::File(_, kind, target) => match target {
                ast::IoFileRedirectTarget::Filename(w) => {
                    let word = self.word(&w.value);
                    match kind {
                        ast::IoFileRedirectKind::Write
                        | ast::IoFileRedirectKind::Append
                        | ast::IoFileRedirectKind::ReadAndWrite
                        | ast::IoFileRedirectKind::Clobber
                        | ast::IoFileRedirectKind::DuplicateOutput => {
                            self.file_write(&kind.to_string(), word);
                        }
                        ast::IoFileRedirectKind::Read | ast::IoFileRedirectKind::DuplicateInput => {
                        }
                    }
                }
                ast::IoFileRedirectTarget::Duplicate(w) => {
                    let word = self.word(&w.value);
                    // `>&2`, `2>&1`, `>&3-` duplicate descriptors; `>&file`
                    // writes to a file.
                    let descriptor = word
                        .text
                        .trim_end_matches('-')
                        .chars()
                        .all(|c| c.is_ascii_digit());
                    if !descriptor && matches!(kind, ast::IoFileRedirectKind::DuplicateOutput) {
                        self.file_write(&kind.to_string(), word);
                    }
                }
                ast::IoFileRedirectTarget::Fd(_) => {}
                ast::IoFileRedirectTarget::ProcessSubstitution(_, subshell) => {
                    self.compound_list(&subshell.list);
                }
            },
            ast::IoRedirect::HereDocument(_, doc) => {
                let body = &doc.doc.value;
                if doc.requires_expansion && !body.contains(['$', '`']) {
                    // Nothing in it expands.
                } else if doc.requires_expansion && !brackets_balance(body) {
                    // The word parser backtracks exponentially over
                    // unclosed substitutions; bash would refuse them.
                    self.doubt(
                        body,
                        "a here-document has unclosed substitutions".to_string(),
                    );
                } else if doc.requires_expansion {
                    match word::parse_heredoc(body, &self.options) {
                        Ok(pieces) => {
                            let (mut text, mut literal) = (String::new(), true);
                            self.pieces(&doc.doc.value, &pieces, true, &mut text, &mut literal);
                        }
                        Err(e) => self.doubt(
                            &doc.doc.value,
                            format!("could not parse a here-document: {e}"),
                        ),
                    }
                }
            }
            ast::IoRedirect::HereString(_, w) => {
                self.word(&w.value);
            }
            ast::IoRedirect::OutputAndError(w, append) => {
                let word = self.word(&w.value);
                self.file_write(if *append { "&>>" } else { "&>" }, word);
            }
        }
    }

    /// The segment of a redirection that writes to `target`: `> out.txt`.
    /// The null device and the standard streams need none.
    fn file_write(&mut self, operator: &str, target: ShellWord) {
        let text = format!("{operator} {}", target.text);
        if !target.literal {
            self.doubt(&text, "writes to a file whose name is computed".to_string());
        } else if !matches!(
            target.text.as_str(),
            "/dev/null" | "/dev/stdout" | "/dev/stderr"
        ) {
            self.segments.push(Segment {
                text,
                kind: SegmentKind::Command,
                words: Vec::new(),
            });
        }
    }

    fn assignment(&mut self, assignment: &ast::Assignment) {
        match &assignment.name {
            ast::AssignmentName::VariableName(_) => {}
            ast::AssignmentName::ArrayElementName(_, index) => self.arithmetic(index),
        }
        match &assignment.value {
            ast::AssignmentValue::Scalar(w) => {
                self.word(&w.value);
            }
            ast::AssignmentValue::Array(items) => {
                for (key, value) in items {
                    if let Some(key) = key {
                        self.word(&key.value);
                    }
                    self.word(&value.value);
                }
            }
        }
    }

    fn simple_command(&mut self, simple: &ast::SimpleCommand) {
        // The command's own segments come first, then those of the
        // substitutions in its words.
        let outer = std::mem::take(&mut self.segments);
        let mut assignments: Vec<ShellWord> = Vec::new();
        let mut words: Vec<ShellWord> = Vec::new();
        for item in simple.prefix.iter().flat_map(|p| p.0.iter()) {
            match item {
                ast::CommandPrefixOrSuffixItem::AssignmentWord(a, w) => {
                    self.assignment(a);
                    assignments.push(ShellWord {
                        text: w.value.clone(),
                        literal: false,
                    });
                }
                other => self.item(other, &mut words),
            }
        }
        if let Some(name) = &simple.word_or_name {
            let word = self.word(&name.value);
            words.push(word);
        }
        for item in simple.suffix.iter().flat_map(|s| s.0.iter()) {
            self.item(item, &mut words);
        }
        let inner = std::mem::replace(&mut self.segments, outer);
        if !words.is_empty() {
            if !assignments.is_empty() {
                let mut all = assignments;
                all.extend(words.iter().cloned());
                self.segments.push(Segment {
                    text: join(&all),
                    kind: SegmentKind::Command,
                    words: all.clone(),
                });
            }
            self.words(&words);
            if is_shell(basename(&words[0].text)) {
                self.shell_stdin(simple);
            }
        }
        self.segments.extend(inner);
    }

    /// A shell reading its commands from a here-document or here-string
    /// (`bash <<EOF`): the text is code, walked like a `bash -c` string.
    fn shell_stdin(&mut self, simple: &ast::SimpleCommand) {
        let items = simple
            .prefix
            .iter()
            .flat_map(|p| p.0.iter())
            .chain(simple.suffix.iter().flat_map(|s| s.0.iter()));
        for item in items {
            match item {
                ast::CommandPrefixOrSuffixItem::IoRedirect(ast::IoRedirect::HereDocument(
                    _,
                    doc,
                )) => self.source(&doc.doc.value),
                ast::CommandPrefixOrSuffixItem::IoRedirect(ast::IoRedirect::HereString(_, w)) => {
                    let word = self.word(&w.value);
                    let words = [word];
                    self.code(&words[0].text.clone(), &words);
                }
                _ => {}
            }
        }
    }

    /// A prefix or suffix item of a simple command; words go to `words`.
    fn item(&mut self, item: &ast::CommandPrefixOrSuffixItem, words: &mut Vec<ShellWord>) {
        match item {
            ast::CommandPrefixOrSuffixItem::IoRedirect(r) => self.redirect(r),
            ast::CommandPrefixOrSuffixItem::Word(w) => {
                let word = self.word(&w.value);
                words.push(word);
            }
            ast::CommandPrefixOrSuffixItem::AssignmentWord(a, w) => {
                // An argument such as `export X=$(...)`.
                self.assignment(a);
                words.push(ShellWord {
                    text: w.value.clone(),
                    literal: false,
                });
            }
            ast::CommandPrefixOrSuffixItem::ProcessSubstitution(kind, subshell) => {
                self.compound_list(&subshell.list);
                words.push(ShellWord {
                    text: format!("{kind}{subshell}"),
                    literal: false,
                });
            }
        }
    }

    /// A simple command's words (command name first): its segment, and the
    /// commands it runs when it is a shell, `eval` or a wrapper.
    fn words(&mut self, words: &[ShellWord]) {
        let Some((name, args)) = words.split_first() else {
            return;
        };
        let text = join(words);
        if !name.literal {
            self.segments.push(Segment {
                text,
                kind: SegmentKind::Doubtful(format!(
                    "the command name is not a literal word: {}",
                    name.text
                )),
                words: Vec::new(),
            });
            return;
        }
        self.segments.push(Segment {
            text: text.clone(),
            kind: SegmentKind::Command,
            words: words.to_vec(),
        });
        let base = basename(&name.text);
        // Shells, eval and wrappers have their arguments read as commands
        // already.
        if !is_shell(base) && base != "eval" && wrapper_syntax(base).is_none() {
            self.option_values(args);
        }
        if base != name.text && !base.is_empty() {
            // `/usr/bin/sudo ls` is `sudo ls` to deny rules.
            let mut renamed = vec![ShellWord {
                text: base.to_string(),
                literal: true,
            }];
            renamed.extend(args.iter().cloned());
            self.segments.push(Segment {
                text: join(&renamed),
                kind: SegmentKind::DenyProbe,
                words: Vec::new(),
            });
        }
        match base {
            _ if is_shell(base) => self.shell(&text, args),
            "find" => self.find_actions(args),
            "eval" => {
                let args = match args.first() {
                    Some(first) if first.text == "--" => &args[1..],
                    _ => args,
                };
                self.code(&text, args);
            }
            _ => {
                if let Some(syntax) = wrapper_syntax(base) {
                    self.wrapper(&syntax, args);
                }
            }
        }
    }

    /// Arguments that read as commands (`--pager="rm -rf x"`, `-c 'rm
    /// x'`): a deny rule matches a denied command hiding in an option
    /// value. Only deny rules look at these probes.
    fn option_values(&mut self, args: &[ShellWord]) {
        // Values within values are probed a few levels deep; each level
        // parses its text once more.
        if self.probe_depth >= MAX_PROBE_DEPTH {
            return;
        }
        let mut probed = 0;
        for arg in args {
            let value = match arg.text.split_once('=') {
                Some((name, value)) if name.starts_with('-') || !name.contains(' ') => value,
                _ => arg.text.as_str(),
            };
            if !value.trim().contains(char::is_whitespace) && !value.contains([';', '|', '&']) {
                continue;
            }
            if probed == MAX_PROBES {
                break;
            }
            probed += 1;
            let before = self.segments.len();
            self.probe_depth += 1;
            self.source(value);
            self.probe_depth -= 1;
            for segment in &mut self.segments[before..] {
                segment.kind = SegmentKind::DenyProbe;
            }
        }
    }

    /// `find ... -exec CMD ... ;`: each command `find` runs is a segment.
    fn find_actions(&mut self, args: &[ShellWord]) {
        self.deeper(args, |walker| walker.find_commands(args));
    }

    fn find_commands(&mut self, args: &[ShellWord]) {
        let mut i = 0;
        while i < args.len() {
            if matches!(
                args[i].text.as_str(),
                "-exec" | "-execdir" | "-ok" | "-okdir"
            ) {
                let start = i + 1;
                let mut end = start;
                while end < args.len() && !matches!(args[end].text.as_str(), ";" | "+") {
                    end += 1;
                }
                if end > start {
                    self.words(&args[start..end]);
                }
                i = end;
            }
            i += 1;
        }
    }

    /// Runs `f` one level deeper, or doubts `args` when the walk is as deep
    /// as it may go.
    fn deeper(&mut self, args: &[ShellWord], f: impl FnOnce(&mut Self)) {
        if self.depth >= MAX_DEPTH {
            self.doubt(
                &join(args),
                "the command nests too deeply to check".to_string(),
            );
            return;
        }
        self.depth += 1;
        f(self);
        self.depth -= 1;
    }

    /// Shell code given as words (`eval` arguments, a `bash -c` string).
    fn code(&mut self, text: &str, words: &[ShellWord]) {
        if words.iter().all(|w| w.literal) {
            self.source(&join(words));
        } else {
            let why = "runs shell code that is not a literal string".to_string();
            // The command's own segment carries the doubt.
            match self
                .segments
                .iter_mut()
                .rev()
                .find(|s| s.text == text && s.kind == SegmentKind::Command)
            {
                Some(segment) => segment.kind = SegmentKind::Doubtful(why),
                None => self.doubt(text, why),
            }
        }
    }

    /// `bash [options] -c STRING ...`: the string is parsed too.
    fn shell(&mut self, text: &str, args: &[ShellWord]) {
        let mut has_c = false;
        let mut i = 0;
        while let Some(arg) = args.get(i) {
            let a = arg.text.as_str();
            if a == "--" {
                i += 1;
                break;
            }
            if matches!(a, "--rcfile" | "--init-file") {
                i += 2;
                continue;
            }
            if a.starts_with("--") {
                i += 1;
                continue;
            }
            if (a.starts_with('-') || a.starts_with('+')) && a.len() > 1 {
                has_c |= a.contains('c');
                i += if a.contains(['o', 'O']) { 2 } else { 1 };
                continue;
            }
            break;
        }
        if has_c && let Some(string) = args.get(i) {
            self.code(text, std::slice::from_ref(string));
        }
    }

    /// A wrapper (`env`, `sudo`, `timeout`, ...): the command it runs is a
    /// segment of its own; where an option may have been misread, other
    /// tails of its arguments are deny probes.
    fn wrapper(&mut self, syntax: &WrapperSyntax, args: &[ShellWord]) {
        self.deeper(args, |walker| walker.wrapped(syntax, args));
    }

    fn wrapped(&mut self, syntax: &WrapperSyntax, args: &[ShellWord]) {
        let Wrapped {
            start,
            split_string,
            certain,
        } = read_wrapper(syntax, args);
        if let Some(code) = split_string {
            let mut words = vec![ShellWord {
                text: code,
                literal: true,
            }];
            words.extend(args.iter().skip(start).cloned());
            self.code(&join(args), &words);
        }
        // Where the command may start if an option was misread: within the
        // options, and, when an option was unknown, a little further.
        let end = if certain {
            start.min(args.len())
        } else {
            start.saturating_add(MAX_PROBES).min(args.len())
        };
        for tail in (1..end).take(MAX_PROBES) {
            if tail != start && !args[tail].text.starts_with('-') {
                self.segments.push(Segment {
                    text: join(&args[tail..]),
                    kind: SegmentKind::DenyProbe,
                    words: Vec::new(),
                });
            }
        }
        if let Some(wrapped) = args.get(start..)
            && !wrapped.is_empty()
        {
            self.words(wrapped);
        }
    }

    /// An arithmetic expression: only command substitutions in it matter.
    fn arithmetic(&mut self, expr: &str) {
        if expr.contains(['$', '`']) {
            self.word(expr);
        }
    }

    /// Analyzes one word: its text after quote removal, whether it is
    /// literal, and the commands its substitutions run.
    fn word(&mut self, raw: &str) -> ShellWord {
        if self.depth >= MAX_DEPTH {
            self.doubt(raw, "the command nests too deeply to check".to_string());
            return ShellWord {
                text: raw.to_string(),
                literal: false,
            };
        }
        match word::parse(raw, &self.options) {
            Ok(pieces) => {
                let (mut text, mut literal) = (String::new(), true);
                self.depth += 1;
                self.pieces(raw, &pieces, false, &mut text, &mut literal);
                self.depth -= 1;
                ShellWord { text, literal }
            }
            Err(e) => {
                self.doubt(raw, format!("could not parse the word {raw:?}: {e}"));
                ShellWord {
                    text: raw.to_string(),
                    literal: false,
                }
            }
        }
    }

    fn pieces(
        &mut self,
        raw: &str,
        pieces: &[WordPieceWithSource],
        quoted: bool,
        text: &mut String,
        literal: &mut bool,
    ) {
        for piece in pieces {
            let source = raw.get(piece.start_index..piece.end_index).unwrap_or("");
            match &piece.piece {
                WordPiece::Text(s) => {
                    text.push_str(s);
                    if !quoted && has_glob(s) {
                        *literal = false;
                    }
                }
                WordPiece::SingleQuotedText(s) => text.push_str(s),
                WordPiece::AnsiCQuotedText(_) => {
                    text.push_str(source);
                    *literal = false;
                }
                WordPiece::DoubleQuotedSequence(inner) => {
                    self.pieces(raw, inner, true, text, literal);
                }
                WordPiece::GettextDoubleQuotedSequence(inner) => {
                    self.pieces(raw, inner, true, text, literal);
                    *literal = false;
                }
                WordPiece::TildeExpansion(_) => text.push_str(source),
                WordPiece::ParameterExpansion(expr) => {
                    text.push_str(source);
                    *literal = false;
                    self.parameter_expr(expr);
                }
                WordPiece::CommandSubstitution(code)
                | WordPiece::BackquotedCommandSubstitution(code) => {
                    text.push_str(source);
                    *literal = false;
                    self.source(code);
                }
                WordPiece::EscapeSequence(s) => {
                    let escaped = s.strip_prefix('\\').unwrap_or(s);
                    if escaped == "\n" {
                        // A line continuation.
                    } else if !quoted || matches!(escaped, "$" | "`" | "\"" | "\\") {
                        text.push_str(escaped);
                    } else {
                        text.push_str(s);
                    }
                }
                WordPiece::ArithmeticExpression(expr) => {
                    text.push_str(source);
                    *literal = false;
                    self.arithmetic(&expr.value);
                }
            }
        }
    }

    fn parameter(&mut self, parameter: &Parameter) {
        match parameter {
            Parameter::NamedWithIndex { index, .. } => self.arithmetic(index),
            Parameter::Positional(_)
            | Parameter::Special(_)
            | Parameter::Named(_)
            | Parameter::NamedWithAllIndices { .. } => {}
        }
    }

    /// The words and expressions inside `${...}` (e.g. the default in
    /// `${X:-$(cmd)}`).
    fn parameter_expr(&mut self, expr: &ParameterExpr) {
        match expr {
            ParameterExpr::Parameter { parameter, .. }
            | ParameterExpr::ParameterLength { parameter, .. }
            | ParameterExpr::Transform { parameter, .. } => self.parameter(parameter),
            ParameterExpr::UseDefaultValues {
                parameter,
                default_value: value,
                ..
            }
            | ParameterExpr::AssignDefaultValues {
                parameter,
                default_value: value,
                ..
            }
            | ParameterExpr::IndicateErrorIfNullOrUnset {
                parameter,
                error_message: value,
                ..
            }
            | ParameterExpr::UseAlternativeValue {
                parameter,
                alternative_value: value,
                ..
            }
            | ParameterExpr::RemoveSmallestSuffixPattern {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::RemoveLargestSuffixPattern {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::RemoveSmallestPrefixPattern {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::RemoveLargestPrefixPattern {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::UppercaseFirstChar {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::UppercasePattern {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::LowercaseFirstChar {
                parameter,
                pattern: value,
                ..
            }
            | ParameterExpr::LowercasePattern {
                parameter,
                pattern: value,
                ..
            } => {
                self.parameter(parameter);
                if let Some(value) = value {
                    self.word(value);
                }
            }
            ParameterExpr::Substring {
                parameter,
                offset,
                length,
                ..
            } => {
                self.parameter(parameter);
                self.arithmetic(&offset.value);
                if let Some(length) = length {
                    self.arithmetic(&length.value);
                }
            }
            ParameterExpr::ReplaceSubstring {
                parameter,
                pattern,
                replacement,
                ..
            } => {
                self.parameter(parameter);
                self.word(pattern);
                if let Some(replacement) = replacement {
                    self.word(replacement);
                }
            }
            ParameterExpr::VariableNames { .. } | ParameterExpr::MemberKeys { .. } => {}
        }
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
