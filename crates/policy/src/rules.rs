//! Compiled rules and what they decide: the verdict for a call, the
//! allowances "approve for this session" records, and which calls get
//! network.

use crate::approvals::{Approver, MAX_APPROVALS, Need};
use crate::config::{PolicyConfig, PolicyRule};
use crate::shell::{Segment, SegmentKind, segments_of, text_tails};
use crate::{BASH, Decision};
use globset::{GlobBuilder, GlobMatcher};
use std::collections::BTreeMap;
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
    /// For a confirm: who must approve (what the confirming rules ask).
    pub need: Need,
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
    /// When the tool is a glob over names.
    tool_glob: Option<GlobMatcher>,
    /// Only tools whose server's read-only hint is this.
    read_only_hint: Option<bool>,
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
    /// For a confirm rule: who must approve.
    need: Need,
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
        self.tool == "*"
            || self.tool == tool
            || self.tool_glob.as_ref().is_some_and(|g| g.is_match(tool))
    }

    /// Whether the rule matches one bash segment.
    fn matches_segment(&self, text: &str) -> bool {
        // A rule about MCP servers' hints never decides a shell command.
        self.read_only_hint.is_none()
            && self.applies_to(BASH)
            && match &self.matcher {
                Matcher::Any => true,
                Matcher::Command(glob) => glob.is_match(text),
                Matcher::Path(_) => false,
            }
    }

    /// Whether the rule matches a call of a tool other than bash. `paths`
    /// are the call's path argument as given and normalized.
    fn matches_call(&self, tool: &str, paths: &[String], read_only_hint: Option<bool>) -> bool {
        self.applies_to(tool)
            && self
                .read_only_hint
                .is_none_or(|hint| Some(hint) == read_only_hint)
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
    let tool_glob = if tool != "*" && tool.contains(['*', '?', '[']) {
        Some(glob(tool, "tool", false)?)
    } else {
        None
    };
    if rule.read_only_hint.is_some() && tool == BASH {
        return Err(invalid(
            "read_only_hint applies to MCP tools, not to bash".to_string(),
        ));
    }
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
    let need = compile_need(rule).map_err(invalid)?;
    let label = match rule.reason.as_deref().map(str::trim) {
        Some(reason) if !reason.is_empty() => format!("rule {index} ({shown}): {reason}"),
        _ => format!("rule {index} ({shown})"),
    };
    Ok(CompiledRule {
        tool: tool.to_string(),
        tool_glob,
        read_only_hint: rule.read_only_hint,
        matcher,
        decision: rule.decision,
        label,
        check_arguments: rule.check_arguments,
        network: rule.network,
        need,
    })
}

/// A rule's `approvers` and `approvals_required`, checked.
fn compile_need(rule: &PolicyRule) -> Result<Need, String> {
    let restricted = !rule.approvers.is_empty() || rule.approvals_required.is_some();
    if restricted && rule.decision != Decision::Confirm {
        return Err(format!(
            "approvers and approvals_required apply to confirm rules, not to a {} rule",
            decision_name(rule.decision)
        ));
    }
    let required = rule.approvals_required.unwrap_or(1);
    if !(1..=MAX_APPROVALS).contains(&required) {
        return Err(format!(
            "approvals_required is {required}; it is 1 to {MAX_APPROVALS}"
        ));
    }
    let approvers = rule
        .approvers
        .iter()
        .map(|a| Approver::parse(a))
        .collect::<Result<Vec<_>, _>>()?;
    let only_people = approvers.iter().all(|a| matches!(a, Approver::Person(_)));
    if !approvers.is_empty() && only_people && approvers.len() < required as usize {
        return Err(format!(
            "approvals_required is {required} but only {} people are named",
            approvers.len()
        ));
    }
    Ok(Need {
        approvers: if approvers.is_empty() {
            Vec::new()
        } else {
            vec![approvers]
        },
        required,
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
        self.check_tool(tool, arguments_json, read_only, None, session_rules)
    }

    /// [`Policy::check`] for any tool: `read_only_hint` is `Some` for a tool
    /// of an MCP server (what the server says of it), `None` for the others.
    /// Only rules asking for a hint match on it, and they match MCP tools
    /// only; path rules never match MCP tools (a server's `path` argument
    /// means what the server wants).
    pub fn check_tool(
        &self,
        tool: &str,
        arguments_json: &str,
        read_only: bool,
        read_only_hint: Option<bool>,
        session_rules: &[SessionRule],
    ) -> Verdict {
        if self.allow_all {
            return Verdict {
                decision: Decision::Allow,
                rule: "allow all".to_string(),
                segment: None,
                need: Need::default(),
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
                    need: Need::default(),
                },
            }
        } else {
            let path = if read_only_hint.is_some() {
                None
            } else {
                string_arg("path")
            };
            self.check_call(tool, path, read_only_hint, default, session_rules)
        }
    }

    /// A call of a tool other than bash.
    fn check_call(
        &self,
        tool: &str,
        path: Option<String>,
        read_only_hint: Option<bool>,
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
        let (decision, rule, need) = match strictest(self.rules.iter(), |r| {
            r.matches_call(tool, &paths, read_only_hint)
        }) {
            Some(rule) => (rule.decision, rule.label.clone(), rule.need.clone()),
            None => (
                default,
                format!("default for {tool}: {}", decision_name(default)),
                Need::default(),
            ),
        };
        // A person's standing approval answers what would ask them; it
        // never lifts a deny, nor a rule naming who approves.
        if decision == Decision::Confirm
            && !need.is_restricted()
            && let Some(session) = session_rules.iter().find(|s| {
                s.tool == tool && s.command.is_none() && (s.path.is_none() || s.path == path)
            })
        {
            return Verdict {
                decision: Decision::Allow,
                rule: session_label(session),
                segment: None,
                need: Need::default(),
            };
        }
        Verdict {
            decision,
            rule,
            segment: None,
            need,
        }
    }

    /// A bash call: the strictest of its segments.
    fn check_bash(
        &self,
        command: &str,
        default: Decision,
        session_rules: &[SessionRule],
    ) -> Verdict {
        // A denied command anywhere in the text, quoted values included,
        // denies the line: bash may run a value as code later.
        let deny_rules: Vec<&CompiledRule> = self
            .rules
            .iter()
            .filter(|r| r.decision == Decision::Deny)
            .collect();
        let mut too_long = false;
        if !deny_rules.is_empty() {
            match text_tails(command) {
                Some(pieces) => {
                    for (piece, starts) in &pieces {
                        for start in starts {
                            let tail = &piece[*start..];
                            if let Some(rule) = deny_rules.iter().find(|r| r.matches_segment(tail))
                            {
                                return Verdict {
                                    decision: Decision::Deny,
                                    rule: rule.label.clone(),
                                    segment: Some(tail.to_string()),
                                    need: Need::default(),
                                };
                            }
                        }
                    }
                }
                None => too_long = true,
            }
        }
        let segments = segments_of(command);
        // The strictest segment; of equally strict ones the first, except
        // that an explanation of doubt beats a plain default.
        let mut best: Option<(Decision, bool, String, String)> = None;
        // Every confirmed segment's rule has its say on who approves.
        let mut need = Need::default();
        for segment in &segments {
            let Some((decision, rule, asks)) =
                self.classify_segment(segment, default, session_rules)
            else {
                continue;
            };
            if decision == Decision::Confirm {
                need.join(&asks);
            }
            let doubtful =
                matches!(segment.kind, SegmentKind::Doubtful(_)) && decision == Decision::Confirm;
            if best.as_ref().is_none_or(|(d, was_doubtful, _, _)| {
                decision > *d || (decision == *d && doubtful && !was_doubtful)
            }) {
                best = Some((decision, doubtful, rule, segment.text.clone()));
            }
        }
        if too_long && best.as_ref().is_none_or(|(d, ..)| *d == Decision::Allow) {
            return Verdict {
                decision: Decision::Confirm,
                rule: "the command is too long to search for denied commands".to_string(),
                segment: None,
                need: Need::default(),
            };
        }
        match best {
            Some((decision, _, rule, segment)) => Verdict {
                need: if decision == Decision::Confirm {
                    need
                } else {
                    Need::default()
                },
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
                    need: Need::default(),
                },
                _ => Verdict {
                    decision: default,
                    rule: format!("default for bash: {}", decision_name(default)),
                    segment: None,
                    need: Need::default(),
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
    ) -> Option<(Decision, String, Need)> {
        let rule = strictest(self.rules.iter(), |r| r.matches_segment(&segment.text));
        let need = rule.map(|r| r.need.clone()).unwrap_or_default();
        match &segment.kind {
            SegmentKind::DenyProbe => rule
                .filter(|r| r.decision == Decision::Deny)
                .map(|r| (r.decision, r.label.clone(), Need::default())),
            SegmentKind::Doubtful(why) => Some(match rule {
                Some(r) if r.decision == Decision::Deny => {
                    (Decision::Deny, r.label.clone(), Need::default())
                }
                _ => (Decision::Confirm, why.clone(), need),
            }),
            SegmentKind::Command => {
                let (decision, label) = match rule {
                    // An allow rule passes the arguments it knows to be
                    // harmless; anything else is confirmed.
                    Some(r) if r.decision == Decision::Allow && r.check_arguments => {
                        let words: Vec<crate::args::Word<'_>> = segment
                            .words
                            .iter()
                            .map(|w| crate::args::Word {
                                text: &w.text,
                                literal: w.literal,
                            })
                            .collect();
                        match crate::args::vet(&words) {
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
                    Some(s) if decision == Decision::Confirm && !need.is_restricted() => {
                        (Decision::Allow, session_label(s), Need::default())
                    }
                    _ => (decision, label, need),
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
pub(crate) fn normalize_path(path: &str) -> String {
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
