//! Narrower rules from the decisions people took: which allow rules would
//! have saved the prompts they answered "yes" to, without allowing anything
//! they answered "no" to.
//!
//! Candidates are narrow by construction: for bash, the program and its
//! first word (`git push*`, `cargo test*`) or the bare program; for file
//! tools, the directory of the path (`src/*`) or the path itself; for other
//! tools (MCP tools, the web tools), the tool. Each candidate is compiled and
//! judged by the real policy: it must allow no denied call (for bash, no
//! command of a denied line, each checked on its own), and what it saves is
//! counted by checking every approved call against it.

use crate::config::{PolicyConfig, PolicyDecision, PolicyRule};
use crate::rules::Policy;
use crate::shell::{SegmentKind, segments_of};
use crate::{BASH, Decision};
use std::collections::BTreeMap;

/// One decision a person took on a call the policy asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// The tool.
    pub tool: String,
    /// Its arguments as the call had them.
    pub arguments_json: String,
    /// Approved (once, for the session, or edited), or denied.
    pub approved: bool,
}

/// A rule that would have saved prompts.
#[derive(Debug, Clone, PartialEq)]
pub struct Suggestion {
    /// The rule, ready for `[[policy.rules]]`.
    pub rule: PolicyRule,
    /// Approved calls it would have allowed without asking.
    pub saves: usize,
    /// Denied calls of the same tool it was checked against (none allowed).
    pub denials_checked: usize,
}

impl Suggestion {
    /// The rule as TOML, with a comment saying what it saves.
    pub fn to_toml(&self) -> String {
        let mut out = format!(
            "# would have saved {} prompt{}; allows none of the {} denied call{} of {}\n\
             [[policy.rules]]\ntool = {:?}\n",
            self.saves,
            if self.saves == 1 { "" } else { "s" },
            self.denials_checked,
            if self.denials_checked == 1 { "" } else { "s" },
            self.rule.tool,
            self.rule.tool,
        );
        if let Some(command) = &self.rule.command {
            out.push_str(&format!("command = {command:?}\n"));
        }
        if let Some(path) = &self.rule.path {
            out.push_str(&format!("path = {path:?}\n"));
        }
        out.push_str("decision = \"allow\"\n");
        out
    }
}

fn allow_rule(tool: &str, command: Option<String>, path: Option<String>) -> PolicyRule {
    PolicyRule {
        tool: tool.to_string(),
        read_only_hint: None,
        command,
        path,
        decision: PolicyDecision::Allow,
        reason: Some("suggested from past approvals".into()),
        check_arguments: true,
        network: false,
        approvers: Vec::new(),
        approvals_required: None,
    }
}

/// The candidate rules one approved call gives.
fn candidates(call: &Decided) -> Vec<PolicyRule> {
    let args = serde_json::from_str::<serde_json::Value>(&call.arguments_json).ok();
    let string_arg = |name: &str| {
        args.as_ref()
            .and_then(|a| a.get(name))
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
    };
    if call.tool == BASH {
        let Some(command) = string_arg("command") else {
            return Vec::new();
        };
        return segments_of(&command)
            .into_iter()
            .filter(|s| matches!(s.kind, SegmentKind::Command))
            .filter_map(|s| {
                let words: Vec<&str> = s.text.split(' ').filter(|w| !w.is_empty()).collect();
                let glob = match words.as_slice() {
                    [] => return None,
                    [program] => (*program).to_string(),
                    // An interpreter runs whatever code it is given
                    // (`python3 -c '…'`, `perl -e '…'`, a script): only
                    // the exact command approved is suggested.
                    [program, ..] if is_interpreter(program) => s.text.clone(),
                    [program, first, ..] => format!("{program} {first}*"),
                };
                // Globs are written with the segment's own characters: one
                // that has glob syntax in it is not suggested.
                (!glob
                    .trim_end_matches('*')
                    .contains(['*', '?', '[', ']', '{', '}']))
                .then(|| allow_rule(BASH, Some(glob), None))
            })
            .collect();
    }
    match string_arg("path") {
        Some(path) if !path.is_empty() && !path.contains(['*', '?', '[', ']', '{', '}']) => {
            let mut rules = vec![allow_rule(&call.tool, None, Some(path.clone()))];
            if let Some((dir, _)) = path.rsplit_once('/')
                && !dir.is_empty()
                && !dir.split('/').any(|part| part == "..")
            {
                rules.push(allow_rule(&call.tool, None, Some(format!("{dir}/*"))));
            }
            rules
        }
        Some(_) => Vec::new(),
        None => vec![allow_rule(&call.tool, None, None)],
    }
}

/// Whether a program runs code given as its arguments: shells, script
/// interpreters (with or without a version: `python3.12`), and tools that
/// take a program (`awk`, `sed -e`, `xargs`, `find -exec`) are treated alike.
fn is_interpreter(program: &str) -> bool {
    let base = program.rsplit('/').next().unwrap_or(program);
    let name = base.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    matches!(
        name,
        "python"
            | "pypy"
            | "perl"
            | "ruby"
            | "node"
            | "nodejs"
            | "deno"
            | "bun"
            | "php"
            | "lua"
            | "luajit"
            | "Rscript"
            | "R"
            | "julia"
            | "tclsh"
            | "wish"
            | "bash"
            | "sh"
            | "zsh"
            | "dash"
            | "ksh"
            | "fish"
            | "pwsh"
            | "powershell"
            | "osascript"
            | "awk"
            | "gawk"
            | "mawk"
            | "sed"
            | "xargs"
            | "find"
            | "env"
            | "eval"
            | "exec"
            | "sudo"
            | "timeout"
            | "nohup"
            | "nice"
    )
}

/// The calls a denied call stands for when a candidate is judged: for bash,
/// each of its commands on its own (a person who denied `a && b` may have
/// objected to either).
fn denied_parts(call: &Decided) -> Vec<String> {
    if call.tool != BASH {
        return vec![call.arguments_json.clone()];
    }
    let command = serde_json::from_str::<serde_json::Value>(&call.arguments_json)
        .ok()
        .and_then(|v| v.get("command")?.as_str().map(str::to_string));
    let Some(command) = command else {
        return vec![call.arguments_json.clone()];
    };
    let mut parts = vec![call.arguments_json.clone()];
    for segment in segments_of(&command) {
        parts.push(serde_json::json!({ "command": segment.text }).to_string());
    }
    parts
}

/// Rules that would have saved at least `min_saves` prompts each, most
/// saving first; none allows a call a person denied.
pub fn suggest(decided: &[Decided], min_saves: usize) -> Vec<Suggestion> {
    let mut seen: BTreeMap<(String, Option<String>, Option<String>), PolicyRule> = BTreeMap::new();
    for call in decided.iter().filter(|c| c.approved) {
        for rule in candidates(call) {
            seen.entry((rule.tool.clone(), rule.command.clone(), rule.path.clone()))
                .or_insert(rule);
        }
    }
    let mut out = Vec::new();
    for rule in seen.into_values() {
        let Ok(policy) = Policy::from_config(&PolicyConfig {
            tools: BTreeMap::new(),
            rules: vec![rule.clone()],
            network: false,
        }) else {
            continue;
        };
        let allows = |tool: &str, args: &str| {
            let hint = tool.contains("__").then_some(false);
            policy.check_tool(tool, args, false, hint, &[]).decision == Decision::Allow
        };
        let denied: Vec<&Decided> = decided
            .iter()
            .filter(|c| !c.approved && c.tool == rule.tool)
            .collect();
        if denied
            .iter()
            .any(|c| denied_parts(c).iter().any(|args| allows(&c.tool, args)))
        {
            continue;
        }
        let saves = decided
            .iter()
            .filter(|c| c.approved && c.tool == rule.tool && allows(&c.tool, &c.arguments_json))
            .count();
        if saves >= min_saves.max(1) {
            out.push(Suggestion {
                rule,
                saves,
                denials_checked: denied.len(),
            });
        }
    }
    // Most saving first; of equal ones, the narrower (a path before its
    // directory, a longer command glob first).
    out.sort_by(|a, b| {
        b.saves.cmp(&a.saves).then_with(|| {
            let len = |s: &Suggestion| {
                s.rule.command.as_ref().map_or(0, String::len)
                    + s.rule.path.as_ref().map_or(0, String::len)
            };
            len(b).cmp(&len(a))
        })
    });
    // A broader rule that saves no more than a narrower one of the same
    // tool is left out.
    let mut kept: Vec<Suggestion> = Vec::new();
    for s in out {
        let redundant = kept.iter().any(|k| {
            k.rule.tool == s.rule.tool
                && k.saves >= s.saves
                && match (&s.rule.path, &k.rule.path) {
                    (Some(broad), Some(narrow)) => {
                        broad.ends_with("/*") && narrow.starts_with(broad.trim_end_matches('*'))
                    }
                    _ => false,
                }
        });
        if !redundant {
            kept.push(s);
        }
    }
    kept
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn bash(command: &str, approved: bool) -> Decided {
        Decided {
            tool: BASH.into(),
            arguments_json: serde_json::json!({ "command": command }).to_string(),
            approved,
        }
    }

    fn write(path: &str, approved: bool) -> Decided {
        Decided {
            tool: "write_file".into(),
            arguments_json: serde_json::json!({ "path": path, "content": "x" }).to_string(),
            approved,
        }
    }

    fn mcp(tool: &str, approved: bool) -> Decided {
        Decided {
            tool: tool.into(),
            arguments_json: "{}".into(),
            approved,
        }
    }

    fn globs(suggestions: &[Suggestion]) -> Vec<(String, String, usize)> {
        suggestions
            .iter()
            .map(|s| {
                (
                    s.rule.tool.clone(),
                    s.rule
                        .command
                        .clone()
                        .or(s.rule.path.clone())
                        .unwrap_or_default(),
                    s.saves,
                )
            })
            .collect()
    }

    #[test]
    fn approvals_become_narrow_rules_that_allow_nothing_denied() {
        let decided = vec![
            bash("cargo test", true),
            bash("cargo test -p agentry-cli", true),
            bash("cargo test --workspace", true),
            bash("make build", true),
            bash("make build", true),
            // `make install` was denied: a `make*` rule would allow it, so
            // only `make build*` is suggested.
            bash("make install && echo done", false),
            bash("git push origin main", true),
            bash("git push --force", false),
            write("src/a.rs", true),
            write("src/b.rs", true),
            write("secrets/key", false),
            mcp("time__get_current_time", true),
            mcp("time__get_current_time", true),
            mcp("git__git_reset", true),
            mcp("git__git_reset", false),
        ];
        let suggested = suggest(&decided, 2);
        let got = globs(&suggested);
        assert!(
            got.contains(&("bash".into(), "cargo test*".into(), 3)),
            "{got:?}"
        );
        assert!(
            got.contains(&("bash".into(), "make build*".into(), 2)),
            "{got:?}"
        );
        assert!(
            got.contains(&("write_file".into(), "src/*".into(), 2)),
            "{got:?}"
        );
        assert!(
            got.contains(&("time__get_current_time".into(), String::new(), 2)),
            "{got:?}"
        );
        // Denied once: never suggested, whatever was approved.
        assert!(
            !got.iter().any(|(_, g, _)| g.starts_with("git push")),
            "{got:?}"
        );
        assert!(
            !got.iter().any(|(t, _, _)| t == "git__git_reset"),
            "{got:?}"
        );
        assert!(
            !got.iter()
                .any(|(_, g, _)| g == "make*" || g == "make install*"),
            "{got:?}"
        );
        // Every suggestion compiles and, checked again, allows no denied call.
        for s in &suggested {
            let policy = Policy::from_config(&PolicyConfig {
                tools: BTreeMap::new(),
                rules: vec![s.rule.clone()],
                network: false,
            })
            .unwrap();
            for d in decided.iter().filter(|d| !d.approved) {
                for args in denied_parts(d) {
                    assert_ne!(
                        policy.check(&d.tool, &args, false, &[]).decision,
                        Decision::Allow,
                        "{s:?} allows denied {d:?}"
                    );
                }
            }
        }
        // Most saving first.
        assert_eq!(suggested[0].saves, 3);
        let toml = suggested[0].to_toml();
        assert!(toml.starts_with("# would have saved 3 prompts"), "{toml}");
        assert!(
            toml.contains("command = \"cargo test*\"\ndecision = \"allow\""),
            "{toml}"
        );
    }

    #[test]
    fn approved_interpreter_code_is_never_widened() {
        let approved = [
            bash("python3 -c 'print(1)'", true),
            bash("python3 -c 'print(1)'", true),
            bash("/usr/bin/perl -e 'print 1'", true),
            bash("/usr/bin/perl -e 'print 1'", true),
            bash("node -e 1", true),
            bash("node -e 1", true),
        ];
        let got = globs(&suggest(&approved, 2));
        let mut commands: Vec<&str> = got.iter().map(|(_, g, _)| g.as_str()).collect();
        commands.sort_unstable();
        assert_eq!(
            commands,
            vec![
                "/usr/bin/perl -e print 1",
                "node -e 1",
                "python3 -c print(1)"
            ],
            "{got:?}"
        );
        assert!(commands.iter().all(|g| !g.ends_with('*')), "{got:?}");
    }

    #[test]
    fn one_approval_is_not_enough_by_default_and_globs_in_input_are_not_copied() {
        assert!(suggest(&[bash("ls -la", true)], 2).is_empty());
        assert_eq!(suggest(&[bash("ls -la", true)], 1).len(), 1);
        // Glob syntax in what was approved is not turned into a glob.
        let tricky = vec![bash("echo [a]", true), bash("echo [a]", true)];
        assert_eq!(
            globs(&suggest(&tricky, 2)),
            Vec::<(String, String, usize)>::new()
        );
        let paths = vec![write("src/*.rs", true), write("src/*.rs", true)];
        assert_eq!(
            globs(&suggest(&paths, 2)),
            Vec::<(String, String, usize)>::new()
        );
        // A path leaving the workspace never widens to its directory.
        let paths = vec![write("../outside", true), write("../outside", true)];
        let got = globs(&suggest(&paths, 2));
        assert!(!got.iter().any(|(_, g, _)| g == "../*"), "{got:?}");
    }
}
