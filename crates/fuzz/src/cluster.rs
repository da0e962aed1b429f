//! The services under test: the test kit's cluster (every service in this
//! process on loopback ports, the fake model answering), a project
//! directory the tool runner may open, and a canary directory beside it
//! that no call may change.

use crate::dict::{IdKind, Pools};
use crate::generate::Places;
use crate::schema::{Method, Schema};
use crate::target::{Credential, Target};
use agentry_proto::orchestrator::v1 as orch;
use agentry_proto::sessions::v1 as sessions;
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Fallback;
use bytes::Bytes;
use prost::Message;
use std::path::{Path, PathBuf};

/// The canary file's content.
const CANARY: &str = "canary: no call may change this file\n";
/// The uid and gid the project belongs to when the services run as root
/// (a project owned by root may not be opened then).
const NOBODY: u32 = 65_534;

/// A running cluster with the fuzzer's channels and places.
pub struct Fuzzed {
    pub cluster: Cluster,
    pub target: Target,
    pub places: Places,
    /// Sessions the run made first (never pruned).
    pub seeded: Vec<String>,
    outside: PathBuf,
    _dir: tempfile::TempDir,
}

impl Fuzzed {
    /// Starts the cluster, makes the project and canary directories, and
    /// a few sessions, a snapshot and a reminder whose ids inputs can name.
    pub async fn start(schema: &Schema, pools: &mut Pools) -> anyhow::Result<Fuzzed> {
        let dir = tempfile::tempdir()?;
        let (roots, project, outside) = make_places(dir.path())?;
        let roots_text = roots.display().to_string();
        let cluster = Cluster::start_with(|config| {
            config.tool_runner.project_roots = vec![roots_text];
            // Each web call would start a browser.
            config.tool_runner.web.chromium = false;
            // MCP servers here exit or never answer: fail fast.
            config.mcp.init_timeout_secs = 2;
            config.mcp.call_timeout_secs = 2;
        })
        .await?;
        cluster.model.set_fallback(Fallback::Directed);
        // A long run would keep every request the model was sent.
        cluster.model.forget_requests();
        let token = |t: Option<&agentry_runtime::auth::Token>| {
            t.map(|t| t.secret().to_string()).unwrap_or_default()
        };
        let client = agentry_runtime::Auth::for_client(&cluster.config)?;
        let config = &cluster.config;
        let target = Target::connect(
            &[
                ("SessionStore", config.session_store.url.as_str()),
                ("ToolRunner", config.tool_runner.url.as_str()),
                ("Scheduler", config.scheduler.url.as_str()),
                ("Orchestrator", config.orchestrator.url.as_str()),
            ],
            token(cluster.auth.service_token()),
            token(client.client_token()),
        )
        .await?;
        let project_text = project.display().to_string();
        let places = Places {
            inside: ["AGENTS.md", "README.md", "notes.txt", "src/main.rs", "image.png", "src"]
                .iter()
                .map(|p| format!("{project_text}/{p}"))
                .collect(),
            outside: vec![
                outside.join("secret.txt").display().to_string(),
                format!("{project_text}/../../outside/secret.txt"),
                format!("{project_text}/escape/secret.txt"),
            ],
            project: project_text,
        };
        let mut fuzzed = Fuzzed {
            cluster,
            target,
            places,
            seeded: Vec::new(),
            outside,
            _dir: dir,
        };
        fuzzed.seed(schema, pools).await?;
        Ok(fuzzed)
    }

    /// Sessions (scratch and project), a finished turn with a tool call, a
    /// snapshot and a reminder.
    async fn seed(&mut self, schema: &Schema, pools: &mut Pools) -> anyhow::Result<()> {
        let shared = self.target.clone();
        let project = self.places.project.clone();
        let mut seeded = Vec::new();
        let call = |path: &str, message: Vec<u8>, credential: Credential| {
            let method = find(schema, path);
            let target = shared.clone();
            async move {
                let method = method?;
                let outcome = target
                    .call(&method, vec![Bytes::from(message)], credential, None, false)
                    .await;
                match outcome.status {
                    Some(status) => Err(anyhow::anyhow!("{path}: {status:?}")),
                    None => Ok((method, outcome.responses)),
                }
            }
        };
        for i in 0..3 {
            let id = format!("fuzz-s{i}");
            let request = orch::CreateSessionRequest {
                session_id: id.clone(),
                title: format!("seed {i}"),
                project_dir: String::new(),
            };
            call(
                "/agentry.orchestrator.v1.Orchestrator/CreateSession",
                request.encode_to_vec(),
                Credential::Client,
            )
            .await?;
            seeded.push(id);
        }
        let request = orch::CreateSessionRequest {
            session_id: "fuzz-p0".into(),
            title: "project".into(),
            project_dir: project,
        };
        call(
            "/agentry.orchestrator.v1.Orchestrator/CreateSession",
            request.encode_to_vec(),
            Credential::Client,
        )
        .await?;
        seeded.push("fuzz-p0".to_string());
        let request = sessions::CreateSessionRequest {
            session_id: "fuzz-store0".into(),
            title: "store only".into(),
            ..Default::default()
        };
        call(
            "/agentry.sessions.v1.SessionStore/CreateSession",
            request.encode_to_vec(),
            Credential::Service,
        )
        .await?;
        seeded.push("fuzz-store0".to_string());
        for id in &seeded {
            pools.add(IdKind::Session, id);
        }
        self.seeded = seeded;
        for session in ["fuzz-s0", "fuzz-p0"] {
            let request = orch::SubmitRequest {
                session_id: session.into(),
                input: Some(orch::Input {
                    kind: Some(orch::input::Kind::UserMessage(orch::UserInput {
                        text: "look\ncall read_file {\"path\":\"README.md\"}".into(),
                        ..Default::default()
                    })),
                }),
            };
            let (method, answers) = call(
                "/agentry.orchestrator.v1.Orchestrator/Submit",
                request.encode_to_vec(),
                Credential::Client,
            )
            .await?;
            harvest(schema, pools, &method, &answers);
        }
        let request = agentry_proto::tools::v1::SnapshotRequest {
            session_id: "fuzz-p0".into(),
        };
        if let Ok((method, answers)) = call(
            "/agentry.tools.v1.ToolRunner/Snapshot",
            request.encode_to_vec(),
            Credential::Service,
        )
        .await
        {
            harvest(schema, pools, &method, &answers);
        }
        let request = agentry_proto::scheduler::v1::CreateReminderRequest {
            session_id: "fuzz-s1".into(),
            due: "in 10m".into(),
            message: "seed reminder".into(),
            ..Default::default()
        };
        let (method, answers) = call(
            "/agentry.scheduler.v1.Scheduler/CreateReminder",
            request.encode_to_vec(),
            Credential::Client,
        )
        .await?;
        harvest(schema, pools, &method, &answers);
        Ok(())
    }

    /// What changed in the canary directory, if anything.
    pub fn canary_problem(&self) -> Option<String> {
        let secret = self.outside.join("secret.txt");
        match std::fs::read_to_string(&secret) {
            Ok(text) if text == CANARY => {}
            Ok(text) => {
                return Some(format!(
                    "{} was changed: {:?}",
                    secret.display(),
                    text.chars().take(200).collect::<String>()
                ));
            }
            Err(e) => return Some(format!("{} is gone: {e}", secret.display())),
        }
        let entries: Vec<String> = std::fs::read_dir(&self.outside)
            .map(|dir| {
                dir.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|name| name != "secret.txt")
                    .collect()
            })
            .unwrap_or_default();
        (!entries.is_empty()).then(|| {
            format!(
                "files appeared in {}: {entries:?}",
                self.outside.display()
            )
        })
    }
}

/// The method at `path`.
pub fn find(schema: &Schema, path: &str) -> anyhow::Result<Method> {
    schema
        .methods
        .iter()
        .find(|m| m.path == path)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("the contracts have no {path}"))
}

/// Remembers the ids in a call's answers.
pub fn harvest(schema: &Schema, pools: &mut Pools, method: &Method, answers: &[Bytes]) {
    for answer in answers {
        pools.harvest(schema, &method.output, answer);
    }
}

/// `dir/roots/project` (a small project, owned by nobody when run as
/// root, with a symlink out of it) and `dir/outside/secret.txt`.
fn make_places(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf, PathBuf)> {
    use std::os::unix::fs::PermissionsExt;
    let roots = dir.join("roots");
    let project = roots.join("project");
    let outside = dir.join("outside");
    std::fs::create_dir_all(project.join("src"))?;
    std::fs::create_dir_all(&outside)?;
    std::fs::write(outside.join("secret.txt"), CANARY)?;
    std::fs::write(project.join("AGENTS.md"), "# Instructions\nBe brief.\n")?;
    std::fs::write(project.join("README.md"), "# Fuzz project\n")?;
    std::fs::write(project.join("notes.txt"), "fuzz\n")?;
    std::fs::write(project.join("src/main.rs"), "fn main() {}\n")?;
    std::fs::write(
        project.join("image.png"),
        b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89",
    )?;
    std::os::unix::fs::symlink("../../outside", project.join("escape"))?;
    for d in [dir, &roots, &outside] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755))?;
    }
    let root = std::fs::metadata(&project).map(|m| std::os::unix::fs::MetadataExt::uid(&m))? == 0;
    if root {
        for path in [
            project.clone(),
            project.join("src"),
            project.join("src/main.rs"),
            project.join("AGENTS.md"),
            project.join("README.md"),
            project.join("notes.txt"),
            project.join("image.png"),
        ] {
            std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY))?;
        }
        std::os::unix::fs::lchown(project.join("escape"), Some(NOBODY), Some(NOBODY))?;
    }
    Ok((roots, project, outside))
}
