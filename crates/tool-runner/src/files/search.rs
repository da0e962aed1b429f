//! Walking the workspace: `list_dir`, `glob` and `grep`, with the
//! `.gitignore` rules and hidden-entry and `.git` exclusions they share.

use super::*;

// ------------------------------------------------------------------- walking

/// Which `.git` entries a walk leaves out.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum GitDir {
    /// Leave `.git` out entirely.
    Skip,
    /// Show `.git` itself, but not what is inside.
    Opaque,
}

/// A walker over `root` (inside the workspace) that respects `.gitignore`
/// files from the workspace root down, never follows symbolic links, and
/// never descends into `.git` (unless `root` is inside it).
pub(super) fn walker(workspace: &Workspace, root: &Path, hidden: bool, git: GitDir) -> WalkBuilder {
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

pub(super) fn keep(
    entry: &DirEntry,
    walk_root: &Path,
    ancestors: &[Gitignore],
    git: GitDir,
) -> bool {
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
pub(super) fn directory(
    workspace: &Workspace,
    path: &str,
    tool: &str,
) -> Result<PathBuf, ToolError> {
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
pub(super) fn capped_listing(mut entries: Vec<(PathBuf, String)>) -> String {
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
pub(super) struct ListArgs {
    #[serde(default = "default_path")]
    path: String,
    #[serde(default)]
    depth: Option<u64>,
    #[serde(default)]
    show_hidden: bool,
}

pub(super) fn list_dir(
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

pub(super) fn plural_bytes(n: u64) -> String {
    if n == 1 {
        "1 byte".to_string()
    } else {
        format!("{n} bytes")
    }
}

// --------------------------------------------------------------------- glob

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GlobArgs {
    pattern: String,
    #[serde(default = "default_path")]
    path: String,
}

/// Compiles a glob in which `*` does not cross '/'.
pub(super) fn compile_glob(pattern: &str, what: &str) -> Result<globset::GlobMatcher, ToolError> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| ToolError::InvalidArguments(format!("invalid {what} {pattern:?}: {e}")))
}

pub(super) fn glob(
    workspace: &Workspace,
    args: GlobArgs,
    limits: &Limits,
) -> Result<ToolOutcome, ToolError> {
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
pub(super) struct GrepArgs {
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

pub(super) fn grep(
    workspace: &Workspace,
    args: GrepArgs,
    limits: &Limits,
) -> Result<ToolOutcome, ToolError> {
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
pub(super) fn clip(line: &str) -> String {
    let line = line.strip_suffix('\r').unwrap_or(line);
    match line.char_indices().nth(MAX_GREP_LINE_CHARS) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}
