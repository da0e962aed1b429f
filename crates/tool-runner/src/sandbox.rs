//! How commands are confined beyond the workspace: a scrubbed environment,
//! resource limits (setrlimit, through the shell's `ulimit`) and, when the
//! runner runs as root, an unprivileged user.

use agentry_runtime::config::ToolRunnerConfig;
use std::path::Path;

/// An unprivileged user commands run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// The user's name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
}

/// Resource limits of one command; 0 = unlimited.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rlimits {
    /// CPU seconds (RLIMIT_CPU).
    pub cpu_secs: u64,
    /// Address space in MiB (RLIMIT_AS).
    pub address_space_mib: u64,
    /// Processes of the user (RLIMIT_NPROC).
    pub processes: u64,
    /// Largest file written, in MiB (RLIMIT_FSIZE).
    pub file_size_mib: u64,
}

/// The confinement of commands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sandbox {
    /// Secret-looking variables passed through anyway.
    pub env_passthrough: Vec<String>,
    /// Resource limits.
    pub rlimits: Rlimits,
    /// The user commands run as, when the runner is root.
    pub run_as: Option<RunAs>,
}

/// Environment variables that never reach a command unless passed through.
pub fn is_secret_var(name: &str) -> bool {
    name.starts_with("AGENTRY_")
        || name.ends_with("_API_KEY")
        || name.ends_with("_TOKEN")
        || name.ends_with("_SECRET")
}

impl Sandbox {
    /// The sandbox the configuration asks for. Fails when the configured
    /// user does not exist (only checked when running as root).
    pub fn from_config(cfg: &ToolRunnerConfig) -> Result<Sandbox, String> {
        let run_as = if nix::unistd::geteuid().is_root() && !cfg.run_as_user.is_empty() {
            let user = nix::unistd::User::from_name(&cfg.run_as_user)
                .map_err(|e| format!("cannot look up user {:?}: {e}", cfg.run_as_user))?
                .ok_or_else(|| {
                    format!(
                        "tool_runner.run_as_user: no user named {:?} on this system",
                        cfg.run_as_user
                    )
                })?;
            Some(RunAs {
                name: user.name,
                uid: user.uid.as_raw(),
                gid: user.gid.as_raw(),
            })
        } else {
            if nix::unistd::geteuid().is_root() {
                tracing::warn!(
                    "the tool runner runs as root and tool_runner.run_as_user is empty: commands run as root"
                );
            }
            None
        };
        Ok(Sandbox {
            env_passthrough: cfg.env_passthrough.clone(),
            rlimits: Rlimits {
                cpu_secs: cfg.limits.cpu_secs,
                address_space_mib: cfg.limits.address_space_mib,
                processes: cfg.limits.processes,
                file_size_mib: cfg.limits.file_size_mib,
            },
            run_as,
        })
    }

    /// Whether a variable of the runner's environment reaches commands.
    pub fn passes(&self, name: &str) -> bool {
        !is_secret_var(name) || self.env_passthrough.iter().any(|p| p == name)
    }

    /// The `ulimit` prefix that applies the limits inside the command's
    /// shell before the command runs (bash's `ulimit` calls setrlimit).
    pub fn ulimit_prefix(&self) -> String {
        let r = &self.rlimits;
        let mut parts = Vec::new();
        if r.cpu_secs > 0 {
            parts.push(format!("-t {}", r.cpu_secs));
        }
        if r.address_space_mib > 0 {
            parts.push(format!("-v {}", r.address_space_mib * 1024));
        }
        if r.processes > 0 {
            parts.push(format!("-u {}", r.processes));
        }
        if r.file_size_mib > 0 {
            // bash counts -f in 1024-byte blocks.
            parts.push(format!("-f {}", r.file_size_mib * 1024));
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!("ulimit {} || exit 126; ", parts.join(" "))
        }
    }

    /// Gives `path` to the unprivileged user, so its commands can use it.
    pub fn hand_over(&self, path: &Path) -> std::io::Result<()> {
        match &self.run_as {
            Some(user) => std::os::unix::fs::chown(path, Some(user.uid), Some(user.gid)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_scrubbed_unless_passed_through() {
        let sandbox = Sandbox {
            env_passthrough: vec!["GITHUB_TOKEN".into()],
            ..Sandbox::default()
        };
        assert!(!sandbox.passes("AGENTRY_LLM_API_KEY"));
        assert!(!sandbox.passes("OPENAI_API_KEY"));
        assert!(!sandbox.passes("NPM_TOKEN"));
        assert!(!sandbox.passes("AWS_SECRET"));
        assert!(sandbox.passes("GITHUB_TOKEN"));
        assert!(sandbox.passes("PATH"));
        assert!(sandbox.passes("HOME"));
    }

    #[test]
    fn limits_become_a_ulimit_prefix() {
        let sandbox = Sandbox {
            rlimits: Rlimits {
                cpu_secs: 10,
                address_space_mib: 512,
                processes: 64,
                file_size_mib: 1,
            },
            ..Sandbox::default()
        };
        assert_eq!(
            sandbox.ulimit_prefix(),
            "ulimit -t 10 -v 524288 -u 64 -f 1024 || exit 126; "
        );
        assert_eq!(Sandbox::default().ulimit_prefix(), "");
    }
}
