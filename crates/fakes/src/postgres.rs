//! A real PostgreSQL server for tests: Debian's `postgresql` package,
//! initialised in a temporary directory and run as an unprivileged user
//! (`nobody` when the tests run as root) on a loopback port; stopped and
//! removed when dropped.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A running server.
pub struct Postgres {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
    /// The identity the server runs as, when the tests run as root.
    ids: Option<(u32, u32)>,
    running: bool,
}

/// The directory of PostgreSQL's programs (the newest installed), or
/// `None` with a message; under `CI=true` its absence panics, so a missing
/// install fails the run.
pub fn binaries() -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| {
            dirs.filter_map(Result::ok)
                .map(|d| d.path().join("bin"))
                .filter(|bin| bin.join("initdb").is_file() && bin.join("pg_ctl").is_file())
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    if let Some(bin) = found.pop() {
        return Some(bin);
    }
    let why = "no PostgreSQL server installed (apt-get install postgresql)";
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("skipping: {why}");
    None
}

/// The password of the test servers' one user.
pub const PASSWORD: &str = "agentry-test-password";

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}

/// `nobody`'s uid and gid.
fn nobody() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.first() != Some(&"nobody") || f.len() < 4 {
                return None;
            }
            Some((f[2].parse().ok()?, f[3].parse().ok()?))
        })
        .unwrap_or((65534, 65534))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(55432)
}

impl Postgres {
    /// Initialises and starts a server, or `None` when PostgreSQL is not
    /// installed (see [`binaries`]).
    pub fn start() -> Option<Postgres> {
        let bin = binaries()?;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary directory: {e}"));
        let ids = is_root().then(nobody);
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown: {e}"));
        }
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .unwrap_or_else(|e| panic!("chmod: {e}"));
        let mut server = Postgres {
            dir,
            bin,
            port: free_port(),
            ids,
            running: false,
        };
        let data = server.data();
        // Password authentication, over TCP and the socket alike: with
        // `trust`, any process of the machine that reaches the socket or
        // the port is the database's owner (and `COPY … TO PROGRAM` runs
        // commands as the server's user).
        let pwfile = server.dir.path().join("pwfile");
        std::fs::write(&pwfile, format!("{PASSWORD}\n"))
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", pwfile.display()));
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown: {e}"));
        }
        server.run(
            "initdb",
            &[
                "-D",
                &data.display().to_string(),
                "-U",
                "agentry",
                "--auth=scram-sha-256",
                &format!("--pwfile={}", pwfile.display()),
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
        );
        let _ = std::fs::remove_file(&pwfile);
        server.start_again();
        Some(server)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command.stdin(Stdio::null()).env("LC_ALL", "C");
        if let Some((uid, gid)) = self.ids {
            use std::os::unix::process::CommandExt;
            command.uid(uid).gid(gid).current_dir(self.dir.path());
        }
        command
    }

    fn run(&self, program: &str, args: &[&str]) {
        let out = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        assert!(
            out.status.success(),
            "{program} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the server (again, after [`Postgres::stop`]) on the same
    /// port and data.
    pub fn start_again(&mut self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("server.log");
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data().display().to_string(),
                "-l",
                &log.display().to_string(),
                "-o",
                &options,
                "-w",
                "start",
            ],
        );
        self.running = true;
    }

    /// Stops the server at once (as a crash would: no clean shutdown).
    pub fn stop(&mut self) {
        if self.running {
            let _ = self
                .command("pg_ctl")
                .args([
                    "-D",
                    &self.data().display().to_string(),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ])
                .output();
            self.running = false;
        }
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://agentry:{PASSWORD}@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates database `name` and returns its URL.
    pub fn create_database(&self, name: &str) -> String {
        self.sql("postgres", &format!("CREATE DATABASE \"{name}\""));
        self.url(name)
    }

    /// Runs `sql` in database `db` as the owner and returns its output,
    /// unaligned and without headers (`psql -tA`): one row per line,
    /// columns separated by `|`.
    pub fn sql(&self, db: &str, sql: &str) -> String {
        let psql = self.bin.join("psql");
        let out = Command::new(psql)
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "agentry",
                "-d",
                db,
                "-tA",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .env("PGPASSWORD", PASSWORD)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("psql: {e}"));
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The server's main process (the postmaster), while it runs.
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// The server's log so far, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Where its files are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop();
    }
}
