//! A real terminal for the process-level tests: tmux runs a script in an
//! 80×24 window, keys are typed with `send-keys` and the screen (as a
//! terminal shows it) is read with `capture-pane`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether tmux can run here; in CI its absence fails the test.
pub fn tmux_present() -> bool {
    let found = Command::new("tmux")
        .arg("-V")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "tmux is needed for the terminal tests and CI=true: install it (apt-get install tmux)"
        );
        eprintln!("SKIPPED: tmux is not installed; the full-screen chat was not driven");
    }
    found
}

/// One tmux server with one 80×24 window running a command.
pub struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    pub fn start(dir: &Path, script: &str) -> Tmux {
        let socket = dir.join("tmux.sock");
        let path = dir.join("chat.sh");
        std::fs::write(&path, script).unwrap();
        let status = Command::new("tmux")
            .arg("-S")
            .arg(&socket)
            .args([
                "-f",
                "/dev/null",
                "new-session",
                "-d",
                "-x",
                "80",
                "-y",
                "24",
                "-s",
                "t",
            ])
            .arg(format!("bash {}", path.display()))
            .env_remove("TMUX")
            .env("TERM", "xterm-256color")
            .status()
            .unwrap();
        assert!(status.success(), "tmux did not start");
        Tmux { socket }
    }

    pub fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `keys` (tmux key names, or literal text with `-l`).
    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "t"];
        args.extend_from_slice(keys);
        self.tmux(&args);
    }

    pub fn type_text(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "t", "-l", text]);
    }

    pub fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", "t"])
    }

    /// Everything the window showed, its scrolled-off history included,
    /// with lines the terminal wrapped joined again.
    pub fn history(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-J", "-S", "-", "-t", "t"])
    }

    /// Waits until the screen satisfies `ok`, returning it.
    pub fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let screen = self.screen();
            if ok(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        self.tmux(&["kill-server"]);
    }
}
