//! What a command the agent runs can reach, tried through a real turn:
//! the model (the attacker here) asks for bash, every call is approved.

use agentry_testkit::Cluster;

/// Runs `command` through a turn in a new session; returns the tool output.
async fn run_in_a_turn(cluster: &Cluster, command: &str) -> String {
    crate::network::run_in_a_turn(cluster, &[command.to_string()])
        .await
        .remove(0)
}

fn port(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_reaches_no_service_and_no_credential() {
    let cluster = Cluster::start().await.unwrap();
    let c = &cluster.config;
    let ports: Vec<String> = [
        &c.orchestrator.url,
        &c.session_store.url,
        &c.tool_runner.url,
        &c.scheduler.url,
        &c.llm.base_url.trim_end_matches("/v1").to_string(),
    ]
    .iter()
    .map(|u| port(u).to_string())
    .collect();
    let auth_dir = cluster.data_dir().join("auth");
    let command = format!(
        "for p in {ports}; do \
           for h in 127.0.0.1 localhost; do \
             if (exec 3<>/dev/tcp/$h/$p) 2>/dev/null; then echo \"OPEN $h:$p\"; \
             else echo \"closed $h:$p\"; fi; \
           done; \
         done; \
         cat {auth}/client.token {auth}/service.token 2>&1 | head -c 400; echo; \
         ls {data} 2>&1 | head -c 400; echo; \
         echo ENV; env; echo PARENT; cat /proc/$PPID/environ 2>&1 | tr '\\0' '\\n'; \
         echo INIT; cat /proc/1/environ 2>&1 | tr '\\0' '\\n'",
        ports = ports.join(" "),
        auth = auth_dir.display(),
        data = cluster.data_dir().display(),
    );
    let output = run_in_a_turn(&cluster, &command).await;
    assert!(
        !output.contains("OPEN"),
        "a service port is reachable:\n{output}"
    );
    assert_eq!(
        output.matches("closed ").count(),
        ports.len() * 2,
        "every port was tried:\n{output}"
    );
    for token in [cluster.auth.client_token(), cluster.auth.service_token()] {
        let secret = token.unwrap().secret();
        assert!(!output.contains(secret), "a token was read:\n{output}");
    }
    assert!(
        !output.contains("sessions.db"),
        "the data dir was listed:\n{output}"
    );
    // The services' environment (this test process: Cargo's variables) is
    // not inherited, and no process a command can see carries it.
    for canary in ["CARGO_MANIFEST_DIR", "CARGO_PKG_NAME", "RUST_TEST_THREADS"] {
        assert!(
            !output.contains(canary),
            "{canary} leaked into a command:\n{output}"
        );
    }
    assert!(output.contains("ENV\n"), "{output}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_detached_process_does_not_outlive_its_call() {
    let cluster = Cluster::start().await.unwrap();
    let marker = format!("sleep 31{}", std::process::id() % 1000);
    let command = format!(
        "setsid -f {marker}; nohup {marker} >/dev/null 2>&1 & \
         ( ( {marker} & ) & ); disown -a; echo started"
    );
    let output = run_in_a_turn(&cluster, &command).await;
    assert!(output.contains("started"), "{output}");
    // The call has ended: nothing it started may still run.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let alive = processes_running(&marker);
        if alive.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "processes outlived their call: {alive:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Pids whose command line is `cmdline` (words separated by spaces).
fn processes_running(cmdline: &str) -> Vec<u32> {
    let wanted: Vec<&str> = cmdline.split(' ').collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
                let words: Vec<&str> = raw
                    .split(|b| *b == 0)
                    .filter(|w| !w.is_empty())
                    .filter_map(|w| std::str::from_utf8(w).ok())
                    .collect();
                words == wanted
            })
        })
        .collect()
}
