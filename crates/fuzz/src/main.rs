//! `agentry-fuzz`: a structure-aware fuzzer for every RPC of Agentry's
//! services and for the configuration loader.
//!
//! Inputs are generated from the contracts' descriptors (see
//! [`generate`]), sent as raw bytes to a whole cluster running in this
//! process (see [`cluster`]), and judged by the oracles of [`oracle`] and
//! [`stored`]: no panic, no hang, proper error statuses, credentials
//! enforced, everything stored readable. A run is reproducible from its
//! seed; each finding's input is saved and replayed first on later runs.
//! `docs/fuzzing.md` says how to run it.

mod cluster;
mod config_fuzz;
mod corpus;
mod decode;
mod dict;
mod generate;
mod oracle;
mod report;
mod rng;
mod run;
mod safety;
mod schema;
mod stored;
mod target;

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "agentry-fuzz",
    about = "Fuzzes every RPC of Agentry's services and the config loader"
)]
struct Args {
    /// The seed (printed by every run; the same seed, the same inputs)
    #[arg(long)]
    seed: Option<u64>,
    /// Inputs per RPC (and for the config loader)
    #[arg(long, default_value_t = 1000)]
    inputs: u64,
    /// Only these (SERVICE/METHOD, SERVICE, or config); repeat or separate with commas
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Where findings' inputs are saved; saved inputs there and in the
    /// repository's crates/fuzz/corpus are replayed first
    #[arg(long, value_name = "DIR")]
    corpus: Option<PathBuf>,
    /// Calls that may start a process (bash, hooks, MCP servers), at most this many a second
    #[arg(long, default_value_t = 20.0)]
    spawn_rate: f64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    oracle::install_panic_hook();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let builtin_corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let opts = run::Options {
        seed,
        inputs: args.inputs,
        only: args.only,
        corpus: args.corpus.unwrap_or_else(|| builtin_corpus.clone()),
        builtin_corpus,
        spawn_rate: args.spawn_rate,
    };
    println!("agentry-fuzz: seed {seed} (replay with --seed {seed})");
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("agentry-fuzz: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(campaign(opts)) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(findings) => {
            println!("agentry-fuzz: {findings} distinct findings (seed {seed})");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("agentry-fuzz: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// The whole run; the number of distinct findings.
async fn campaign(opts: run::Options) -> anyhow::Result<usize> {
    let mut runner = run::Runner::new(opts)?;
    let methods = runner.methods();
    if methods.is_empty() && !runner.config_selected() {
        anyhow::bail!("--only selects nothing: name SERVICE/METHOD, SERVICE or config");
    }
    if !methods.is_empty() {
        println!("note: {}", runner.restricted());
        println!(
            "note: live streams (Watch, Subscribe, Chat, StreamDue, McpWatch) get 1-3 messages \
             and are read until idle for {:?}, then dropped",
            target::LIVE_IDLE
        );
    }
    runner.rpcs().await?;
    if runner.config_selected() {
        runner.config().await?;
    }
    report::table(&runner.stats);
    for (finding, count) in &runner.findings {
        println!(
            "finding: [{}] {} ({count}×): {}",
            finding.kind,
            finding.rpc,
            finding.detail.lines().next().unwrap_or_default()
        );
    }
    Ok(runner.findings.len())
}
