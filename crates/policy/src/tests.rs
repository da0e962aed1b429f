#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::rules::normalize_path;
use crate::shell::{MAX_NESTING, nesting_bound};
use crate::*;
use pretty_assertions::assert_eq;
use serde_json::json;
use std::collections::BTreeMap;

const RM_RULE: &str = r#"rule 1 (bash "rm -rf /*"): never delete from the root of the file system"#;
const SUDO_RULE: &str = r#"rule 2 (bash "sudo *"): no privilege escalation"#;
const SECRETS_RULE: &str = r#"rule 10 (write_file path "secrets/**"): secrets stay secret"#;
const NOTES_RULE: &str = r#"rule 11 (write_file path "notes/*.md")"#;
const BASH_DEFAULT: &str = "default for bash: confirm";
const ASSIGNMENT: &str = "sets a variable, whose value bash or a program may later run as code";

fn rule(
    tool: &str,
    command: Option<&str>,
    path: Option<&str>,
    decision: Decision,
    reason: Option<&str>,
) -> PolicyRule {
    PolicyRule {
        read_only_hint: None,
        tool: tool.to_string(),
        command: command.map(str::to_string),
        path: path.map(str::to_string),
        decision,
        reason: reason.map(str::to_string),
        check_arguments: true,
        network: false,
        approvers: Vec::new(),
        approvals_required: None,
    }
}

fn bash_rule(command: &str, decision: Decision) -> PolicyRule {
    rule("bash", Some(command), None, decision, None)
}

/// config/default.toml's policy, plus two path rules for write_file.
fn test_config() -> PolicyConfig {
    PolicyConfig {
        tools: [
            ("bash".to_string(), Decision::Confirm),
            ("write_file".to_string(), Decision::Confirm),
            ("read_file".to_string(), Decision::Allow),
        ]
        .into_iter()
        .collect(),
        rules: vec![
            rule(
                "bash",
                Some("rm -rf /*"),
                None,
                Decision::Deny,
                Some("never delete from the root of the file system"),
            ),
            rule(
                "bash",
                Some("sudo *"),
                None,
                Decision::Deny,
                Some("no privilege escalation"),
            ),
            bash_rule("ls*", Decision::Allow),
            bash_rule("pwd", Decision::Allow),
            bash_rule("cat *", Decision::Allow),
            bash_rule("echo*", Decision::Allow),
            bash_rule("git status*", Decision::Allow),
            bash_rule("git diff*", Decision::Allow),
            bash_rule("git log*", Decision::Allow),
            rule(
                "write_file",
                None,
                Some("secrets/**"),
                Decision::Deny,
                Some("secrets stay secret"),
            ),
            rule(
                "write_file",
                None,
                Some("notes/*.md"),
                Decision::Allow,
                None,
            ),
        ],
        network: false,
    }
}

fn policy() -> Policy {
    Policy::from_config(&test_config()).unwrap()
}

fn bash_args(command: &str) -> String {
    json!({ "command": command }).to_string()
}

fn path_args(path: &str) -> String {
    json!({ "path": path, "content": "x" }).to_string()
}

fn bash(policy: &Policy, command: &str) -> Verdict {
    bash_with(policy, command, &[])
}

fn bash_with(policy: &Policy, command: &str, session: &[SessionRule]) -> Verdict {
    policy.check("bash", &bash_args(command), false, session)
}

fn write(policy: &Policy, path: &str, session: &[SessionRule]) -> Verdict {
    policy.check("write_file", &path_args(path), false, session)
}

fn verdict(decision: Decision, rule: &str, segment: Option<&str>) -> Verdict {
    Verdict {
        decision,
        rule: rule.to_string(),
        segment: segment.map(str::to_string),
        need: Need::default(),
    }
}

fn bash_session(command: &str) -> SessionRule {
    SessionRule {
        tool: "bash".to_string(),
        command: Some(command.to_string()),
        path: None,
    }
}

#[test]
fn tool_defaults() {
    let p = policy();
    assert_eq!(
        p.check("read_file", &path_args("src/main.rs"), true, &[]),
        verdict(Decision::Allow, "default for read_file: allow", None)
    );
    assert_eq!(
        bash(&p, "make"),
        verdict(Decision::Confirm, BASH_DEFAULT, Some("make"))
    );
    assert_eq!(
        write(&p, "src/main.rs", &[]),
        verdict(Decision::Confirm, "default for write_file: confirm", None)
    );
    // Tools the configuration does not list follow their read-only flag.
    assert_eq!(
        p.check("list_dir", "{}", true, &[]),
        verdict(Decision::Allow, "default for list_dir: allow", None)
    );
    assert_eq!(
        p.check("deploy", "{}", false, &[]),
        verdict(Decision::Confirm, "default for deploy: confirm", None)
    );
    // A configured default wins over the flag.
    assert_eq!(bash_with_read_only(&p, "make"), Decision::Confirm);
}

fn bash_with_read_only(policy: &Policy, command: &str) -> Decision {
    policy
        .check("bash", &bash_args(command), true, &[])
        .decision
}

#[test]
fn allow_rules() {
    let p = policy();
    assert_eq!(
        bash(&p, "ls -la"),
        verdict(Decision::Allow, r#"rule 3 (bash "ls*")"#, Some("ls -la"))
    );
    assert_eq!(
        bash(&p, "git status"),
        verdict(
            Decision::Allow,
            r#"rule 7 (bash "git status*")"#,
            Some("git status")
        )
    );
    assert_eq!(bash(&p, "pwd").decision, Decision::Allow);
    assert_eq!(
        bash(&p, "cat README.md | grep -v x").decision,
        Decision::Confirm
    );
    assert_eq!(
        bash(&p, "cat README.md && echo done; ls").decision,
        Decision::Allow
    );
    // Quotes are removed before matching.
    assert_eq!(
        bash(&p, r#"echo "a b" 'c'"#),
        verdict(
            Decision::Allow,
            r#"rule 6 (bash "echo*")"#,
            Some("echo a b c")
        )
    );
}

#[test]
fn hidden_sudo_is_denied() {
    let p = policy();
    let cases = [
        "ls; sudo rm x",
        "ls | sudo tee x",
        "echo $(sudo id)",
        "echo `sudo id`",
        "(cd /tmp && sudo ls)",
        "{ sudo ls; }",
        "bash -c 'sudo ls'",
        r#"sh -c "ls && sudo ls""#,
        "eval sudo ls",
        "env X=1 sudo ls",
        "if true; then sudo ls; fi",
        "if false; then :; elif sudo ls; then :; else :; fi",
        "for i in 1; do sudo ls; done",
        "while sudo ls; do :; done",
        "until false; do sudo ls; done",
        "f() { sudo ls; }; f",
        "case x in x) sudo ls ;; esac",
        "case $(sudo id) in *) ;; esac",
        "ls || sudo ls",
        "ls & sudo ls",
        "! sudo ls",
        "time sudo ls",
        "echo \"$(sudo id)\"",
        "echo ${X:-$(sudo id)}",
        "echo $((1 + $(sudo id)))",
        "(( $(sudo id) ))",
        "[[ -n $(sudo id) ]]",
        "X=$(sudo id)",
        "X=$(sudo id) ls",
        "ls > $(sudo id)",
        "cat <(sudo ls)",
        "cat <<EOF\n$(sudo id)\nEOF\n",
        "echo $(echo $(echo `sudo id`))",
        // Backquotes nest by escaping: `\`` one level down, `\\\``
        // two levels down.
        r"echo `echo \`sudo id\``",
        r"echo `echo \`echo \\\`sudo id\\\`\``",
        r#"echo "`echo \"\`sudo id\`\"`""#,
        "bash -lc 'sudo ls'",
        "bash -c 'bash -c \"sudo ls\"'",
        "sudo bash -c 'ls'",
        "eval 'echo ok; sudo ls'",
        "eval -- sudo ls",
        "env -i PATH=/bin sudo ls",
        "env -S 'sudo ls'",
        "nohup sudo ls",
        "timeout 5 sudo ls",
        "timeout -s KILL 5 sudo ls",
        "find . | xargs sudo rm",
        "xargs -n 1 sudo rm < list",
        "exec sudo ls",
        "command sudo ls",
        "nice -n 5 sudo ls",
        "busybox sh -c 'sudo ls'",
        "coproc sudo ls",
        "sudo -u root bash -c 'ls'",
        "/usr/bin/sudo ls",
        "\\sudo ls",
        "'sudo' ls",
        "\"sudo\" ls",
        "su\\\ndo ls",
        "X=1 sudo ls",
        "sudo",
    ];
    for command in cases {
        let v = bash(&p, command);
        if command == "sudo" {
            // `sudo *` needs an argument; bare sudo is only confirmed.
            assert_eq!(v.decision, Decision::Confirm, "{command}");
            continue;
        }
        assert_eq!(v.decision, Decision::Deny, "{command}: {v:?}");
        assert_eq!(v.rule, SUDO_RULE, "{command}");
        assert!(
            v.segment.as_deref().is_some_and(|s| s.starts_with("sudo")),
            "{command}: {v:?}"
        );
    }
}

#[test]
fn hidden_rm_is_denied() {
    let p = policy();
    assert_eq!(
        bash(&p, "ls && rm -rf /x"),
        verdict(Decision::Deny, RM_RULE, Some("rm -rf /x"))
    );
    assert_eq!(
        bash(&p, "ls && rm -rf '/x'"),
        verdict(Decision::Deny, RM_RULE, Some("rm -rf /x"))
    );
    // Even behind an option the wrapper syntax does not know.
    assert_eq!(
        bash(&p, "timeout --weird X 5 rm -rf /"),
        verdict(Decision::Deny, RM_RULE, Some("rm -rf /"))
    );
    assert_eq!(bash(&p, "timeout 5 rm -rf /").decision, Decision::Deny);
    // A denied command's text anywhere in the line denies it, even as an
    // argument: bash may evaluate a value as code later, and the policy
    // does not guess which text stays text.
    for command in [
        "timeout 5 grep sudo ls",
        "timeout -s KILL 5 grep sudo ls",
        "find . | xargs grep sudo file",
        "env X=1 grep -r sudo src",
    ] {
        assert_eq!(bash(&p, command).decision, Decision::Deny, "{command}");
    }
    // Without the denied words, wrapped commands are confirmed.
    for command in [
        "timeout 5 grep pattern ls",
        "find . | xargs grep pattern file",
    ] {
        assert_eq!(bash(&p, command).decision, Decision::Confirm, "{command}");
    }
}

#[test]
fn strictest_segment_decides() {
    let p = policy();
    assert_eq!(
        bash(&p, "ls && make"),
        verdict(Decision::Confirm, BASH_DEFAULT, Some("make"))
    );
    // Of equally strict segments, the first one is reported; a command
    // comes before the substitutions in its words.
    assert_eq!(
        bash(&p, "make $(date) && cargo build"),
        verdict(Decision::Confirm, BASH_DEFAULT, Some("make $(date)"))
    );
    // Wrapped commands are confirmed like the wrapper.
    assert_eq!(
        bash(&p, "timeout -s KILL 5 ls"),
        verdict(
            Decision::Confirm,
            BASH_DEFAULT,
            Some("timeout -s KILL 5 ls")
        )
    );
    // Assignments before a command are confirmed whatever the command.
    assert_eq!(
        bash(&p, "PAGER=evil git log"),
        verdict(Decision::Confirm, ASSIGNMENT, Some("PAGER=evil"))
    );
}

#[test]
fn file_writes_by_redirection_are_segments() {
    let p = policy();
    assert_eq!(
        bash(&p, "echo hi > notes.txt"),
        verdict(Decision::Confirm, BASH_DEFAULT, Some("> notes.txt"))
    );
    assert_eq!(
        bash(&p, "echo x >> ~/.bashrc"),
        verdict(Decision::Confirm, BASH_DEFAULT, Some(">> ~/.bashrc"))
    );
    assert_eq!(
        bash(&p, "ls &> out.log"),
        verdict(Decision::Confirm, BASH_DEFAULT, Some("&> out.log"))
    );
    assert_eq!(
        bash(&p, "{ ls; } > out"),
        verdict(Decision::Confirm, BASH_DEFAULT, Some("> out"))
    );
    assert_eq!(
        bash(&p, "ls >& out"),
        verdict(Decision::Confirm, BASH_DEFAULT, Some(">& out"))
    );
    assert_eq!(
        bash(&p, "echo x > \"$F\""),
        verdict(
            Decision::Confirm,
            "writes to a file whose name is computed",
            Some("> $F")
        )
    );
    // Reading, descriptors and the null device are no file writes.
    for command in [
        "ls 2>/dev/null",
        "ls > /dev/null 2>&1",
        "ls >&2",
        "ls 3>&1 1>&2 2>&3-",
        "ls < input.txt",
        "ls &>/dev/null",
    ] {
        assert_eq!(bash(&p, command).decision, Decision::Allow, "{command}");
    }
    // Rules and session rules see them like commands.
    let rules = session_rules_for("bash", &bash_args("echo hi > out.txt"));
    assert_eq!(
        rules,
        vec![bash_session("echo hi"), bash_session("> out.txt")]
    );
    assert_eq!(
        bash_with(&p, "echo bye > out.txt", &rules).decision,
        Decision::Allow
    );
    assert_eq!(
        bash_with(&p, "echo bye > other.txt", &rules).decision,
        Decision::Confirm
    );
    let etc = Policy::from_config(&PolicyConfig {
        tools: BTreeMap::new(),
        rules: vec![bash_rule("*> /etc/*", Decision::Deny)],
        network: false,
    })
    .unwrap();
    assert_eq!(
        bash(&etc, "echo x >> /etc/passwd"),
        verdict(
            Decision::Deny,
            r#"rule 1 (bash "*> /etc/*")"#,
            Some(">> /etc/passwd")
        )
    );
}

#[test]
fn unparsable_commands_are_confirmed() {
    let p = policy();
    for command in [
        "ls &&",
        "echo \"unterminated",
        "echo $(ls",
        "if true; then ls",
    ] {
        let v = bash(&p, command);
        assert_eq!(v.decision, Decision::Confirm, "{command}");
        assert!(
            v.rule.starts_with("could not parse the command: "),
            "{command}: {v:?}"
        );
        assert_eq!(v.segment.as_deref(), Some(command));
    }
    // An unparsable substitution inside a parsable line.
    let v = bash(&p, "echo `ls &&`");
    assert_eq!(v.decision, Decision::Confirm);
    assert!(v.rule.starts_with("could not parse the command: "), "{v:?}");
    // The raw text still meets the deny rules.
    assert_eq!(
        bash(&p, "sudo ls &&"),
        verdict(Decision::Deny, SUDO_RULE, Some("sudo ls"))
    );
}

#[test]
fn computed_command_names_are_confirmed() {
    let p = policy();
    assert_eq!(
        bash(&p, "$CMD -rf /"),
        verdict(
            Decision::Confirm,
            "the command name is not a literal word: $CMD",
            Some("$CMD -rf /")
        )
    );
    for command in [
        r#""$(echo rm)" -rf x"#,
        "${X:-ls} -la",
        "`echo ls`",
        "s*o ls",
        "{sudo,} ls",
        "$'\\x73udo' ls",
        "ls && $CMD",
        "eval \"$X\"",
        "bash -c \"$X\"",
    ] {
        let v = bash(&p, command);
        assert_eq!(v.decision, Decision::Confirm, "{command}: {v:?}");
        assert!(v.rule.contains("not a literal"), "{command}: {v:?}");
    }
    // Never allowed, whatever allows it.
    let allow_everything = Policy::from_config(&PolicyConfig {
        tools: [("bash".to_string(), Decision::Allow)]
            .into_iter()
            .collect(),
        rules: vec![bash_rule("*", Decision::Allow)],
        network: false,
    })
    .unwrap();
    assert_eq!(bash(&allow_everything, "ls").decision, Decision::Allow);
    assert_eq!(
        bash(&allow_everything, "$CMD -rf /").decision,
        Decision::Confirm
    );
    assert_eq!(bash(&allow_everything, "ls &&").decision, Decision::Confirm);
    assert_eq!(
        bash_with(&p, "$CMD -rf /", &[bash_session("$CMD -rf /")]).decision,
        Decision::Confirm
    );
}

#[test]
fn nothing_to_run_gets_the_bash_default() {
    let p = policy();
    for command in ["", "   ", "# just a comment"] {
        assert_eq!(
            bash(&p, command),
            verdict(Decision::Confirm, BASH_DEFAULT, None),
            "{command:?}"
        );
    }
    // A bare assignment runs nothing now, but its value may run later.
    assert_eq!(
        bash(&p, "X=1"),
        verdict(Decision::Confirm, ASSIGNMENT, Some("X=1"))
    );
}

#[test]
fn bad_bash_arguments_get_the_bash_default() {
    let p = policy();
    let expected = verdict(
        Decision::Confirm,
        "default for bash: confirm (no command argument)",
        None,
    );
    assert_eq!(p.check("bash", "not json", false, &[]), expected);
    assert_eq!(p.check("bash", "{}", false, &[]), expected);
    assert_eq!(p.check("bash", r#"{"command": 3}"#, false, &[]), expected);
}

#[test]
fn path_globs() {
    let p = policy();
    for path in [
        "secrets/key",
        "secrets/a/b/c",
        "./secrets/key",
        "notes/../secrets/key.md",
        "secrets//key",
    ] {
        assert_eq!(
            write(&p, path, &[]),
            verdict(Decision::Deny, SECRETS_RULE, None),
            "{path}"
        );
    }
    assert_eq!(
        write(&p, "notes/today.md", &[]),
        verdict(Decision::Allow, NOTES_RULE, None)
    );
    // `*` stays within one directory.
    assert_eq!(
        write(&p, "notes/sub/x.md", &[]),
        verdict(Decision::Confirm, "default for write_file: confirm", None)
    );
    assert_eq!(
        write(&p, "notes/today.txt", &[]).decision,
        Decision::Confirm
    );
    // The rules name write_file; read_file keeps its default.
    assert_eq!(
        p.check("read_file", &path_args("secrets/key"), true, &[])
            .decision,
        Decision::Allow
    );
    // No path argument: path rules do not match.
    assert_eq!(
        p.check("write_file", "{}", false, &[]).decision,
        Decision::Confirm
    );
}

#[test]
fn star_rules_match_every_tool() {
    let p = Policy::from_config(&PolicyConfig {
        tools: BTreeMap::new(),
        rules: vec![
            rule(
                "*",
                None,
                Some("**/.env"),
                Decision::Deny,
                Some("no env files"),
            ),
            rule("*", None, None, Decision::Confirm, None),
            bash_rule("ls*", Decision::Allow),
        ],
        network: false,
    })
    .unwrap();
    let env_rule = r#"rule 1 (* path "**/.env"): no env files"#;
    assert_eq!(
        p.check("read_file", &path_args(".env"), true, &[]),
        verdict(Decision::Deny, env_rule, None)
    );
    assert_eq!(
        p.check("write_file", &path_args("app/.env"), false, &[]),
        verdict(Decision::Deny, env_rule, None)
    );
    assert_eq!(
        p.check("read_file", &path_args("src/lib.rs"), true, &[]),
        verdict(Decision::Confirm, "rule 2 (*)", None)
    );
    assert_eq!(
        p.check("anything", "{}", true, &[]),
        verdict(Decision::Confirm, "rule 2 (*)", None)
    );
    // The `*` rule matches every bash segment, and beats the allow.
    assert_eq!(
        bash(&p, "ls"),
        verdict(Decision::Confirm, "rule 2 (*)", Some("ls"))
    );
}

#[test]
fn strictest_rule_wins() {
    let p = Policy::from_config(&PolicyConfig {
        tools: BTreeMap::new(),
        rules: vec![
            bash_rule("git *", Decision::Allow),
            bash_rule("git push*", Decision::Deny),
            bash_rule("git push --dry-run", Decision::Allow),
            bash_rule("git commit*", Decision::Confirm),
            rule("write_file", None, Some("docs/**"), Decision::Allow, None),
            rule(
                "write_file",
                None,
                Some("docs/private/**"),
                Decision::Deny,
                None,
            ),
        ],
        network: false,
    })
    .unwrap();
    assert_eq!(
        bash(&p, "git push --dry-run"),
        verdict(
            Decision::Deny,
            r#"rule 2 (bash "git push*")"#,
            Some("git push --dry-run")
        )
    );
    assert_eq!(
        bash(&p, "git commit -m x"),
        verdict(
            Decision::Confirm,
            r#"rule 4 (bash "git commit*")"#,
            Some("git commit -m x")
        )
    );
    assert_eq!(bash(&p, "git status").decision, Decision::Allow);
    assert_eq!(
        write(&p, "docs/private/a", &[]),
        verdict(
            Decision::Deny,
            r#"rule 6 (write_file path "docs/private/**")"#,
            None
        )
    );
    assert_eq!(
        write(&p, "docs/a", &[]),
        verdict(
            Decision::Allow,
            r#"rule 5 (write_file path "docs/**")"#,
            None
        )
    );
}

#[test]
fn session_rules_for_bash() {
    let rules = session_rules_for("bash", &bash_args("make test && ls"));
    assert_eq!(rules, vec![bash_session("make test"), bash_session("ls")]);
    // Repeated commands give one rule; unreadable ones none.
    assert_eq!(
        session_rules_for("bash", &bash_args("make; make; $CMD x")),
        vec![bash_session("make")]
    );
    assert_eq!(session_rules_for("bash", "not json"), Vec::new());
    assert_eq!(session_rules_for("bash", &bash_args("")), Vec::new());

    let p = policy();
    assert_eq!(
        bash_with(&p, "make test", &rules),
        verdict(
            Decision::Allow,
            r#"session rule: bash "make test""#,
            Some("make test")
        )
    );
    assert_eq!(
        bash_with(&p, "make install", &rules),
        verdict(Decision::Confirm, BASH_DEFAULT, Some("make install"))
    );
    assert_eq!(
        bash_with(&p, "make test && make install", &rules),
        verdict(Decision::Confirm, BASH_DEFAULT, Some("make install"))
    );
    // A session rule never beats a deny rule, even for the exact command.
    assert_eq!(
        bash_with(&p, "sudo ls", &[bash_session("sudo ls")]),
        verdict(Decision::Deny, SUDO_RULE, Some("sudo ls"))
    );
    // But it does answer a confirm rule: that rule asks a person, and the
    // person already said yes for this session.
    let confirming = Policy::from_config(&PolicyConfig {
        tools: BTreeMap::new(),
        rules: vec![bash_rule("git push*", Decision::Confirm)],
        network: false,
    })
    .unwrap();
    assert_eq!(
        bash_with(&confirming, "git push", &[bash_session("git push")]),
        verdict(
            Decision::Allow,
            r#"session rule: bash "git push""#,
            Some("git push")
        )
    );
    assert_eq!(
        bash_with(&confirming, "git push --force", &[bash_session("git push")]),
        verdict(
            Decision::Confirm,
            r#"rule 1 (bash "git push*")"#,
            Some("git push --force")
        )
    );
    // A bash rule without a command allows every segment no rule decides.
    let any_bash = SessionRule {
        tool: "bash".to_string(),
        command: None,
        path: None,
    };
    let session = std::slice::from_ref(&any_bash);
    assert_eq!(
        bash_with(&p, "make install", session),
        verdict(Decision::Allow, "session rule: bash", Some("make install"))
    );
    assert_eq!(
        bash_with(&p, "make && sudo ls", session).decision,
        Decision::Deny
    );
}

#[test]
fn session_rules_for_paths_and_tools() {
    let p = policy();
    let rules = session_rules_for("write_file", &path_args("out.txt"));
    assert_eq!(
        rules,
        vec![SessionRule {
            tool: "write_file".to_string(),
            command: None,
            path: Some("out.txt".to_string()),
        }]
    );
    assert_eq!(
        write(&p, "out.txt", &rules),
        verdict(
            Decision::Allow,
            r#"session rule: write_file path "out.txt""#,
            None
        )
    );
    assert_eq!(write(&p, "other.txt", &rules).decision, Decision::Confirm);
    assert_eq!(
        p.check("edit_file", &path_args("out.txt"), false, &rules)
            .decision,
        Decision::Confirm
    );
    // Deny rules still win.
    let secret = session_rules_for("write_file", &path_args("secrets/key"));
    assert_eq!(
        write(&p, "secrets/key", &secret),
        verdict(Decision::Deny, SECRETS_RULE, None)
    );
    // Without a path argument: the tool alone.
    let tool_rules = session_rules_for("deploy", r#"{"target":"prod"}"#);
    assert_eq!(
        tool_rules,
        vec![SessionRule {
            tool: "deploy".to_string(),
            command: None,
            path: None,
        }]
    );
    assert_eq!(
        p.check("deploy", r#"{"target":"staging"}"#, false, &tool_rules),
        verdict(Decision::Allow, "session rule: deploy", None)
    );
    assert_eq!(session_rules_for("write_file", &path_args("")), Vec::new());
}

#[test]
fn session_rules_never_override_a_configured_deny_default() {
    let p = Policy::from_config(&PolicyConfig {
        tools: [("deploy".to_string(), Decision::Deny)]
            .into_iter()
            .collect(),
        rules: Vec::new(),
        network: false,
    })
    .unwrap();
    let rules = session_rules_for("deploy", "{}");
    assert_eq!(
        p.check("deploy", "{}", false, &rules),
        verdict(Decision::Deny, "default for deploy: deny", None)
    );
}

#[test]
fn invalid_rules_are_rejected() {
    let bad = |rule: PolicyRule| {
        let config = PolicyConfig {
            tools: BTreeMap::new(),
            rules: vec![bash_rule("ls*", Decision::Allow), rule],
            network: false,
        };
        match Policy::from_config(&config) {
            Err(PolicyError::InvalidRule { index, reason }) => {
                assert_eq!(index, 2);
                reason
            }
            Ok(_) => panic!("accepted"),
        }
    };
    let reason = bad(bash_rule("ls [", Decision::Deny));
    assert!(
        reason.starts_with("invalid command glob \"ls [\""),
        "{reason}"
    );
    let reason = bad(rule("read_file", Some("ls"), None, Decision::Deny, None));
    assert!(reason.contains("only applies to bash"), "{reason}");
    let reason = bad(rule("bash", Some("ls"), Some("x"), Decision::Deny, None));
    assert!(reason.contains("not both"), "{reason}");
    let reason = bad(rule(" ", None, None, Decision::Deny, None));
    assert!(reason.contains("tool name is empty"), "{reason}");
    let reason = bad(rule("bash", None, Some("x/**"), Decision::Deny, None));
    assert!(reason.contains("never matches bash"), "{reason}");
    let reason = bad(rule("write_file", None, Some("a/[b"), Decision::Deny, None));
    assert!(reason.starts_with("invalid path glob"), "{reason}");
    let reason = bad(bash_rule("", Decision::Deny));
    assert!(reason.contains("empty"), "{reason}");

    let err = Policy::from_config(&PolicyConfig {
        tools: BTreeMap::new(),
        rules: vec![rule("", None, None, Decision::Deny, None)],
        network: false,
    })
    .unwrap_err();
    assert_eq!(err.to_string(), "policy rule 1: the tool name is empty");
    // A command glob on `*` applies to bash only, and is accepted.
    assert!(
        Policy::from_config(&PolicyConfig {
            tools: BTreeMap::new(),
            rules: vec![rule("*", Some("sudo *"), None, Decision::Deny, None)],
            network: false,
        })
        .is_ok()
    );
}

#[test]
fn allow_all_allows_everything() {
    let p = Policy::allow_all();
    for command in ["sudo rm -rf /", "ls &&", "$CMD"] {
        assert_eq!(bash(&p, command).decision, Decision::Allow, "{command}");
    }
    assert_eq!(
        p.check("deploy", "{}", false, &[]),
        verdict(Decision::Allow, "allow all", None)
    );
}

#[test]
fn the_shipped_defaults() {
    // The `[policy]` section of the configuration compiled into the binary.
    #[derive(serde::Deserialize)]
    struct Shipped {
        policy: PolicyConfig,
    }
    let shipped: Shipped = toml::from_str(include_str!("../../../config/default.toml")).unwrap();
    let p = Policy::from_config(&shipped.policy).unwrap();
    assert_eq!(bash(&p, "ls -la").decision, Decision::Allow);
    assert_eq!(
        bash(&p, "git status && git diff HEAD~1").decision,
        Decision::Allow
    );
    assert_eq!(
        bash(&p, "ls && sudo rm x"),
        verdict(Decision::Deny, SUDO_RULE, Some("sudo rm x"))
    );
    assert_eq!(
        bash(&p, "rm -rf /"),
        verdict(Decision::Deny, RM_RULE, Some("rm -rf /"))
    );
    assert_eq!(
        bash(&p, "ls && make"),
        verdict(Decision::Confirm, BASH_DEFAULT, Some("make"))
    );
    assert_eq!(
        p.check("read_file", &path_args("README.md"), true, &[])
            .decision,
        Decision::Allow
    );
    assert_eq!(write(&p, "README.md", &[]).decision, Decision::Confirm);
    assert_eq!(
        p.check("unknown_reader", "{}", true, &[]).decision,
        Decision::Allow
    );
    assert_eq!(
        p.check("unknown_writer", "{}", false, &[]).decision,
        Decision::Confirm
    );
}

#[test]
fn normalized_paths() {
    assert_eq!(normalize_path("./a/b"), "a/b");
    assert_eq!(normalize_path("a/./b//c/"), "a/b/c");
    assert_eq!(normalize_path("a/../b"), "b");
    assert_eq!(normalize_path("../a"), "../a");
    assert_eq!(normalize_path("/x/../../y"), "/y");
}

#[test]
fn deep_nesting_never_overflows_the_stack() {
    let p = policy();
    let n = MAX_NESTING;
    let cases = [
        format!("{}ls{}", "(".repeat(n), ")".repeat(n)),
        format!("{}ls{}", "echo $(".repeat(n), ")".repeat(n)),
        format!("{}ls{}", "\"$(".repeat(n), ")\"".repeat(n)),
        format!("{}ls;{}", "{ ".repeat(n), "} ".repeat(n)),
        format!("{}ls{}", "if a; then ".repeat(n), "; fi".repeat(n)),
        format!("{}ls{}", "while a; do ".repeat(n), "; done".repeat(n)),
        format!(
            "{}ls{}",
            "f() if a; then ".repeat(n / 2),
            "; fi".repeat(n / 2)
        ),
        format!("[[ {} -n x ]]", "! ".repeat(n - 2)),
        format!("[[ {} -n x {} ]]", "( ".repeat(n - 2), ") ".repeat(n - 2)),
        format!("echo {}x{}", "${a:-".repeat(n), "}".repeat(n)),
        format!("echo {}1{}", "$((1+".repeat(n / 2), "))".repeat(n / 2)),
    ];
    for command in &cases {
        assert!(nesting_bound(command) <= MAX_NESTING, "{command}");
        let v = bash(&p, command);
        assert_ne!(v.decision, Decision::Deny, "{v:?}");
    }
    // A deny deep inside is still found.
    let hidden = format!("{}sudo ls;{}", "{ ".repeat(1000), "} ".repeat(1000));
    assert_eq!(bash(&p, &hidden).decision, Decision::Deny);
    // Beyond the bound: confirmed without parsing, but the raw text still
    // meets the deny rules.
    let too_deep = format!("{}ls{}", "(".repeat(n + 1), ")".repeat(n + 1));
    let v = bash(&p, &too_deep);
    assert_eq!(v.decision, Decision::Confirm);
    assert_eq!(v.rule, "the command is too complex to check");
    assert_eq!(
        bash(&p, &format!("sudo ls; {too_deep}")).decision,
        Decision::Deny
    );
    // Wrappers of wrappers, too.
    let v = bash(&p, &format!("{}ls", "nohup ".repeat(40)));
    assert_eq!(v.decision, Decision::Confirm);
    assert_eq!(v.rule, "the command nests too deeply to check");
    // `$( )` nesting deeper than the walker follows is confirmed.
    let v = bash(&p, &format!("{}ls{}", "echo $(".repeat(20), ")".repeat(20)));
    assert_eq!(v.decision, Decision::Confirm);
    assert_eq!(v.rule, "the command nests too deeply to check");
}

#[test]
fn a_here_document_without_an_end_word_is_confirmed_not_parsed() {
    // The shell parser loops without end (and without bound on memory) on
    // some of these; they must come back at once, as questions.
    let policy = policy();
    for command in [
        "<<$( (#",
        "<<$(  #x",
        "cat <<$(\t(#",
        "echo $(cat << #",
        "cat <<- `ls` x",
        "cat << ",
        "cat <<",
        "cat << ;ls",
        "cat <<\x0c",
        "cat <<'' #",
        "cat <<- \"\" #",
        "''<<\\~$( >${",
        "cat <<\"x\\\" $( #\"",
        "cat <<E$(x)OF",
        "case x in <<'\"'||#$\"x\"))",
        "${''<<\"\"} ",
        "$[x<<'']",
        "<<?]$(\"\"(#",
        "cat <<E}$( #",
        "cat <<\"$( \" #",
        "<<\"\")f ",
        "<<'')f ",
        "${<<''}i ",
        "$(<<\"\"]x",
    ] {
        let verdict = bash(&policy, command);
        assert_eq!(verdict.decision, Decision::Confirm, "{command:?}");
        assert!(
            verdict.rule.contains("no end word"),
            "{command:?}: {}",
            verdict.rule
        );
    }
    // Unclosed substitutions in a body: the word parser would take
    // exponential time (each `$((` multiplies it by about six).
    let body = format!("cat <<EOF\n{}x\nEOF", "$((".repeat(12));
    let verdict = bash(&policy, &body);
    assert_eq!(verdict.decision, Decision::Confirm);
    assert!(
        verdict.rule.contains("unclosed substitutions"),
        "{}",
        verdict.rule
    );
    // Ordinary here-documents and here-strings are still read.
    for command in [
        "cat <<EOF\nhello\nEOF",
        "cat << 'EOF'\nhello\nEOF",
        "cat <<-\tEND\n\thi\n\tEND",
        "cat <<\\EOF\n$x\nEOF",
        "cat <<\"E O\"\nhi\nE O",
        "cat > notes.txt <<'END_OF_NOTES'\nhi\nEND_OF_NOTES",
        "cat <<<hello",
        "x=$(cat << EOF\nhi\nEOF\n)",
        "$(<<\t n|$(",
        "bash <<'E$(x)'\nls\nE$(x)",
        "cat <<< $x",
        "echo $((1 << 4))",
    ] {
        let verdict = bash(&policy, command);
        assert!(
            !verdict.rule.contains("no end word"),
            "{command:?}: {}",
            verdict.rule
        );
    }
}

#[test]
fn mcp_tools_are_confirmed_unless_a_rule_names_them() {
    let mut config = PolicyConfig {
        tools: BTreeMap::new(),
        rules: Vec::new(),
        network: false,
    };
    let policy = Policy::from_config(&config).unwrap();
    // A server's read-only hint alone allows nothing.
    let verdict = policy.check_tool("time__get_current_time", "{}", false, Some(true), &[]);
    assert_eq!(verdict.decision, Decision::Confirm);
    assert_eq!(verdict.rule, "default for time__get_current_time: confirm");

    // A rule may name a whole server, and trust its hints.
    config.rules.push(PolicyRule {
        read_only_hint: Some(true),
        ..rule(
            "time__*",
            None,
            None,
            Decision::Allow,
            Some("reads the clock"),
        )
    });
    config
        .rules
        .push(rule("git__git_reset", None, None, Decision::Deny, None));
    let policy = Policy::from_config(&config).unwrap();
    let allowed = policy.check_tool("time__get_current_time", "{}", false, Some(true), &[]);
    assert_eq!(allowed.decision, Decision::Allow);
    assert_eq!(allowed.rule, "rule 1 (time__*): reads the clock");
    // ... but only the tools the server calls read-only.
    let unhinted = policy.check_tool("time__set_clock", "{}", false, Some(false), &[]);
    assert_eq!(unhinted.decision, Decision::Confirm);
    // Another server's tool with the same hint is not covered.
    let other = policy.check_tool("timer__get", "{}", false, Some(true), &[]);
    assert_eq!(other.decision, Decision::Confirm);
    let denied = policy.check_tool("git__git_reset", "{}", false, Some(false), &[]);
    assert_eq!(denied.decision, Decision::Deny);
    // The plain check never claims a hint.
    assert_eq!(
        policy
            .check("time__get_current_time", "{}", false, &[])
            .decision,
        Decision::Confirm
    );

    // A rule trusting every server's hints decides MCP tools only: never
    // a bash command, never a built-in tool.
    let config = PolicyConfig {
        tools: BTreeMap::new(),
        rules: vec![PolicyRule {
            read_only_hint: Some(true),
            ..rule("*", None, None, Decision::Allow, None)
        }],
        network: false,
    };
    let trusting = Policy::from_config(&config).unwrap();
    let rm = trusting.check("bash", r#"{"command":"rm -rf ~"}"#, false, &[]);
    assert_eq!(rm.decision, Decision::Confirm, "{rm:?}");
    let write = trusting.check("write_file", r#"{"path":"a","content":""}"#, false, &[]);
    assert_eq!(write.decision, Decision::Confirm, "{write:?}");
    let mcp = trusting.check_tool("docs__search", "{}", false, Some(true), &[]);
    assert_eq!(mcp.decision, Decision::Allow);
    // Path rules never match an MCP tool's own `path` argument.
    let config = PolicyConfig {
        tools: BTreeMap::new(),
        rules: vec![rule("*", None, Some("src/**"), Decision::Allow, None)],
        network: false,
    };
    let paths = Policy::from_config(&config).unwrap();
    let fs = paths.check_tool("fs__delete", r#"{"path":"src/a"}"#, false, Some(false), &[]);
    assert_eq!(fs.decision, Decision::Confirm, "{fs:?}");

    // Hints mean nothing for bash, and a bad tool glob is refused.
    for bad in [
        PolicyRule {
            read_only_hint: Some(true),
            ..rule("bash", None, None, Decision::Allow, None)
        },
        rule("time__[", None, None, Decision::Allow, None),
    ] {
        let config = PolicyConfig {
            tools: BTreeMap::new(),
            rules: vec![bad],
            network: false,
        };
        assert!(Policy::from_config(&config).is_err());
    }
}

/// Lines whose every command is allowed by a rule, but which make bash run
/// a value as code later (found by a hostile run): never allowed, and
/// denied when the hidden code is a denied command.
#[test]
fn code_bash_evaluates_later_is_never_allowed() {
    let p = policy();
    for command in [
        // Prompt expansion of a value.
        "x='$(id)'; echo ${x@P}",
        // Array subscripts evaluated by arithmetic.
        "y='a[$(id)]'; echo $((y))",
        "y='a[$(id)]'; (( y )) && ls",
        "y='a[$(id)]'; [[ $y -eq 1 ]] && ls",
        "echo ${a[$(id)]}",
        "ls ${x:-$(id)}",
        "echo ${!x}",
        "echo ${x:1:2}",
        // Variables that change what later commands run.
        "PATH=.:$PATH; ls",
        "HOME=sub; git status",
        "PATH=.:$PATH ls",
        "export PATH=.:$PATH; ls",
        "declare -n r=x; echo $r",
        "printf -v x '%s' '$(id)'; echo ${x@P}",
        "mapfile -C 'id #' -c 1 < notes; ls",
        "trap 'id' EXIT; ls",
        "complete -C 'id' ls; ls",
        "read 'a[$(id)]' <<< 1; ls",
        "echo $PROMPT_COMMAND",
        "env BASH_ENV=x bash -c ls",
        "env -i git status",
        "env -u GIT_CONFIG_COUNT git status",
        "let x=1; ls",
        "source ./x; ls",
        "cat x < /dev/tcp/10.0.0.1/80",
        "for ((;;)); do ls; done",
    ] {
        let v = bash(&p, command);
        assert_eq!(v.decision, Decision::Confirm, "{command}: {v:?}");
    }
    // The plain forms stay allowed.
    for command in [
        "echo $HOME",
        "echo ${HOME}",
        "echo \"$1\"",
        "echo ${#HOME}",
        "echo \"${args[@]}\"",
        "ls -la && echo done",
    ] {
        let v = bash(&p, command);
        assert_eq!(v.decision, Decision::Allow, "{command}: {v:?}");
    }
}

/// Denied commands composed into every construct bash evaluates later are
/// denied, whatever quoting hides them.
#[test]
fn denied_commands_hidden_in_values_are_denied() {
    let p = policy();
    let denied = ["sudo id", "rm -rf /*", "sudo  -u root  sh", "s\\udo id"];
    let constructs = [
        "x='$(CMD)'; echo ${x@P}",
        "y='a[$(CMD)]'; echo $((y))",
        "y='a[$(CMD)]'; (( y ))",
        "y='a[$(CMD)]'; [[ $y -eq 1 ]]",
        "x=\"$(CMD)\"",
        "echo 'CMD'",
        "echo \"CMD\" | cat",
        "trap 'CMD' EXIT",
        "printf -v x '%s' 'CMD'",
        "cat <<'EOF'\nCMD\nEOF",
        "ls --color=\"$(CMD)\"",
        "x=a[$(CMD)]",
    ];
    for hidden in denied {
        for construct in constructs {
            let command = construct.replace("CMD", hidden);
            let v = bash(&p, &command);
            assert_eq!(v.decision, Decision::Deny, "{command}: {v:?}");
        }
    }
    // Quotes inside the hidden code do not hide it.
    for command in ["x='$(su\"\"do id)'; echo ${x@P}", "x='$(\"sudo\" id)'"] {
        assert_eq!(bash(&p, command).decision, Decision::Deny, "{command}");
    }
}

/// A line too long to search for denied commands is never allowed.
#[test]
fn a_line_too_long_to_search_is_not_allowed() {
    let p = policy();
    let long = format!("echo {}", "word ".repeat(crate::shell::MAX_TEXT_TAILS));
    assert_eq!(bash(&p, &long).decision, Decision::Confirm);
}

fn restricted(tool: &str, command: Option<&str>, approvers: &[&str], n: Option<u32>) -> PolicyRule {
    PolicyRule {
        approvers: approvers.iter().map(|a| a.to_string()).collect(),
        approvals_required: n,
        ..rule(tool, command, None, Decision::Confirm, Some("production"))
    }
}

fn policy_of(rules: Vec<PolicyRule>) -> Result<Policy, PolicyError> {
    Policy::from_config(&PolicyConfig {
        tools: BTreeMap::new(),
        rules,
        network: false,
    })
}

#[test]
fn a_confirm_rule_says_who_approves_and_how_many() {
    let policy = policy_of(vec![
        bash_rule("ls*", Decision::Allow),
        restricted(
            "bash",
            Some("deploy *"),
            &["role:admin", "user:alice"],
            Some(2),
        ),
        restricted("bash", Some("kubectl *"), &["user:bob"], None),
        restricted("write_file", None, &["role:admin"], None),
    ])
    .unwrap();
    let deploy = bash(&policy, "deploy prod");
    assert_eq!(deploy.decision, Decision::Confirm);
    assert_eq!(deploy.need.count(), 2);
    assert!(deploy.need.admits("alice", "approver"));
    assert!(deploy.need.admits("carol", "admin"));
    assert!(!deploy.need.admits("dave", "approver"));
    // Every confirmed command of the line has its say, whichever decides.
    let both = bash(&policy, "kubectl get pods; deploy prod");
    assert_eq!(both.need.count(), 2);
    assert!(!both.need.admits("alice", "admin"), "{both:?}");
    assert!(!both.need.admits("bob", "approver"), "{both:?}");
    assert!(both.need.admits("bob", "admin"), "{both:?}");
    // An allowed call asks nobody; an unrestricted confirm asks any approver.
    assert_eq!(bash(&policy, "ls").need, Need::default());
    assert_eq!(bash(&policy, "rm x").need, Need::default());
    let write = write(&policy, "a.txt", &[]);
    assert!(write.need.is_restricted());
    assert_eq!(write.need.describe(), "role:admin");
}

#[test]
fn a_standing_approval_never_answers_a_rule_naming_approvers() {
    let policy = policy_of(vec![
        restricted("bash", Some("deploy *"), &["role:admin"], None),
        restricted("write_file", None, &[], Some(2)),
    ])
    .unwrap();
    let session = [bash_session("deploy prod")];
    let deploy = bash_with(&policy, "deploy prod", &session);
    assert_eq!(deploy.decision, Decision::Confirm, "{deploy:?}");
    let session = [SessionRule {
        tool: "write_file".into(),
        command: None,
        path: None,
    }];
    let write = write(&policy, "a.txt", &session);
    assert_eq!(write.decision, Decision::Confirm, "{write:?}");
    // An unrestricted confirm still takes it.
    let session = [bash_session("rm x")];
    assert_eq!(
        bash_with(&policy, "rm x", &session).decision,
        Decision::Allow
    );
}

#[test]
fn approvers_on_a_rule_are_checked_when_it_is_read() {
    for (bad, says) in [
        (
            PolicyRule {
                approvers: vec!["role:admin".into()],
                ..bash_rule("ls", Decision::Allow)
            },
            "apply to confirm rules",
        ),
        (
            restricted("bash", None, &[], Some(0)),
            "approvals_required is 0",
        ),
        (
            restricted("bash", None, &[], Some(9)),
            "approvals_required is 9",
        ),
        (
            restricted("bash", None, &["user:alice"], Some(2)),
            "only 1 people are named",
        ),
        (restricted("bash", None, &["role:viewer"], None), "viewer"),
        (restricted("bash", None, &["alice"], None), "user:NAME"),
    ] {
        let err = policy_of(vec![bad]).unwrap_err().to_string();
        assert!(err.contains(says), "{err}");
        assert!(err.starts_with("policy rule 1:"), "{err}");
    }
    assert!(
        policy_of(vec![restricted(
            "bash",
            None,
            &["user:a", "user:b"],
            Some(2)
        )])
        .is_ok()
    );
}
