//! Commands run confined by the real `agentry-sandbox` helper: limits, a
//! uid per session when the runner is root, an allowlisted environment, no
//! network, no way into another session's workspace.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sandbox_support;
use sandbox_support::{bash, confined, limits, open, run, workspace_root};

use agentry_sandbox::{Layers, Limits as Rlimits};
use agentry_tool_runner::sandbox::Sandbox;
use agentry_tool_runner::tools::{self};
use serde_json::json;
use std::time::Duration;

#[tokio::test]
async fn resource_limits_are_applied_to_commands() {
    let root = workspace_root();
    let Some(sandbox) = confined(root.path()) else {
        return;
    };
    limits_hold(root.path(), sandbox).await;
}

#[tokio::test]
async fn without_the_os_sandbox_the_same_limits_hold() {
    let root = workspace_root();
    let Some(mut sandbox) = confined(root.path()) else {
        return;
    };
    // No helper: the runner starts bash itself and sets the limits
    // between fork and exec.
    sandbox.helper = None;
    limits_hold(root.path(), sandbox).await;
}

async fn limits_hold(root: &std::path::Path, mut sandbox: Sandbox) {
    sandbox.limits = Rlimits {
        cpu_secs: 7,
        address_space_mib: 1024,
        processes: 0,
        file_size_mib: 1,
        open_files: 64,
    };
    let ws = open(root, "s1", &sandbox);
    let out = bash(&ws, &sandbox, "ulimit -t; ulimit -v; ulimit -f; ulimit -n").await;
    assert_eq!(out.output, "7\n1048576\n1024\n64\n");
    let out = bash(
        &ws,
        &sandbox,
        "head -c 3000000 /dev/zero > big.bin; echo status=$?; stat -c %s big.bin",
    )
    .await;
    assert!(
        out.output.contains("status=1") || out.output.contains("status=153"),
        "{}",
        out.output
    );
    // The shell's note on standard error may come before or after.
    assert!(
        out.output.lines().any(|l| l.trim() == "1048576"),
        "{}",
        out.output
    );
}

#[tokio::test]
async fn sessions_run_as_their_own_uid_and_cannot_reach_each_other() {
    let root = workspace_root();
    let Some(sandbox) = confined(root.path()) else {
        return;
    };
    let a = open(root.path(), "session-a", &sandbox);
    let b = open(root.path(), "session-b", &sandbox);
    std::fs::write(b.root().join("secret.txt"), "B-SECRET").unwrap();
    let out = bash(
        &a,
        &sandbox,
        "id -u; cat ../session-b/secret.txt; ls ..; echo x > ../session-b/planted",
    )
    .await;
    assert!(!out.output.contains("B-SECRET"), "{}", out.output);
    assert!(!b.root().join("planted").exists());
    if let Some(ids) = sandbox.ids_for("session-a") {
        assert!(
            out.output.starts_with(&format!("{}\n", ids.uid)),
            "{}",
            out.output
        );
        assert_ne!(sandbox.ids_for("session-a"), sandbox.ids_for("session-b"));
    }
    // Files the runner writes belong to the session: its commands can change them.
    run(
        &a,
        &sandbox,
        "write_file",
        json!({"path": "dir/note.txt", "content": "hello"}),
    )
    .await;
    let out = bash(
        &a,
        &sandbox,
        "echo more >> dir/note.txt && cat dir/note.txt",
    )
    .await;
    assert_eq!(out.output, "hellomore\n");
}

#[tokio::test]
async fn the_environment_is_only_the_allowlist() {
    let root = workspace_root();
    let Some(sandbox) = confined(root.path()) else {
        return;
    };
    let ws = open(root.path(), "s1", &sandbox);
    let out = bash(&ws, &sandbox, "env").await;
    let mut names: Vec<&str> = out
        .output
        .lines()
        .filter_map(|l| l.split_once('=').map(|(n, _)| n))
        .collect();
    names.sort_unstable();
    for name in &names {
        assert!(
            [
                "HOME", "LANG", "LC_ALL", "LC_CTYPE", "LOGNAME", "PATH", "PWD", "SHELL", "SHLVL",
                "TERM", "TMPDIR", "TZ", "USER", "_"
            ]
            .contains(name)
                || name.starts_with("GIT_CONFIG_"),
            "{name} reached the command: {}",
            out.output
        );
    }
    // HOME is a fresh directory of the call's, never the workspace.
    let home = out
        .output
        .lines()
        .find_map(|l| l.strip_prefix("HOME="))
        .unwrap();
    assert!(
        !home.starts_with(&ws.root().display().to_string()),
        "{home}"
    );
    assert!(
        std::path::Path::new(home)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(".home-"),
        "{home}"
    );
    assert!(out.output.contains("GIT_CONFIG_GLOBAL=/dev/null"));
    assert!(
        out.output
            .contains(&format!("TMPDIR={}", ws.tmp().display()))
    );
}

#[tokio::test]
async fn commands_have_no_network_and_no_way_to_the_services() {
    let root = workspace_root();
    let Some(sandbox) = confined(root.path()) else {
        return;
    };
    if sandbox.layers == Layers::default() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no sandbox layer works"
        );
        eprintln!("skipping: no sandbox layer works here");
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let ws = open(root.path(), "s1", &sandbox);
    let out = bash(
        &ws,
        &sandbox,
        &format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED"),
    )
    .await;
    assert!(out.is_error, "{}", out.output);
    assert!(!out.output.contains("CONNECTED"), "{}", out.output);
    assert!(
        listener.accept().is_err(),
        "a connection reached the listener"
    );
}

#[tokio::test]
async fn a_setsid_escape_is_killed_when_the_call_ends() {
    let root = workspace_root();
    let Some(sandbox) = confined(root.path()) else {
        return;
    };
    let ws = open(root.path(), "s1", &sandbox);
    let out = bash(
        &ws,
        &sandbox,
        "setsid bash -c 'sleep 3931 & disown' </dev/null >/dev/null 2>&1; (sleep 3932 &) ; echo started",
    )
    .await;
    assert_eq!(out.output, "started\n");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let survivors = sandbox_support::processes_with("sleep 393");
    assert!(survivors.is_empty(), "{survivors:?}");
}

/// Without the namespaces layer, a call granted network reaches the
/// runner's proxy on a loopback port that Landlock (TCP rules, ABI 4+)
/// holds it to: the page comes through the proxy, a connection around it
/// is refused by the kernel, and a call without the grant cannot even
/// reach the proxy.
#[tokio::test(flavor = "multi_thread")]
async fn without_namespaces_a_granted_call_reaches_only_the_proxy_port() {
    use std::io::{Read, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    let root = workspace_root();
    let Some(mut sandbox) = confined(root.path()) else {
        return;
    };
    let abi = sandbox
        .report
        .as_ref()
        .and_then(|r| r.landlock.as_ref().ok().copied())
        .unwrap_or(0);
    if !sandbox.layers.landlock || abi < 4 {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "Landlock with TCP rules (ABI 4+) is missing; ABI {abi}"
        );
        eprintln!("skipping: Landlock with TCP rules (ABI 4+) is missing here");
        return;
    }
    sandbox.layers.namespaces = false;
    sandbox.network_allow_hosts = vec!["127.0.0.1".into()];
    assert_eq!(
        sandbox.network_route(),
        Ok(agentry_tool_runner::sandbox::NetworkRoute::HostPort)
    );
    std::fs::create_dir_all(root.path().join(".tmp")).unwrap();
    let egress = agentry_tool_runner::start_egress(&sandbox, root.path()).await;
    egress.available().unwrap();

    // A page on the host's loopback, counting the connections it gets.
    let page = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = page.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    std::thread::spawn(move || {
        for stream in page.incoming() {
            let Ok(mut stream) = stream else { continue };
            counted.fetch_add(1, Ordering::SeqCst);
            let mut head = Vec::new();
            let mut buffer = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buffer[..n]),
                }
            }
            let _ = stream.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nthe-page",
            );
        }
    });

    let ws = open(root.path(), "s1", &sandbox);
    let curl = |args: String| json!({ "command": format!("curl -sS --max-time 10 -w ' status=%{{http_code}}' {args}") });
    let registry = tools::registry(&limits(), &sandbox, None, None);
    let pass = egress.grant(false).unwrap();
    let agentry_sandbox::ProxyRoute::Host { port: proxy_port } = pass.route else {
        panic!("not the host route: {:?}", pass.route);
    };
    let call = tools::Call {
        network: Some(pass),
        ..tools::Call::in_workspace(&ws)
    };
    let through = tools::run(
        &registry,
        "bash",
        &curl(format!("http://127.0.0.1:{port}/")).to_string(),
        &call,
    )
    .await
    .unwrap();
    let pass = call.network.expect("the pass");
    assert!(
        through.output.contains("the-page") && through.output.contains("status=200"),
        "{}",
        through.output
    );
    assert!(
        pass.note()
            .is_some_and(|n| n.contains(&format!("reached 127.0.0.1:{port}"))),
        "{:?}",
        pass.note()
    );
    assert_eq!(connections.load(Ordering::SeqCst), 1);

    // Around the proxy, with the grant: the kernel refuses the connection.
    let call = tools::Call {
        network: Some(pass),
        ..tools::Call::in_workspace(&ws)
    };
    let around = tools::run(
        &registry,
        "bash",
        &curl(format!("--noproxy '*' http://127.0.0.1:{port}/")).to_string(),
        &call,
    )
    .await
    .unwrap();
    assert!(around.output.contains("status=000"), "{}", around.output);

    // Without the grant: not even the proxy's port.
    let without = run(
        &ws,
        &sandbox,
        "bash",
        curl(format!(
            "--proxy http://127.0.0.1:{proxy_port} http://127.0.0.1:{port}/"
        )),
    )
    .await;
    assert!(
        without.output.contains("status=000") && !without.output.contains("status=407"),
        "{}",
        without.output
    );
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "the page was reached"
    );
}

#[tokio::test]
async fn only_the_helper_can_report_a_sandbox_failure() {
    let root = workspace_root();
    let Some(sandbox) = confined(root.path()) else {
        return;
    };
    let ws = open(root.path(), "reports", &sandbox);
    // A command that imitates the helper's old message and exit code is
    // just a command that failed.
    let out = bash(
        &ws,
        &sandbox,
        "echo 'agentry-sandbox: the sandbox is broken' >&2; exit 125",
    )
    .await;
    assert_eq!(out.exit_code, Some(125), "{}", out.output);
    assert!(
        out.output.contains("the sandbox is broken"),
        "{}",
        out.output
    );
    // A real set-up failure (a limit no kernel allows) is told as one.
    let mut sandbox = sandbox;
    sandbox.limits.open_files = 1 << 40;
    let err = sandbox_support::attempt(&ws, &sandbox, "bash", &json!({"command": "true"}))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("the sandbox could not start the command"),
        "{err}"
    );
}
