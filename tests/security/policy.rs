//! The policy as an attacker sees it: the shipped default rules
//! (`config/default.toml`), commands written to slip a denied or
//! sensitive command past them, property tests that compose denied
//! commands inside allowed ones, and a fuzz target for the shell
//! segmenter.

use agentry_policy::{Decision, Policy};
use agentry_runtime::config::{Config, ConfigSource};
use proptest::prelude::*;
use std::time::{Duration, Instant};

fn shipped() -> Policy {
    let config = Config::load(&ConfigSource::default()).unwrap();
    Policy::from_config(&config.policy).unwrap()
}

fn decide(policy: &Policy, command: &str) -> (Decision, String) {
    let args = serde_json::json!({ "command": command }).to_string();
    let verdict = policy.check("bash", &args, false, &[]);
    (verdict.decision, verdict.rule)
}

#[test]
fn allowed_commands_that_write_run_or_read_outside_are_confirmed() {
    let policy = shipped();
    for command in [
        // Writes any file the runner can.
        "git diff --no-index --output=../data/sessions.db a b",
        "git diff --output=x HEAD",
        "git diff --outp=x HEAD",
        "git log --output=.git/config --format=x",
        "git log -p --ext-diff",
        // Runs a command.
        "git difftool -x 'touch pwned' HEAD",
        "git difftool --extcmd=sh HEAD",
        "git -c core.pager='touch pwned' log",
        "git -c core.fsmonitor='touch pwned' status",
        "git --config-env=core.pager=EVIL log",
        "git --exec-path=/tmp/x status",
        "git -p log",
        "git --git-dir=/tmp/other/.git log",
        "git log --show-signature",
        "git grep --open-files-in-pager=sh x",
        "git status; git commit -am x",
        // Reads outside the workspace.
        "cat /proc/$PPID/environ",
        "cat /etc/shadow",
        "cat ../other-session/notes.txt",
        "cat ~/.ssh/id_ed25519",
        "cat $HOME/../x",
        "ls /",
        "ls ../",
        "ls -la ~",
        "git diff --no-index /etc/passwd README.md",
        "git -C /etc status",
        "git log -- ../other",
        // Computed arguments could be anything.
        "cat $FILE",
        "git diff $OPTS",
        "git log \"$(printf -- --output=x)\"",
    ] {
        let (decision, rule) = decide(&policy, command);
        assert_ne!(
            decision,
            Decision::Allow,
            "{command:?} was allowed ({rule})"
        );
    }
}

#[test]
fn the_reason_names_the_rule_and_the_argument() {
    let (decision, rule) = decide(&shipped(), "git diff --output=../sessions.db");
    assert_eq!(decision, Decision::Confirm);
    assert!(
        rule.contains("\"git diff*\"") && rule.contains("--output writes its output to a file"),
        "{rule}"
    );
    let (_, rule) = decide(&shipped(), "cat /etc/passwd");
    assert!(rule.contains("a path outside the workspace"), "{rule}");
}

#[test]
fn harmless_uses_of_allowed_commands_stay_allowed() {
    let policy = shipped();
    for command in [
        "ls",
        "ls -la src",
        "ls -R --color=never",
        "cat README.md",
        "cat -n src/main.rs",
        "cat *.md",
        "echo $HOME",
        "echo hi",
        "pwd",
        "git status",
        "git status --porcelain=v2 -z",
        "git diff --stat HEAD~1",
        "git diff --cached -- src/lib.rs",
        "git diff main..feature",
        "git diff -U5 --word-diff=color",
        "git log --oneline -n 5",
        "git log -5 --format=%H main..feature -- src/",
        "git log --graph --decorate --all",
        "git log -p -S needle",
        "git status && git diff",
    ] {
        let (decision, rule) = decide(&policy, command);
        assert_eq!(decision, Decision::Allow, "{command:?}: {rule}");
    }
}

#[test]
fn a_rule_that_trusts_its_text_allows_as_written() {
    let mut config = Config::load(&ConfigSource::default()).unwrap();
    let policy = Policy::from_config(&config.policy).unwrap();
    assert_eq!(decide(&policy, "git commit -m x").0, Decision::Confirm);
    for rule in &mut config.policy.rules {
        if rule.command.as_deref() == Some("git log*") {
            rule.check_arguments = false;
        }
    }
    config
        .policy
        .rules
        .push(agentry_runtime::config::PolicyRule {
            read_only_hint: None,
            tool: "bash".into(),
            command: Some("git commit *".into()),
            path: None,
            decision: Decision::Allow,
            reason: None,
            check_arguments: true,
            network: false,
            approvers: Vec::new(),
            approvals_required: None,
        });
    let policy = Policy::from_config(&config.policy).unwrap();
    assert_eq!(
        decide(&policy, "git log --output=x").0,
        Decision::Allow,
        "check_arguments = false trusts the rule"
    );
    // An allow rule for a git command not known to only read: confirmed,
    // saying how to trust it.
    let (decision, rule) = decide(&policy, "git commit -m x");
    assert_eq!(decision, Decision::Confirm);
    assert!(rule.contains("check_arguments = false"), "{rule}");
}

#[test]
fn a_denied_command_hiding_in_an_option_value_is_denied() {
    let policy = shipped();
    for command in [
        "git -c core.pager='sudo rm -rf /' log",
        "git log --format=x --pager='sudo id'",
        "make CMD='sudo reboot'",
        "mytool --exec=\"sudo sh\"",
        "ls --color='x; sudo id'",
        "bash <<EOF\nls\nsudo id\nEOF",
        "sh <<< 'sudo id'",
        "cat x --opt='bash <<EOF\nsudo id\nEOF'",
        "find . -name x -exec sudo rm {} \\;",
        "cat x --opt='ls && find . -exec sudo id \\;'",
    ] {
        let (decision, rule) = decide(&policy, command);
        assert_eq!(decision, Decision::Deny, "{command:?}: {rule}");
    }
}

// ---------------------------------------------------------------- property

/// Commands the shipped rules deny.
const DENIED: &[&str] = &[
    "sudo rm -rf /tmp/x",
    "rm -rf /",
    "sudo -u root id",
    "sudo sh",
];

/// Commands that need a person: no rule allows them.
const SENSITIVE: &[&str] = &[
    "curl http://example.com",
    "git push --force",
    "python3 -c 'import os'",
    "touch x",
    "git diff --output=x",
    "cat /etc/shadow",
];

/// Commands the shipped rules allow.
const ALLOWED: &[&str] = &[
    "ls",
    "pwd",
    "cat README.md",
    "echo hi",
    "git status",
    "git diff --stat",
    "git log --oneline",
];

fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// One way of running `inner` from a command line that also runs
/// `allowed`.
fn compose(way: usize, allowed: &str, inner: &str) -> String {
    match way {
        0 => format!("{allowed} && {inner}"),
        1 => format!("{allowed}; {inner}"),
        2 => format!("{allowed} | {inner}"),
        3 => format!("{allowed} || {inner}"),
        // (A space: `$((` would start arithmetic.)
        4 => format!("echo $( {inner} )"),
        // Backticks within backticks are escaped.
        5 => format!("echo `{}`", inner.replace('\\', "\\\\").replace('`', "\\`")),
        6 => format!("bash -c {}", quote(inner)),
        7 => format!("eval {}", quote(inner)),
        8 => format!("{allowed} | xargs {inner}"),
        9 => format!("find . -exec {inner} \\;"),
        10 => format!("env FOO=1 {inner}"),
        11 => format!("command {inner}"),
        12 => format!("nice -n 5 {inner}"),
        13 => format!("timeout 5 {inner}"),
        14 => format!("bash <<'EOF'\n{allowed}\n{inner}\nEOF"),
        15 => format!("git -c core.pager={} log", quote(inner)),
        16 => format!("{allowed} --opt={}", quote(inner)),
        17 => format!("( {allowed}; {inner} )"),
        18 => format!("{{ {inner}; }}"),
        19 => format!("if {allowed}; then {inner}; fi"),
        20 => format!("sh -c {} && {allowed}", quote(inner)),
        21 => format!("nohup {inner} &"),
        // Values bash evaluates as code later: prompt expansion, array
        // subscripts in arithmetic, `[[ ]]`, traps, `printf -v`.
        23 => format!("x={}; {allowed} ${{x@P}}", quote(&format!("$( {inner} )"))),
        24 => format!("y={}; echo $((y))", quote(&format!("a[$( {inner} )]"))),
        25 => format!(
            "y={}; (( y )) && {allowed}",
            quote(&format!("a[$( {inner} )]"))
        ),
        26 => format!(
            "y={}; [[ $y -eq 1 ]] || {allowed}",
            quote(&format!("a[$( {inner} )]"))
        ),
        27 => format!("trap {} EXIT; {allowed}", quote(inner)),
        28 => format!(
            "printf -v x %s {}; {allowed} ${{x@P}}",
            quote(&format!("$( {inner} )"))
        ),
        29 => format!(
            "read {} <<< 1; {allowed}",
            quote(&format!("a[$( {inner} )]"))
        ),
        _ => format!("for f in a; do {inner}; done"),
    }
}

const WAYS: usize = 30;

/// The ways that hide a command in a value bash evaluates later.
const LATE_WAYS: std::ops::Range<usize> = 23..30;

/// `inner` composed with an allowed command once per step, innermost first.
fn wrap(inner: &str, steps: &[(usize, usize)]) -> String {
    steps
        .iter()
        .fold(inner.to_string(), |command, &(way, allowed)| {
            compose(way, ALLOWED[allowed], &command)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// A denied command, wrapped any number of times, is never allowed;
    /// and where it is denied, it is denied as well when the whole line
    /// hides in an option value of an allowed command.
    #[test]
    fn denied_commands_are_never_allowed_however_wrapped(
        denied in 0..DENIED.len(),
        steps in prop::collection::vec(
            ((0..WAYS).prop_filter("not an option value", |w| *w != 16), 0..ALLOWED.len()),
            1..4,
        ),
    ) {
        let policy = shipped();
        let command = wrap(DENIED[denied], &steps);
        let (decision, rule) = decide(&policy, &command);
        prop_assert_ne!(decision, Decision::Allow, "{:?} was allowed ({})", command, rule);
        if decision == Decision::Deny {
            let hidden = compose(16, "cat README.md", &command);
            let (decision, rule) = decide(&policy, &hidden);
            prop_assert_eq!(decision, Decision::Deny, "{:?}: {}", hidden, rule);
        }
    }

    /// A denied command hidden in a value bash evaluates later is denied,
    /// not merely confirmed: its text is in the line.
    #[test]
    fn denied_commands_in_late_evaluated_values_are_denied(
        denied in 0..DENIED.len(),
        way in LATE_WAYS,
        allowed in 0..ALLOWED.len(),
        outer in prop::collection::vec(
            ((0..WAYS).prop_filter("not an option value", |w| *w != 16), 0..ALLOWED.len()),
            0..2,
        ),
    ) {
        let command = wrap(&compose(way, ALLOWED[allowed], DENIED[denied]), &outer);
        let (decision, rule) = decide(&shipped(), &command);
        prop_assert_eq!(decision, Decision::Deny, "{:?} was not denied ({})", command, rule);
    }

    /// So is a command that needs a person (other than as the value of
    /// an option of an allowed command, which only carries it as text).
    #[test]
    fn sensitive_commands_are_never_allowed_however_wrapped(
        sensitive in 0..SENSITIVE.len(),
        steps in prop::collection::vec(
            ((0..WAYS).prop_filter("not an option value", |w| *w != 16), 0..ALLOWED.len()),
            1..4,
        ),
    ) {
        let command = wrap(SENSITIVE[sensitive], &steps);
        let (decision, rule) = decide(&shipped(), &command);
        prop_assert_ne!(decision, Decision::Allow, "{:?} was allowed ({})", command, rule);
    }
}

// -------------------------------------------------------------------- fuzz

/// Pieces of shell syntax the segmenter must survive in any order.
const SHELL_PIECES: &[&str] = &[
    "$(",
    ")",
    "`",
    "'",
    "\"",
    "\\",
    "&&",
    "||",
    ";",
    "|",
    "&",
    "\n",
    "<<EOF\n",
    "EOF\n",
    "<<-",
    "<<",
    "''",
    "\"\"",
    "<(",
    ">(",
    ">",
    ">>",
    "2>&1",
    "{",
    "}",
    "(",
    "((",
    "))",
    "[[",
    "]]",
    "${",
    "${#",
    "${x:-",
    "$((",
    "bash -c ",
    "eval ",
    "env ",
    "sudo ",
    "xargs ",
    "find . -exec ",
    "\\;",
    "if ",
    "then ",
    "fi",
    "case x in ",
    "esac",
    "for i in ",
    "do ",
    "done",
    "function f ",
    "rm -rf /",
    "git ",
    "--output=",
    "-c ",
    "ls ",
    "cat ",
    "*",
    "?",
    "[a]",
    "~",
    "=",
    " ",
    "\t",
    "#",
    "!",
    "$'\\x41'",
    "$\"x\"",
];

/// How long one command line may take to classify, even in a debug build:
/// anything near it means the segmenter has gone super-linear.
const BOUND: Duration = Duration::from_secs(5);

fn classify_within_bound(policy: &Policy, command: &str) -> Result<(), TestCaseError> {
    let started = Instant::now();
    let (decision, _) = decide(policy, command);
    let took = started.elapsed();
    prop_assert!(took < BOUND, "{:?} took {:?}", command, took);
    // Whatever the input, the verdict is one of the three.
    prop_assert!(matches!(
        decision,
        Decision::Allow | Decision::Confirm | Decision::Deny
    ));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Shell-shaped noise: no panic, bounded time.
    #[test]
    fn the_segmenter_survives_shell_syntax_soup(
        pieces in prop::collection::vec(prop::sample::select(SHELL_PIECES), 0..80),
    ) {
        classify_within_bound(&shipped(), &pieces.concat())?;
    }

    /// Any text at all.
    #[test]
    fn the_segmenter_survives_any_text(text in "\\PC{0,300}") {
        classify_within_bound(&shipped(), &text)?;
    }
}

#[test]
fn deeply_nested_input_is_classified_in_bounded_time() {
    let policy = shipped();
    for (open, close) in [
        ("$(", ")"),
        ("(", ")"),
        ("{ ", "; }"),
        ("`", "`"),
        ("\"$(", ")\""),
    ] {
        for depth in [10, 100, 2000, 20_000] {
            let command = format!("{}ls{}", open.repeat(depth), close.repeat(depth));
            let started = Instant::now();
            let (decision, _) = decide(&policy, &command);
            assert!(
                started.elapsed() < BOUND,
                "{open}…{close} × {depth} took {:?}",
                started.elapsed()
            );
            if depth >= 2000 {
                assert_ne!(decision, Decision::Allow, "{open}…{close} × {depth}");
            }
        }
    }
    let chain = format!("bash -c {}", "'bash -c \"".repeat(30));
    classify_within_bound(&policy, &chain).unwrap();
}
