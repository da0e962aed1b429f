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
    for _ in 0..turns {
        let (l, e) = session_turns(client.clone(), stack, 1).await?;
        latencies.extend(l);
        errors += e;
    }
    let busy_secs = latencies.iter().sum::<f64>() / 1000.0;
    let count = latencies.len();
    let rate = count as f64 / busy_secs;
    let (p50, p99, max) = summary(&mut latencies);
    println!(
        "{:>12} {count:>7} {rate:>10.1} {p50:>9.2} {p99:>9.2} {max:>9.2} {errors:>7}",
        "1 (fresh)"
    );
    Ok(json!({
        "mode": "sequential, a fresh session per turn",
        "sessions": 1, "turns": count, "turns_per_sec": rate,
        "p50_ms": p50, "p99_ms": p99, "max_ms": max, "errors": errors,
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
    let mut chunks = Vec::with_capacity(2 * n + 1);
    for i in 0..n {
        chunks.push(fake_model::text(&format!("t{i} ")));
        chunks.push(fake_model::pause(pace));
    }
    chunks.push(fake_model::finish("stop"));
    Reply::stream(chunks)
}

/// Token arrival instants, read straight from the model.
async fn direct_arrivals(model: &FakeModel) -> anyhow::Result<Vec<Instant>> {
    let http = reqwest::Client::new();
    let response = http
        .post(format!("{}/chat/completions", model.base_url()))
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
                arrivals.extend(text.split_whitespace().map(|_| at));
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

/// Streaming overhead: each token's delay from the model's send to the
/// reader, straight from the model and through Agentry (durable deltas).
pub async fn streaming(bin: &Path) -> anyhow::Result<Value> {
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
    Ok(json!({
        "tokens": TOKENS, "pace_ms": pace.as_secs_f64() * 1000.0,
        "ttft_agentry_ms": ttft,
        "direct_p50_ms": d50, "direct_p99_ms": d99, "direct_max_ms": dmax,
        "agentry_p50_ms": v50, "agentry_p99_ms": v99, "agentry_max_ms": vmax,
        "added_p50_ms": v50 - d50, "added_p99_ms": v99 - d99,
    }))
}

/// Runs one tool call of the shell scenario's session to its result;
/// fails unless it succeeded.
async fn execute_ok(
    runner: &mut ToolRunnerClient<agentry_testkit::cluster::Channel>,
    i: usize,
    tool: &str,
    args: Value,
) -> anyhow::Result<()> {
    let mut stream = runner
        .execute(ExecuteRequest {
            call_id: format!("{tool}-{i}"),
            session_id: "bench-shell".into(),
            tool: tool.into(),
            arguments_json: args.to_string(),
            timeout_ms: 0,
            network: false,
        })
        .await?
        .into_inner();
    let mut failure = Some("no result".to_string());
    while let Some(message) = stream.message().await? {
        if let Some(execute_response::Kind::Result(r)) = message.kind {
            failure = r.is_error.then(|| r.output.chars().take(500).collect());
        }
    }
    if let Some(why) = failure {
        anyhow::bail!("{tool} failed through the tool runner: {why}");
    }
    Ok(())
}

/// `bash` running `true` through the tool runner's `Execute`, `runs` times
/// after a warm-up, in ms each.
async fn shell_through(bin: &Path, sandbox: bool, runs: usize) -> anyhow::Result<Vec<f64>> {
    let extra = if sandbox {
        Vec::new()
    } else {
        vec![("AGENTRY_SANDBOX".to_string(), "off".to_string())]
    };
    let stack = Stack::start_with(bin, "http://127.0.0.1:9/v1", &["tool-runner"], &extra).await?;
    let mut runner = ToolRunnerClient::new(stack.as_service("tool-runner").await?);
    let mut through = Vec::with_capacity(runs);
    for i in 0..runs + 10 {
        let started = Instant::now();
        execute_ok(&mut runner, i, "bash", json!({"command": "true"})).await?;
        if i >= 10 {
            through.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    Ok(through)
}

/// A bare fork/exec of `program args`, `runs` times, in ms each.
async fn fork_exec(program: &str, args: &[&str], runs: usize) -> anyhow::Result<Vec<f64>> {
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        let status = tokio::process::Command::new(program)
            .args(args)
            .status()
            .await?;
        anyhow::ensure!(status.success(), "`{program}` failed");
        times.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(times)
}

/// The shell tool running `true`, with the OS sandbox and without, versus
/// a bare fork/exec of `true` (and of `bash -c true`, what the tool runs);
/// `read_file` through the same runner for comparison.
pub async fn shell(bin: &Path) -> anyhow::Result<Value> {
    const RUNS: usize = 300;
    println!("\n== shell: `true`, {RUNS} runs each");
    let mut sandboxed = shell_through(bin, true, RUNS).await?;
    let mut plain = shell_through(bin, false, RUNS).await?;
    // A file tool: no process, but a thread of its own with the session's
    // identity and a Landlock domain.
    let stack = Stack::start_only(bin, "http://127.0.0.1:9/v1", &["tool-runner"]).await?;
    let mut runner = ToolRunnerClient::new(stack.as_service("tool-runner").await?);
    execute_ok(
        &mut runner,
        0,
        "write_file",
        json!({"path": "bench.txt", "content": "hello\n"}),
    )
    .await?;
    let mut read = Vec::with_capacity(RUNS);
    for i in 0..RUNS + 10 {
        let started = Instant::now();
        execute_ok(&mut runner, i, "read_file", json!({"path": "bench.txt"})).await?;
        if i >= 10 {
            read.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    let mut bare = fork_exec("true", &[], RUNS).await?;
    let mut bash = fork_exec("bash", &["-c", "true"], RUNS).await?;
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let mut figures = serde_json::Map::new();
    let mut line = |name: &str, label: &str, v: &mut Vec<f64>| {
        let m = mean(v);
        let (p50, p99, _) = summary(v);
        println!("{label:<34} mean {m:6.2} ms, p50 {p50:6.2}, p99 {p99:6.2}");
        figures.insert(format!("{name}_mean_ms"), json!(m));
        figures.insert(format!("{name}_p50_ms"), json!(p50));
        figures.insert(format!("{name}_p99_ms"), json!(p99));
        m
    };
    let on = line(
        "sandbox_on",
        "bash through the runner, sandbox on",
        &mut sandboxed,
    );
    let off = line(
        "sandbox_off",
        "bash through the runner, sandbox off",
        &mut plain,
    );
    line("read_file", "read_file through the runner", &mut read);
    let exec = line("fork_exec", "fork/exec of `true`", &mut bare);
    let bash_exec = line("bash_exec", "fork/exec of `bash -c true`", &mut bash);
    println!(
        "ratio to fork/exec (mean): {:.2}x with the sandbox, {:.2}x without",
        on / exec,
        off / exec
    );
    println!(
        "  of which: bash itself {:.2} ms, the runner (gRPC, limits, capture, quota) {:.2} ms, \
         the sandbox's set-up {:.2} ms",
        bash_exec - exec,
        off - bash_exec,
        on - off
    );
    figures.insert("runs".into(), json!(RUNS));
    figures.insert("ratio_sandbox_on".into(), json!(on / exec));
    figures.insert("ratio_sandbox_off".into(), json!(off / exec));
    figures.insert("ratio".into(), json!(on / exec));
    Ok(Value::Object(figures))
}

/// Reminder lateness among N pending (the scheduler's real worker over its
/// store on disk).
pub async fn reminders(pending: &[usize]) -> anyhow::Result<Value> {
    println!(
        "\n== reminders: {} falling due over {} s among N pending",
        crate::scenarios::lateness::SAMPLE,
        crate::scenarios::lateness::WINDOW.as_secs()
    );
    println!(
        "{:>10} {:>8} {:>10} {:>10} {:>10}",
        "pending", "fired", "p50 ms", "p99 ms", "max ms"
    );
    let mut runs = Vec::new();
    for &n in pending {
        let (p50, p99, max, fired) = lateness::measure(n).await?;
        println!("{n:>10} {fired:>8} {p50:>10.2} {p99:>10.2} {max:>10.2}");
        runs.push(
            json!({"pending": n, "fired": fired, "p50_ms": p50, "p99_ms": p99, "max_ms": max}),
        );
    }
    Ok(json!({"runs": runs}))
}

/// Durable appends of one small event, one writer and 16 concurrent.
pub async fn store(bin: &Path) -> anyhow::Result<Value> {
    const PER_WRITER: usize = 500;
    // The store alone: no orchestrator takes these sessions for its own.
    let stack = Stack::start_only(bin, "http://127.0.0.1:9/v1", &["session-store"]).await?;
    let channel = stack.as_service("session-store").await?;
    println!("\n== store: appends of one event, each durable (fsynced) before the answer");
    println!(
        "{:>8} {:>8} {:>12} {:>9} {:>9}",
        "writers", "appends", "appends/s", "p50 ms", "p99 ms"
    );
    let mut runs = Vec::new();
    for writers in [1usize, 16] {
        let appends = if writers == 1 {
            2 * PER_WRITER
        } else {
            PER_WRITER
        };
        let started = Instant::now();
        let tasks = (0..writers).map(|_| {
            let mut client = SessionStoreClient::new(channel.clone());
            async move {
                let session = client
                    .create_session(spb::CreateSessionRequest::default())
                    .await?
                    .into_inner();
                let mut latencies = Vec::with_capacity(appends);
                for seq in 1..=appends as u64 {
                    let t = Instant::now();
                    client
                        .append(spb::AppendRequest {
                            session_id: session.id.clone(),
                            expected_seq: seq,
                            events: vec![spb::Event {
                                kind: Some(spb::event::Kind::UserMessage(spb::UserMessage {
                                    images: Vec::new(),
                                    text: "a message of about sixty bytes, as a short chat line is"
                                        .into(),
                                    approval_mode: 0,
                                    plan: false,
                                    network: false,
                                    budget: None,
                                    compact: false,
                                })),
                                ..Default::default()
                            }],
                            lease_epoch: 0,
                        })
                        .await?;
                    latencies.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                anyhow::Ok(latencies)
            }
        });
        let mut latencies = Vec::new();
        for result in futures::future::join_all(tasks).await {
            latencies.extend(result?);
        }
        let rate = latencies.len() as f64 / started.elapsed().as_secs_f64();
        let count = latencies.len();
        let (p50, p99, _) = summary(&mut latencies);
        println!("{writers:>8} {count:>8} {rate:>12.1} {p50:>9.2} {p99:>9.2}");
        runs.push(json!({"writers": writers, "appends": count, "appends_per_sec": rate, "p50_ms": p50, "p99_ms": p99}));
    }
    Ok(json!({"runs": runs}))
}

/// Orchestrator memory per idle session: N sessions that each ran a turn.
pub async fn idle(bin: &Path, sessions: usize) -> anyhow::Result<Value> {
    let model = FakeModel::start().await?;
    model.forget_requests();
    model.set_fallback(react_model());
    let stack = Stack::start(bin, &model.base_url()).await?;
    println!("\n== idle: {sessions} sessions that each ran one turn, then idle");
    turn_run_quiet(&stack).await?;
    let pid = stack
        .pid("orchestrator")
        .ok_or_else(|| anyhow::anyhow!("no orchestrator process"))?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = crate::stats::status_kib(pid, "VmRSS").unwrap_or(0);
    let mut clients = Vec::new();
    for _ in 0..sessions.div_ceil(SESSIONS_PER_CONNECTION) {
        clients.push(stack.orchestrator().await?);
    }
    // Fifty at a time: this measures memory, not throughput.
    let mut errors = 0;
    for batch in (0..sessions).collect::<Vec<_>>().chunks(50) {
        let runs = batch
            .iter()
            .map(|&i| session_turns(clients[i / SESSIONS_PER_CONNECTION].clone(), &stack, 1));
        for result in futures::future::join_all(runs).await {
            errors += result.map(|(_, e)| e).unwrap_or(1);
        }
    }
    drop(clients);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = crate::stats::status_kib(pid, "VmRSS").unwrap_or(0);
    let per_session_kib = after.saturating_sub(before) as f64 / sessions as f64;
    println!(
        "orchestrator RSS {:.1} MiB → {:.1} MiB: {per_session_kib:.1} KiB per idle session ({errors} errors)",
        before as f64 / 1024.0,
        after as f64 / 1024.0
    );
    Ok(json!({
        "sessions": sessions, "rss_before_mib": before as f64 / 1024.0,
        "rss_after_mib": after as f64 / 1024.0, "kib_per_session": per_session_kib,
        "errors": errors,
    }))
}

pub mod lateness {
    //! How late do reminders fire? N pending reminders in a fresh scheduler
    //! store (SQLite on disk, durable writes), of which a sample falls due
    //! over a few seconds and the rest far in the future; the real firing
    //! worker runs; for each sample reminder, the time from its due time to
    //! the moment its firing was handed to delivery.

    use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
    use agentry_scheduler::schedule::MissedPolicy;
    use agentry_scheduler::store::{Kind, NewReminder, Store};
    use agentry_scheduler::{Core, Settings, SystemClock};
    use chrono::Utc;
    use std::sync::Arc;
    use std::time::Duration;

    /// Reminders that fall due during the measurement.
    pub const SAMPLE: usize = 1000;
    /// Over how long the sample falls due.
    pub const WINDOW: Duration = Duration::from_secs(5);

    /// (p50, p99, max) lateness in ms, and how many fired.
    pub async fn measure(pending: usize) -> anyhow::Result<(f64, f64, f64, usize)> {
        let dir = tempfile::tempdir()?;
        let store = Arc::new(Store::open(&dir.path().join("scheduler.db"))?);
        let now = Utc::now();
        let start = now + chrono::Duration::seconds(2);
        let sample = SAMPLE.min(pending);
        let mut reminders = Vec::with_capacity(pending);
        for i in 0..pending {
            let due = if i < sample {
                start
                    + chrono::Duration::microseconds(
                        (WINDOW.as_micros() as i64 * i as i64) / sample as i64,
                    )
            } else {
                now + chrono::Duration::days(1) + chrono::Duration::seconds(i as i64)
            };
            reminders.push(NewReminder {
                session_id: "bench".into(),
                message: format!("reminder {i}"),
                kind: Kind::Notify,
                due,
                recurrence: None,
                missed: MissedPolicy::Once,
            });
        }
        let store = agentry_scheduler::Backend::Sqlite(store);
        store.create_many(reminders, now).await?;
        // The worker never checks sessions; this client is never dialled.
        let sessions = SessionStoreClient::new(
            agentry_runtime::Auth::off().lazy_channel("http://127.0.0.1:9")?,
        );
        let core = Core::new(
            store,
            Arc::new(SystemClock),
            Settings::default(),
            sessions,
            "unused".into(),
        );
        let mut fired = core.subscribe_fired();
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let worker = tokio::spawn(core.clone().run_worker(stop));
        let mut lateness = Vec::with_capacity(sample);
        let deadline = tokio::time::Instant::now() + WINDOW + Duration::from_secs(10);
        while lateness.len() < sample {
            let firing = tokio::time::timeout_at(deadline, fired.recv()).await??;
            let observed = Utc::now();
            lateness.push((observed - firing.due).num_microseconds().unwrap_or(0) as f64 / 1000.0);
        }
        let _ = stop_tx.send(true);
        worker.abort();
        let (p50, p99, max) = crate::stats::summary(&mut lateness);
        Ok((p50, p99, max, sample))
    }
}

/// Workspace snapshots of a 10,000-file workspace (100 directories of 100
/// small files, written by the session's own shell): the first snapshot
/// (every file stored), again unchanged (nothing read), after 10 files
/// changed, and a restore after 1,000 files were deleted.
pub async fn snapshots(bin: &Path) -> anyhow::Result<Value> {
    use agentry_proto::tools::v1::{RestoreSnapshotRequest, SnapshotRequest};
    const RUNS: usize = 5;
    let stack = Stack::start_only(bin, "http://127.0.0.1:9/v1", &["tool-runner"]).await?;
    let mut runner = ToolRunnerClient::new(stack.as_service("tool-runner").await?);
    let shell = |command: &str| json!({"command": command, "timeout_secs": 300});
    execute_ok(
        &mut runner,
        0,
        "bash",
        shell(
            "for d in $(seq -w 0 99); do mkdir -p d$d; for f in $(seq -w 0 99); do \
             echo \"file $d/$f: some content of a small source file\" > d$d/f$f.txt; done; done",
        ),
    )
    .await?;
    let request = SnapshotRequest {
        session_id: "bench-shell".into(),
    };
    println!("\n== snapshots: a workspace of 10,000 files in 100 directories");
    let started = Instant::now();
    let first = runner.snapshot(request.clone()).await?.into_inner();
    let first_ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(first.files == 10_000, "{} files recorded", first.files);
    let mut unchanged = Vec::new();
    for _ in 0..RUNS {
        let started = Instant::now();
        let again = runner.snapshot(request.clone()).await?.into_inner();
        unchanged.push(started.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            again.snapshot_id == first.snapshot_id,
            "an unchanged workspace gave another snapshot"
        );
    }
    let mut changed = Vec::new();
    let mut new_bytes = 0;
    for run in 0..RUNS {
        execute_ok(
            &mut runner,
            run + 1,
            "bash",
            shell(&format!(
                "for d in $(seq 0 9); do echo run {run} >> d0$d/f00.txt; done"
            )),
        )
        .await?;
        let started = Instant::now();
        let taken = runner.snapshot(request.clone()).await?.into_inner();
        changed.push(started.elapsed().as_secs_f64() * 1000.0);
        new_bytes = taken.new_bytes;
    }
    execute_ok(&mut runner, 99, "bash", shell("rm -r d0[0-9]")).await?;
    let started = Instant::now();
    let restored = runner
        .restore_snapshot(RestoreSnapshotRequest {
            session_id: "bench-shell".into(),
            snapshot_id: first.snapshot_id.clone(),
        })
        .await?
        .into_inner();
    let restore_ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        restored.written >= 1_000,
        "the restore wrote {} entries",
        restored.written
    );
    let store = stack.data.path().join("workspaces/.snapshots");
    let stored = du(&store);
    let workspace = du(&stack.workspace("bench-shell"));
    let (u50, u99, _) = summary(&mut unchanged);
    let (c50, c99, _) = summary(&mut changed);
    println!(
        "first snapshot:     {first_ms:>8.1} ms  ({} files, {} bytes stored)",
        first.files, first.new_bytes
    );
    println!("unchanged again:    {u50:>8.1} ms p50, {u99:.1} p99");
    println!("10 files changed:   {c50:>8.1} ms p50, {c99:.1} p99 ({new_bytes} new bytes)");
    println!(
        "restore 1,000 deleted files + 10 changed: {restore_ms:.1} ms ({} written, {} unchanged)",
        restored.written, restored.unchanged
    );
    println!(
        "disk: workspace {:.1} MiB, store {:.1} MiB after {} snapshots",
        workspace as f64 / 1_048_576.0,
        stored as f64 / 1_048_576.0,
        RUNS + 1
    );
    Ok(json!({
        "files": first.files,
        "first_ms": first_ms,
        "unchanged_p50_ms": u50, "unchanged_p99_ms": u99,
        "changed_p50_ms": c50, "changed_p99_ms": c99,
        "restore_ms": restore_ms, "restore_written": restored.written,
        "workspace_bytes_on_disk": workspace, "store_bytes_on_disk": stored,
    }))
}

/// Workspace snapshots of a person's project: a repository of 50,000
/// files in 500 directories with a `.git` of 2,000 objects and an ignored
/// 1 GiB build directory (`target/`: 64 files of 16 MiB and 10,000 small
/// ones). The first snapshot, again unchanged, after 10 files changed, and
/// a restore after 1,000 files were deleted; the build directory and `.git`
/// are never read nor touched.
pub async fn project(bin: &Path) -> anyhow::Result<Value> {
    use agentry_proto::tools::v1::{OpenProjectRequest, RestoreSnapshotRequest, SnapshotRequest};
    use std::os::unix::fs::PermissionsExt;
    const RUNS: usize = 5;
    let home = tempfile::tempdir()?;
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755))?;
    let repo = home.path().join("repo");
    println!("\n== project: 50,000 files, .git, and an ignored 1 GiB target/");
    let made = Instant::now();
    for d in 0..500 {
        let dir = repo.join(format!("src/m{d:03}"));
        std::fs::create_dir_all(&dir)?;
        for f in 0..100 {
            std::fs::write(
                dir.join(format!("f{f:02}.rs")),
                format!("// module {d}, file {f}\npub fn f{f}() -> u32 {{ {f} }}\n"),
            )?;
        }
    }
    std::fs::write(repo.join(".gitignore"), "/target\n")?;
    for o in 0..2_000 {
        let dir = repo.join(format!(".git/objects/{:02x}", o % 256));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("{o:038x}")), format!("object {o}"))?;
    }
    let big = vec![7u8; 16 << 20];
    std::fs::create_dir_all(repo.join("target/release/deps"))?;
    for n in 0..64 {
        std::fs::write(repo.join(format!("target/release/deps/lib{n}.rlib")), &big)?;
    }
    for n in 0..10_000 {
        std::fs::write(repo.join(format!("target/release/deps/d{n}.d")), "dep")?;
    }
    if nix::unistd::geteuid().is_root() {
        // Commands and snapshots run as the project's owner, never root.
        let status = std::process::Command::new("chown")
            .args(["-R", "4242:4242", &repo.display().to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "chown failed");
    }
    println!(
        "made the repository in {:.1} s ({:.1} GiB on disk)",
        made.elapsed().as_secs_f64(),
        du(&repo) as f64 / (1u64 << 30) as f64
    );
    let roots = [(
        "AGENTRY_PROJECT_ROOTS".to_string(),
        home.path().display().to_string(),
    )];
    let stack = Stack::start_with(bin, "http://127.0.0.1:9/v1", &["tool-runner"], &roots).await?;
    let mut runner = ToolRunnerClient::new(stack.as_service("tool-runner").await?);
    let session = "bench-project".to_string();
    runner
        .open_project(OpenProjectRequest {
            session_id: session.clone(),
            dir: repo.display().to_string(),
            check_only: false,
        })
        .await?;
    let request = SnapshotRequest {
        session_id: session.clone(),
    };
    let started = Instant::now();
    let first = runner.snapshot(request.clone()).await?.into_inner();
    let first_ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        first.files == 50_001,
        "{} files recorded (50,000 and .gitignore expected)",
        first.files
    );
    let mut unchanged = Vec::new();
    for _ in 0..RUNS {
        let started = Instant::now();
        let again = runner.snapshot(request.clone()).await?.into_inner();
        unchanged.push(started.elapsed().as_secs_f64() * 1000.0);
        anyhow::ensure!(
            again.snapshot_id == first.snapshot_id,
            "unchanged, yet another snapshot"
        );
    }
    let mut changed = Vec::new();
    for run in 0..RUNS {
        for d in 0..10 {
            let file = repo.join(format!("src/m{d:03}/f00.rs"));
            let mut text = std::fs::read_to_string(&file)?;
            text.push_str(&format!("// run {run}\n"));
            std::fs::write(&file, text)?;
        }
        let started = Instant::now();
        runner.snapshot(request.clone()).await?;
        changed.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    for d in 0..10 {
        std::fs::remove_dir_all(repo.join(format!("src/m{d:03}")))?;
    }
    std::fs::write(repo.join("target/release/deps/d0.d"), "rebuilt")?;
    let started = Instant::now();
    let restored = runner
        .restore_snapshot(RestoreSnapshotRequest {
            session_id: session.clone(),
            snapshot_id: first.snapshot_id.clone(),
        })
        .await?
        .into_inner();
    let restore_ms = started.elapsed().as_secs_f64() * 1000.0;
    anyhow::ensure!(
        std::fs::read_to_string(repo.join("target/release/deps/d0.d"))? == "rebuilt",
        "the restore touched the ignored build directory"
    );
    anyhow::ensure!(
        repo.join("src/m000/f00.rs").exists() && repo.join(".git/objects/00").exists(),
        "the restore did not put the files back, or touched .git"
    );
    let (u50, u99, _) = summary(&mut unchanged);
    let (c50, c99, _) = summary(&mut changed);
    println!(
        "first snapshot:     {first_ms:>8.1} ms  ({} files, {} bytes stored)",
        first.files, first.new_bytes
    );
    println!("unchanged again:    {u50:>8.1} ms p50, {u99:.1} p99");
    println!("10 files changed:   {c50:>8.1} ms p50, {c99:.1} p99");
    println!(
        "restore 1,000 deleted files: {restore_ms:.1} ms ({} written, {} unchanged)",
        restored.written, restored.unchanged
    );
    Ok(json!({
        "files": first.files,
        "first_ms": first_ms,
        "unchanged_p50_ms": u50, "unchanged_p99_ms": u99,
        "changed_p50_ms": c50, "changed_p99_ms": c99,
        "restore_ms": restore_ms, "restore_written": restored.written,
    }))
}

/// Bytes a directory tree takes on disk (allocated blocks).
fn du(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    let mut total = meta.blocks() * 512;
    if meta.is_dir()
        && let Ok(entries) = std::fs::read_dir(path)
    {
        for entry in entries.flatten() {
            total += du(&entry.path());
        }
    }
    total
}

/// Turns on PostgreSQL: one orchestrator, then two (each driving the
/// sessions it receives), then two with every input reaching the replica
/// that does not drive its session (forwarded). A fresh database each time.
pub async fn scale_out(bin: &Path, turns: usize, sessions: &[usize]) -> anyhow::Result<Value> {
    let Some(server) = agentry_testkit::postgres::Postgres::start() else {
        anyhow::bail!("the scale-out scenario needs PostgreSQL (apt-get install postgresql)");
    };
    let model = FakeModel::start().await?;
    model.forget_requests();
    model.set_fallback(react_model());
    println!("\n== scale-out: turns on PostgreSQL, one orchestrator versus two");
    println!(
        "{:>28} {:>9} {:>7} {:>10} {:>9} {:>9} {:>7}",
        "orchestrators", "sessions", "turns", "turns/s", "p50 ms", "p99 ms", "errors"
    );
    let mut runs = Vec::new();
    let mut database = 0;
    for &n in sessions {
        for mode in ["1", "2", "2, inputs forwarded"] {
            database += 1;
            let url = server.create_database(&format!("bench{database}"));
            let mut stack = Stack::start_with(
                bin,
                &model.base_url(),
                &["session-store", "tool-runner", "scheduler"],
                &[
                    ("AGENTRY_SESSION_STORE_DATABASE_URL".into(), url.clone()),
                    ("AGENTRY_SCHEDULER_DATABASE_URL".into(), url.clone()),
                ],
            )
            .await?;
            let first = stack.add_orchestrator(bin).await?;
            let second = match mode {
                "1" => None,
                _ => Some(stack.add_orchestrator(bin).await?),
            };
            let turns_each = (turns / n).max(2);
            // Where sessions are driven: the first replica, or both in turn.
            let mut drivers = vec![first.clone()];
            if let (Some(second), "2") = (&second, mode) {
                drivers.push(second.clone());
            }
            let per_driver = n.div_ceil(drivers.len());
            let mut pools = Vec::new();
            for url in &drivers {
                let mut pool = Vec::new();
                for _ in 0..per_driver.div_ceil(SESSIONS_PER_CONNECTION) {
                    pool.push(stack.orchestrator_at(url).await?);
                }
                pools.push(pool);
            }
            // Forwarded: inputs go to the replica that does not drive.
            let other = match (&second, mode) {
                (Some(second), "2, inputs forwarded") => Some(stack.orchestrator_at(second).await?),
                _ => None,
            };
            let started = Instant::now();
            let runs_of = (0..n).map(|i| {
                let pool = &pools[i % pools.len()];
                let client = pool[(i / pools.len()) / SESSIONS_PER_CONNECTION].clone();
                session_turns_via(client, other.clone(), &stack, turns_each)
            });
            let results = futures::future::join_all(runs_of).await;
            let elapsed = started.elapsed().as_secs_f64();
            let mut latencies = Vec::new();
            let mut errors = 0;
            for result in results {
                match result {
                    Ok((l, e)) => {
                        latencies.extend(l);
                        errors += e;
                    }
                    Err(e) => {
                        eprintln!("  a session failed: {e:#}");
                        errors += turns_each;
                    }
                }
            }
            let count = latencies.len();
            let rate = count as f64 / elapsed;
            let (p50, p99, _) = summary(&mut latencies);
            println!("{mode:>28} {n:>9} {count:>7} {rate:>10.1} {p50:>9.2} {p99:>9.2} {errors:>7}");
            runs.push(json!({
                "orchestrators": mode, "sessions": n, "turns": count, "turns_per_sec": rate,
                "p50_ms": p50, "p99_ms": p99, "errors": errors,
            }));
        }
    }
    Ok(json!({"runs": runs}))
}
