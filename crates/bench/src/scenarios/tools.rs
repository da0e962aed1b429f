//! The shell tool's cost, through the runner and bare.

use super::*;

/// Runs one tool call of the shell scenario's session to its result;
/// fails unless it succeeded.
pub(super) async fn execute_ok(
    runner: &mut ToolRunnerClient<agentry_testkit::cluster::Channel>,
    i: usize,
    tool: &str,
    args: Value,
) -> anyhow::Result<()> {
    execute_in(runner, "bench-shell", i, tool, args).await
}

/// Runs one tool call of `session` to its result; fails unless it
/// succeeded.
async fn execute_in(
    runner: &mut ToolRunnerClient<agentry_testkit::cluster::Channel>,
    session: &str,
    i: usize,
    tool: &str,
    args: Value,
) -> anyhow::Result<()> {
    let mut stream = runner
        .execute(ExecuteRequest {
            call_id: format!("{tool}-{i}"),
            session_id: session.into(),
            tool: tool.into(),
            arguments_json: args.to_string(),
            timeout_ms: 0,
            network: false,
            resume: None,
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
/// How the shell scenario's commands are confined.
#[derive(Clone, Copy)]
enum Confined {
    /// The OS sandbox, forked from the session's sandbox (the default).
    PerSession,
    /// The OS sandbox, a new one per command (`session_idle_secs = 0`).
    PerCommand,
    /// No OS sandbox.
    Off,
}

/// `true` through the runner `runs` times in one session (after ten to
/// warm up), and the first command of `firsts` new sessions (with the
/// sandbox: each starts its session's sandbox), in ms each.
async fn shell_through(
    bin: &Path,
    sandbox: Confined,
    runs: usize,
    firsts: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let variable = |name: &str, value: &str| vec![(name.to_string(), value.to_string())];
    let extra = match sandbox {
        Confined::PerSession => Vec::new(),
        Confined::PerCommand => variable("AGENTRY_SANDBOX_SESSION_IDLE_SECS", "0"),
        Confined::Off => variable("AGENTRY_SANDBOX", "off"),
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
    let mut first = Vec::with_capacity(firsts);
    for i in 0..firsts {
        let session = format!("bench-first-{i}");
        let started = Instant::now();
        execute_in(&mut runner, &session, 0, "bash", json!({"command": "true"})).await?;
        first.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    Ok((through, first))
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
    const FIRSTS: usize = 30;
    let (mut sandboxed, mut first) = shell_through(bin, Confined::PerSession, RUNS, FIRSTS).await?;
    let (mut per_command, _) = shell_through(bin, Confined::PerCommand, RUNS, 0).await?;
    let (mut plain, _) = shell_through(bin, Confined::Off, RUNS, 0).await?;
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
    let alone = line(
        "sandbox_per_command",
        "sandbox on, one per command (before)",
        &mut per_command,
    );
    line(
        "session_first",
        "a session's first command, sandbox on",
        &mut first,
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
        "  of which: bash itself {:.2} ms, the runner without the sandbox (gRPC, limits, \
         capture, quota, its own fork) {:.2} ms; with the session's sandbox {:+.2} ms against \
         that, with a sandbox per command {:+.2} ms",
        bash_exec - exec,
        off - bash_exec,
        on - off,
        alone - off
    );
    println!(
        "a sandbox per command instead (tool_runner.sandbox.session_idle_secs = 0): {:.2}x",
        alone / exec
    );
    figures.insert("ratio_sandbox_per_command".into(), json!(alone / exec));
    figures.insert("runs".into(), json!(RUNS));
    figures.insert("ratio_sandbox_on".into(), json!(on / exec));
    figures.insert("ratio_sandbox_off".into(), json!(off / exec));
    figures.insert("ratio".into(), json!(on / exec));
    Ok(Value::Object(figures))
}
