//! `agentry-bench`: measures Agentry on this machine and prints a table
//! (and JSON with `--json FILE`).
//!
//! The services run as child processes of the real `agentry` binary
//! (`agentry serve …`, data in a temporary directory on disk, every event
//! durable), so each one's peak memory can be read; the test kit's fake
//! model answers instantly (or at a fixed pace for the streaming run).
//! After the scenarios, a table of the performance goals with the figures
//! this run measured (`goals` in the JSON). Scenarios:
//!
//! - `turns`: user message → `read_file` of a small file → result → answer;
//!   one session sequentially, then N sessions at once;
//! - `streaming`: 2,000 tokens at a fixed pace, read through Agentry versus
//!   straight from the fake model; then `--streams` sessions (100) streaming
//!   at once, at 100 tokens/s each;
//! - `shell`: `true` through the tool runner, with the OS sandbox and
//!   without, versus a bare fork/exec;
//! - `reminders`: lateness of reminders falling due among N pending;
//! - `store`: durable appends, one writer and 16 concurrent;
//! - `idle`: orchestrator memory per idle session;
//! - `startup`: `agentry up` until every service serves;
//! - `snapshots`: workspace snapshots and a restore of 10,000 files;
//! - `project`: snapshots of a 50,000-file repository with an ignored
//!   1 GiB build directory (not in the default set: it writes 1 GiB);
//! - `scale-out`: turns on PostgreSQL through one orchestrator and two
//!   (needs PostgreSQL installed; not in the default set);
//! - `chaos`: a soak under random faults with a checker that fails the run
//!   on any lost or repeated work (`--layout sqlite,postgres`, `--minutes`,
//!   `--seed`; not in the default set).

mod chaos;
mod scenarios;
mod stack;
mod startup;
mod stats;

use clap::{Parser, ValueEnum};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "agentry-bench",
    about = "Benchmarks Agentry's services on this machine and prints the figures"
)]
struct Args {
    /// Scenarios to run
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "turns,streaming,shell,reminders,store,idle,startup,snapshots"
    )]
    scenarios: Vec<Scenario>,
    /// Concurrent sessions of the turns scenario
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    sessions: Vec<usize>,
    /// Turns of the single-session run (concurrent runs do at least 2 per session)
    #[arg(long, default_value_t = 500)]
    turns: usize,
    /// Pending reminders of the reminders scenario
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pending: Vec<usize>,
    /// Idle sessions of the idle scenario
    #[arg(long, default_value_t = 1000)]
    idle_sessions: usize,
    /// Sessions streaming at once in the streaming scenario's second part
    #[arg(long, default_value_t = 100)]
    streams: usize,
    /// Pages watching one session in the gateway scenario
    #[arg(long, default_value_t = 100)]
    watchers: usize,
    /// Stored sessions of the large scenario
    #[arg(long, default_value_t = 10_000)]
    large_sessions: usize,
    /// Events of the large scenario's long session
    #[arg(long, default_value_t = 100_000)]
    long_events: usize,
    /// Write the figures as JSON here
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Minutes of faults in the chaos soak
    #[arg(long, default_value_t = 2.0)]
    minutes: f64,
    /// The chaos soak's seed (printed by every run; the same seed, the same faults)
    #[arg(long)]
    seed: Option<u64>,
    /// Sessions driven at once in the chaos soak
    #[arg(long, default_value_t = 50)]
    chaos_sessions: usize,
    /// Layouts of the chaos soak
    #[arg(long, value_enum, value_delimiter = ',', default_value = "sqlite")]
    layout: Vec<chaos::Layout>,
    /// The `agentry` binary to run the services with [default: next to this program]
    #[arg(long, value_name = "PATH")]
    agentry_bin: Option<PathBuf>,
}

/// What to measure.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Turn overhead, one session and many
    Turns,
    /// Added streaming latency
    Streaming,
    /// The shell tool versus fork/exec
    Shell,
    /// Reminder lateness
    Reminders,
    /// Session-store append throughput
    Store,
    /// Memory per idle session
    Idle,
    /// `agentry up` until every service serves
    Startup,
    /// Workspace snapshots of 10,000 files
    Snapshots,
    /// Snapshots of a 50,000-file repository with a 1 GiB ignored build dir
    Project,
    /// One orchestrator versus two on PostgreSQL
    ScaleOut,
    /// Many console pages on one session: the gateway's added delay
    Gateway,
    /// 10,000 stored sessions listed; the first turn of a 100,000-event session
    Large,
    /// A soak under random faults, checked for lost or repeated work
    Chaos,
}

fn agentry_bin(args: &Args) -> anyhow::Result<PathBuf> {
    if let Some(path) = &args.agentry_bin {
        anyhow::ensure!(
            path.is_file(),
            "--agentry-bin {} does not exist",
            path.display()
        );
        return Ok(path.clone());
    }
    let beside = std::env::current_exe()?.with_file_name("agentry");
    anyhow::ensure!(
        beside.is_file(),
        "no agentry binary at {}: build it first (cargo build --release --bin agentry) or pass --agentry-bin",
        beside.display()
    );
    Ok(beside)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentry-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let bin = agentry_bin(&args)?;
    let mut report = serde_json::Map::new();
    report.insert(
        "machine".into(),
        serde_json::json!({
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        }),
    );
    println!(
        "agentry-bench ({} build, {} cores)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    for scenario in &args.scenarios {
        let figures = match scenario {
            Scenario::Turns => scenarios::turns(&bin, args.turns, &args.sessions).await?,
            Scenario::Streaming => scenarios::streaming(&bin, args.streams).await?,
            Scenario::Shell => scenarios::shell(&bin).await?,
            Scenario::Reminders => scenarios::reminders(&args.pending).await?,
            Scenario::Store => scenarios::store(&bin).await?,
            Scenario::Idle => scenarios::idle(&bin, args.idle_sessions).await?,
            Scenario::Startup => startup::startup(&bin).await?,
            Scenario::Snapshots => scenarios::snapshots(&bin).await?,
            Scenario::Project => scenarios::project(&bin).await?,
            Scenario::ScaleOut => scenarios::scale_out(&bin, args.turns, &args.sessions).await?,
            Scenario::Gateway => scenarios::gateway(&bin, args.watchers).await?,
            Scenario::Large => {
                scenarios::large(&bin, args.large_sessions, args.long_events).await?
            }
            Scenario::Chaos => {
                chaos::chaos(
                    &bin,
                    &chaos::Settings {
                        layouts: args.layout.clone(),
                        minutes: args.minutes,
                        seed: args.seed,
                        sessions: args.chaos_sessions,
                    },
                )
                .await?
            }
        };
        let name = format!("{scenario:?}").to_lowercase();
        report.insert(name, figures);
    }
    let goals = goals(&report);
    if !goals.is_empty() {
        report.insert("goals".into(), Value::Array(goals));
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        println!("\nfigures written to {}", path.display());
    }
    // The soak fails the run once its figures are written.
    if let Some(failed) = report
        .get("chaos")
        .and_then(|c| c["failed"].as_array())
        .filter(|f| !f.is_empty())
    {
        anyhow::bail!("the chaos soak found violations on {failed:?}");
    }
    Ok(())
}

/// The performance goals, each with the figure this run measured (only
/// those whose scenarios ran); printed as a table. The ratio to LangGraph
/// is `bench/compare.sh`'s.
fn goals(report: &serde_json::Map<String, Value>) -> Vec<Value> {
    let mut goals = Vec::new();
    let mut goal = |figure: &str, value: Option<f64>, target: f64, at_least: bool, unit: &str| {
        let Some(value) = value.filter(|v| v.is_finite()) else {
            return;
        };
        let met = if at_least {
            value >= target
        } else {
            value <= target
        };
        goals.push(json!({
            "figure": figure, "value": value, "goal": target,
            "at_least": at_least, "unit": unit, "met": met,
        }));
    };
    let runs = report
        .get("turns")
        .and_then(|t| t["runs"].as_array())
        .cloned()
        .unwrap_or_default();
    let rate = |mode: &str| {
        runs.iter()
            .find(|r| r["mode"].as_str().is_some_and(|m| m.starts_with(mode)))
            .and_then(|r| r["turns_per_sec"].as_f64())
    };
    let fresh = rate("sequential");
    if let (Some(fresh), Some(growing)) = (fresh, rate("one session")) {
        goal(
            "one session growing to 2,000 messages vs a fresh session",
            Some(growing / fresh),
            0.9,
            true,
            "x",
        );
    }
    let sequential = runs.iter().find(|r| {
        r["mode"]
            .as_str()
            .is_some_and(|m| m.starts_with("sequential"))
    });
    goal(
        "durable commits per one-tool turn",
        sequential.and_then(|r| r["commits_per_turn"].as_f64()),
        3.0,
        false,
        "",
    );
    // The goal is set for 1,000 sessions (or more).
    let widest = runs
        .iter()
        .filter(|r| r["mode"] == "concurrent sessions")
        .filter(|r| r["sessions"].as_u64().unwrap_or(0) >= 1000)
        .max_by_key(|r| r["sessions"].as_u64().unwrap_or(0));
    if let (Some(fresh), Some(widest)) = (fresh, widest) {
        let sessions = widest["sessions"].as_u64().unwrap_or(0);
        let errors = widest["errors"].as_u64().unwrap_or(0);
        goal(
            &format!(
                "{sessions} concurrent sessions vs one session (aggregate turns/s, {errors} errors)"
            ),
            widest["turns_per_sec"]
                .as_f64()
                .map(|r| if errors == 0 { r / fresh } else { 0.0 }),
            3.0,
            true,
            "x",
        );
    }
    let large = report.get("large");
    let large_sessions = large
        .and_then(|l| l["sessions"].as_u64())
        .unwrap_or_default();
    goal(
        &format!("list, first page, {large_sessions} sessions stored (gRPC, p50)"),
        large.and_then(|l| l["list_p50_ms"].as_f64()),
        20.0,
        false,
        "ms",
    );
    goal(
        &format!("console's list, first page, {large_sessions} sessions stored (p50)"),
        large.and_then(|l| l["console_list_p50_ms"].as_f64()),
        20.0,
        false,
        "ms",
    );
    goal(
        &format!(
            "first turn of a {}-event session after a restart starts (from its checkpoint)",
            large
                .and_then(|l| l["long_session_events"].as_u64())
                .unwrap_or_default()
        ),
        large.and_then(|l| l["first_turn_started_ms"].as_f64()),
        100.0,
        false,
        "ms",
    );
    let gateway = report.get("gateway");
    goal(
        &format!(
            "gateway: delay added per token with {} pages watching, p99",
            gateway
                .and_then(|g| g["watchers"].as_u64())
                .unwrap_or_default()
        ),
        gateway.and_then(|g| g["added_p99_ms"].as_f64()),
        50.0,
        false,
        "ms",
    );
    goal(
        "console's first load (no request elsewhere)",
        gateway.and_then(|g| {
            let refs = g["first_load_external_refs"].as_u64()?;
            let bytes = g["first_load_bytes"].as_f64()?;
            Some(if refs == 0 {
                bytes / 1024.0
            } else {
                f64::INFINITY
            })
        }),
        150.0,
        false,
        "KiB",
    );
    goal(
        "streaming: delay added per token, p99",
        report
            .get("streaming")
            .and_then(|s| s["added_p99_ms"].as_f64()),
        1.0,
        false,
        "ms",
    );
    let streaming = report.get("streaming");
    goal(
        &format!(
            "streaming: delay added per token, p99, {} sessions streaming",
            streaming
                .and_then(|s| s["streams"].as_u64())
                .unwrap_or_default()
        ),
        streaming.and_then(|s| s["load_added_p99_ms"].as_f64()),
        1.0,
        false,
        "ms",
    );
    let shell = report.get("shell");
    goal(
        "shell tool `true` vs bare fork/exec, sandbox on",
        shell.and_then(|s| s["ratio_sandbox_on"].as_f64()),
        3.0,
        false,
        "x",
    );
    goal(
        "shell tool `true` vs bare fork/exec, sandbox off",
        shell.and_then(|s| s["ratio_sandbox_off"].as_f64()),
        2.5,
        false,
        "x",
    );
    goal(
        "`agentry up` start to all services healthy, p50",
        report
            .get("startup")
            .and_then(|s| s["up"]["p50_ms"].as_f64()),
        300.0,
        false,
        "ms",
    );
    if !goals.is_empty() {
        println!("\n== goals (the ratio to LangGraph: bench/compare.sh)");
        for g in &goals {
            println!(
                "  {:<72} {:>8.2} {:<2} goal {} {:<6} {}",
                g["figure"].as_str().unwrap_or_default(),
                g["value"].as_f64().unwrap_or(f64::NAN),
                g["unit"].as_str().unwrap_or_default(),
                if g["at_least"] == true { ">=" } else { "<=" },
                g["goal"],
                if g["met"] == true { "met" } else { "NOT MET" },
            );
        }
    }
    goals
}
