//! Reading and changing files: `read_file`, `write_file`, `edit_file`.

use super::*;

// ------------------------------------------------------ read_file, write_file

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReadArgs {
    path: String,
    #[serde(default)]
    offset: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
}

/// Files larger than this are never loaded whole.
pub(super) const MAX_SCAN_BYTES: u64 = 64 * 1024 * 1024;

pub(super) fn read_file(
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
pub(super) struct WriteArgs {
    path: String,
    content: String,
}

pub(super) fn write_file(
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
pub(super) struct EditArgs {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

/// An edit worked out: the file's text now and after, with what the
/// replaced file had.
struct PlannedEdit {
    shown: String,
    meta: std::fs::Metadata,
    old_text: String,
    new_text: String,
    count: usize,
}

/// Reads the file and applies the replacement in memory; writes nothing.
fn plan_edit(workspace: &Workspace, args: &EditArgs) -> Result<PlannedEdit, ToolError> {
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
    Ok(PlannedEdit {
        shown,
        meta,
        old_text,
        new_text,
        count,
    })
}

/// The unified diff from `old` to `new` of the file shown as `shown`.
fn unified_diff(old: &str, new: &str, shown: &str) -> String {
    let diff = similar::TextDiff::configure()
        .timeout(DIFF_TIMEOUT)
        .diff_lines(old, new);
    let mut text = diff
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{shown}"), &format!("b/{shown}"))
        .to_string();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

pub(super) fn edit_file(
    workspace: &Workspace,
    args: EditArgs,
    limits: &Limits,
) -> Result<ToolOutcome, ToolError> {
    let edit = plan_edit(workspace, &args)?;
    let growth = (edit.new_text.len() as u64).saturating_sub(edit.meta.len());
    if growth > 0 {
        workspace.check_quota(limits.workspace_bytes, growth)?;
    }
    workspace.replace_file(&args.path, edit.new_text.as_bytes(), Some(&edit.meta))?;
    let mut text = unified_diff(&edit.old_text, &edit.new_text, &edit.shown);
    text.push_str(&format!(
        "replaced {}",
        plural(edit.count, "occurrence", "occurrences")
    ));
    Ok(outcome(&text, limits))
}

/// What a `write_file` or `edit_file` call would change, worked out
/// without writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    /// The file, relative to the workspace.
    pub path: String,
    /// The change as a unified diff.
    pub diff: String,
    /// The file does not exist yet.
    pub creates: bool,
}

/// The preview of a `write_file` call: the file's text now (none when it
/// does not exist) against the content it would get.
pub(super) fn preview_write(
    workspace: &Workspace,
    args: WriteArgs,
    _limits: &Limits,
) -> Result<Preview, ToolError> {
    let current = match workspace.open_read(&args.path) {
        Ok((file, shown)) => {
            let meta = file
                .metadata()
                .map_err(|e| ToolError::Io(format!("{shown}: {e}")))?;
            if meta.len() > MAX_EDIT_BYTES {
                return Err(ToolError::TooLarge(format!(
                    "{shown} is {} bytes, too large to show what the write changes",
                    meta.len()
                )));
            }
            let mut bytes = Vec::with_capacity(meta.len() as usize);
            std::io::Read::read_to_end(&mut { file }, &mut bytes)
                .map_err(|e| ToolError::Io(format!("{shown}: {e}")))?;
            // A binary file is shown as replaced whole.
            let text = String::from_utf8(bytes)
                .ok()
                .filter(|t| {
                    !t.as_bytes()
                        .iter()
                        .take(BINARY_SNIFF_BYTES)
                        .any(|b| *b == 0)
                })
                .unwrap_or_else(|| "[binary content]\n".to_string());
            Some((text, shown))
        }
        Err(ToolError::Io(m)) if m.ends_with("no such file in the workspace") => None,
        Err(e) => return Err(e),
    };
    Ok(match current {
        Some((old, shown)) => Preview {
            diff: unified_diff(&old, &args.content, &shown),
            path: shown,
            creates: false,
        },
        None => {
            let shown = args.path.trim_start_matches("./").to_string();
            Preview {
                diff: unified_diff("", &args.content, &shown),
                path: shown,
                creates: true,
            }
        }
    })
}

/// The preview of an `edit_file` call.
pub(super) fn preview_edit(
    workspace: &Workspace,
    args: EditArgs,
    _limits: &Limits,
) -> Result<Preview, ToolError> {
    let edit = plan_edit(workspace, &args)?;
    Ok(Preview {
        diff: unified_diff(&edit.old_text, &edit.new_text, &edit.shown),
        path: edit.shown,
        creates: false,
    })
}

/// Why `old` was not found in `content`, with a hint when it nearly matches.
pub(super) fn not_found_message(content: &str, old: &str, shown: &str) -> String {
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
pub(super) fn line_trimmed_match(content: &str, old: &str) -> Option<usize> {
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
