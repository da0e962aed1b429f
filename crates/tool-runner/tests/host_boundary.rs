//! Where the sandbox meets the host: the person's terminal, host sockets,
//! `/sys`, and configuration the model plants for programs it may run
//! without asking. Each case runs through the real `agentry-sandbox` helper
//! (as root with a uid per session, and again as an ordinary user by
//! `.ci/as-user`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod sandbox_support;
use sandbox_support::{bash, confined, open, workspace_root};

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

/// The system's Python, which sandboxed users can read (a pyenv build
/// under a home directory is not in the sandbox's view).
const PYTHON: &str = "/usr/bin/python3";

fn python_or_skip() -> bool {
    if Path::new(PYTHON).exists() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{PYTHON} is missing"
    );
    eprintln!("skipping: {PYTHON} is missing");
    false
}

/// What a process reports of its terminal: its session id against its
/// pid, its controlling terminal (`tty_nr`, 0 = none), and whether it can
/// open `/dev/tty` or push a character into the terminal on its standard
/// input (TIOCSTI).
const TERMINAL_PROBE: &str = r##"
import fcntl, os, termios
stat = open("/proc/self/stat").read()
fields = stat[stat.rindex(")") + 2:].split()
print("leader", int(fields[3]) == os.getpid(), "tty_nr", fields[4])
try:
    os.open("/dev/tty", os.O_RDWR)
    print("devtty opened")
except OSError as e:
    print("devtty refused", e.errno)
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"#")
    print("tiocsti worked")
except OSError as e:
    print("tiocsti refused", e.errno)
"##;

/// The helper is started the way a careless runner would: with a pseudo
/// terminal as its controlling terminal and as the command's standard
/// input. The command still has no terminal: a session of its own, no
/// `/dev/tty`, and TIOCSTI refused; nothing is typed into the terminal.
#[tokio::test(flavor = "multi_thread")]
async fn a_command_has_no_terminal_even_when_the_helper_has_one() {
    let root = workspace_root();
    let Some(sandbox) = confined(root.path()) else {
        return;
    };
    if !python_or_skip() {
        return;
    }
    let ws = open(root.path(), "s1", &sandbox);
    let script = ws.root().join("probe.py");
    std::fs::write(&script, TERMINAL_PROBE).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut spec = sandbox.spec(
        agentry_tool_runner::sandbox::Who::session("s1"),
        vec![PYTHON.into(), script.display().to_string()],
        ws.root(),
        ws.tmp(),
        None,
    );
    spec.stdin = true;
    // Started by hand here, without the runner's report pipe.
    spec.report_fd = None;
    let helper = sandbox.helper.clone().unwrap();
    // Python's pty module makes the terminal the helper's controlling
    // terminal and its standard streams, then reports what the command
    // printed and whatever was typed into the terminal's input.
    let driver = r#"
import os, pty, select, sys, termios, tty
helper, spec = sys.argv[1], sys.argv[2]
pid, master = pty.fork()
if pid == 0:
    os.execv(helper, ["agentry-sandbox", spec])
out = b""
while True:
    try:
        ready, _, _ = select.select([master], [], [], 20)
        if not ready:
            break
        chunk = os.read(master, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
os.waitpid(pid, 0)
sys.stdout.write(out.decode(errors="replace"))
"#;
    let out = std::process::Command::new(PYTHON)
        .arg("-c")
        .arg(driver)
        .arg(&helper)
        .arg(serde_json::to_string(&spec).unwrap())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    assert!(
        text.contains("leader True tty_nr 0"),
        "the command kept a terminal:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("devtty refused"), "{text}");
    assert!(text.contains("tiocsti refused"), "{text}");
    assert!(!text.contains("worked"), "{text}");
}

/// Whatever the layers, a bash call runs in a session of its own: with
/// the helper and without it (the runner starts bash itself).
#[tokio::test]
async fn every_command_leads_a_session_of_its_own() {
    let root = workspace_root();
    let Some(mut sandbox) = confined(root.path()) else {
        return;
    };
    let ws = open(root.path(), "s1", &sandbox);
    let probe = "read -r pid _ _ _ _ sid _ < /proc/self/stat; \
                 [ \"$pid\" = \"$sid\" ] && echo LEADER || echo \"pid=$pid sid=$sid\"";
    let with_helper = bash(&ws, &sandbox, probe).await;
    assert_eq!(with_helper.output, "LEADER\n");
    sandbox.helper = None;
    let without = bash(&ws, &sandbox, probe).await;
    assert_eq!(without.output, "LEADER\n");
}

/// A host socket a command's identity could open by its file mode (mode
/// 0777, like a careless service's, or owned by the same user when the
/// runner is not root) cannot be reached: with namespaces it is not in the
/// command's view at all, without them no Unix socket can be made.
#[tokio::test(flavor = "multi_thread")]
async fn host_unix_sockets_cannot_be_reached() {
    let root = workspace_root();
    let Some(sandbox) = confined(root.path()) else {
        return;
    };
    if !python_or_skip() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("agentry-host-socket-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("service.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    listener.set_nonblocking(true).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let command = format!(
        "{PYTHON} -c 'import socket\n\
         s = socket.socket(socket.AF_UNIX)\n\
         s.connect(\"{}\")\n\
         print(\"CONNECTED\")'",
        path.display()
    );
    let mut layouts = vec![("as probed", sandbox.clone())];
    if sandbox.layers.namespaces && sandbox.layers.seccomp {
        let mut without = sandbox.clone();
        without.layers.namespaces = false;
        layouts.push(("without namespaces", without));
    }
    for (name, sandbox) in layouts {
        if sandbox.layers == agentry_sandbox::Layers::default() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "no sandbox layer works"
            );
            eprintln!("skipping: no sandbox layer works here");
            return;
        }
        let ws = open(root.path(), "s1", &sandbox);
        let out = bash(&ws, &sandbox, &command).await;
        assert!(
            out.is_error && !out.output.contains("CONNECTED"),
            "{name}: a host socket was reached:\n{}",
            out.output
        );
        assert!(
            out.output.contains("FileNotFoundError")
                || out.output.contains("PermissionError")
                || out.output.contains("Operation not permitted"),
            "{name}: {}",
            out.output
        );
        assert!(
            listener.accept().is_err(),
            "{name}: the host socket got a connection"
        );
    }
}

/// PostgreSQL's Unix socket (where, before the built view, a command as
/// the database's own user reached it with peer authentication) is not
/// reachable either.
#[tokio::test(flavor = "multi_thread")]
async fn the_postgresql_socket_cannot_be_reached() {
    let root = workspace_root();
    let Some(sandbox) = confined(root.path()) else {
        return;
    };
    if !python_or_skip() {
        return;
    }
    let Some(postgres) = agentry_fakes::postgres::Postgres::start() else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "PostgreSQL is not installed"
        );
        eprintln!("skipping: PostgreSQL is not installed");
        return;
    };
    let socket = postgres.dir().join(format!(".s.PGSQL.{}", postgres.port()));
    assert!(socket.exists(), "no socket at {}", socket.display());
    let ws = open(root.path(), "s1", &sandbox);
    let out = bash(
        &ws,
        &sandbox,
        &format!(
            "{PYTHON} -c 'import socket\n\
             s = socket.socket(socket.AF_UNIX)\n\
             s.connect(\"{}\")\n\
             print(\"CONNECTED\")'",
            socket.display()
        ),
    )
    .await;
    assert!(
        out.is_error && !out.output.contains("CONNECTED"),
        "PostgreSQL's socket was reached:\n{}",
        out.output
    );
}

/// `/sys` (the host's devices, kernel knobs) and `/run` (sockets of the
/// host's services) are not in a command's view.
#[tokio::test]
async fn sys_and_run_are_hidden() {
    let root = workspace_root();
    let Some(sandbox) = confined(root.path()) else {
        return;
    };
    if !(sandbox.layers.namespaces || sandbox.layers.landlock) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "neither namespaces nor Landlock work here"
        );
        eprintln!("skipping: neither namespaces nor Landlock work here");
        return;
    }
    let ws = open(root.path(), "s1", &sandbox);
    let out = bash(
        &ws,
        &sandbox,
        "ls /sys/class /sys/devices 2>&1 | head -n 3; ls /run /var/run 2>&1 | head -n 3; \
         echo END",
    )
    .await;
    assert!(out.output.ends_with("END\n"), "{}", out.output);
    for line in out.output.lines().filter(|l| *l != "END") {
        assert!(
            line.contains("No such file") || line.contains("Permission denied"),
            "something of /sys or /run is visible:\n{}",
            out.output
        );
    }
}

/// A repository the model set up with `core.fsmonitor` (code git runs on
/// `git status`, a command the default policy lets run without asking)
/// runs nothing: git is told to ignore it. Turning that setting back off
/// shows the planted command would have run.
#[tokio::test]
async fn a_planted_git_fsmonitor_runs_nothing() {
    let root = workspace_root();
    let Some(sandbox) = confined(root.path()) else {
        return;
    };
    if !Path::new("/usr/bin/git").exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "git is missing"
        );
        eprintln!("skipping: git is missing");
        return;
    }
    let ws = open(root.path(), "s1", &sandbox);
    let marker = ws.root().join("FSMONITOR_RAN");
    let planted = bash(
        &ws,
        &sandbox,
        "git init -q r && cd r && git config core.fsmonitor \"touch $PWD/../FSMONITOR_RAN; false\" \
         && printf '[core]\\n\\tfsmonitor = touch ../FSMONITOR_RAN\\n' > ../.gitconfig && echo planted",
    )
    .await;
    assert_eq!(planted.output, "planted\n");
    let status = bash(&ws, &sandbox, "cd r && git status --short; echo done").await;
    assert!(status.output.ends_with("done\n"), "{}", status.output);
    assert!(!marker.exists(), "the planted fsmonitor ran");
    // The same repository with git's configuration from the environment
    // turned off: the planted command runs (the test plants for real).
    let control = bash(
        &ws,
        &sandbox,
        "cd r && GIT_CONFIG_COUNT=0 git status --short; true",
    )
    .await;
    assert!(
        marker.exists(),
        "the control run did not run the fsmonitor: {}",
        control.output
    );
}

/// A session whose commands allocate 4 × 1.5 GiB together (each process
/// under its own address-space limit) is stopped at the session's memory
/// cap, and the model is told why; another session's command runs on.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_s_memory_is_capped_across_its_processes() {
    let root = workspace_root();
    let Some(mut sandbox) = confined(root.path()) else {
        return;
    };
    if !python_or_skip() {
        return;
    }
    sandbox.memory = agentry_tool_runner::watchdog::MemoryWatch::new(4096);
    let greedy = open(root.path(), "s1", &sandbox);
    let calm = open(root.path(), "s2", &sandbox);
    let allocate = format!(
        "for i in 1 2 3 4; do \
           {PYTHON} -c 'import time; a = b\"x\" * (1536 << 20); time.sleep(60)' & \
         done; wait; echo ALL-DONE"
    );
    let started = std::time::Instant::now();
    let (out, other) = tokio::join!(
        bash(&greedy, &sandbox, &allocate),
        bash(&calm, &sandbox, "sleep 3; echo alive")
    );
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "the cap took {:?}",
        started.elapsed()
    );
    assert!(out.is_error, "{}", out.output);
    assert!(!out.output.contains("ALL-DONE"), "{}", out.output);
    assert!(
        out.output.contains("tool_runner.limits.session_memory_mib"),
        "{}",
        out.output
    );
    assert_eq!(other.output, "alive\n", "the other session was stopped too");
}
