#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The file tools: edit_file, list_dir, glob and grep, confined to the
//! session's workspace.

use agentry_tool_runner::files;
use agentry_tool_runner::sandbox::Sandbox;
use agentry_tool_runner::tools::{self, Call, ToolOutcome};
use agentry_tool_runner::workspace::Workspace;
use agentry_tool_runner::{Limits, ToolError};
use serde_json::{Value, json};
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::time::Duration;
use tempfile::TempDir;

fn limits() -> Limits {
    Limits {
        default_timeout: Duration::from_secs(20),
        max_timeout: Duration::from_secs(60),
        max_output_bytes: 262_144,
        max_read_bytes: 262_144,
        workspace_bytes: 0,
    }
}

fn setup() -> (TempDir, Workspace) {
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::open(dir.path(), "s1").unwrap();
    (dir, ws)
}

fn write(ws: &Workspace, rel: &str, content: impl AsRef<[u8]>) {
    let path = ws.root().join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
}

fn read(ws: &Workspace, rel: &str) -> String {
    std::fs::read_to_string(ws.root().join(rel)).unwrap()
}

/// One call through the runner's registry (no web, no MCP servers).
async fn raw(ws: &Workspace, tool: &str, arguments: &str) -> Result<ToolOutcome, ToolError> {
    let registry = tools::registry(&limits(), &Sandbox::unconfined(), None, None);
    tools::run(&registry, tool, arguments, &Call::in_workspace(ws)).await
}

async fn call(ws: &Workspace, tool: &str, args: Value) -> Result<ToolOutcome, ToolError> {
    raw(ws, tool, &args.to_string()).await
}

async fn ok(ws: &Workspace, tool: &str, args: Value) -> String {
    let outcome = call(ws, tool, args).await.unwrap();
    assert!(!outcome.is_error);
    assert!(!outcome.truncated);
    outcome.output
}

async fn invalid(ws: &Workspace, tool: &str, args: Value) -> String {
    match call(ws, tool, args).await.unwrap_err() {
        ToolError::InvalidArguments(m) => m,
        other => panic!("expected InvalidArguments, got {other:?}"),
    }
}

fn outside(e: ToolError) -> bool {
    matches!(e, ToolError::PathOutsideWorkspace { .. })
}

// ----------------------------------------------------------------- general

#[test]
fn specs_have_the_right_flags() {
    let specs: Vec<_> = files::tools(&limits(), &Sandbox::unconfined())
        .iter()
        .map(|t| t.spec().clone())
        .collect();
    let flags: Vec<(&str, bool, bool, bool, bool, bool)> = specs
        .iter()
        .map(|s| {
            (
                s.name.as_str(),
                s.read_only,
                s.parallel_safe,
                s.sensitive,
                s.network,
                s.grows_workspace,
            )
        })
        .collect();
    assert_eq!(
        flags,
        vec![
            ("edit_file", false, false, true, false, false),
            ("glob", true, true, false, false, false),
            ("grep", true, true, false, false, false),
            ("list_dir", true, true, false, false, false),
            ("read_file", true, true, false, false, false),
            ("write_file", false, false, true, false, false),
        ]
    );
    for spec in &specs {
        assert_eq!(spec.schema["type"], "object");
        assert_eq!(spec.schema["additionalProperties"], false);
    }
    assert_eq!(
        specs[0].schema["required"],
        json!(["path", "old_string", "new_string"])
    );
}

#[tokio::test]
async fn a_tool_the_runner_has_not_set_up_is_unknown_and_the_error_lists_those_it_has() {
    let (_d, ws) = setup();
    for tool in ["web_fetch", "srv__tool", ""] {
        assert_eq!(
            raw(&ws, tool, "{}").await,
            Err(ToolError::UnknownTool {
                name: tool.into(),
                available: "bash, edit_file, glob, grep, list_dir, read_file, write_file".into(),
            })
        );
    }
}

#[tokio::test]
async fn only_a_tool_that_takes_network_may_be_given_it() {
    let (_d, ws) = setup();
    write(&ws, "a.txt", "x");
    let registry = tools::registry(&limits(), &Sandbox::unconfined(), None, None);
    let socket = ws.root().join("..").join("proxy.sock");
    // A loopback proxy (no namespaces needed): the pass is real.
    let egress =
        agentry_tool_runner::egress::Egress::start(&[], &socket, false, true, "unused").await;
    let call = Call {
        network: Some(egress.grant(false).unwrap()),
        ..Call::in_workspace(&ws)
    };
    assert_eq!(
        tools::run(&registry, "read_file", r#"{"path": "a.txt"}"#, &call).await,
        Err(ToolError::InvalidRequest(
            "network is given to bash calls only, not to read_file".into()
        ))
    );
}

#[tokio::test]
async fn bad_arguments_are_invalid() {
    let (_d, ws) = setup();
    let err = raw(&ws, "grep", "{not json").await.unwrap_err();
    assert!(
        matches!(&err, ToolError::InvalidArguments(m) if m.starts_with("arguments of grep are not valid JSON: "))
    );
    let err = raw(&ws, "glob", "[1]").await.unwrap_err();
    assert_eq!(
        err,
        ToolError::InvalidArguments("arguments of glob must be a JSON object, got [1]".into())
    );
    let m = invalid(&ws, "list_dir", json!({"path": ".", "recursive": true})).await;
    assert!(
        m.starts_with("invalid arguments for list_dir: unknown field `recursive`"),
        "{m}"
    );
    let m = invalid(&ws, "edit_file", json!({"path": "a"})).await;
    assert_eq!(
        m,
        "invalid arguments for edit_file: missing field `old_string`"
    );
    // No arguments at all: list_dir has defaults for everything.
    write(&ws, "a.txt", "x");
    let out = raw(&ws, "list_dir", "").await.unwrap();
    assert_eq!(out.output, "a.txt (1 byte)");
}

// ---------------------------------------------------------------- edit_file

#[tokio::test]
async fn edit_once_returns_the_exact_diff() {
    let (_d, ws) = setup();
    write(
        &ws,
        "src/f.txt",
        "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\n",
    );
    let out = ok(
        &ws,
        "edit_file",
        json!({"path": "src/f.txt", "old_string": "five\n", "new_string": "FIVE\n5\n"}),
    )
    .await;
    assert_eq!(
        out,
        "--- a/src/f.txt\n\
         +++ b/src/f.txt\n\
         @@ -2,7 +2,8 @@\n \
         two\n \
         three\n \
         four\n\
         -five\n\
         +FIVE\n\
         +5\n \
         six\n \
         seven\n \
         eight\n\
         replaced 1 occurrence"
    );
    assert_eq!(
        read(&ws, "src/f.txt"),
        "one\ntwo\nthree\nfour\nFIVE\n5\nsix\nseven\neight\nnine\n"
    );
}

#[tokio::test]
async fn edit_without_trailing_newline() {
    let (_d, ws) = setup();
    write(&ws, "f.txt", "a\nb");
    let out = ok(
        &ws,
        "edit_file",
        json!({"path": "./f.txt", "old_string": "b", "new_string": "c"}),
    )
    .await;
    assert_eq!(
        out,
        "--- a/f.txt\n+++ b/f.txt\n@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\nreplaced 1 occurrence"
    );
    assert_eq!(read(&ws, "f.txt"), "a\nc");
}

#[tokio::test]
async fn edit_replace_all() {
    let (_d, ws) = setup();
    write(&ws, "f.rs", "let x = 1;\nlet y = x + x;\n");
    let out = ok(
        &ws,
        "edit_file",
        json!({"path": "f.rs", "old_string": "x", "new_string": "z", "replace_all": true}),
    )
    .await;
    assert_eq!(
        out,
        "--- a/f.rs\n+++ b/f.rs\n@@ -1,2 +1,2 @@\n-let x = 1;\n-let y = x + x;\n+let z = 1;\n+let y = z + z;\nreplaced 3 occurrences"
    );
    assert_eq!(read(&ws, "f.rs"), "let z = 1;\nlet y = z + z;\n");
    // replace_all with a single occurrence is fine too.
    let out = ok(
        &ws,
        "edit_file",
        json!({"path": "f.rs", "old_string": "y", "new_string": "w", "replace_all": true}),
    )
    .await;
    assert!(out.ends_with("\nreplaced 1 occurrence"), "{out}");
    assert_eq!(read(&ws, "f.rs"), "let z = 1;\nlet w = z + z;\n");
}

#[tokio::test]
async fn edit_ambiguous_gives_the_count() {
    let (_d, ws) = setup();
    write(&ws, "f.txt", "x\nx\nx\n");
    let m = invalid(
        &ws,
        "edit_file",
        json!({"path": "f.txt", "old_string": "x", "new_string": "y"}),
    )
    .await;
    assert_eq!(
        m,
        "old_string occurs 3 times in f.txt; it must occur exactly once: add surrounding lines \
         to old_string to make it unique, or set replace_all to true to replace every occurrence"
    );
    assert_eq!(read(&ws, "f.txt"), "x\nx\nx\n");
}

#[tokio::test]
async fn edit_not_found_with_hints() {
    let (_d, ws) = setup();
    write(&ws, "f.py", "def f():\n    return 1\n\nx = 2\n");
    let m = invalid(
        &ws,
        "edit_file",
        json!({"path": "f.py", "old_string": "return 2", "new_string": "return 3"}),
    )
    .await;
    assert_eq!(
        m,
        "old_string was not found in f.py; read the file and copy the exact text to replace, \
         including whitespace"
    );
    // Extra whitespace at the ends.
    let m = invalid(
        &ws,
        "edit_file",
        json!({"path": "f.py", "old_string": "x = 2 \n\n", "new_string": "x = 3"}),
    )
    .await;
    assert_eq!(
        m,
        "old_string was not found in f.py, but it matches once its leading and trailing \
         whitespace is removed; check the whitespace (spaces, tabs, newlines) at its start and end"
    );
    // Wrong indentation on an inner line.
    let m = invalid(
        &ws,
        "edit_file",
        json!({"path": "f.py", "old_string": "def f():\n  return 1", "new_string": "def g():\n  return 1"}),
    )
    .await;
    assert_eq!(
        m,
        "old_string was not found in f.py, but it matches at line 1 when the whitespace at the \
         start and end of each line is ignored; copy the exact text, with its indentation, from \
         the file"
    );
    assert_eq!(read(&ws, "f.py"), "def f():\n    return 1\n\nx = 2\n");
}

#[tokio::test]
async fn edit_refuses_empty_and_identical_strings() {
    let (_d, ws) = setup();
    write(&ws, "f.txt", "abc\n");
    let m = invalid(
        &ws,
        "edit_file",
        json!({"path": "f.txt", "old_string": "", "new_string": "x"}),
    )
    .await;
    assert_eq!(
        m,
        "old_string must not be empty; to create or overwrite a file use write_file"
    );
    let m = invalid(
        &ws,
        "edit_file",
        json!({"path": "f.txt", "old_string": "abc", "new_string": "abc"}),
    )
    .await;
    assert_eq!(
        m,
        "old_string and new_string are identical; there is nothing to change"
    );
    assert_eq!(read(&ws, "f.txt"), "abc\n");
}

#[tokio::test]
async fn edit_refuses_binary_missing_and_directories() {
    let (_d, ws) = setup();
    write(&ws, "b.bin", b"abc\0def");
    let m = invalid(
        &ws,
        "edit_file",
        json!({"path": "b.bin", "old_string": "abc", "new_string": "x"}),
    )
    .await;
    assert_eq!(
        m,
        "b.bin is a binary file (not UTF-8 text); edit_file only edits text files"
    );
    assert_eq!(std::fs::read(ws.root().join("b.bin")).unwrap(), b"abc\0def");
    write(&ws, "l.txt", b"abc \xff\xfe");
    let m = invalid(
        &ws,
        "edit_file",
        json!({"path": "l.txt", "old_string": "abc", "new_string": "x"}),
    )
    .await;
    assert_eq!(
        m,
        "l.txt is a binary file (not UTF-8 text); edit_file only edits text files"
    );
    let err = call(
        &ws,
        "edit_file",
        json!({"path": "nope.txt", "old_string": "a", "new_string": "b"}),
    )
    .await
    .unwrap_err();
    assert_eq!(
        err,
        ToolError::Io(
            "nope.txt: no such file in the workspace; use write_file to create it".into()
        )
    );
    std::fs::create_dir(ws.root().join("d")).unwrap();
    let m = invalid(
        &ws,
        "edit_file",
        json!({"path": "d", "old_string": "a", "new_string": "b"}),
    )
    .await;
    assert_eq!(m, "d is a directory, not a file");
}

#[tokio::test]
async fn edit_refuses_paths_outside() {
    let (_d, ws) = setup();
    symlink("/etc", ws.root().join("etc")).unwrap();
    for path in ["../x", "a/../../x", "/etc/passwd", "etc/passwd"] {
        let err = call(
            &ws,
            "edit_file",
            json!({"path": path, "old_string": "root", "new_string": "toor"}),
        )
        .await
        .unwrap_err();
        assert!(outside(err.clone()), "{path}: {err:?}");
    }
}

#[tokio::test]
async fn edit_keeps_permissions_and_owner() {
    let (_d, ws) = setup();
    write(&ws, "run.sh", "#!/bin/sh\necho hi\n");
    let path = ws.root().join("run.sh");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o751)).unwrap();
    let root = nix::unistd::geteuid().is_root();
    if root {
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    }
    ok(
        &ws,
        "edit_file",
        json!({"path": "run.sh", "old_string": "hi", "new_string": "bye"}),
    )
    .await;
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o751);
    if root {
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
    }
    assert_eq!(read(&ws, "run.sh"), "#!/bin/sh\necho bye\n");
    // No temporary file is left behind.
    let names: Vec<String> = std::fs::read_dir(ws.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["run.sh".to_string()]);
}

#[tokio::test]
async fn edit_through_a_symlink_inside_edits_the_target() {
    let (_d, ws) = setup();
    write(&ws, "real/f.txt", "old\n");
    // Links inside the workspace are relative (absolute ones are refused).
    symlink("real", ws.root().join("link")).unwrap();
    let out = ok(
        &ws,
        "edit_file",
        json!({"path": "link/f.txt", "old_string": "old", "new_string": "new"}),
    )
    .await;
    assert_eq!(
        out,
        "--- a/link/f.txt\n+++ b/link/f.txt\n@@ -1 +1 @@\n-old\n+new\nreplaced 1 occurrence"
    );
    assert_eq!(read(&ws, "real/f.txt"), "new\n");
    assert!(
        std::fs::symlink_metadata(ws.root().join("link"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

// ----------------------------------------------------------------- list_dir

fn tree(ws: &Workspace) {
    write(ws, "a.txt", "hello");
    write(ws, "src/lib.rs", "fn main() {}\n");
    write(ws, "src/nested/deep/x.rs", "");
    write(ws, ".hidden", "h");
    write(ws, ".gitignore", "target/\n*.log\n");
    write(ws, "target/debug/app", "bin");
    write(ws, "build.log", "log");
    write(ws, "src/nested/trace.log", "log");
}

#[tokio::test]
async fn list_dir_depth_one() {
    let (_d, ws) = setup();
    tree(&ws);
    assert_eq!(
        ok(&ws, "list_dir", json!({})).await,
        "a.txt (5 bytes)\nsrc/"
    );
    assert_eq!(
        ok(&ws, "list_dir", json!({"path": "src"})).await,
        "src/lib.rs (13 bytes)\nsrc/nested/"
    );
}

#[tokio::test]
async fn list_dir_nested_depth() {
    let (_d, ws) = setup();
    tree(&ws);
    assert_eq!(
        ok(&ws, "list_dir", json!({"path": ".", "depth": 3})).await,
        "a.txt (5 bytes)\nsrc/\nsrc/lib.rs (13 bytes)\nsrc/nested/\nsrc/nested/deep/"
    );
    assert_eq!(
        ok(&ws, "list_dir", json!({"depth": 5})).await,
        "a.txt (5 bytes)\nsrc/\nsrc/lib.rs (13 bytes)\nsrc/nested/\nsrc/nested/deep/\nsrc/nested/deep/x.rs (0 bytes)"
    );
    // The .gitignore of the workspace root applies below it too.
    assert_eq!(
        ok(&ws, "list_dir", json!({"path": "src/nested"})).await,
        "src/nested/deep/"
    );
    for depth in [0, 6] {
        let m = invalid(&ws, "list_dir", json!({"depth": depth})).await;
        assert_eq!(m, format!("depth must be between 1 and 5, got {depth}"));
    }
}

#[tokio::test]
async fn list_dir_hidden_and_symlinks() {
    let (_d, ws) = setup();
    tree(&ws);
    std::fs::create_dir(ws.root().join(".git")).unwrap();
    write(&ws, ".git/HEAD", "ref: refs/heads/main\n");
    symlink("/etc", ws.root().join("etc")).unwrap();
    symlink("a.txt", ws.root().join("alias")).unwrap();
    assert_eq!(
        ok(&ws, "list_dir", json!({"show_hidden": true, "depth": 2})).await,
        ".git/\n.gitignore (14 bytes)\n.hidden (1 byte)\na.txt (5 bytes)\nalias -> a.txt\netc -> /etc\nsrc/\nsrc/lib.rs (13 bytes)\nsrc/nested/"
    );
}

#[tokio::test]
async fn list_dir_errors_and_empty() {
    let (_d, ws) = setup();
    tree(&ws);
    let m = invalid(&ws, "list_dir", json!({"path": "a.txt"})).await;
    assert_eq!(m, "a.txt is not a directory; use read_file to read a file");
    let err = call(&ws, "list_dir", json!({"path": "missing"}))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ToolError::Io("missing: no such file or directory in the workspace".into())
    );
    symlink("/etc", ws.root().join("etc")).unwrap();
    for path in ["..", "/", "etc", "../s2"] {
        let err = call(&ws, "list_dir", json!({"path": path}))
            .await
            .unwrap_err();
        assert!(outside(err.clone()), "{path}: {err:?}");
    }
    std::fs::create_dir(ws.root().join("empty")).unwrap();
    assert_eq!(
        ok(&ws, "list_dir", json!({"path": "empty"})).await,
        "empty is empty"
    );
}

#[tokio::test]
async fn list_dir_caps_at_1000_entries() {
    let (_d, ws) = setup();
    for i in 0..1005 {
        write(&ws, &format!("many/f{i:04}"), "");
    }
    let out = ok(&ws, "list_dir", json!({"path": "many"})).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1001);
    assert_eq!(lines[0], "many/f0000 (0 bytes)");
    assert_eq!(lines[999], "many/f0999 (0 bytes)");
    assert_eq!(lines[1000], "… 5 more");
}

// --------------------------------------------------------------------- glob

#[tokio::test]
async fn glob_patterns() {
    let (_d, ws) = setup();
    tree(&ws);
    write(&ws, "Cargo.toml", "");
    write(&ws, "src/Sub.toml", "");
    write(&ws, "target/gen.rs", "");
    write(&ws, ".github/ci.rs", "");
    assert_eq!(
        ok(&ws, "glob", json!({"pattern": "**/*.rs"})).await,
        "src/lib.rs\nsrc/nested/deep/x.rs"
    );
    assert_eq!(
        ok(&ws, "glob", json!({"pattern": "*.toml"})).await,
        "Cargo.toml"
    );
    assert_eq!(
        ok(&ws, "glob", json!({"pattern": "src/*.toml"})).await,
        "src/Sub.toml"
    );
    assert_eq!(
        ok(
            &ws,
            "glob",
            json!({"pattern": "**/*.{rs,toml}", "path": "src"})
        )
        .await,
        "src/Sub.toml\nsrc/lib.rs\nsrc/nested/deep/x.rs"
    );
    assert_eq!(
        ok(&ws, "glob", json!({"pattern": "*.rs", "path": "src"})).await,
        "src/lib.rs"
    );
    // Gitignored files are never found; hidden ones when the pattern names them.
    assert_eq!(
        ok(&ws, "glob", json!({"pattern": "**/*.log"})).await,
        "no files match \"**/*.log\" in ."
    );
    assert_eq!(
        ok(&ws, "glob", json!({"pattern": ".*"})).await,
        ".gitignore\n.hidden"
    );
    assert_eq!(
        ok(&ws, "glob", json!({"pattern": "**/.github/*.rs"})).await,
        ".github/ci.rs"
    );
    // Nothing inside .git is ever found.
    write(&ws, ".git/HEAD", "ref: refs/heads/main\n");
    assert_eq!(
        ok(&ws, "glob", json!({"pattern": ".git/*"})).await,
        "no files match \".git/*\" in ."
    );
}

#[tokio::test]
async fn glob_errors() {
    let (_d, ws) = setup();
    tree(&ws);
    let m = invalid(&ws, "glob", json!({"pattern": "src/[a"})).await;
    assert!(m.starts_with("invalid glob pattern \"src/[a\": "), "{m}");
    let m = invalid(&ws, "glob", json!({"pattern": ""})).await;
    assert_eq!(m, "pattern must not be empty");
    let m = invalid(&ws, "glob", json!({"pattern": "/etc/*"})).await;
    assert_eq!(
        m,
        "pattern \"/etc/*\" must be relative to path, not absolute"
    );
    let m = invalid(&ws, "glob", json!({"pattern": "*", "path": "a.txt"})).await;
    assert_eq!(m, "a.txt is not a directory");
    let err = call(&ws, "glob", json!({"pattern": "*", "path": "../"}))
        .await
        .unwrap_err();
    assert!(outside(err));
}

#[tokio::test]
async fn glob_does_not_follow_symlinks_out() {
    let (_d, ws) = setup();
    symlink("/etc", ws.root().join("etc")).unwrap();
    write(&ws, "a.conf", "");
    assert_eq!(
        ok(&ws, "glob", json!({"pattern": "**/*.conf"})).await,
        "a.conf"
    );
}

#[tokio::test]
async fn glob_caps_at_1000() {
    let (_d, ws) = setup();
    for i in 0..1002 {
        write(&ws, &format!("d/f{i:04}.txt"), "");
    }
    let out = ok(&ws, "glob", json!({"pattern": "**/*.txt"})).await;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1001);
    assert_eq!(lines[999], "d/f0999.txt");
    assert_eq!(lines[1000], "… 2 more");
}

// --------------------------------------------------------------------- grep

fn code(ws: &Workspace) {
    write(
        ws,
        "src/a.rs",
        "fn alpha() {}\nfn beta() {}\n// TODO: Alpha\n",
    );
    write(ws, "src/b.py", "def alpha():\n    pass\n");
    write(ws, "README.md", "Alpha and omega\n");
    write(ws, "data.bin", b"alpha\0binary");
    write(ws, ".gitignore", "ignored/\n");
    write(ws, "ignored/c.rs", "fn alpha() {}\n");
    write(ws, ".env", "alpha=1\n");
}

#[tokio::test]
async fn grep_regex_sorted() {
    let (_d, ws) = setup();
    code(&ws);
    assert_eq!(
        ok(&ws, "grep", json!({"pattern": "alpha"})).await,
        "src/a.rs:1:fn alpha() {}\nsrc/b.py:1:def alpha():"
    );
    assert_eq!(
        ok(&ws, "grep", json!({"pattern": r"^fn \w+\(\)"})).await,
        "src/a.rs:1:fn alpha() {}\nsrc/a.rs:2:fn beta() {}"
    );
    assert_eq!(
        ok(&ws, "grep", json!({"pattern": "zeta"})).await,
        "no matches"
    );
}

#[tokio::test]
async fn grep_case_insensitive_and_include() {
    let (_d, ws) = setup();
    code(&ws);
    assert_eq!(
        ok(
            &ws,
            "grep",
            json!({"pattern": "alpha", "case_insensitive": true})
        )
        .await,
        "README.md:1:Alpha and omega\nsrc/a.rs:1:fn alpha() {}\nsrc/a.rs:3:// TODO: Alpha\nsrc/b.py:1:def alpha():"
    );
    assert_eq!(
        ok(
            &ws,
            "grep",
            json!({"pattern": "alpha", "case_insensitive": true, "include": "*.rs"})
        )
        .await,
        "src/a.rs:1:fn alpha() {}\nsrc/a.rs:3:// TODO: Alpha"
    );
    assert_eq!(
        ok(
            &ws,
            "grep",
            json!({"pattern": "(?i)alpha", "include": "src/*.py"})
        )
        .await,
        "src/b.py:1:def alpha():"
    );
    let m = invalid(&ws, "grep", json!({"pattern": "a", "include": "[x"})).await;
    assert!(m.starts_with("invalid include glob \"[x\": "), "{m}");
}

#[tokio::test]
async fn grep_paths() {
    let (_d, ws) = setup();
    code(&ws);
    assert_eq!(
        ok(&ws, "grep", json!({"pattern": "alpha", "path": "src"})).await,
        "src/a.rs:1:fn alpha() {}\nsrc/b.py:1:def alpha():"
    );
    assert_eq!(
        ok(&ws, "grep", json!({"pattern": "a", "path": "src/b.py"})).await,
        "src/b.py:1:def alpha():\nsrc/b.py:2:    pass"
    );
    // Named explicitly, an ignored directory is searched.
    assert_eq!(
        ok(&ws, "grep", json!({"pattern": "alpha", "path": "ignored"})).await,
        "ignored/c.rs:1:fn alpha() {}"
    );
    // And so is a hidden file.
    assert_eq!(
        ok(&ws, "grep", json!({"pattern": "alpha", "path": ".env"})).await,
        ".env:1:alpha=1"
    );
    symlink("/etc", ws.root().join("etc")).unwrap();
    for path in ["etc", "/etc", "../s1"] {
        let err = call(&ws, "grep", json!({"pattern": "root", "path": path}))
            .await
            .unwrap_err();
        assert!(outside(err.clone()), "{path}: {err:?}");
    }
    // The symlink is not followed by the walk either.
    assert_eq!(
        ok(&ws, "grep", json!({"pattern": "^root:"})).await,
        "no matches"
    );
    let err = call(&ws, "grep", json!({"pattern": "a", "path": "nope"}))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ToolError::Io("nope: no such file or directory in the workspace".into())
    );
}

#[tokio::test]
async fn grep_ancestor_gitignore_applies_in_subdirectories() {
    let (_d, ws) = setup();
    write(&ws, ".gitignore", "*.gen.rs\n");
    write(&ws, "src/main.rs", "needle\n");
    write(&ws, "src/x.gen.rs", "needle\n");
    assert_eq!(
        ok(&ws, "grep", json!({"pattern": "needle", "path": "src"})).await,
        "src/main.rs:1:needle"
    );
    assert_eq!(
        ok(&ws, "grep", json!({"pattern": "needle"})).await,
        "src/main.rs:1:needle"
    );
}

#[tokio::test]
async fn grep_invalid_regex_and_limits() {
    let (_d, ws) = setup();
    code(&ws);
    let m = invalid(&ws, "grep", json!({"pattern": "fn ("})).await;
    assert!(m.starts_with("invalid regex \"fn (\": "), "{m}");
    assert!(m.contains("unclosed group"), "{m}");
    let m = invalid(&ws, "grep", json!({"pattern": ""})).await;
    assert_eq!(m, "pattern must not be empty");
    for n in [0, 2001] {
        let m = invalid(&ws, "grep", json!({"pattern": "a", "max_results": n})).await;
        assert_eq!(
            m,
            format!("max_results must be between 1 and 2000, got {n}")
        );
    }
    let m = invalid(&ws, "grep", json!({"pattern": r"\w{1000}{1000}"})).await;
    assert!(m.starts_with("invalid regex "), "{m}");
}

#[tokio::test]
async fn grep_max_results_cap() {
    let (_d, ws) = setup();
    let body: String = (1..=10).map(|i| format!("hit {i}\n")).collect();
    write(&ws, "a.txt", &body);
    write(&ws, "b.txt", "hit b\n");
    assert_eq!(
        ok(&ws, "grep", json!({"pattern": "hit", "max_results": 3})).await,
        "a.txt:1:hit 1\na.txt:2:hit 2\na.txt:3:hit 3\n… 8 more matches (raise max_results or narrow the search)"
    );
    assert_eq!(
        ok(&ws, "grep", json!({"pattern": "hit", "max_results": 10})).await,
        format!(
            "{}\n… 1 more match (raise max_results or narrow the search)",
            (1..=10)
                .map(|i| format!("a.txt:{i}:hit {i}"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    );
    let out = ok(&ws, "grep", json!({"pattern": "hit"})).await;
    assert_eq!(out.lines().count(), 11);
    assert_eq!(out.lines().last(), Some("b.txt:1:hit b"));
}

#[tokio::test]
async fn grep_clips_long_lines_and_skips_binary() {
    let (_d, ws) = setup();
    let long = format!("{}needle{}", "é".repeat(298), "x".repeat(100));
    write(&ws, "long.txt", format!("{long}\r\nneedle\r\n"));
    write(&ws, "bin.dat", b"needle\0");
    let mut late_nul = b"needle\n".to_vec();
    late_nul.extend(std::iter::repeat_n(b'a', 9000));
    late_nul.push(0);
    write(&ws, "late.dat", &late_nul);
    // Over 10 MiB: skipped.
    let mut big = b"needle\n".to_vec();
    big.resize(10 * 1024 * 1024 + 1, b'\n');
    write(&ws, "big.txt", &big);
    let out = ok(&ws, "grep", json!({"pattern": "needle"})).await;
    assert_eq!(
        out,
        format!(
            "late.dat:1:needle\nlong.txt:1:{}ne…\nlong.txt:2:needle",
            "é".repeat(298)
        )
    );
}

// ------------------------------------------------------------------ previews

async fn preview(ws: &Workspace, tool: &str, args: Value) -> Result<files::Preview, ToolError> {
    files::preview(
        tool,
        &args.to_string(),
        ws,
        &limits(),
        &Sandbox::unconfined(),
    )
    .await
    .expect("a tool with a preview")
}

#[tokio::test]
async fn a_preview_shows_the_change_as_a_diff_and_writes_nothing() {
    let (_dir, ws) = setup();
    write(&ws, "a.txt", "one\ntwo\nthree\n");
    let edit = preview(
        &ws,
        "edit_file",
        json!({"path": "a.txt", "old_string": "two", "new_string": "2"}),
    )
    .await
    .unwrap();
    assert_eq!(
        edit,
        files::Preview {
            path: "a.txt".into(),
            diff: "--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n".into(),
            creates: false,
        }
    );
    let whole = preview(
        &ws,
        "write_file",
        json!({"path": "a.txt", "content": "one\n"}),
    )
    .await
    .unwrap();
    assert!(whole.diff.contains("-two\n-three\n"), "{}", whole.diff);
    let new = preview(
        &ws,
        "write_file",
        json!({"path": "sub/new.txt", "content": "hello\n"}),
    )
    .await
    .unwrap();
    assert!(new.creates);
    assert!(new.diff.contains("+hello"), "{}", new.diff);
    // Nothing was written.
    assert_eq!(read(&ws, "a.txt"), "one\ntwo\nthree\n");
    assert!(!ws.root().join("sub").exists());
}

#[tokio::test]
async fn a_preview_fails_as_the_call_would() {
    let (_dir, ws) = setup();
    write(&ws, "a.txt", "one\n");
    let outside = preview(
        &ws,
        "write_file",
        json!({"path": "../escape.txt", "content": "x"}),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(outside, ToolError::PathOutsideWorkspace { .. }),
        "{outside:?}"
    );
    let missing = preview(
        &ws,
        "edit_file",
        json!({"path": "a.txt", "old_string": "zzz", "new_string": "y"}),
    )
    .await
    .unwrap_err();
    assert!(
        missing.to_string().contains("old_string was not found"),
        "{missing}"
    );
    let bad = preview(&ws, "edit_file", json!({"path": 3}))
        .await
        .unwrap_err();
    assert!(matches!(bad, ToolError::InvalidArguments(_)), "{bad:?}");
    assert!(
        files::preview("bash", "{}", &ws, &limits(), &Sandbox::unconfined())
            .await
            .is_none()
    );
}
