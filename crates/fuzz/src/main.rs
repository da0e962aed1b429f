//! `agentry-fuzz`: structure-aware fuzzing of every RPC of Agentry's
//! services and of the config loader.
//!
//! Each RPC gets its own cluster (every service in this process, on real
//! loopback connections, with the fake model) and a stream of inputs
//! written from the contract's descriptors: well-formed messages with
//! hostile values, ids of sessions that exist, and now and then a damaged
//! encoding. A finding is a panic in any service, a call that hangs, an
//! error that says nothing (or only "internal"), a broken connection, a
//! service that stops answering, a stored event that cannot be read back,
//! or a session that no longer answers a turn. Inputs that found
//! something are written out so that they can be replayed (`--corpus`).

mod config;
mod mutate;
mod rng;
mod schema;
mod wire;

use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::sessions::v1 as spb;
use agentry_testkit::cluster::{Channel, connect_as};
use agentry_testkit::{Cluster, fake_model};
use anyhow::Context;
use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use rng::Rng;
use schema::{Method, Pools, Schema};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tonic::Code;
use wire::Outcome;

/// Fuzz every RPC of Agentry's services, and the config loader.
///
/// Examples:
///   agentry-fuzz --inputs 2000                      # every RPC, 2,000 inputs each
///   agentry-fuzz --rpc SessionStore.Append --inputs 1000000
///   agentry-fuzz --rpc Orchestrator. --seed 7       # the orchestrator's RPCs, again as run 7
///   agentry-fuzz --list                             # the RPCs it knows
#[derive(Parser, Debug)]
#[command(verbatim_doc_comment)]
struct Args {
    /// Inputs per RPC (the corpus is replayed first and counts).
    #[arg(long, default_value_t = 2000)]
    inputs: u64,
    /// Inputs for the config loader.
    #[arg(long, default_value_t = 5000)]
    config_inputs: u64,
    /// The run's seed: the same seed gives the same inputs. Random when
    /// not given (it is printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Only RPCs whose name (`Service.Method`) contains this; repeatable.
    /// `config` selects the config loader.
    #[arg(long)]
    rpc: Vec<String>,
    /// Inputs worth keeping: replayed and mutated first, one directory
    /// per RPC.
    #[arg(long, default_value = "crates/fuzz/corpus")]
    corpus: PathBuf,
    /// Add to the corpus one input per distinct answer of each RPC (at
    /// most 16 per RPC).
    #[arg(long)]
    save_corpus: bool,
    /// Where inputs that found something are written.
    #[arg(long, default_value = "target/fuzz-findings")]
    findings: PathBuf,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds a call may take before it counts as hung.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
    /// Write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// List the RPCs and stop.
    #[arg(long)]
    list: bool,
}

/// Panics anywhere in the process (the services run in it), by message.
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());
static PANIC_COUNT: AtomicU64 = AtomicU64::new(0);

fn panics() -> u64 {
    PANIC_COUNT.load(Ordering::SeqCst)
}

/// What fuzzing one RPC showed.
#[derive(Default)]
struct RpcReport {
    label: String,
    inputs: u64,
    answered: u64,
    codes: BTreeMap<String, u64>,
    findings: BTreeMap<String, Finding>,
    seconds: f64,
    corpus: usize,
}

struct Finding {
    count: u64,
    example: String,
    file: Option<PathBuf>,
}

impl RpcReport {
    fn find(&mut self, kind: &str, detail: &str, input: Option<&[Bytes]>, dir: &Path) {
        let key = format!("{kind}: {}", shape(detail));
        let finding = self.findings.entry(key).or_insert_with(|| Finding {
            count: 0,
            example: detail.chars().take(600).collect(),
            file: input.and_then(|input| save(&dir.join(&self.label), input).ok()),
        });
        finding.count += 1;
    }
}

/// A message with its particulars (numbers, quoted values) taken out, so
/// that one kind of answer counts once.
fn shape(message: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    for c in message.chars().take(160) {
        match c {
            '"' => {
                quoted = !quoted;
                out.push('"');
            }
            _ if quoted => {}
            c if c.is_ascii_digit() => {
                if !out.ends_with('#') {
                    out.push('#');
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// An input as a file: each message as a 4-byte little-endian length and
/// its bytes. Named by its content.
fn save(dir: &Path, input: &[Bytes]) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let mut data = Vec::new();
    for message in input {
        data.extend_from_slice(&(message.len() as u32).to_le_bytes());
        data.extend_from_slice(message);
    }
    let path = dir.join(format!("{:016x}.bin", fnv(&data)));
    std::fs::write(&path, data)?;
    Ok(path)
}

fn load_corpus(dir: &Path) -> Vec<Vec<Bytes>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    files.sort();
    files
        .iter()
        .filter_map(|path| std::fs::read(path).ok())
        .map(|data| {
            let mut messages = Vec::new();
            let mut rest = &data[..];
            while rest.len() >= 4 {
                let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let body = &rest[4..];
                let len = len.min(body.len());
                messages.push(Bytes::copy_from_slice(&body[..len]));
                rest = &body[len..];
            }
            messages
        })
        .collect()
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Whether an answer is a finding, and which.
fn judge(outcome: &Outcome, timeout: Duration) -> Option<(&'static str, String)> {
    match outcome {
        Outcome::Ok => None,
        Outcome::Hung => Some(("hang", format!("no answer within {timeout:?}"))),
        Outcome::Status(code, message) => {
            let broken = [
                "transport error",
                "h2 protocol error",
                "connection reset",
                "broken pipe",
            ];
            if message.trim().is_empty() {
                Some(("error without words", format!("{code:?} with no message")))
            } else if broken.iter().any(|b| message.contains(b)) {
                Some(("broken connection", message.clone()))
            } else {
                match code {
                    Code::Unknown | Code::DataLoss => {
                        Some(("unclear error", format!("{code:?}: {message}")))
                    }
                    // A request that does not decode is refused by the
                    // gRPC layer itself with INTERNAL, as gRPC servers do.
                    Code::Internal if !message.starts_with("failed to decode Protobuf message") => {
                        Some(("internal error", message.clone()))
                    }
                    _ => None,
                }
            }
        }
    }
}

/// Everything one RPC's run needs.
struct Target {
    cluster: Cluster,
    channel: Channel,
    pools: Pools,
}

async fn start(method: &Method) -> anyhow::Result<Target> {
    // The services' own bounds on waiting for an MCP server sit below the
    // hang timeout: inputs name real programs (`bash` as a server), which
    // never answer MCP's handshake, and the answer then comes at the
    // service's bound, which is what is checked.
    let cluster = Cluster::start_with(|c| {
        c.mcp.init_timeout_secs = 2;
        c.mcp.call_timeout_secs = 4;
    })
    .await?;
    cluster.model.set_fallback(fake_model::Fallback::Echo);
    cluster.model.forget_requests();
    let mut orchestrator = cluster.orchestrator().await?;
    let mut pools = Pools::default();
    for i in 0..4 {
        let session = orchestrator
            .create_session(opb::CreateSessionRequest {
                title: format!("fuzz {i}"),
                ..Default::default()
            })
            .await?
            .into_inner();
        pools.session_ids.push(session.id);
    }
    let first = pools.session_ids[0].clone();
    let turn = submit_text(&mut orchestrator, &first, "hello").await?;
    wait_turn(&cluster, &first, &turn).await?;
    pools.tool_names = orchestrator
        .list_tools(opb::ListToolsRequest::default())
        .await?
        .into_inner()
        .tools
        .into_iter()
        .map(|t| t.name)
        .collect();
    let (url, auth) = match method.service.rsplit('.').next() {
        Some("Orchestrator") => (
            cluster.config.orchestrator.url.clone(),
            cluster.client_auth(),
        ),
        Some("SessionStore") => (
            cluster.config.session_store.url.clone(),
            cluster.auth.clone(),
        ),
        Some("Scheduler") => (cluster.config.scheduler.url.clone(), cluster.auth.clone()),
        Some("ToolRunner") => (cluster.config.tool_runner.url.clone(), cluster.auth.clone()),
        _ => anyhow::bail!("no service serves {}", method.service),
    };
    let channel = connect_as(&auth, &url).await?;
    Ok(Target {
        cluster,
        channel,
        pools,
    })
}

async fn submit_text(
    orchestrator: &mut agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient<
        Channel,
    >,
    session: &str,
    text: &str,
) -> Result<String, tonic::Status> {
    Ok(orchestrator
        .submit(opb::SubmitRequest {
            session_id: session.to_string(),
            input: Some(opb::Input {
                kind: Some(opb::input::Kind::UserMessage(opb::UserInput {
                    text: text.to_string(),
                    ..Default::default()
                })),
            }),
        })
        .await?
        .into_inner()
        .turn_id)
}

/// Waits (10 s at most) until `turn` of `session` has finished.
async fn wait_turn(cluster: &Cluster, session: &str, turn: &str) -> anyhow::Result<()> {
    let mut store = cluster.store().await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut last = Vec::new();
    while Instant::now() < deadline {
        let events = read_all(&mut store, session).await?;
        last = events
            .iter()
            .rev()
            .take(4)
            .rev()
            .map(|e| {
                format!(
                    "#{} {:?} turn {:?}",
                    e.seq,
                    e.kind.as_ref().map(kind_name),
                    e.turn_id
                )
            })
            .collect();
        if events
            .iter()
            .any(|e| e.turn_id == turn && matches!(e.kind, Some(spb::event::Kind::TurnFinished(_))))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!(
        "turn {turn:?} of session {session} did not finish within 10 s; the log ends with {}",
        last.join(", ")
    )
}

/// An event's kind, without its contents.
fn kind_name(kind: &spb::event::Kind) -> String {
    let text = format!("{kind:?}");
    text.split(['(', ' ', '{'])
        .next()
        .unwrap_or_default()
        .to_string()
}

async fn read_all(
    store: &mut agentry_proto::sessions::v1::session_store_client::SessionStoreClient<Channel>,
    session: &str,
) -> Result<Vec<spb::Event>, tonic::Status> {
    let mut events = Vec::new();
    let mut from = 1;
    loop {
        let page = store
            .read(spb::ReadRequest {
                session_id: session.to_string(),
                from_seq: from,
                limit: 1000,
                ..Default::default()
            })
            .await?
            .into_inner()
            .events;
        let Some(last) = page.last() else {
            return Ok(events);
        };
        from = last.seq + 1;
        let short = page.len() < 1000;
        events.extend(page);
        if short {
            return Ok(events);
        }
    }
}

/// The input number `i` of an RPC's run.
fn input(
    schema: &Schema,
    method: &Method,
    pools: &Pools,
    corpus: &[Vec<Bytes>],
    seed: u64,
    i: u64,
) -> Vec<Bytes> {
    if let Some(entry) = corpus.get(i as usize) {
        return entry.clone();
    }
    let mut rng =
        Rng::new(seed ^ fnv(method.label().as_bytes()) ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d));
    let count = if method.client_streaming {
        1 + rng.below(3)
    } else {
        1
    };
    (0..count)
        .map(|_| {
            let fresh = schema.generate(&method.input, &mut rng, pools);
            let message = match rng.below(100) {
                0..=69 => fresh,
                70..=84 => {
                    let extra = schema.generate(&method.input, &mut rng, pools);
                    mutate::mutate(&fresh, &extra, &mut rng)
                }
                _ if !corpus.is_empty() => {
                    let entry = &corpus[rng.below(corpus.len() as u64) as usize];
                    let base = entry.first().cloned().unwrap_or_default();
                    mutate::mutate(&base, &fresh, &mut rng)
                }
                _ => mutate::mutate(&fresh, &[], &mut rng),
            };
            Bytes::from(message)
        })
        .collect()
}

const BATCH: u64 = 1024;

async fn fuzz_rpc(
    schema: &Schema,
    method: &Method,
    args: &Args,
    seed: u64,
) -> anyhow::Result<RpcReport> {
    let started = Instant::now();
    let target = start(method)
        .await
        .with_context(|| format!("starting the services for {}", method.label()))?;
    let corpus_dir = args.corpus.join(method.label());
    let corpus = load_corpus(&corpus_dir);
    let timeout = Duration::from_secs(args.timeout);
    let mut report = RpcReport {
        label: method.label(),
        corpus: corpus.len(),
        ..Default::default()
    };
    let mut saved_shapes = std::collections::BTreeSet::new();
    let total = args.inputs.max(corpus.len() as u64);
    let mut next = 0;
    while next < total {
        let end = (next + BATCH).min(total);
        let before = panics();
        let inputs: Vec<Vec<Bytes>> = (next..end)
            .map(|i| input(schema, method, &target.pools, &corpus, seed, i))
            .collect();
        let outcomes: Vec<(usize, Outcome)> = futures::stream::iter(inputs.iter().enumerate())
            .map(|(k, messages)| {
                let channel = &target.channel;
                async move {
                    (
                        k,
                        wire::call(channel, method, messages.clone(), timeout).await,
                    )
                }
            })
            // A streamed answer is read for a moment, mostly waiting:
            // more of them at once keep the cores busy.
            .buffer_unordered(if method.server_streaming {
                args.concurrency * 4
            } else {
                args.concurrency
            })
            .collect()
            .await;
        for (k, outcome) in &outcomes {
            report.inputs += 1;
            let code = match outcome {
                Outcome::Ok => {
                    report.answered += 1;
                    "OK".to_string()
                }
                Outcome::Status(code, _) => format!("{code:?}"),
                Outcome::Hung => "hung".to_string(),
            };
            *report.codes.entry(code.clone()).or_default() += 1;
            let words = match outcome {
                Outcome::Status(_, message) => message.as_str(),
                _ => "",
            };
            if let Some((kind, detail)) = judge(outcome, timeout) {
                report.find(kind, &detail, Some(&inputs[*k]), &args.findings);
            } else if args.save_corpus
                && saved_shapes.len() < 16
                && saved_shapes.insert(format!("{code} {}", shape(words)))
            {
                save(&corpus_dir, &inputs[*k])?;
            }
        }
        if panics() > before {
            isolate_panics(
                method,
                &target,
                &inputs,
                timeout,
                &mut report,
                &args.findings,
            )
            .await;
        }
        next = end;
    }
    check_after(&target, &mut report).await;
    report.seconds = started.elapsed().as_secs_f64();
    drop(target);
    Ok(report)
}

/// Replays a batch one input at a time to find which input made a
/// service panic.
async fn isolate_panics(
    method: &Method,
    target: &Target,
    inputs: &[Vec<Bytes>],
    timeout: Duration,
    report: &mut RpcReport,
    dir: &Path,
) {
    let mut found = false;
    for messages in inputs {
        let before = panics();
        wire::call(&target.channel, method, messages.clone(), timeout).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
        if panics() > before {
            report.find("panic", &last_panic(), Some(messages), dir);
            found = true;
        }
    }
    if !found {
        report.find("panic (input not isolated)", &last_panic(), None, dir);
    }
}

/// The message of the latest panic.
fn last_panic() -> String {
    PANICS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .last()
        .cloned()
        .unwrap_or_default()
}

/// After the inputs: every service still answers, every stored event
/// reads back, and the sessions that existed before still take a turn.
async fn check_after(target: &Target, report: &mut RpcReport) {
    let dir = PathBuf::new();
    let cluster = &target.cluster;
    let grace = Duration::from_secs(10);
    let answered = tokio::time::timeout(grace, async {
        let mut orchestrator = cluster.orchestrator().await?;
        orchestrator
            .list_sessions(spb::ListSessionsRequest::default())
            .await?;
        let mut scheduler = cluster.scheduler().await?;
        scheduler
            .list_reminders(agentry_proto::scheduler::v1::ListRemindersRequest::default())
            .await?;
        let mut runner = agentry_proto::tools::v1::tool_runner_client::ToolRunnerClient::new(
            connect_as(&cluster.auth, &cluster.config.tool_runner.url).await?,
        );
        runner
            .list_tools(agentry_proto::tools::v1::ListToolsRequest::default())
            .await?;
        anyhow::Ok(())
    })
    .await;
    match answered {
        Ok(Ok(())) => {}
        Ok(Err(e)) => report.find("a service stopped answering", &format!("{e:#}"), None, &dir),
        Err(_) => report.find(
            "a service stopped answering",
            "no answer within 10 s",
            None,
            &dir,
        ),
    }
    // Every stored event reads back (the 2,000 most recent sessions, and
    // those made before the run).
    let Ok(mut store) = cluster.store().await else {
        report.find(
            "a service stopped answering",
            "cannot connect to the store",
            None,
            &dir,
        );
        return;
    };
    let mut ids: Vec<String> = target.pools.session_ids.clone();
    for offset in (0..2000).step_by(500) {
        match store
            .list_sessions(spb::ListSessionsRequest {
                limit: 500,
                offset,
                only_open_turns: false,
            })
            .await
        {
            Ok(page) => {
                let page = page.into_inner().sessions;
                let short = page.len() < 500;
                ids.extend(page.into_iter().map(|s| s.id));
                if short {
                    break;
                }
            }
            Err(status) => {
                report.find(
                    "stored sessions cannot be listed",
                    status.message(),
                    None,
                    &dir,
                );
                break;
            }
        }
    }
    ids.sort();
    ids.dedup();
    for id in &ids {
        match read_all(&mut store, id).await {
            Ok(events) => {
                if let Some(event) = events.iter().find(|e| e.kind.is_none()) {
                    report.find(
                        "a stored event of no kind",
                        &format!("session {id} seq {}", event.seq),
                        None,
                        &dir,
                    );
                }
            }
            Err(status) if status.code() == Code::NotFound => {}
            Err(status) => report.find(
                "a stored log does not read back",
                &format!("{:?}: {}", status.code(), status.message()),
                None,
                &dir,
            ),
        }
    }
    // The sessions made before the run still answer (unless the run
    // deleted them or left one waiting for a person).
    let Ok(mut orchestrator) = cluster.orchestrator().await else {
        return;
    };
    for id in &target.pools.session_ids {
        match submit_text(&mut orchestrator, id, "still there?").await {
            Ok(turn) => {
                if let Err(e) = wait_turn(cluster, id, &turn).await {
                    report.find("a session no longer answers", &format!("{e:#}"), None, &dir);
                }
            }
            Err(status)
                if matches!(
                    status.code(),
                    Code::NotFound | Code::FailedPrecondition | Code::InvalidArgument
                ) => {}
            Err(status) => report.find(
                "a session no longer answers",
                &format!("{:?}: {}", status.code(), status.message()),
                None,
                &dir,
            ),
        }
    }
}

fn fuzz_config(args: &Args, seed: u64) -> anyhow::Result<config::Report> {
    let generator = config::Generator::new()?;
    let dir = tempfile::tempdir()?;
    let mut report = config::Report::default();
    for i in 0..args.config_inputs {
        let mut rng = Rng::new(seed ^ 0xc0f1 ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let input = generator.input(&mut rng);
        config::check(dir.path(), &input, &mut report)?;
    }
    Ok(report)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let schema = Schema::load()?;
    if args.list {
        for method in &schema.methods {
            println!("{}", method.label());
        }
        return Ok(());
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    println!(
        "agentry-fuzz: seed {seed} (rerun with --seed {seed}), {} inputs per RPC",
        args.inputs
    );
    std::panic::set_hook(Box::new(|info| {
        let message = info.to_string();
        let n = PANIC_COUNT.fetch_add(1, Ordering::SeqCst);
        if n < 20 {
            eprintln!("panic: {message}");
        }
        let mut panics = PANICS.lock().unwrap_or_else(|e| e.into_inner());
        if panics.len() < 1000 {
            panics.push(message);
        }
    }));
    let selected =
        |label: &str| args.rpc.is_empty() || args.rpc.iter().any(|r| label.contains(r.as_str()));
    if let Some(unknown) = args.rpc.iter().find(|r| {
        r.as_str() != "config"
            && !schema
                .methods
                .iter()
                .any(|m| m.label().contains(r.as_str()))
    }) {
        anyhow::bail!(
            "no RPC's name contains {unknown:?}; `agentry-fuzz --list` prints them \
             (`--rpc config` selects the config loader)"
        );
    }
    if !args.corpus.is_dir() {
        println!(
            "agentry-fuzz: no corpus at {} (run from the repository's root, or pass --corpus)",
            args.corpus.display()
        );
    }
    let mut reports = Vec::new();
    let mut total_findings = 0;
    for method in &schema.methods {
        if !selected(&method.label()) {
            continue;
        }
        let report = fuzz_rpc(&schema, method, &args, seed).await?;
        let codes: Vec<String> = report
            .codes
            .iter()
            .map(|(c, n)| format!("{c} {n}"))
            .collect();
        println!(
            "{:<36} {:>9} inputs {:>8.0}/s  {}  findings {}",
            report.label,
            report.inputs,
            report.inputs as f64 / report.seconds.max(0.001),
            codes.join(", "),
            report.findings.len()
        );
        for (key, finding) in &report.findings {
            println!("    {key} (x{}): {}", finding.count, finding.example);
            if let Some(file) = &finding.file {
                println!("      input: {}", file.display());
            }
        }
        total_findings += report.findings.len();
        reports.push(report);
    }
    let config_report = if args.rpc.is_empty() || selected("config") {
        let report = tokio::task::block_in_place(|| fuzz_config(&args, seed))?;
        println!(
            "{:<36} {:>9} inputs  loaded {}, refused {}, slowest {:?}  findings {}",
            "config loader",
            report.inputs,
            report.loaded,
            report.refused,
            report.slowest,
            report.findings.len()
        );
        for finding in report.findings.iter().take(10) {
            println!("    {finding}");
        }
        total_findings += report.findings.len();
        Some(report)
    } else {
        None
    };
    if let Some(path) = &args.json {
        let rpcs: Vec<serde_json::Value> = reports
            .iter()
            .map(|r| {
                serde_json::json!({
                    "rpc": r.label,
                    "inputs": r.inputs,
                    "answered": r.answered,
                    "codes": r.codes,
                    "corpus": r.corpus,
                    "seconds": r.seconds,
                    "findings": r.findings.iter().map(|(k, f)| serde_json::json!({
                        "kind": k, "count": f.count, "example": f.example,
                        "input": f.file.as_ref().map(|p| p.display().to_string()),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let json = serde_json::json!({
            "seed": seed,
            "inputs_per_rpc": args.inputs,
            "rpcs": rpcs,
            "config": config_report.as_ref().map(|c| serde_json::json!({
                "inputs": c.inputs, "loaded": c.loaded, "refused": c.refused,
                "slowest_ms": c.slowest.as_millis() as u64, "findings": c.findings,
            })),
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
    }
    if total_findings > 0 {
        eprintln!("{total_findings} finding(s); rerun with --seed {seed}");
        std::process::exit(1);
    }
    println!("no findings");
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use prost::Message;

    fn method(schema: &Schema, label: &str) -> Method {
        schema
            .methods
            .iter()
            .find(|m| m.label() == label)
            .cloned()
            .unwrap()
    }

    #[test]
    fn every_rpc_of_every_service_is_known() {
        let schema = Schema::load().unwrap();
        assert_eq!(schema.methods.len(), 51);
        for label in [
            "SessionStore.Append",
            "ToolRunner.Execute",
            "Scheduler.StreamDue",
            "Orchestrator.Chat",
        ] {
            method(&schema, label);
        }
        let chat = method(&schema, "Orchestrator.Chat");
        assert!(chat.client_streaming && chat.server_streaming);
        assert_eq!(chat.path(), "/agentry.orchestrator.v1.Orchestrator/Chat");
    }

    #[test]
    fn generated_inputs_are_mostly_well_formed_and_repeat_with_the_seed() {
        let schema = Schema::load().unwrap();
        let submit = method(&schema, "Orchestrator.Submit");
        let pools = Pools {
            session_ids: vec!["s1".into()],
            ..Default::default()
        };
        let mut decoded = 0;
        let mut with_message = 0;
        let mut real_session = 0;
        for i in 0..2000 {
            let input = input(&schema, &submit, &pools, &[], 7, i);
            assert_eq!(input, super::input(&schema, &submit, &pools, &[], 7, i));
            if let Ok(request) = opb::SubmitRequest::decode(input[0].clone()) {
                decoded += 1;
                if matches!(
                    request.input.and_then(|i| i.kind),
                    Some(opb::input::Kind::UserMessage(_))
                ) {
                    with_message += 1;
                }
                if request.session_id == "s1" {
                    real_session += 1;
                }
            }
        }
        // 70% are generated whole; some of the damaged ones still decode.
        assert!(decoded > 1100, "{decoded} of 2000 decode");
        assert!(with_message > 50, "{with_message} carry a message");
        assert!(
            real_session > 50,
            "{real_session} name the session that exists"
        );
        let other_seed = input(&schema, &submit, &pools, &[], 8, 1);
        let same_seed = input(&schema, &submit, &pools, &[], 7, 1);
        assert_ne!(other_seed, same_seed);
    }

    #[test]
    fn a_corpus_entry_is_replayed_before_generated_inputs() {
        let schema = Schema::load().unwrap();
        let get = method(&schema, "SessionStore.GetSession");
        let dir = tempfile::tempdir().unwrap();
        let entry = vec![Bytes::from_static(b"\x0a\x03abc"), Bytes::from_static(b"")];
        let path = save(&dir.path().join("x"), &entry).unwrap();
        assert!(path.exists());
        let corpus = load_corpus(&dir.path().join("x"));
        assert_eq!(corpus, vec![entry.clone()]);
        let first = input(&schema, &get, &Pools::default(), &corpus, 1, 0);
        assert_eq!(first, entry);
    }

    #[test]
    fn answers_of_one_kind_have_one_shape_and_findings_are_judged() {
        assert_eq!(
            shape("session \"abc\" not found at seq 12"),
            shape("session \"zz9\" not found at seq 7")
        );
        let timeout = Duration::from_secs(1);
        assert!(judge(&Outcome::Ok, timeout).is_none());
        assert!(
            judge(
                &Outcome::Status(Code::NotFound, "no such session".into()),
                timeout
            )
            .is_none()
        );
        assert!(
            judge(
                &Outcome::Status(
                    Code::Internal,
                    "failed to decode Protobuf message: x".into()
                ),
                timeout
            )
            .is_none()
        );
        assert_eq!(judge(&Outcome::Hung, timeout).unwrap().0, "hang");
        assert_eq!(
            judge(&Outcome::Status(Code::InvalidArgument, " ".into()), timeout)
                .unwrap()
                .0,
            "error without words"
        );
        assert_eq!(
            judge(
                &Outcome::Status(Code::Internal, "database exploded".into()),
                timeout
            )
            .unwrap()
            .0,
            "internal error"
        );
        assert_eq!(
            judge(
                &Outcome::Status(Code::Unavailable, "h2 protocol error: http2 error".into()),
                timeout
            )
            .unwrap()
            .0,
            "broken connection"
        );
    }
}
