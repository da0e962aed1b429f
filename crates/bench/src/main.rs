//! `agentry-bench`: measures Agentry on this machine and prints a table
//! (and JSON with `--json FILE`).
//!
//! The services run as child processes of the real `agentry` binary
//! (`agentry serve …`, data in a temporary directory on disk, every event
//! durable), so each one's peak memory can be read; the test kit's fake
//! model answers instantly (or at a fixed pace for the streaming run).
//! Scenarios:
//!
//! - `turns`: user message → `read_file` of a small file → result → answer;
//!   one session sequentially, then N sessions at once;
//! - `streaming`: 2,000 tokens at a fixed pace, read through Agentry versus
//!   straight from the fake model;
//! - `shell`: `true` through the tool runner versus a bare fork/exec;
//! - `reminders`: lateness of reminders falling due among N pending;
//! - `store`: durable appends, one writer and 16 concurrent;
//! - `idle`: orchestrator memory per idle session;
//! - `startup`: `agentry up` until every service serves;
//! - `snapshots`: workspace snapshots and a restore of 10,000 files;
//! - `scale-out`: turns on PostgreSQL through one orchestrator and two
//!   (needs PostgreSQL installed; not in the default set).

mod scenarios;
mod stack;
mod startup;
mod stats;

use clap::{Parser, ValueEnum};
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
    /// Write the figures as JSON here
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
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
    /// One orchestrator versus two on PostgreSQL
    ScaleOut,
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
            Scenario::Streaming => scenarios::streaming(&bin).await?,
            Scenario::Shell => scenarios::shell(&bin).await?,
            Scenario::Reminders => scenarios::reminders(&args.pending).await?,
            Scenario::Store => scenarios::store(&bin).await?,
            Scenario::Idle => scenarios::idle(&bin, args.idle_sessions).await?,
            Scenario::Startup => startup::startup(&bin).await?,
            Scenario::Snapshots => scenarios::snapshots(&bin).await?,
            Scenario::ScaleOut => scenarios::scale_out(&bin, args.turns, &args.sessions).await?,
        };
        let name = format!("{scenario:?}").to_lowercase();
        report.insert(name, figures);
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        println!("\nfigures written to {}", path.display());
    }
    Ok(())
}
