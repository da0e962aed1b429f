//! What the commands an allow rule lets through may be given.
//!
//! An allow rule matches command text (`git diff*`); text alone cannot say
//! whether `git diff --output=../sessions.db` writes a file or `git
//! difftool -x cmd` runs one. For the commands Agentry knows — `ls`, `cat`,
//! `echo`, `pwd` and the read-only `git` commands — every option must be on
//! a list of options known to only read and print, every path must stay in
//! the workspace (relative, no `..`), and no argument may be computed
//! (`$VAR`, `$(...)`); anything else is confirmed by a person. A rule with
//! `check_arguments = false` is trusted as written.
//!
//! This is a convenience layer: the OS sandbox is what confines a command,
//! whatever the policy decided.

/// One word of a command: its text after quote removal, and whether
/// nothing (expansion, substitution, globbing) can change it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Word<'a> {
    pub text: &'a str,
    pub literal: bool,
}

impl Word<'_> {
    /// Only globbing may change it (`*.rs`), no expansion or substitution.
    fn glob_only(&self) -> bool {
        !self.text.contains(['$', '`'])
    }
}

/// Checks the words of a command an allow rule matched (command name
/// first). `Ok` when the arguments are known to be harmless, or the
/// command is not one Agentry knows; `Err` says why a person should
/// confirm it.
pub(crate) fn vet(words: &[Word<'_>]) -> Result<(), String> {
    let Some((name, args)) = words.split_first() else {
        return Ok(());
    };
    match name.text.rsplit('/').next().unwrap_or(name.text) {
        "echo" => Ok(()),
        "pwd" => plain("pwd", args, &["-L", "-P"]),
        // Every option of ls and cat only selects or formats what is printed.
        "ls" => paths_with_any_option("ls", args),
        "cat" => paths_with_any_option("cat", args),
        "git" => git(args),
        _ => Ok(()),
    }
}

/// A command that takes only the given flags and no operands.
fn plain(command: &str, args: &[Word<'_>], flags: &[&str]) -> Result<(), String> {
    for arg in args {
        if !arg.literal {
            return Err(computed(command, arg));
        }
        if !flags.contains(&arg.text) {
            return Err(format!("{command} is not known to take {:?}", arg.text));
        }
    }
    Ok(())
}

/// `ls` and `cat`: options are read-only; operands are paths in the
/// workspace (a glob is fine: it expands to names in the workspace, and
/// whatever it expands to is only read).
fn paths_with_any_option(command: &str, args: &[Word<'_>]) -> Result<(), String> {
    let mut options_end = false;
    for arg in args {
        if !arg.literal && !arg.glob_only() {
            return Err(computed(command, arg));
        }
        if !options_end && arg.text == "--" {
            options_end = true;
            continue;
        }
        if !options_end && arg.text.starts_with('-') && arg.text != "-" {
            continue;
        }
        inside_workspace(command, arg.text)?;
    }
    Ok(())
}

fn computed(command: &str, arg: &Word<'_>) -> String {
    format!(
        "{command} is given a computed argument ({}), which could be anything",
        arg.text
    )
}

/// A path operand must name something in the workspace: relative, without
/// a `..` component, not in a home directory.
fn inside_workspace(command: &str, path: &str) -> Result<(), String> {
    if path == "-" {
        return Ok(());
    }
    if path.starts_with('/') || path.starts_with('~') {
        return Err(format!(
            "{command} is given {path:?}, a path outside the workspace"
        ));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(format!(
            "{command} is given {path:?}, which climbs out with '..'"
        ));
    }
    Ok(())
}

// ------------------------------------------------------------------- git

/// Options of git itself (before the subcommand) that change nothing but
/// how it reads and prints.
const GIT_GLOBAL_FLAGS: &[&str] = &[
    "--no-pager",
    "-P",
    "--no-optional-locks",
    "--literal-pathspecs",
    "--glob-pathspecs",
    "--noglob-pathspecs",
    "--icase-pathspecs",
    "--no-replace-objects",
    "--bare",
];

/// Why some git options are never passed without a person: each writes,
/// runs a program, or changes configuration.
const GIT_DANGEROUS: &[(&str, &str)] = &[
    (
        "-c",
        "sets configuration (pagers, hooks, fsmonitor, aliases run programs)",
    ),
    ("--config-env", "sets configuration from the environment"),
    (
        "--exec-path",
        "changes where git finds the programs it runs",
    ),
    (
        "--git-dir",
        "points git at another repository and its configuration",
    ),
    ("--work-tree", "points git at another work tree"),
    ("--namespace", "changes the refs git reads"),
    ("-p", "runs a pager"),
    ("--paginate", "runs a pager"),
    ("--output", "writes its output to a file"),
    ("--ext-diff", "runs the configured external diff program"),
    ("--textconv", "runs the configured text conversion programs"),
    ("--open-files-in-pager", "runs a program"),
    ("-O", "reads an order file from any path"),
    ("--show-signature", "runs gpg"),
    ("-x", "runs a command"),
    ("--extcmd", "runs a command"),
    ("--exec", "runs a command"),
    ("--upload-pack", "runs a program"),
    ("--receive-pack", "runs a program"),
];

/// The git commands an allow rule may pass without a person, all
/// read-only, and the options each may take.
fn git_subcommand(name: &str) -> Option<Vec<&'static str>> {
    let lists: &[&[&str]] = match name {
        "status" => &[GIT_STATUS],
        "diff" | "diff-tree" | "diff-index" | "diff-files" => &[GIT_DIFF],
        "log" | "show" | "shortlog" | "whatchanged" => &[GIT_LOG, GIT_DIFF],
        _ => &[git_listing(name)?],
    };
    Some(lists.iter().flat_map(|l| l.iter().copied()).collect())
}

/// Listing commands: only their listing options (`git branch -D` deletes).
fn git_listing(name: &str) -> Option<&'static [&'static str]> {
    Some(match name {
        "rev-parse" => &[
            "--show-toplevel",
            "--abbrev-ref",
            "--short",
            "--verify",
            "--git-dir",
            "--is-inside-work-tree",
            "--show-prefix",
            "--symbolic-full-name",
            "-q",
            "--quiet",
        ],
        "ls-files" => &[
            "-c",
            "--cached",
            "-m",
            "--modified",
            "-o",
            "--others",
            "-d",
            "--deleted",
            "-s",
            "--stage",
            "-u",
            "--unmerged",
            "-z",
            "--exclude-standard",
            "-i",
            "--ignored",
            "--full-name",
            "--error-unmatch",
        ],
        "describe" => &[
            "--tags", "--all", "--long", "--always", "--dirty", "--abbrev",
        ],
        "blame" => &[
            "-L",
            "-w",
            "-M",
            "-C",
            "-e",
            "-s",
            "-l",
            "--porcelain",
            "-p",
            "--line-porcelain",
            "--date",
        ],
        "branch" | "tag" => &[
            "-l",
            "--list",
            "-a",
            "--all",
            "-r",
            "--remotes",
            "-v",
            "-vv",
            "--verbose",
            "--show-current",
            "--contains",
            "--merged",
            "--no-merged",
            "--sort",
            "--format",
            "--column",
            "--no-column",
            "--points-at",
            "-n",
        ],
        "remote" => &["-v", "--verbose", "show", "get-url"],
        _ => return None,
    })
}

const GIT_STATUS: &[&str] = &[
    "-s",
    "--short",
    "-b",
    "--branch",
    "--show-stash",
    "--porcelain",
    "--long",
    "-v",
    "--verbose",
    "-u",
    "--untracked-files",
    "--ignored",
    "--ignore-submodules",
    "-z",
    "--column",
    "--no-column",
    "--ahead-behind",
    "--no-ahead-behind",
    "--renames",
    "--no-renames",
    "--find-renames",
];

const GIT_DIFF: &[&str] = &[
    "--cached",
    "--staged",
    "--merge-base",
    "--no-index",
    "-p",
    "-u",
    "--patch",
    "-s",
    "--no-patch",
    "-U",
    "--unified",
    "--raw",
    "--patch-with-raw",
    "--minimal",
    "--patience",
    "--histogram",
    "--anchored",
    "--diff-algorithm",
    "--stat",
    "--compact-summary",
    "--numstat",
    "--shortstat",
    "--dirstat",
    "--cumulative",
    "--summary",
    "--patch-with-stat",
    "-z",
    "--name-only",
    "--name-status",
    "--submodule",
    "--color",
    "--no-color",
    "--color-moved",
    "--no-color-moved",
    "--color-moved-ws",
    "--word-diff",
    "--word-diff-regex",
    "--color-words",
    "--no-renames",
    "--check",
    "--full-index",
    "--binary",
    "--abbrev",
    "-B",
    "--break-rewrites",
    "-M",
    "--find-renames",
    "-C",
    "--find-copies",
    "--find-copies-harder",
    "-D",
    "--irreversible-delete",
    "-l",
    "--diff-filter",
    "-S",
    "-G",
    "--pickaxe-all",
    "--pickaxe-regex",
    "-R",
    "--relative",
    "--no-relative",
    "-a",
    "--text",
    "--ignore-cr-at-eol",
    "--ignore-space-at-eol",
    "-b",
    "--ignore-space-change",
    "-w",
    "--ignore-all-space",
    "--ignore-blank-lines",
    "-I",
    "--ignore-matching-lines",
    "--inter-hunk-context",
    "-W",
    "--function-context",
    "--exit-code",
    "--quiet",
    "--no-ext-diff",
    "--no-textconv",
    "--ignore-submodules",
    "--src-prefix",
    "--dst-prefix",
    "--no-prefix",
    "--default-prefix",
    "--line-prefix",
    "--ita-invisible-in-index",
    "--ita-visible-in-index",
    "-r",
    "-t",
    "--root",
    "--stdin",
    "--no-commit-id",
    "-m",
    "--cc",
    "--combined-all-paths",
    "--dd",
    "--remerge-diff",
    "--indent-heuristic",
    "--no-indent-heuristic",
    "--ignore-other",
    "-0",
    "-1",
    "-2",
    "-3",
    "--base",
    "--ours",
    "--theirs",
];

const GIT_LOG: &[&str] = &[
    "--oneline",
    "--graph",
    "--decorate",
    "--no-decorate",
    "--decorate-refs",
    "--decorate-refs-exclude",
    "--source",
    "--all",
    "--branches",
    "--tags",
    "--remotes",
    "--glob",
    "--exclude",
    "-n",
    "--max-count",
    "--skip",
    "--since",
    "--after",
    "--until",
    "--before",
    "--author",
    "--committer",
    "--grep",
    "--all-match",
    "--invert-grep",
    "-i",
    "--regexp-ignore-case",
    "-E",
    "--extended-regexp",
    "-F",
    "--fixed-strings",
    "-P",
    "--perl-regexp",
    "--merges",
    "--no-merges",
    "--min-parents",
    "--max-parents",
    "--first-parent",
    "--not",
    "--reverse",
    "--follow",
    "--full-history",
    "--simplify-by-decoration",
    "--ancestry-path",
    "--topo-order",
    "--date-order",
    "--author-date-order",
    "--boundary",
    "--left-right",
    "--cherry-pick",
    "--cherry-mark",
    "--cherry",
    "--left-only",
    "--right-only",
    "--no-walk",
    "--do-walk",
    "--date",
    "--pretty",
    "--format",
    "--abbrev-commit",
    "--no-abbrev-commit",
    "--relative-date",
    "--parents",
    "--children",
    "--log-size",
    "--notes",
    "--no-notes",
    "--mailmap",
    "--no-mailmap",
    "--use-mailmap",
    "--full-diff",
    "-L",
    "--summary",
    "-e",
    "-s",
    "-c",
    "--expand-tabs",
    "--no-expand-tabs",
    "--show-linear-break",
    "--count",
    "--name-only",
    "--name-status",
    "-q",
    "--quiet",
    "--numbered",
    "--committer",
    "--email",
    "--group",
];

/// `git [global options] <command> [options] [revisions] [--] [paths]`.
fn git(args: &[Word<'_>]) -> Result<(), String> {
    let mut i = 0;
    // Global options, up to the subcommand.
    let subcommand = loop {
        let Some(arg) = args.get(i) else {
            // `git` alone, `git --version`: prints help.
            return Ok(());
        };
        if !arg.literal {
            return Err(computed("git", arg));
        }
        let (flag, _) = split_option(arg.text);
        if !arg.text.starts_with('-') {
            break arg.text;
        }
        if let Some(why) = dangerous(flag) {
            return Err(format!("git {flag} {why}"));
        }
        if flag == "-C" {
            let dir = args.get(i + 1).ok_or("git -C needs a directory")?;
            if !dir.literal {
                return Err(computed("git", dir));
            }
            inside_workspace("git -C", dir.text)?;
            i += 2;
            continue;
        }
        if matches!(arg.text, "--version" | "--help" | "-h") {
            return Ok(());
        }
        if !GIT_GLOBAL_FLAGS.contains(&flag) {
            return Err(format!(
                "git {flag} is not one of the options known to only read"
            ));
        }
        i += 1;
    };
    let Some(options) = git_subcommand(subcommand) else {
        return Err(format!(
            "git {subcommand} is not one of the git commands known to only read (status, \
             diff, log, show, ...); set check_arguments = false on the rule to allow it as written"
        ));
    };
    let rest = &args[i + 1..];
    let mut after_dashes = false;
    let mut j = 0;
    while let Some(arg) = rest.get(j) {
        j += 1;
        if !arg.literal {
            return Err(computed(&format!("git {subcommand}"), arg));
        }
        if after_dashes {
            inside_workspace(&format!("git {subcommand}"), arg.text)?;
            continue;
        }
        if arg.text == "--" {
            after_dashes = true;
            continue;
        }
        if arg.text.starts_with('-') && arg.text != "-" {
            let (flag, _) = split_option(arg.text);
            if let Some(why) = dangerous(flag)
                // -p, -c, -x and -O mean other things to some commands.
                && !options.contains(&flag)
            {
                return Err(format!("git {subcommand} {flag} {why}"));
            }
            if !known_option(&options, arg.text) {
                return Err(format!(
                    "git {subcommand} {flag} is not one of the options known to only read"
                ));
            }
            // Options whose value may be the next word.
            if matches!(flag, "-n" | "-S" | "-G" | "-L" | "-U" | "-I" | "--format")
                && arg.text == flag
            {
                j += 1;
            }
            continue;
        }
        // A revision or a path: paths must stay inside.
        if arg.text.contains('/') || arg.text.starts_with('~') {
            // `main..feature`, `HEAD~2` and `origin/main` are revisions;
            // only a component of exactly ".." climbs out.
            let looks_like_revision = !arg.text.starts_with('/')
                && !arg.text.starts_with('~')
                && !arg.text.split('/').any(|p| p == "..");
            if !looks_like_revision {
                inside_workspace(&format!("git {subcommand}"), arg.text)?;
            }
        }
    }
    Ok(())
}

/// `--name=value` → (`--name`, Some(value)); `-n5` stays whole.
fn split_option(text: &str) -> (&str, Option<&str>) {
    match text.split_once('=') {
        Some((flag, value)) if text.starts_with("--") => (flag, Some(value)),
        _ => (text, None),
    }
}

fn dangerous(flag: &str) -> Option<&'static str> {
    GIT_DANGEROUS
        .iter()
        .find(|(f, _)| *f == flag)
        .map(|(_, why)| *why)
}

/// Whether `text` is one of `options`: exactly, as `--name=value`, as a
/// short option with its value attached (`-n5`, `-U3`), or as a number
/// (`-5`, a count).
fn known_option(options: &[&str], text: &str) -> bool {
    let (flag, _) = split_option(text);
    if options.contains(&flag) {
        return true;
    }
    if text.len() > 1 && text[1..].bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    // A short option with an attached value: -n5, -U10, -Sfoo, -L1,5:f.
    if !text.starts_with("--") && text.len() > 2 {
        let short = &text[..2];
        return matches!(
            short,
            "-n" | "-U" | "-S" | "-G" | "-L" | "-I" | "-M" | "-C" | "-B"
        ) && options.contains(&short);
    }
    false
}
