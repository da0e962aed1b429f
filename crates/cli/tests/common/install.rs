//! One isolated Agentry install (its own config, data dir and ports) and
//! `agentry up` running in it, for tests of the real binary.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use super::BIN;

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The environment of one isolated Agentry install.
pub struct Install {
    pub dir: tempfile::TempDir,
    pub env: Vec<(String, String)>,
}

impl Install {
    pub fn new(model_url: &str) -> Install {
        let dir = tempfile::tempdir().unwrap();
        // An empty config directory: built-in defaults plus the environment.
        std::fs::create_dir(dir.path().join("config")).unwrap();
        let mut env = vec![
            (
                "AGENTRY_CONFIG_DIR".to_string(),
                dir.path().join("config").display().to_string(),
            ),
            (
                "AGENTRY_DATA_DIR".to_string(),
                dir.path().join("data").display().to_string(),
            ),
            ("AGENTRY_LLM_BASE_URL".to_string(), model_url.to_string()),
            ("AGENTRY_LLM_MODEL".to_string(), "fake-model".to_string()),
            (
                "AGENTRY_LLM_API_KEY".to_string(),
                "sk-test-secret-123".to_string(),
            ),
        ];
        for (name, var) in [
            ("orchestrator", "ORCHESTRATOR"),
            ("session-store", "SESSION_STORE"),
            ("tool-runner", "TOOL_RUNNER"),
            ("scheduler", "SCHEDULER"),
            ("gateway", "GATEWAY"),
        ] {
            let _ = name;
            let port = free_port();
            env.push((format!("AGENTRY_{var}_LISTEN"), format!("127.0.0.1:{port}")));
            env.push((
                format!("AGENTRY_{var}_URL"),
                format!("http://127.0.0.1:{port}"),
            ));
        }
        Install { dir, env }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .current_dir(self.dir.path())
            .env_remove("RUST_LOG");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Shell lines that export the install's environment (for scripts run
    /// in a terminal).
    pub fn shell_exports(&self) -> String {
        self.env
            .iter()
            .map(|(k, v)| format!("export {k}='{v}'\n"))
            .collect()
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).stdin(Stdio::null()).output().unwrap()
    }

    /// The id of the most recent session (`agentry sessions list`).
    pub fn latest_session(&self) -> String {
        let list = String::from_utf8_lossy(&self.run(&["sessions", "list"]).stdout).into_owned();
        list.lines()
            .nth(1)
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("no session listed: {list}"))
            .to_string()
    }

    /// A session's log as `sessions show --json` gives it, one object per
    /// event.
    pub fn events(&self, session: &str) -> Vec<serde_json::Value> {
        let out = self.run(&["sessions", "show", "--json", session]);
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The value of one of the install's variables.
    pub fn env_value(&self, name: &str) -> String {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    }

    pub fn orchestrator_url(&self) -> String {
        self.env
            .iter()
            .find(|(k, _)| k == "AGENTRY_ORCHESTRATOR_URL")
            .unwrap()
            .1
            .clone()
    }
}

/// `agentry up`, stopped with SIGTERM when dropped.
pub struct Up(Child);

impl Up {
    /// Starts `agentry up`; `None` when it exited at once (for example
    /// because another test took one of its ports in the meantime).
    pub fn try_start(install: &Install, log: &Path) -> Option<Up> {
        let log_file = std::fs::File::create(log).unwrap();
        let child = install
            .command(&["up"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap();
        let mut up = Up(child);
        // Ready when `agentry sessions list` gets an answer.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = up.0.try_wait().unwrap() {
                let logs = std::fs::read_to_string(log).unwrap_or_default();
                assert!(
                    logs.contains("already in use"),
                    "agentry up exited with {status}: {logs}"
                );
                return None;
            }
            let out = install.run(&["sessions", "list"]);
            if out.status.success() {
                return Some(up);
            }
            assert!(
                Instant::now() < deadline,
                "agentry up did not come up: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A fresh install with `agentry up` running against `model_url`.
    pub fn start(model_url: &str) -> (Install, Up, std::path::PathBuf) {
        Up::start_configured(model_url, "")
    }

    /// The same, with `local_toml` as the install's `config/local.toml`.
    pub fn start_configured(
        model_url: &str,
        local_toml: &str,
    ) -> (Install, Up, std::path::PathBuf) {
        for _ in 0..3 {
            let install = Install::new(model_url);
            std::fs::write(install.dir.path().join("config/local.toml"), local_toml).unwrap();
            let log = install.dir.path().join("up.log");
            if let Some(up) = Up::try_start(&install, &log) {
                return (install, up, log);
            }
        }
        panic!("agentry up could not bind its ports three times in a row");
    }

    /// A fresh install with `agentry up` running whose sessions may work
    /// in project directories under the returned root (made first, open to
    /// the sandbox's users), with `more` added to its configuration.
    pub fn start_with_projects(
        model_url: &str,
        more: &str,
    ) -> (Install, Up, std::path::PathBuf, std::path::PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        for _ in 0..3 {
            let install = Install::new(model_url);
            let root = install.dir.path().join("projects");
            std::fs::create_dir_all(&root).unwrap();
            for dir in [install.dir.path(), root.as_path()] {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            std::fs::write(
                install.dir.path().join("config/local.toml"),
                format!(
                    "{more}\n[tool_runner]\nproject_roots = [{:?}]\n",
                    root.display().to_string()
                ),
            )
            .unwrap();
            let log = install.dir.path().join("up.log");
            if let Some(up) = Up::try_start(&install, &log) {
                return (install, up, root, log);
            }
        }
        panic!("agentry up could not bind its ports three times in a row");
    }

    pub fn stop(mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "agentry up did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A project directory `name` under `root` holding a README; as root, it
/// is given to an owner who is not root (a root-owned project is refused
/// with per-session users).
pub fn project_dir(root: &Path, name: &str) -> std::path::PathBuf {
    let project = root.join(name);
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("README"), "a project\n").unwrap();
    if nix::unistd::geteuid().is_root() {
        let out = Command::new("chown")
            .args(["-R", "4242:4242", &project.display().to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{:?}", text(&out));
    }
    project
}

/// Runs `script ARGS` with the virtualenv's Python in the install's
/// environment (a client written with an official SDK starting `agentry`
/// as an editor or an MCP host would); fails the test with its output
/// unless it succeeds; its last line, as JSON.
pub fn run_client(
    install: &Install,
    venv: &Path,
    script: &str,
    args: &[&str],
) -> serde_json::Value {
    let out = Command::new(venv.join("bin/python"))
        .arg(script)
        .args(args)
        .envs(install.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env_remove("RUST_LOG")
        .current_dir(install.dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

/// stdout and stderr as text.
pub fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the binary with `args`, `input` on its standard input.
pub async fn run_with_input(
    install: &Install,
    args: &[&str],
    input: &'static [u8],
    extra_env: &[(&str, &str)],
) -> Output {
    let mut cmd = install.command(args);
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}
