//! `agentry-bench --scenarios chaos`: a soak under faults, with a checker.
//!
//! The services run as separate processes (`agentry serve …`), each behind
//! a TCP proxy the harness controls, in one of two layouts: one node on
//! SQLite, or PostgreSQL with two orchestrators, two schedulers and three
//! tool runners. Clients drive many sessions at once (turns with changing
//! and read-only calls, approvals answered by a scripted person,
//! reminders, forks, rewinds) while faults are injected at random, several
//! at once. When the faults stop, a checker reads every log, the marker
//! files and the clients' records, and the run fails on any violation.
//! The fault schedule comes from the seed, printed first: a rerun with
//! `--seed` replays it.

mod checker;
mod faults;
mod fleet;
mod workload;

use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_testkit::fake_model::{FakeModel, Fallback};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use agentry_testkit::rng::Rng;

/// Where the soak's services keep their data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    /// One of each service, SQLite in the data directory.
    Sqlite,
    /// PostgreSQL; two orchestrators, two schedulers, three tool runners.
    Postgres,
}

/// The soak's settings.
pub struct Settings {
    pub layouts: Vec<Layout>,
    pub minutes: f64,
    pub seed: Option<u64>,
    pub sessions: usize,
}

/// Runs the soak on each layout; fails when any violation was found.
pub async fn chaos(bin: &Path, settings: &Settings) -> anyhow::Result<Value> {
    let seed = settings.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let mut results = Vec::new();
    let mut failed = Vec::new();
    for &layout in &settings.layouts {
        if layout == Layout::Postgres && agentry_testkit::postgres::binaries().is_none() {
            anyhow::ensure!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the PostgreSQL layout needs PostgreSQL installed (apt-get install postgresql)"
            );
            println!(
                "\n== chaos: Postgres layout SKIPPED: PostgreSQL is not installed \
                 (apt-get install postgresql)"
            );
            continue;
        }
        let result = soak(bin, layout, settings, seed).await?;
        if result["violations"]
            .as_array()
            .is_some_and(|v| !v.is_empty())
        {
            failed.push(format!("{layout:?}"));
        }
        results.push(result);
    }
    if !failed.is_empty() {
        println!(
            "\nthe soak found violations on {} (seed {seed}; rerun with --seed {seed})",
            failed.join(", ")
        );
    }
    Ok(json!({ "seed": seed, "runs": results, "failed": failed }))
}

/// A small file system for the data directory, so that filling its disk
/// is a fault the harness can inject (root only: it mounts a tmpfs).
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &Path) -> Result<SmallDisk, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("not root: no small file system can be mounted".into());
        }
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=384m,mode=0755", "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(SmallDisk(dir.to_path_buf()))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .output();
    }
}

async fn soak(bin: &Path, layout: Layout, settings: &Settings, seed: u64) -> anyhow::Result<Value> {
    let length = Duration::from_secs_f64(settings.minutes * 60.0);
    println!(
        "\n== chaos: {layout:?} layout, {} sessions, {:.1} min of faults, seed {seed} (rerun: --seed {seed})",
        settings.sessions, settings.minutes
    );
    let model = FakeModel::start().await?;
    model.forget_requests();
    model.set_fallback(Fallback::Directed);
    let root = tempfile::tempdir()?;
    let data = root.path().join("data");
    std::fs::create_dir_all(&data)?;
    let disk = match SmallDisk::mount(&data) {
        Ok(disk) => Some(disk),
        Err(why) => {
            println!("  disk-full faults skipped: {why}");
            None
        }
    };
    if !Path::new(fleet::FAKETIME).exists() {
        anyhow::ensure!(
            std::env::var("CI").as_deref() != Ok("true"),
            "clock-jump faults need libfaketime (apt-get install faketime)"
        );
        println!(
            "  clock-jump faults skipped: libfaketime is not installed (apt-get install faketime)"
        );
    }
    let projects = project_dirs(root.path())?;
    let mut env = vec![
        (
            "AGENTRY_PROJECT_ROOTS".to_string(),
            root.path().join("projects").display().to_string(),
        ),
        ("AGENTRY_LLM_BASE_URL".to_string(), model.base_url()),
        ("AGENTRY_LLM_MODEL".to_string(), "fake-model".to_string()),
        ("AGENTRY_CONFIG_DIR".to_string(), config_dir(root.path())?),
    ];
    let mut postgres = None;
    let processes: &[(&str, usize)] = match layout {
        Layout::Sqlite => &[
            ("session-store", 1),
            ("tool-runner", 1),
            ("scheduler", 1),
            ("orchestrator", 1),
        ],
        Layout::Postgres => {
            let Some(server) = agentry_testkit::postgres::Postgres::start() else {
                anyhow::bail!(
                    "the PostgreSQL layout needs PostgreSQL installed (apt-get install postgresql)"
                );
            };
            let url = server.create_database("chaos");
            env.push(("AGENTRY_SESSION_STORE_DATABASE_URL".into(), url.clone()));
            env.push(("AGENTRY_SCHEDULER_DATABASE_URL".into(), url));
            postgres = Some(Arc::new(std::sync::Mutex::new(server)));
            &[
                ("session-store", 2),
                ("tool-runner", 3),
                ("scheduler", 2),
                ("orchestrator", 2),
            ]
        }
    };
    let fleet = Arc::new(fleet::Fleet::start(bin, &data, processes, env).await?);
    let orchestrators = fleet
        .of("orchestrator")
        .map(|p| fleet.client_channel(&p.url()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let targets = Arc::new(workload::Targets {
        orchestrators,
        scheduler: fleet.client_channel(&fleet.urls["scheduler"])?,
        store: fleet.service_channel(&fleet.urls["session-store"])?,
        projects,
    });
    let ledger = Arc::new(workload::Ledger::default());
    let (stop_clients, clients_stop) = tokio::sync::watch::channel(false);
    let (stop_person, person_stop) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let person = tokio::spawn(workload::person(
        targets.clone(),
        ledger.clone(),
        seed,
        person_stop,
    ));
    let mut clients = Vec::new();
    for i in 0..settings.sessions {
        clients.push(tokio::spawn(workload::drive_session(
            targets.clone(),
            ledger.clone(),
            i,
            seed,
            clients_stop.clone(),
        )));
    }
    let extras = Arc::new(faults::Extras {
        disk: disk.as_ref().map(|d| d.0.clone()),
        postgres: postgres.clone(),
    });
    println!("  faults (time, kind, target):");
    let faults = faults::inject(fleet.clone(), extras, seed, length).await;
    let faults_ended = Instant::now();
    println!(
        "  faults over after {:.0}s; clients stop, the person goes on answering",
        started.elapsed().as_secs_f64()
    );
    let _ = stop_clients.send(true);
    for client in clients {
        let _ = client.await;
    }
    let mut store = SessionStoreClient::new(targets.store.clone());
    let open = checker::quiesce(&mut store, Duration::from_secs(30)).await?;
    // Reminders set just before the end fall due within 20 s: each is
    // given 15 s past its due time to be delivered.
    let latest_due = ledger.with(|r| r.latest_due);
    let settle = latest_due
        .map(|due| due + Duration::from_secs(15))
        .unwrap_or(faults_ended)
        .max(faults_ended + Duration::from_secs(10));
    tokio::time::sleep_until(settle.into()).await;
    let records = checker::records(&ledger);
    let mut logs = checker::logs(&mut store).await?;
    // A reminder that fell due while its session was busy (a task waits
    // for the turn to end) or while the faults held its delivery up comes
    // when it can: a minute more for those, and the checker counts them.
    let waited_from = Instant::now();
    while checker::reminders_waiting(&logs, &records) > 0
        && waited_from.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_secs(2)).await;
        logs = checker::logs(&mut store).await?;
    }
    let reminder_wait = waited_from.elapsed();
    let minutes = (started.elapsed().as_secs() / 60).max(1);
    let mut violations = checker::check(&logs, &records, &data.join("workspaces"), minutes);
    for (session, turn) in &open {
        violations.push(checker::Violation {
            kind: "stuck-turn",
            detail: format!(
                "{session}: turn {turn} neither finished nor waits for a person 30 s after the last fault"
            ),
        });
    }
    // Sub-agents' tasks take no messages from people.
    let sessions: Vec<String> = logs
        .keys()
        .filter(|s| !s.starts_with("sub-"))
        .cloned()
        .collect();
    let answered_at = Instant::now();
    violations.extend(
        checker::answers_new_turns(&targets.orchestrators, &sessions, Duration::from_secs(10))
            .await,
    );
    let answered_in = answered_at.elapsed();
    // The person answered until now: a reminder's turn that began late
    // may have asked for an approval the new turn would otherwise wait on.
    let _ = stop_person.send(true);
    let _ = person.await;
    // A lock held now may belong to a call still finishing: held twice,
    // 2 s apart, it is left behind.
    let mut locks = checker::held_locks(&data.join("workspaces"));
    if !locks.is_empty() {
        tokio::time::sleep(Duration::from_secs(2)).await;
        locks = checker::held_locks(&data.join("workspaces"));
    }
    violations.extend(locks);
    fleet.stop_all();
    tokio::time::sleep(Duration::from_secs(2)).await;
    violations.extend(checker::leftovers(&data));
    for fault in faults.iter().filter(|f| f.problem.is_some()) {
        violations.push(checker::Violation {
            kind: "no-recovery",
            detail: format!(
                "{} of {} at {:.1}s: {}",
                fault.kind.name(),
                fault.target,
                fault.at.as_secs_f64(),
                fault.problem.clone().unwrap_or_default()
            ),
        });
    }
    let project_changes: usize = records
        .projects
        .values()
        .collect::<std::collections::BTreeSet<_>>()
        .iter()
        .map(|dir| {
            std::fs::read_to_string(dir.join(workload::MARKER))
                .unwrap_or_default()
                .lines()
                .count()
        })
        .sum();
    println!(
        "  project sessions {} (sharing {} directories), changes made there {project_changes}",
        records.projects.len(),
        records
            .projects
            .values()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );
    let report = report(
        &faults,
        &records,
        &logs,
        &violations,
        (reminder_wait, answered_in),
    );
    if !violations.is_empty() {
        for proc in &fleet.procs {
            let tail = fleet.log_tail(proc, 15);
            if !tail.is_empty() {
                println!("  --- {} (last lines of its log)\n{tail}", proc.name);
            }
        }
    }
    drop(fleet);
    if !violations.is_empty() {
        // What the checker read, for a person to look into.
        let mut dump = String::new();
        for (session, events) in &logs {
            for e in events {
                dump.push_str(&format!("{session} {e:?}\n"));
            }
        }
        let path = root.path().join("logs.txt");
        std::fs::write(&path, dump)?;
        let _ = std::process::Command::new("cp")
            .arg("-a")
            .arg(&data)
            .arg(root.path().join("data-copy"))
            .output();
        println!("  kept for inspection: {}", root.keep().display());
    }
    drop(disk);
    Ok(
        json!({ "layout": format!("{layout:?}"), "seed": seed, "report": report,
        "violations": violations.iter().map(|v| json!({"kind": v.kind, "detail": v.detail})).collect::<Vec<_>>() }),
    )
}

/// Three project directories some sessions work in, two sessions each
/// (owned by `nobody` when the harness runs as root: commands in a project
/// run as its owner, never as root).
fn project_dirs(root: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755))?;
    let mut dirs = Vec::new();
    for i in 0..3 {
        let dir = root.join("projects").join(format!("p{i}"));
        std::fs::create_dir_all(&dir)?;
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534))?;
        }
        dirs.push(dir);
    }
    Ok(dirs)
}

/// The services' configuration for a soak: the default policy (every
/// changing call of the soak writes to a file, so a person approves each)
/// and a sub-agent that reads.
fn config_dir(root: &Path) -> anyhow::Result<String> {
    let dir = root.join("config");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("local.toml"),
        format!(
            r#"[[agents]]
name = "{reader}"
description = "Reads files of the workspace"
system_prompt = "You read files and report what they hold."
tools = ["read_file"]
"#,
            reader = workload::READER
        ),
    )?;
    Ok(dir.display().to_string())
}

/// Prints the figures and returns them.
fn report(
    faults: &[faults::Fault],
    records: &workload::Records,
    logs: &std::collections::BTreeMap<String, Vec<agentry_proto::sessions::v1::Event>>,
    violations: &[checker::Violation],
    (reminder_wait, answered_in): (Duration, Duration),
) -> Value {
    use std::collections::BTreeMap;
    let mut by_kind: BTreeMap<faults::Kind, Vec<&faults::Fault>> = BTreeMap::new();
    for fault in faults {
        by_kind.entry(fault.kind).or_default().push(fault);
    }
    println!(
        "  {:<14} {:>6} {:>14} {:>14}",
        "fault", "count", "recovery p50", "recovery p99"
    );
    let mut kinds = serde_json::Map::new();
    for (kind, list) in &by_kind {
        let mut times: Vec<f64> = list
            .iter()
            .filter_map(|f| f.recovery)
            .map(|d| d.as_secs_f64() * 1000.0)
            .collect();
        times.sort_by(f64::total_cmp);
        let pick = |q: f64| {
            times
                .get(((times.len() as f64 - 1.0) * q).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        println!(
            "  {:<14} {:>6} {:>11.0} ms {:>11.0} ms",
            kind.name(),
            list.len(),
            pick(0.5),
            pick(0.99)
        );
        kinds.insert(
            kind.name().into(),
            json!({"count": list.len(), "recovery_p50_ms": pick(0.5), "recovery_p99_ms": pick(0.99)}),
        );
    }
    let events: usize = logs.values().map(Vec::len).sum();
    let turns_finished: usize = logs
        .values()
        .flatten()
        .filter(|e| {
            matches!(
                e.kind,
                Some(agentry_proto::sessions::v1::event::Kind::TurnFinished(_))
            )
        })
        .count();
    let tasks = logs.keys().filter(|s| s.starts_with("sub-")).count();
    println!(
        "  sessions {} (forks {}, sub-agent tasks {tasks}), turns acknowledged {}, turns finished {} (in the logs), approvals answered {}, reminders {}, events {}, failed requests {}",
        logs.len(),
        records.forks.len(),
        records.turns.len(),
        turns_finished,
        records.answers.len(),
        records.reminders.len(),
        events,
        records.failed_requests
    );
    println!(
        "  reminders that came late were waited for {:.1}s; every session answered a new turn in {:.1}s (8 at a time)",
        reminder_wait.as_secs_f64(),
        answered_in.as_secs_f64()
    );
    let mut per_kind: BTreeMap<&str, usize> = BTreeMap::new();
    for v in violations {
        *per_kind.entry(v.kind).or_insert(0) += 1;
    }
    if violations.is_empty() {
        println!("  violations: 0");
    } else {
        println!("  violations: {} {per_kind:?}", violations.len());
        for v in violations.iter().take(40) {
            println!("    {}: {}", v.kind, v.detail);
        }
    }
    json!({
        "faults": kinds,
        "sessions": logs.len(),
        "forks": records.forks.len(),
        "sub_agent_tasks": tasks,
        "turns_acknowledged": records.turns.len(),
        "turns_finished": turns_finished,
        "approvals_answered": records.answers.len(),
        "reminders": records.reminders.len(),
        "events": events,
        "failed_requests": records.failed_requests,
        "new_turns_seconds": answered_in.as_secs_f64(),
        "late_reminders_waited_seconds": reminder_wait.as_secs_f64(),
        "violations_by_kind": per_kind,
    })
}
