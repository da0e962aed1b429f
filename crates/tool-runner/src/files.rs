//! The file tools: `edit_file` (exact string replacement), `list_dir`,
//! `glob` and `grep`.
//!
//! Every path given goes through [`Workspace::resolve`]; every path shown is
//! relative to the workspace root. Walks respect `.gitignore` files (also
//! outside git repositories, and those of the directories between the
//! workspace root and the searched directory, but never those above the
//! workspace), skip hidden entries unless asked, never descend into `.git`
//! and never follow symbolic links.

use crate::output::CappedOutput;
use crate::sandbox::Sandbox;
use crate::tools::{ToolOutcome, ToolSpec};
use crate::workspace::Workspace;
use crate::{Limits, ToolError};
use ignore::gitignore::Gitignore;
use ignore::{DirEntry, Match, WalkBuilder};
use serde::Deserialize;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Most entries `list_dir` and `glob` show.
const MAX_ENTRIES: usize = 1000;
/// Deepest `list_dir` goes.
const MAX_LIST_DEPTH: u64 = 5;
/// `grep` results when the call names no limit.
const DEFAULT_GREP_RESULTS: usize = 200;
/// The most `grep` results a call may ask for.
const MAX_GREP_RESULTS: usize = 2000;
/// `grep` skips larger files.
const MAX_GREP_FILE_BYTES: u64 = 10 * 1024 * 1024;
/// Longest line `grep` shows, in characters.
const MAX_GREP_LINE_CHARS: usize = 300;
/// Largest compiled regex.
const REGEX_SIZE_LIMIT: usize = 1024 * 1024;
/// How much of a file is looked at for NUL bytes to call it binary.
const BINARY_SNIFF_BYTES: usize = 8192;
/// Largest file `edit_file` edits.
const MAX_EDIT_BYTES: u64 = 16 * 1024 * 1024;
/// How long computing an `edit_file` diff may take before it gets coarser.
const DIFF_TIMEOUT: Duration = Duration::from_secs(2);

/// Descriptions of the file tools (`edit_file`, `glob`, `grep`, `list_dir`),
/// sorted by name. All but `edit_file` are read-only, parallel-safe and not
/// sensitive; `edit_file` changes files, runs alone and is sensitive.
pub fn specs() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "edit_file",
            description: "Edit a text file in the workspace by exact string replacement: \
                `old_string` is replaced by `new_string`. `old_string` must match the file \
                exactly (including whitespace and indentation) and occur exactly once, unless \
                `replace_all` is true; add surrounding lines to make it unique. Returns a \
                unified diff of the change. Use write_file to create files.",
            schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path relative to the workspace."},
                    "old_string": {"type": "string", "description": "The exact text to replace (not empty)."},
                    "new_string": {"type": "string", "description": "The text to put in its place (must differ from old_string)."},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of exactly one (default false)."}
                },
                "required": ["path", "old_string", "new_string"],
                "additionalProperties": false
            }),
            read_only: false,
            parallel_safe: false,
            sensitive: true,
        },
        ToolSpec {
            name: "glob",
            description: "Find files whose path (relative to `path`) matches a glob pattern, \
                e.g. \"**/*.rs\" or \"src/*.toml\". `*` does not cross '/', `**` matches any \
                number of directories. Files ignored by .gitignore are skipped, and so are \
                hidden ones unless the pattern names them (\".*\", \"**/.github/**\"). Returns \
                paths relative to the workspace, sorted.",
            schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Glob pattern, relative to `path`."},
                    "path": {"type": "string", "description": "Directory to search, relative to the workspace (default \".\")."}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
            read_only: true,
            parallel_safe: true,
            sensitive: false,
        },
        ToolSpec {
            name: "grep",
            description: "Search file contents with a regular expression (Rust regex syntax), \
                line by line. Returns matching lines as \"path:line_number:line\", sorted by \
                path then line. Skips binary files, files over 10 MiB, hidden files and files \
                ignored by .gitignore.",
            schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "description": "Regular expression to search for."},
                    "path": {"type": "string", "description": "File or directory to search, relative to the workspace (default \".\")."},
                    "include": {"type": "string", "description": "Only search files whose name matches this glob, e.g. \"*.rs\" (a glob containing '/' is matched against the path relative to `path`)."},
                    "case_insensitive": {"type": "boolean", "description": "Ignore case (default false)."},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": MAX_GREP_RESULTS, "description": "Most matching lines returned (default 200)."}
                },
                "required": ["pattern"],
                "additionalProperties": false
            }),
            read_only: true,
            parallel_safe: true,
            sensitive: false,
        },
        ToolSpec {
            name: "list_dir",
            description: "List a directory of the workspace: directories end with '/', symbolic \
                links are shown as \"name -> target\", files with their size. Entries ignored \
                by .gitignore are left out, and so are hidden ones unless `show_hidden`. Paths \
                are relative to the workspace, sorted.",
            schema: serde_json::json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Directory relative to the workspace (default \".\")."},
                    "depth": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_DEPTH, "description": "How many levels to list (default 1)."},
                    "show_hidden": {"type": "boolean", "description": "Include hidden entries (names starting with '.'; default false)."}
                },
                "additionalProperties": false
            }),
            read_only: true,
            parallel_safe: true,
            sensitive: false,
        },
    ]
}

/// Runs `tool` if it is one of the file tools; `None` otherwise.
pub async fn execute(
    tool: &str,
    arguments_json: &str,
    workspace: &Workspace,
    limits: &Limits,
    sandbox: &Sandbox,
) -> Option<Result<ToolOutcome, ToolError>> {
    let result = match tool {
        "read_file" => confined(tool, arguments_json, workspace, limits, sandbox, read_file).await,
        "write_file" => {
            confined(tool, arguments_json, workspace, limits, sandbox, write_file).await
        }
        "edit_file" => confined(tool, arguments_json, workspace, limits, sandbox, edit_file).await,
        "list_dir" => confined(tool, arguments_json, workspace, limits, sandbox, list_dir).await,
        "glob" => confined(tool, arguments_json, workspace, limits, sandbox, glob).await,
        "grep" => confined(tool, arguments_json, workspace, limits, sandbox, grep).await,
        _ => return None,
    };
    Some(result)
}

/// Parses the arguments, then runs `f` on a thread of its own confined
/// like a command of the session (its identity, and a Landlock domain
/// holding only the workspace): what a file tool can touch is what the
/// session's shell can.
async fn confined<A, F>(
    tool: &str,
    arguments_json: &str,
    workspace: &Workspace,
    limits: &Limits,
    sandbox: &Sandbox,
    f: F,
) -> Result<ToolOutcome, ToolError>
where
    A: for<'de> Deserialize<'de> + Send + 'static,
    F: FnOnce(&Workspace, A, &Limits) -> Result<ToolOutcome, ToolError> + Send + 'static,
{
    let args: A = crate::tools::parse_args(tool, arguments_json)?;
    let confinement = sandbox.file_confinement(workspace);
    let workspace = workspace.clone();
    let limits = limits.clone();
    tokio::task::spawn_blocking(move || {
        agentry_sandbox::run_confined(&confinement, move || f(&workspace, args, &limits))
    })
    .await
    .map_err(|e| ToolError::Io(format!("{tool} failed: {e}")))?
    .map_err(|e| ToolError::Io(format!("{tool} could not be confined: {e}")))?
}

/// The capped output of a successful call.
fn outcome(text: &str, limits: &Limits) -> ToolOutcome {
    let mut capped = CappedOutput::new(limits.max_output_bytes);
    capped.push(text.as_bytes());
    let (output, truncated) = capped.finish();
    ToolOutcome {
        output,
        truncated,
        ..ToolOutcome::default()
    }
}

/// `path` relative to the workspace, "." for the root itself.
fn shown(workspace: &Workspace, path: &Path) -> String {
    let s = workspace.display(path);
    if s.is_empty() { ".".to_string() } else { s }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn default_path() -> String {
    ".".to_string()
}

/// Metadata of an existing path, with a clear error when it is missing.
fn existing(path: &Path, shown: &str) -> Result<std::fs::Metadata, ToolError> {
    std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => ToolError::Io(format!(
            "{shown}: no such file or directory in the workspace"
        )),
        _ => ToolError::Io(format!("{shown}: {e}")),
    })
}

// ------------------------------------------------------ read_file, write_file

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    #[serde(default)]
    offset: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
}

/// Files larger than this are never loaded whole.
const MAX_SCAN_BYTES: u64 = 64 * 1024 * 1024;

fn read_file(
    workspace: &Workspace,
    args: ReadArgs,
    limits: &Limits,
) -> Result<ToolOutcome, ToolError> {
    // One handle, opened beneath the workspace: what is checked is what
    // is read.
    let (file, shown) = workspace.open_read(&args.path)?;
    let meta = file
        .metadata()
        .map_err(|e| ToolError::Io(format!("{shown}: {e}")))?;
    let ranged = args.offset.is_some() || args.limit.is_some();
    if meta.len() > MAX_SCAN_BYTES || (!ranged && meta.len() > limits.max_read_bytes) {
        return Err(ToolError::TooLarge(format!(
            "{shown} is {} bytes, over the {}-byte limit; read a line range with offset and limit",
            meta.len(),
            if ranged {
                MAX_SCAN_BYTES
            } else {
                limits.max_read_bytes
            }
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::io::Read::read_to_end(&mut { file }, &mut bytes)
        .map_err(|e| ToolError::Io(format!("{shown}: {e}")))?;
    if bytes.iter().take(8192).any(|b| *b == 0) {
        return Err(ToolError::Binary(shown));
    }
    let text = String::from_utf8(bytes).map_err(|_| ToolError::Binary(shown.clone()))?;
    let selected = if ranged {
        let offset = args.offset.unwrap_or(1).max(1);
        let limit = args.limit.unwrap_or(usize::MAX);
        let total = text.lines().count();
        if offset > total.max(1) {
            return Err(ToolError::InvalidArguments(format!(
                "offset {offset} is past the end of {shown} ({total} lines)"
            )));
        }
        text.split_inclusive('\n')
            .skip(offset - 1)
            .take(limit)
            .collect::<String>()
    } else {
        text
    };
    let mut capped = CappedOutput::new(limits.max_read_bytes as usize);
    capped.push(selected.as_bytes());
    let (output, truncated) = capped.finish();
    Ok(ToolOutcome {
        output,
        truncated,
        ..ToolOutcome::default()
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}

fn write_file(
    workspace: &Workspace,
    args: WriteArgs,
    limits: &Limits,
) -> Result<ToolOutcome, ToolError> {
    let len = args.content.len();
    workspace.check_quota(limits.workspace_bytes, len as u64)?;
    // The thread runs as the session's user: what it makes is theirs.
    let shown = workspace.replace_file(&args.path, args.content.as_bytes(), None)?;
    Ok(ToolOutcome {
        output: format!("wrote {len} bytes to {shown}"),
        ..ToolOutcome::default()
    })
}

// ---------------------------------------------------------------- edit_file

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

fn edit_file(
    workspace: &Workspace,
    args: EditArgs,
    limits: &Limits,
) -> Result<ToolOutcome, ToolError> {
    if args.old_string.is_empty() {
        return Err(ToolError::InvalidArguments(
            "old_string must not be empty; to create or overwrite a file use write_file".into(),
        ));
    }
    if args.old_string == args.new_string {
        return Err(ToolError::InvalidArguments(
            "old_string and new_string are identical; there is nothing to change".into(),
        ));
    }
    let (mut file, shown) = workspace.open_read(&args.path).map_err(|e| match e {
        ToolError::Io(m) if m.ends_with("no such file in the workspace") => {
            ToolError::Io(format!("{m}; use write_file to create it"))
        }
        e => e,
    })?;
    let meta = file
        .metadata()
        .map_err(|e| ToolError::Io(format!("{shown}: {e}")))?;
    if meta.len() > MAX_EDIT_BYTES {
        return Err(ToolError::TooLarge(format!(
            "{shown} is {} bytes, over the {MAX_EDIT_BYTES}-byte limit of edit_file",
            meta.len()
        )));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::io::Read::read_to_end(&mut file, &mut bytes)
        .map_err(|e| ToolError::Io(format!("{shown}: {e}")))?;
    drop(file);
    let binary = || {
        ToolError::InvalidArguments(format!(
            "{shown} is a binary file (not UTF-8 text); edit_file only edits text files"
        ))
    };
    if bytes.iter().take(BINARY_SNIFF_BYTES).any(|b| *b == 0) {
        return Err(binary());
    }
    let old_text = String::from_utf8(bytes).map_err(|_| binary())?;

    let count = old_text.matches(args.old_string.as_str()).count();
    if count == 0 {
        return Err(ToolError::InvalidArguments(not_found_message(
            &old_text,
            &args.old_string,
            &shown,
        )));
    }
    if count > 1 && !args.replace_all {
        return Err(ToolError::InvalidArguments(format!(
            "old_string occurs {count} times in {shown}; it must occur exactly once: add \
             surrounding lines to old_string to make it unique, or set replace_all to true to \
             replace every occurrence"
        )));
    }
    let new_text = if args.replace_all {
        old_text.replace(&args.old_string, &args.new_string)
    } else {
        old_text.replacen(&args.old_string, &args.new_string, 1)
    };

    let growth = (new_text.len() as u64).saturating_sub(meta.len());
    if growth > 0 {
        workspace.check_quota(limits.workspace_bytes, growth)?;
    }
    workspace.replace_file(&args.path, new_text.as_bytes(), Some(&meta))?;

    let diff = similar::TextDiff::configure()
        .timeout(DIFF_TIMEOUT)
        .diff_lines(old_text.as_str(), new_text.as_str());
    let mut text = diff
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{shown}"), &format!("b/{shown}"))
        .to_string();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!(
        "replaced {}",
        plural(count, "occurrence", "occurrences")
    ));
    Ok(outcome(&text, limits))
}

/// Why `old` was not found in `content`, with a hint when it nearly matches.
fn not_found_message(content: &str, old: &str, shown: &str) -> String {
    let base = format!("old_string was not found in {shown}");
    let trimmed = old.trim();
    if !trimmed.is_empty() && trimmed != old && content.contains(trimmed) {
        return format!(
            "{base}, but it matches once its leading and trailing whitespace is removed; \
             check the whitespace (spaces, tabs, newlines) at its start and end"
        );
    }
    if let Some(line) = line_trimmed_match(content, old) {
        return format!(
            "{base}, but it matches at line {line} when the whitespace at the start and end of \
             each line is ignored; copy the exact text, with its indentation, from the file"
        );
    }
    format!("{base}; read the file and copy the exact text to replace, including whitespace")
}

/// The first line (1-based) where the lines of `old` match consecutive lines
/// of `content`, both with each line trimmed.
fn line_trimmed_match(content: &str, old: &str) -> Option<usize> {
    let wanted: Vec<&str> = old.trim().lines().map(str::trim).collect();
    if wanted.is_empty() || wanted.iter().all(|l| l.is_empty()) {
        return None;
    }
    let lines: Vec<&str> = content.lines().map(str::trim).collect();
    if wanted.len() == 1 {
        // A single line: it may be part of a line.
        return lines
            .iter()
            .position(|l| l.contains(wanted[0]))
            .map(|i| i + 1);
    }
    lines
        .windows(wanted.len())
        .position(|w| {
            let last = wanted.len() - 1;
            w.iter().zip(&wanted).enumerate().all(|(i, (have, want))| {
                // The first and last lines of old_string may be partial lines.
                if i == 0 {
                    have.ends_with(want)
                } else if i == last {
                    have.starts_with(want)
                } else {
                    have == want
                }
            })
        })
        .map(|i| i + 1)
}

// ------------------------------------------------------------------- walking

/// Which `.git` entries a walk leaves out.
#[derive(Clone, Copy, PartialEq)]
enum GitDir {
    /// Leave `.git` out entirely.
    Skip,
    /// Show `.git` itself, but not what is inside.
    Opaque,
}

/// A walker over `root` (inside the workspace) that respects `.gitignore`
/// files from the workspace root down, never follows symbolic links, and
/// never descends into `.git` (unless `root` is inside it).
fn walker(workspace: &Workspace, root: &Path, hidden: bool, git: GitDir) -> WalkBuilder {
    // The walker reads the ignore files of `root` and below; those of the
    // directories between the workspace root and `root` are applied here,
    // and none from above the workspace (`parents(false)`).
    // (A file named as the root is searched whatever the ignore files say.)
    let mut ancestors = Vec::new();
    if root.is_dir() && root != workspace.root() {
        let mut dir = root.parent();
        while let Some(d) = dir {
            if !d.starts_with(workspace.root()) {
                break;
            }
            let file = d.join(".gitignore");
            if file.is_file() {
                let (gi, err) = Gitignore::new(&file);
                if let Some(e) = err {
                    tracing::debug!(file = %file.display(), error = %e, "partly invalid .gitignore");
                }
                ancestors.push(gi);
            }
            if d == workspace.root() {
                break;
            }
            dir = d.parent();
        }
    }
    let walk_root = root.to_path_buf();
    let mut builder = WalkBuilder::new(root);
    builder
        .hidden(hidden)
        .parents(false)
        .ignore(false)
        .git_ignore(true)
        .git_global(false)
        .git_exclude(true)
        .require_git(false)
        .follow_links(false)
        .filter_entry(move |entry| keep(entry, &walk_root, &ancestors, git));
    builder
}

fn keep(entry: &DirEntry, walk_root: &Path, ancestors: &[Gitignore], git: GitDir) -> bool {
    if entry.depth() == 0 {
        return true;
    }
    let path = entry.path();
    match git {
        GitDir::Skip => {
            if entry.file_name() == OsStr::new(".git") {
                return false;
            }
        }
        GitDir::Opaque => {
            if let Some(parent) = path.parent()
                && parent != walk_root
                && parent.file_name() == Some(OsStr::new(".git"))
            {
                return false;
            }
        }
    }
    let is_dir = entry.file_type().is_some_and(|t| t.is_dir());
    // Deepest first: a deeper .gitignore overrides a shallower one.
    for gi in ancestors {
        match gi.matched(path, is_dir) {
            Match::Ignore(_) => return false,
            Match::Whitelist(_) => return true,
            Match::None => {}
        }
    }
    true
}

/// Resolves a directory argument and checks that it is one.
fn directory(workspace: &Workspace, path: &str, tool: &str) -> Result<PathBuf, ToolError> {
    let dir = workspace.resolve(path)?;
    let shown = shown(workspace, &dir);
    if !existing(&dir, &shown)?.is_dir() {
        let hint = if tool == "list_dir" {
            "; use read_file to read a file"
        } else {
            ""
        };
        return Err(ToolError::InvalidArguments(format!(
            "{shown} is not a directory{hint}"
        )));
    }
    Ok(dir)
}

/// Sorted lines, at most `MAX_ENTRIES`, then "… N more".
fn capped_listing(mut entries: Vec<(PathBuf, String)>) -> String {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let total = entries.len();
    let mut lines: Vec<String> = entries
        .into_iter()
        .take(MAX_ENTRIES)
        .map(|(_, line)| line)
        .collect();
    if total > MAX_ENTRIES {
        lines.push(format!("… {} more", total - MAX_ENTRIES));
    }
    lines.join("\n")
}

// ----------------------------------------------------------------- list_dir

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    #[serde(default = "default_path")]
    path: String,
    #[serde(default)]
    depth: Option<u64>,
    #[serde(default)]
    show_hidden: bool,
}

fn list_dir(
    workspace: &Workspace,
    args: ListArgs,
    limits: &Limits,
) -> Result<ToolOutcome, ToolError> {
    let depth = args.depth.unwrap_or(1);
    if !(1..=MAX_LIST_DEPTH).contains(&depth) {
        return Err(ToolError::InvalidArguments(format!(
            "depth must be between 1 and {MAX_LIST_DEPTH}, got {depth}"
        )));
    }
    let dir = directory(workspace, &args.path, "list_dir")?;
    let mut builder = walker(workspace, &dir, !args.show_hidden, GitDir::Opaque);
    builder.max_depth(usize::try_from(depth).ok());
    let mut entries = Vec::new();
    for item in builder.build() {
        let entry = match item {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!(error = %e, "list_dir skipped an entry");
                continue;
            }
        };
        if entry.depth() == 0 {
            continue;
        }
        let path = entry.path();
        let name = shown(workspace, path);
        let line = match entry.file_type() {
            Some(t) if t.is_dir() => format!("{name}/"),
            Some(t) if t.is_symlink() => match std::fs::read_link(path) {
                Ok(target) => format!("{name} -> {}", target.display()),
                Err(_) => format!("{name} -> ?"),
            },
            Some(t) if t.is_file() => match entry.metadata() {
                Ok(m) => format!("{name} ({})", plural_bytes(m.len())),
                Err(_) => name,
            },
            _ => name,
        };
        entries.push((path.to_path_buf(), line));
    }
    let text = if entries.is_empty() {
        format!("{} is empty", shown(workspace, &dir))
    } else {
        capped_listing(entries)
    };
    Ok(outcome(&text, limits))
}

fn plural_bytes(n: u64) -> String {
    if n == 1 {
        "1 byte".to_string()
    } else {
        format!("{n} bytes")
    }
}

// --------------------------------------------------------------------- glob

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GlobArgs {
    pattern: String,
    #[serde(default = "default_path")]
    path: String,
}

/// Compiles a glob in which `*` does not cross '/'.
fn compile_glob(pattern: &str, what: &str) -> Result<globset::GlobMatcher, ToolError> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| ToolError::InvalidArguments(format!("invalid {what} {pattern:?}: {e}")))
}

fn glob(workspace: &Workspace, args: GlobArgs, limits: &Limits) -> Result<ToolOutcome, ToolError> {
    let mut pattern = args.pattern.trim();
    while let Some(rest) = pattern.strip_prefix("./") {
        pattern = rest;
    }
    if pattern.is_empty() {
        return Err(ToolError::InvalidArguments(
            "pattern must not be empty".into(),
        ));
    }
    if pattern.starts_with('/') {
        return Err(ToolError::InvalidArguments(format!(
            "pattern {pattern:?} must be relative to path, not absolute"
        )));
    }
    let matcher = compile_glob(pattern, "glob pattern")?;
    let dir = directory(workspace, &args.path, "glob")?;
    let hidden = !(pattern.starts_with('.') || pattern.contains("/."));
    let mut entries = Vec::new();
    for item in walker(workspace, &dir, hidden, GitDir::Skip).build() {
        let Ok(entry) = item else { continue };
        if entry.depth() == 0 || entry.file_type().is_none_or(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        let Ok(rel) = path.strip_prefix(&dir) else {
            continue;
        };
        if matcher.is_match(rel) {
            entries.push((path.to_path_buf(), shown(workspace, path)));
        }
    }
    let text = if entries.is_empty() {
        format!("no files match {pattern:?} in {}", shown(workspace, &dir))
    } else {
        capped_listing(entries)
    };
    Ok(outcome(&text, limits))
}

// --------------------------------------------------------------------- grep

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrepArgs {
    pattern: String,
    #[serde(default = "default_path")]
    path: String,
    #[serde(default)]
    include: Option<String>,
    #[serde(default)]
    case_insensitive: bool,
    #[serde(default)]
    max_results: Option<usize>,
}

fn grep(workspace: &Workspace, args: GrepArgs, limits: &Limits) -> Result<ToolOutcome, ToolError> {
    if args.pattern.is_empty() {
        return Err(ToolError::InvalidArguments(
            "pattern must not be empty".into(),
        ));
    }
    let max_results = args.max_results.unwrap_or(DEFAULT_GREP_RESULTS);
    if !(1..=MAX_GREP_RESULTS).contains(&max_results) {
        return Err(ToolError::InvalidArguments(format!(
            "max_results must be between 1 and {MAX_GREP_RESULTS}, got {max_results}"
        )));
    }
    let regex = regex::RegexBuilder::new(&args.pattern)
        .case_insensitive(args.case_insensitive)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| {
            ToolError::InvalidArguments(format!("invalid regex {:?}: {e}", args.pattern))
        })?;
    let include = match args.include.as_deref().map(str::trim) {
        None | Some("") => None,
        Some(g) => Some((compile_glob(g, "include glob")?, g.contains('/'))),
    };
    let root = workspace.resolve(&args.path)?;
    existing(&root, &shown(workspace, &root))?;

    // (Not `WalkBuilder::max_filesize`: with it, the walker skips the entry
    // filter for files, and so the ancestors' ignore files.)
    let mut files = Vec::new();
    for item in walker(workspace, &root, true, GitDir::Skip).build() {
        let Ok(entry) = item else { continue };
        if !entry.file_type().is_some_and(|t| t.is_file())
            || entry
                .metadata()
                .map_or(true, |m| m.len() > MAX_GREP_FILE_BYTES)
        {
            continue;
        }
        let path = entry.path();
        // A file named explicitly is searched whatever `include` says.
        if entry.depth() > 0
            && let Some((matcher, by_path)) = &include
        {
            let subject = if *by_path {
                path.strip_prefix(&root).unwrap_or(path)
            } else {
                Path::new(entry.file_name())
            };
            if !matcher.is_match(subject) {
                continue;
            }
        }
        files.push(path.to_path_buf());
    }
    files.sort();

    let mut lines = Vec::new();
    let mut total = 0usize;
    for file in &files {
        // Opened again beneath the workspace (openat2), not by the name the
        // walk found: a directory swapped for a link since is refused.
        let Ok((mut handle, _)) = workspace.open_read(&workspace.display(file)) else {
            continue;
        };
        let mut bytes = Vec::new();
        if std::io::Read::read_to_end(&mut handle, &mut bytes).is_err() {
            continue;
        }
        if bytes.len() as u64 > MAX_GREP_FILE_BYTES
            || bytes.iter().take(BINARY_SNIFF_BYTES).any(|b| *b == 0)
        {
            continue;
        }
        let text = String::from_utf8_lossy(&bytes);
        let name = shown(workspace, file);
        for (i, line) in text.lines().enumerate() {
            if !regex.is_match(line) {
                continue;
            }
            total += 1;
            if lines.len() < max_results {
                lines.push(format!("{name}:{}:{}", i + 1, clip(line)));
            }
        }
    }
    let text = if total == 0 {
        "no matches".to_string()
    } else {
        if total > lines.len() {
            let more = total - lines.len();
            lines.push(format!(
                "… {more} more {} (raise max_results or narrow the search)",
                if more == 1 { "match" } else { "matches" }
            ));
        }
        lines.join("\n")
    };
    Ok(outcome(&text, limits))
}

/// A line cut to `MAX_GREP_LINE_CHARS` characters.
fn clip(line: &str) -> String {
    let line = line.strip_suffix('\r').unwrap_or(line);
    match line.char_indices().nth(MAX_GREP_LINE_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}
