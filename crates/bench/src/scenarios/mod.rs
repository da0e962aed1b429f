//! The measurements. Each prints its table and returns its figures as JSON.

use crate::stack::Stack;
use crate::stats::summary;
use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_proto::sessions::v1 as spb;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_proto::tools::v1::tool_runner_client::ToolRunnerClient;
use agentry_proto::tools::v1::{ExecuteRequest, execute_response};
use agentry_testkit::cluster::Channel;
use agentry_testkit::fake_model::{self, FakeModel, Fallback, Reply};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use tokio_stream::StreamExt;

const ANSWER: &str = "done";
/// Sessions sharing one HTTP/2 connection.
const SESSIONS_PER_CONNECTION: usize = 100;

fn react_model() -> Fallback {
    Fallback::ToolThenText {
        tool: "read_file".into(),
        arguments: json!({"path": "small.txt"}),
        text: ANSWER.into(),
    }
}

/// Follows a session's events from its start.
async fn follow(
    client: &mut OrchestratorClient<Channel>,
    session_id: &str,
) -> anyhow::Result<tonic::Streaming<spb::Event>> {
    Ok(client
        .subscribe(opb::SubscribeRequest {
            session_id: session_id.to_string(),
            from_seq: 0,
            live_only: false,
        })
        .await?
        .into_inner())
}

/// Sends a user message (tool calls under the configured policy).
async fn submit(
    client: &mut OrchestratorClient<Channel>,
    session_id: &str,
    text: &str,
) -> Result<tonic::Response<opb::SubmitResponse>, tonic::Status> {
    client
        .submit(opb::SubmitRequest {
            session_id: session_id.to_string(),
            input: Some(opb::Input {
                kind: Some(opb::input::Kind::UserMessage(opb::UserInput {
                    images: Vec::new(),
                    text: text.into(),
                    approval_mode: spb::ApprovalMode::Policy as i32,
                    plan: false,
                    network: false,
                    budget: None,
                    compact: false,
                    interrupt: false,
                })),
            }),
        })
        .await
}

/// One session's sequence of turns; returns each turn's latency in ms, and
/// the number of turns that did not complete with the expected answer.
async fn session_turns(
    client: OrchestratorClient<Channel>,
    stack: &Stack,
    turns: usize,
) -> anyhow::Result<(Vec<f64>, usize)> {
    session_turns_via(client, None, stack, turns).await
}

/// A session ready for turns: created, its workspace holding the file
/// the turn reads, its events followed.
struct Prepared {
    session_id: String,
    events: tonic::Streaming<spb::Event>,
}

async fn prepare(
    client: &mut OrchestratorClient<Channel>,
    stack: &Stack,
) -> anyhow::Result<Prepared> {
    let session = client
        .create_session(opb::CreateSessionRequest::default())
        .await?
        .into_inner();
    let workspace = stack.workspace(&session.id);
    std::fs::create_dir_all(&workspace)?;
    std::fs::write(workspace.join("small.txt"), "a small file\n")?;
    let events = follow(client, &session.id).await?;
    Ok(Prepared {
        session_id: session.id,
        events,
    })
}

/// [`session_turns`], the inputs sent through `submit_via` when given
/// (after one unmeasured turn through `client`, so that the session is
/// driven by `client`'s orchestrator and every input is forwarded).
async fn session_turns_via(
    mut client: OrchestratorClient<Channel>,
    submit_via: Option<OrchestratorClient<Channel>>,
    stack: &Stack,
    turns: usize,
) -> anyhow::Result<(Vec<f64>, usize)> {
    let prepared = prepare(&mut client, stack).await?;
    prepared_turns(client, submit_via, prepared, turns).await
}

/// Runs `turns` turns in a prepared session.
async fn prepared_turns(
    mut client: OrchestratorClient<Channel>,
    submit_via: Option<OrchestratorClient<Channel>>,
    prepared: Prepared,
    turns: usize,
) -> anyhow::Result<(Vec<f64>, usize)> {
    let Prepared {
        session_id,
        mut events,
    } = prepared;
    let mut latencies = Vec::with_capacity(turns);
    let mut errors = 0;
    let forwarding = submit_via.is_some();
    let mut sender = submit_via.unwrap_or_else(|| client.clone());
    for turn in 0..turns + usize::from(forwarding) {
        let warm_up = forwarding && turn == 0;
        let started = Instant::now();
        let via = if warm_up { &mut client } else { &mut sender };
        let submitted = submit(via, &session_id, "read small.txt").await;
        if submitted.is_err() {
            errors += 1;
            continue;
        }
        let mut read_file_ok = false;
        loop {
            let Some(event) = events.next().await else {
                anyhow::bail!("the event stream of session {session_id} ended");
            };
            match event?.kind {
                Some(spb::event::Kind::ToolResult(r)) => {
                    read_file_ok = !r.is_error && r.output.contains("a small file");
                }
                Some(spb::event::Kind::TurnFinished(f)) => {
                    let completed = f.outcome == spb::TurnOutcome::Completed as i32;
                    if !(completed && f.message == ANSWER && read_file_ok) {
                        errors += 1;
                    }
                    break;
                }
                _ => {}
            }
        }
        if !warm_up {
            latencies.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    Ok((latencies, errors))
}

async fn turn_run(stack: &Stack, sessions: usize, turns_each: usize) -> anyhow::Result<Value> {
    let mut clients = Vec::new();
    for _ in 0..sessions.div_ceil(SESSIONS_PER_CONNECTION) {
        clients.push(stack.orchestrator().await?);
    }
    // The sessions are created, their workspaces written and their events
    // followed before the clock starts: the figure is turns, not set-up.
    let mut prepared = Vec::with_capacity(sessions);
    for i in 0..sessions {
        let mut client = clients[i / SESSIONS_PER_CONNECTION].clone();
        prepared.push((client.clone(), prepare(&mut client, stack).await?));
    }
    let started = Instant::now();
    // Each session on a task of its own: the client's work spreads over
    // the runtime's threads like the services' does.
    let runs: Vec<_> = prepared
        .into_iter()
        .map(|(client, session)| tokio::spawn(prepared_turns(client, None, session, turns_each)))
        .collect();
    let results = futures::future::join_all(runs).await;
    let elapsed = started.elapsed().as_secs_f64();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for result in results {
        match result {
            Ok(Ok((l, e))) => {
                latencies.extend(l);
                errors += e;
            }
            Ok(Err(e)) => {
                eprintln!("  a session failed: {e:#}");
                errors += turns_each;
            }
            Err(e) => {
                eprintln!("  a session's task failed: {e}");
                errors += turns_each;
            }
        }
    }
    let turns = latencies.len();
    let (p50, p99, max) = summary(&mut latencies);
    let rate = turns as f64 / elapsed;
    let label = if sessions == 1 {
        "1 (growing)".to_string()
    } else {
        sessions.to_string()
    };
    println!("{label:>12} {turns:>7} {rate:>10.1} {p50:>9.2} {p99:>9.2} {max:>9.2} {errors:>7}");
    Ok(json!({
        "mode": if sessions == 1 { "one session, history growing" } else { "concurrent sessions" },
        "sessions": sessions, "turns": turns, "turns_per_sec": rate,
        "p50_ms": p50, "p99_ms": p99, "max_ms": max, "errors": errors,
    }))
}

/// Turn overhead: one session sequentially, then N at once.
pub async fn turns(bin: &Path, turns: usize, sessions: &[usize]) -> anyhow::Result<Value> {
    let model = FakeModel::start().await?;
    model.forget_requests();
    model.set_fallback(react_model());
    println!("\n== turns: user message → read_file → result → answer (every event durable)");
    println!(
        "{:>12} {:>7} {:>10} {:>9} {:>9} {:>9} {:>7}",
        "sessions", "turns", "turns/s", "p50 ms", "p99 ms", "max ms", "errors"
    );
    let mut runs = Vec::new();
    let mut peak = serde_json::Map::new();
    {
        let stack = Stack::start(bin, &model.base_url()).await?;
        turn_run_quiet(&stack).await?;
        runs.push(sequential_fresh(&stack, turns).await?);
        runs.push(turn_run(&stack, 1, turns).await?);
        for (service, mib) in stack.peak_rss_mib() {
            peak.insert(format!("{service}@sequential"), json!(mib));
        }
    }
    for &n in sessions.iter().filter(|&&n| n > 1) {
        // A fresh stack per run: memory and store size start from zero.
        let stack = Stack::start(bin, &model.base_url()).await?;
        let turns_each = (turns / n).max(2);
        // Warm-up: connections, the tool list, SQLite's caches.
        turn_run_quiet(&stack).await?;
        runs.push(turn_run(&stack, n, turns_each).await?);
        for (service, mib) in stack.peak_rss_mib() {
            peak.insert(format!("{service}@{n}"), json!(mib));
        }
    }
    println!(
        "peak RSS (MiB) by service@sessions: {}",
        Value::Object(peak.clone())
    );
    Ok(json!({"runs": runs, "peak_rss_mib": peak}))
}

/// One turn at a time, each the first of a fresh session (so the history
/// does not grow; session creation is not timed): the per-turn overhead.
async fn sequential_fresh(stack: &Stack, turns: usize) -> anyhow::Result<Value> {
    let client = stack.orchestrator().await?;
    let mut latencies = Vec::with_capacity(turns);
    let mut errors = 0;
    let before = stack.store_writes().await?;
    let cpu_before = stack.cpu_ms();
    let bytes_before = stack.store_bytes();
    for _ in 0..turns {
        let (l, e) = session_turns(client.clone(), stack, 1).await?;
        latencies.extend(l);
        errors += e;
    }
    let after = stack.store_writes().await?;
    let per_turn = |x: f64| x / turns.max(1) as f64;
    // One turn at a time: every commit of the run belongs to a turn.
    let commits_per_turn = per_turn(after.commits - before.commits);
    let appends_per_turn = per_turn(after.appends - before.appends);
    let events_per_turn = per_turn(after.events - before.events);
    // The store's file grows by pages: over hundreds of turns, a fair
    // reading of the bytes an event takes (indexes included).
    let bytes = stack.store_bytes().saturating_sub(bytes_before) as f64;
    let bytes_per_event = bytes / (after.events - before.events).max(1.0);
    let cpu_per_turn: serde_json::Map<String, Value> = stack
        .cpu_ms()
        .into_iter()
        .map(|(service, ms)| {
            let spent = ms - cpu_before.get(service).copied().unwrap_or(0.0);
            (service.to_string(), json!(per_turn(spent)))
        })
        .collect();
    let busy_secs = latencies.iter().sum::<f64>() / 1000.0;
    let count = latencies.len();
    let rate = count as f64 / busy_secs;
    let (p50, p99, max) = summary(&mut latencies);
    println!(
        "{:>12} {count:>7} {rate:>10.1} {p50:>9.2} {p99:>9.2} {max:>9.2} {errors:>7}",
        "1 (fresh)"
    );
    println!(
        "{:>12} durable commits per turn {commits_per_turn:.2} ({appends_per_turn:.2} appends, \
         {events_per_turn:.1} events, ~{bytes_per_event:.0} bytes stored per event)",
        ""
    );
    println!(
        "{:>12} CPU ms per turn by service: {}",
        "",
        Value::Object(cpu_per_turn.clone())
    );
    Ok(json!({
        "mode": "sequential, a fresh session per turn",
        "sessions": 1, "turns": count, "turns_per_sec": rate,
        "p50_ms": p50, "p99_ms": p99, "max_ms": max, "errors": errors,
        "commits_per_turn": commits_per_turn, "appends_per_turn": appends_per_turn,
        "events_per_turn": events_per_turn, "bytes_per_event": bytes_per_event,
        "cpu_ms_per_turn": cpu_per_turn,
    }))
}

async fn turn_run_quiet(stack: &Stack) -> anyhow::Result<()> {
    let client = stack.orchestrator().await?;
    let (_, errors) = session_turns(client, stack, 5).await?;
    anyhow::ensure!(errors == 0, "warm-up turns failed: is the stack healthy?");
    Ok(())
}

/// The paced reply: `n` one-word tokens, `pace` apart.
fn paced_reply(n: usize, pace: Duration) -> Reply {
    named_reply(0, 1, n, pace)
}

/// Token arrival instants, read straight from the model.
async fn direct_arrivals(model: &FakeModel) -> anyhow::Result<Vec<Instant>> {
    let tokens = read_stream(reqwest::Client::new(), model.base_url()).await?;
    Ok(tokens.into_iter().map(|(_, at)| at).collect())
}

/// Asks the model at `base_url` for a streamed answer and reads it: each
/// token (word) of its text, with when it arrived.
async fn read_stream(
    http: reqwest::Client,
    base_url: String,
) -> anyhow::Result<Vec<(String, Instant)>> {
    let response = http
        .post(format!("{base_url}/chat/completions"))
        .json(&json!({"model": "fake-model", "stream": true,
                      "messages": [{"role": "user", "content": "stream"}]}))
        .send()
        .await?;
    let mut body = response.bytes_stream();
    let mut arrivals = Vec::new();
    let mut pending = String::new();
    while let Some(chunk) = body.next().await {
        let at = Instant::now();
        pending.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = pending.find('\n') {
            let line: String = pending.drain(..=end).collect();
            if let Some(data) = line.trim().strip_prefix("data: ")
                && let Ok(v) = serde_json::from_str::<Value>(data)
                && let Some(text) = v["choices"][0]["delta"]["content"].as_str()
            {
                arrivals.extend(text.split_whitespace().map(|t| (t.to_string(), at)));
            }
        }
    }
    Ok(arrivals)
}

/// Token arrival instants as a client of Agentry sees them, and the time
/// to the first token from the submit.
async fn agentry_arrivals(stack: &Stack) -> anyhow::Result<(Vec<Instant>, f64)> {
    let mut client = stack.orchestrator().await?;
    let session = client
        .create_session(opb::CreateSessionRequest::default())
        .await?
        .into_inner();
    let mut events = follow(&mut client, &session.id).await?;
    let started = Instant::now();
    submit(&mut client, &session.id, "stream").await?;
    let mut arrivals = Vec::new();
    while let Some(event) = events.next().await {
        let at = Instant::now();
        match event?.kind {
            Some(spb::event::Kind::ModelTextDelta(d)) => {
                arrivals.extend(d.text.split_whitespace().map(|_| at));
            }
            Some(spb::event::Kind::TurnFinished(_)) => break,
            _ => {}
        }
    }
    let ttft = arrivals
        .first()
        .map(|a| a.duration_since(started).as_secs_f64() * 1000.0)
        .unwrap_or(f64::NAN);
    Ok((arrivals, ttft))
}

/// How long after the fake model handed each token to its HTTP server the
/// reader had it, in ms.
fn lags(arrivals: &[Instant], sent: &[Instant]) -> Vec<f64> {
    arrivals
        .iter()
        .zip(sent)
        .map(|(a, s)| a.saturating_duration_since(*s).as_secs_f64() * 1000.0)
        .collect()
}

/// A paced reply whose tokens name their stream (`s{stream}t{i}`), so that
/// streams running at once can be told apart. Its first token comes after
/// `stream / streams` of the pace: the streams of independent sessions
/// are not in step, and here they start together.
fn named_reply(stream: usize, streams: usize, n: usize, pace: Duration) -> Reply {
    let mut chunks = Vec::with_capacity(2 * n + 2);
    chunks.push(fake_model::pause(
        pace * stream as u32 / streams.max(1) as u32,
    ));
    for i in 0..n {
        chunks.push(fake_model::text(&format!("s{stream}t{i} ")));
        chunks.push(fake_model::pause(pace));
    }
    chunks.push(fake_model::finish("stop"));
    Reply::stream(chunks)
}

/// Each token's delay from the model's send to its reader, in ms, for
/// tokens named as [`named_reply`] names them.
fn named_lags(arrivals: &[(String, Instant)], sent: &[(String, Instant)]) -> Vec<f64> {
    let sent: std::collections::HashMap<&str, Instant> =
        sent.iter().map(|(text, at)| (text.trim(), *at)).collect();
    arrivals
        .iter()
        .filter_map(|(token, at)| {
            let sent = sent.get(token.as_str())?;
            Some(at.saturating_duration_since(*sent).as_secs_f64() * 1000.0)
        })
        .collect()
}

/// Every reader's arrivals, once all have ended.
async fn gathered(
    readers: impl Iterator<Item = tokio::task::JoinHandle<anyhow::Result<Vec<(String, Instant)>>>>,
) -> anyhow::Result<Vec<(String, Instant)>> {
    let mut arrivals = Vec::new();
    for reader in futures::future::join_all(readers).await {
        arrivals.extend(reader??);
    }
    Ok(arrivals)
}

/// `streams` streams of `tokens` tokens at once, read straight from the
/// model: each token's arrival.
async fn direct_arrivals_at_once(
    model: &FakeModel,
    streams: usize,
    tokens: usize,
    pace: Duration,
) -> anyhow::Result<Vec<(String, Instant)>> {
    for stream in 0..streams {
        model.push(named_reply(stream, streams, tokens, pace));
    }
    let http = reqwest::Client::new();
    let readers = (0..streams).map(|_| tokio::spawn(read_stream(http.clone(), model.base_url())));
    gathered(readers).await
}

/// `streams` sessions streaming `tokens` tokens each at once through
/// Agentry: each token's arrival at its session's subscriber.
async fn agentry_arrivals_at_once(
    stack: &Stack,
    model: &FakeModel,
    streams: usize,
    tokens: usize,
    pace: Duration,
) -> anyhow::Result<Vec<(String, Instant)>> {
    let mut clients = Vec::new();
    for _ in 0..streams.div_ceil(SESSIONS_PER_CONNECTION) {
        clients.push(stack.orchestrator().await?);
    }
    let mut sessions = Vec::with_capacity(streams);
    for i in 0..streams {
        let mut client = clients[i / SESSIONS_PER_CONNECTION].clone();
        let session = client
            .create_session(opb::CreateSessionRequest::default())
            .await?
            .into_inner();
        let events = follow(&mut client, &session.id).await?;
        sessions.push((client, session.id, events));
    }
    for stream in 0..streams {
        model.push(named_reply(stream, streams, tokens, pace));
    }
    let readers = sessions.into_iter().map(|(mut client, id, mut events)| {
        tokio::spawn(async move {
            submit(&mut client, &id, "stream").await?;
            let mut arrivals = Vec::new();
            while let Some(event) = events.next().await {
                let at = Instant::now();
                match event?.kind {
                    Some(spb::event::Kind::ModelTextDelta(d)) => {
                        arrivals.extend(d.text.split_whitespace().map(|t| (t.to_string(), at)));
                    }
                    Some(spb::event::Kind::TurnFinished(_)) => break,
                    _ => {}
                }
            }
            anyhow::Ok(arrivals)
        })
    });
    gathered(readers).await
}

/// Streaming overhead: each token's delay from the model's send to the
/// reader, straight from the model and through Agentry (durable deltas);
/// then with `streams` sessions streaming at once.
pub async fn streaming(bin: &Path, streams: usize) -> anyhow::Result<Value> {
    const TOKENS: usize = 2000;
    let pace = Duration::from_millis(1);
    let model = FakeModel::start().await?;
    model.forget_requests();
    let stack = Stack::start(bin, &model.base_url()).await?;
    println!(
        "\n== streaming: {TOKENS} tokens, one every {} ms",
        pace.as_millis()
    );
    model.push(paced_reply(TOKENS, pace));
    let _ = model.take_text_sent();
    let direct = direct_arrivals(&model).await?;
    let mut direct_lag = lags(&direct, &model.take_text_sent());
    model.push(paced_reply(TOKENS, pace));
    let (via, ttft) = agentry_arrivals(&stack).await?;
    let mut via_lag = lags(&via, &model.take_text_sent());
    anyhow::ensure!(
        direct.len() == TOKENS && via.len() == TOKENS,
        "expected {TOKENS} tokens, got {} directly and {} through Agentry",
        direct.len(),
        via.len()
    );
    let (d50, d99, dmax) = summary(&mut direct_lag);
    let (v50, v99, vmax) = summary(&mut via_lag);
    println!("time to first token through Agentry (submit → first delta): {ttft:.2} ms");
    println!("token delay, model send → reader (p50 / p99 / max ms):");
    println!("  straight from the model {d50:8.3} {d99:8.3} {dmax:8.3}");
    println!("  through Agentry         {v50:8.3} {v99:8.3} {vmax:8.3}");
    println!(
        "  added by Agentry        {:8.3} {:8.3}",
        v50 - d50,
        v99 - d99
    );

    // Many sessions at once, each at a model's pace (100 tokens/s).
    const LOAD_TOKENS: usize = 300;
    let load_pace = Duration::from_millis(10);
    println!(
        "{streams} streams at once, {LOAD_TOKENS} tokens each, one every {} ms \
         ({:.0} tokens/s in all):",
        load_pace.as_millis(),
        streams as f64 * 1000.0 / load_pace.as_millis() as f64
    );
    let _ = model.take_texts_sent();
    let direct = direct_arrivals_at_once(&model, streams, LOAD_TOKENS, load_pace).await?;
    let mut direct_lag = named_lags(&direct, &model.take_texts_sent());
    let cpu_before = stack.cpu_ms();
    let own_before = crate::stats::cpu_ms(std::process::id()).unwrap_or(0.0);
    let load_started = Instant::now();
    let via = agentry_arrivals_at_once(&stack, &model, streams, LOAD_TOKENS, load_pace).await?;
    let load_secs = load_started.elapsed().as_secs_f64();
    let own_ms = crate::stats::cpu_ms(std::process::id()).unwrap_or(0.0) - own_before;
    let cpu_after = stack.cpu_ms();
    let used = |name: &str| {
        cpu_after.get(name).copied().unwrap_or(0.0) - cpu_before.get(name).copied().unwrap_or(0.0)
    };
    let mut via_lag = named_lags(&via, &model.take_texts_sent());
    let expected = streams * LOAD_TOKENS;
    anyhow::ensure!(
        direct_lag.len() == expected && via_lag.len() == expected,
        "expected {expected} tokens, got {} directly and {} through Agentry",
        direct_lag.len(),
        via_lag.len()
    );
    let (ld50, ld99, ldmax) = summary(&mut direct_lag);
    let (lv50, lv99, lvmax) = summary(&mut via_lag);
    println!("  straight from the model {ld50:8.3} {ld99:8.3} {ldmax:8.3}");
    println!("  through Agentry         {lv50:8.3} {lv99:8.3} {lvmax:8.3}");
    println!(
        "  added by Agentry        {:8.3} {:8.3}",
        lv50 - ld50,
        lv99 - ld99
    );
    // What the machine spent, per token, while the sessions streamed
    // through Agentry (this process is the model and the readers).
    let tokens = expected as f64;
    let orchestrator_us = used("orchestrator") * 1000.0 / tokens;
    let others_us = ["session-store", "tool-runner", "scheduler"]
        .iter()
        .map(|name| used(name))
        .sum::<f64>()
        * 1000.0
        / tokens;
    let bench_us = own_ms * 1000.0 / tokens;
    let cores = (used("orchestrator") + own_ms) / 1000.0 / load_secs;
    println!(
        "  CPU per token: orchestrator {orchestrator_us:.1} µs, other services \
         {others_us:.1} µs, model and readers (this process) {bench_us:.1} µs; \
         {cores:.2} of 2 cores busy over {load_secs:.1} s"
    );
    Ok(json!({
        "load_orchestrator_cpu_us_per_token": orchestrator_us,
        "load_services_cpu_us_per_token": others_us,
        "load_bench_cpu_us_per_token": bench_us,
        "load_cores_busy": cores,
        "streams": streams, "load_tokens": LOAD_TOKENS,
        "load_pace_ms": load_pace.as_secs_f64() * 1000.0,
        "load_direct_p50_ms": ld50, "load_direct_p99_ms": ld99, "load_direct_max_ms": ldmax,
        "load_agentry_p50_ms": lv50, "load_agentry_p99_ms": lv99, "load_agentry_max_ms": lvmax,
        "load_added_p50_ms": lv50 - ld50, "load_added_p99_ms": lv99 - ld99,
        "tokens": TOKENS, "pace_ms": pace.as_secs_f64() * 1000.0,
        "ttft_agentry_ms": ttft,
        "direct_p50_ms": d50, "direct_p99_ms": d99, "direct_max_ms": dmax,
        "agentry_p50_ms": v50, "agentry_p99_ms": v99, "agentry_max_ms": vmax,
        "added_p50_ms": v50 - d50, "added_p99_ms": v99 - d99,
    }))
}

mod gateway;
mod large;
mod scale;
mod state;
mod tools;
mod workspace;

pub use gateway::gateway;
pub use large::large;
pub use scale::scale_out;
pub use state::{idle, lateness, reminders, store};
pub use tools::shell;
pub use workspace::{project, snapshots};
