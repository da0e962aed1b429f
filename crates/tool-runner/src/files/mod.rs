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
use crate::tools::{Call, Running, Target, Tool, ToolOutcome, ToolSpec};
use crate::workspace::Workspace;
use crate::{Limits, ToolError};
use ignore::gitignore::Gitignore;
use ignore::{DirEntry, Match, WalkBuilder};
use serde::Deserialize;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Most entries `list_dir` and `glob` show.
mod edit;
mod search;

pub use edit::Preview;
use edit::*;
use search::*;

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

/// The file tools (`edit_file`, `glob`, `grep`, `list_dir`, `read_file`,
/// `write_file`). The readers are read-only, parallel-safe and not
/// sensitive; the writers change files, run alone and are sensitive.
pub fn tools(limits: &Limits, sandbox: &Sandbox) -> Vec<Arc<dyn Tool<Call>>> {
    vec![
        file_tool(
            ToolSpec::changing(
                "edit_file",
                "Edit a text file in the workspace by exact string replacement: \
                `old_string` is replaced by `new_string`. `old_string` must match the file \
                exactly (including whitespace and indentation) and occur exactly once, unless \
                `replace_all` is true; add surrounding lines to make it unique. Returns a \
                unified diff of the change. Use write_file to create files.",
                serde_json::json!({
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
            ),
            edit_file,
            false,
            limits,
            sandbox,
        ),
        file_tool(
            ToolSpec::reading(
                "glob",
                "Find files whose path (relative to `path`) matches a glob pattern, \
                e.g. \"**/*.rs\" or \"src/*.toml\". `*` does not cross '/', `**` matches any \
                number of directories. Files ignored by .gitignore are skipped, and so are \
                hidden ones unless the pattern names them (\".*\", \"**/.github/**\"). Returns \
                paths relative to the workspace, sorted.",
                serde_json::json!({
                    "type": "object",
                    "properties": {
                        "pattern": {"type": "string", "description": "Glob pattern, relative to `path`."},
                        "path": {"type": "string", "description": "Directory to search, relative to the workspace (default \".\")."}
                    },
                    "required": ["pattern"],
                    "additionalProperties": false
                }),
            ),
            glob,
            true,
            limits,
            sandbox,
        ),
        file_tool(
            ToolSpec::reading(
                "grep",
                "Search file contents with a regular expression (Rust regex syntax), \
                line by line. Returns matching lines as \"path:line_number:line\", sorted by \
                path then line. Skips binary files, files over 10 MiB, hidden files and files \
                ignored by .gitignore.",
                serde_json::json!({
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
            ),
            grep,
            true,
            limits,
            sandbox,
        ),
        file_tool(
            ToolSpec::reading(
                "list_dir",
                "List a directory of the workspace: directories end with '/', symbolic \
                links are shown as \"name -> target\", files with their size. Entries ignored \
                by .gitignore are left out, and so are hidden ones unless `show_hidden`. Paths \
                are relative to the workspace, sorted.",
                serde_json::json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "Directory relative to the workspace (default \".\")."},
                        "depth": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_DEPTH, "description": "How many levels to list (default 1)."},
                        "show_hidden": {"type": "boolean", "description": "Include hidden entries (names starting with '.'; default false)."}
                    },
                    "additionalProperties": false
                }),
            ),
            list_dir,
            true,
            limits,
            sandbox,
        ),
        file_tool(
            ToolSpec::reading(
                "read_file",
                "Read a text file in the workspace. Paths are relative to the workspace. \
                Optionally read only `limit` lines starting at line `offset` (1-based).",
                serde_json::json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "File path relative to the workspace."},
                        "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based)."},
                        "limit": {"type": "integer", "minimum": 1, "description": "Number of lines to read."}
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
            ),
            read_file,
            false,
            limits,
            sandbox,
        ),
        file_tool(
            ToolSpec::changing(
                "write_file",
                "Create or replace a text file in the workspace with the given content, \
                creating parent directories. The write is atomic.",
                serde_json::json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "File path relative to the workspace."},
                        "content": {"type": "string", "description": "The full new content of the file."}
                    },
                    "required": ["path", "content"],
                    "additionalProperties": false
                }),
            ),
            write_file,
            false,
            limits,
            sandbox,
        ),
    ]
}

/// A file tool: its arguments parsed, then `act` run on a confined thread.
struct FileTool<A> {
    spec: ToolSpec,
    act: fn(&Workspace, A, &Limits) -> Result<ToolOutcome, ToolError>,
    /// Its `path` names a directory to look in (else a file).
    directory: bool,
    limits: Limits,
    sandbox: Sandbox,
}

fn file_tool<A>(
    spec: ToolSpec,
    act: fn(&Workspace, A, &Limits) -> Result<ToolOutcome, ToolError>,
    directory: bool,
    limits: &Limits,
    sandbox: &Sandbox,
) -> Arc<dyn Tool<Call>>
where
    A: for<'de> Deserialize<'de> + Send + 'static,
{
    Arc::new(FileTool {
        spec,
        act,
        directory,
        limits: limits.clone(),
        sandbox: sandbox.clone(),
    })
}

impl<A> Tool<Call> for FileTool<A>
where
    A: for<'de> Deserialize<'de> + Send + 'static,
{
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn run<'a>(
        &'a self,
        call: &'a Call,
        arguments: &'a str,
    ) -> Running<'a, Result<ToolOutcome, ToolError>> {
        Box::pin(confined(
            &self.spec.name,
            arguments,
            &call.workspace,
            &self.limits,
            &self.sandbox,
            self.act,
        ))
    }

    fn target(&self, arguments: &str) -> Option<Target> {
        let args: serde_json::Value = serde_json::from_str(arguments).ok()?;
        Some(Target {
            path: args.get("path")?.as_str()?.to_string(),
            directory: self.directory,
        })
    }
}

/// Reads the image at `path` as the session, confined like a file tool:
/// (media type, bytes).
pub async fn read_image(
    path: &str,
    workspace: &Workspace,
    limits: &Limits,
    sandbox: &Sandbox,
) -> Result<(&'static str, Vec<u8>), ToolError> {
    let arguments = serde_json::json!({ "path": path }).to_string();
    confined(
        "read_image",
        &arguments,
        workspace,
        limits,
        sandbox,
        |workspace: &Workspace, args: ImageArgs, _: &Limits| {
            let (file, shown) = workspace.open_read(&args.path)?;
            let meta = file
                .metadata()
                .map_err(|e| ToolError::Io(format!("{shown}: {e}")))?;
            if meta.is_dir() {
                return Err(ToolError::InvalidArguments(format!(
                    "{shown} is a directory, not an image"
                )));
            }
            if meta.len() > agentry_runtime::images::MAX_IMAGE_BYTES {
                return Err(ToolError::TooLarge(format!(
                    "{shown} is {} bytes; an image sent to the model may have at most {} \
                     (scale it down first)",
                    meta.len(),
                    agentry_runtime::images::MAX_IMAGE_BYTES
                )));
            }
            let mut data = Vec::with_capacity(meta.len() as usize);
            std::io::Read::read_to_end(
                &mut std::io::Read::take(file, agentry_runtime::images::MAX_IMAGE_BYTES + 1),
                &mut data,
            )
            .map_err(|e| ToolError::Io(format!("{shown}: {e}")))?;
            let Some(mime) = agentry_runtime::images::image_type(&data) else {
                return Err(ToolError::InvalidArguments(format!(
                    "{shown} is not a PNG, JPEG, GIF or WebP image, the kinds model servers take"
                )));
            };
            Ok((mime, data))
        },
    )
    .await
}

#[derive(Deserialize)]
struct ImageArgs {
    path: String,
}

/// What a `write_file` or `edit_file` call would change, worked out in
/// the same confinement as the call itself; nothing is written. `None`
/// for every other tool.
pub async fn preview(
    tool: &str,
    arguments_json: &str,
    workspace: &Workspace,
    limits: &Limits,
    sandbox: &Sandbox,
) -> Option<Result<Preview, ToolError>> {
    let result = match tool {
        "write_file" => {
            confined(
                tool,
                arguments_json,
                workspace,
                limits,
                sandbox,
                preview_write,
            )
            .await
        }
        "edit_file" => {
            confined(
                tool,
                arguments_json,
                workspace,
                limits,
                sandbox,
                preview_edit,
            )
            .await
        }
        _ => return None,
    };
    Some(result)
}

/// Parses the arguments, then runs `f` on a thread of its own confined
/// like a command of the session (its identity, and a Landlock domain
/// holding only the workspace): what a file tool can touch is what the
/// session's shell can.
async fn confined<A, R, F>(
    tool: &str,
    arguments_json: &str,
    workspace: &Workspace,
    limits: &Limits,
    sandbox: &Sandbox,
    f: F,
) -> Result<R, ToolError>
where
    A: for<'de> Deserialize<'de> + Send + 'static,
    R: Send + 'static,
    F: FnOnce(&Workspace, A, &Limits) -> Result<R, ToolError> + Send + 'static,
{
    let args: A = agentry_tool::arguments(tool, arguments_json)?;
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
