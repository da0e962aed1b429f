//! Several orchestrators and runners against one store.

use super::*;

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
            let db = format!("bench{database}");
            let url = server.create_database(&db);
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
            let first = stack.add_orchestrator().await?;
            let second = match mode {
                "1" => None,
                _ => Some(stack.add_orchestrator().await?),
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
            let cost_before = PgCost::read(&server, &db, &stack).await?;
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
            let cost = PgCost::read(&server, &db, &stack)
                .await?
                .per_turn(&cost_before, count);
            let rate = count as f64 / elapsed;
            let (p50, p99, _) = summary(&mut latencies);
            println!("{mode:>28} {n:>9} {count:>7} {rate:>10.1} {p50:>9.2} {p99:>9.2} {errors:>7}");
            println!(
                "{:>28} per turn: {:.2} commits of appends, {:.0} bytes of WAL, {:.0} bytes of \
                 tables and indexes; CPU ms {}",
                "",
                cost["commits"].as_f64().unwrap_or(f64::NAN),
                cost["wal_bytes"].as_f64().unwrap_or(f64::NAN),
                cost["database_bytes"].as_f64().unwrap_or(f64::NAN),
                cost["cpu_ms"]
            );
            runs.push(json!({
                "orchestrators": mode, "sessions": n, "turns": count, "turns_per_sec": rate,
                "p50_ms": p50, "p99_ms": p99, "errors": errors, "per_turn": cost,
            }));
        }
    }
    Ok(json!({"runs": runs}))
}

/// What the database has done so far: the session store's commits of
/// appends (its own count: PostgreSQL's statistics lag by seconds, and its
/// transaction ids count each append's savepoint too), the WAL written,
/// the run's database's size, and CPU by process (the services, and
/// PostgreSQL with its connection processes).
struct PgCost {
    commits: f64,
    wal: f64,
    size: f64,
    cpu: std::collections::BTreeMap<String, f64>,
}

impl PgCost {
    async fn read(
        server: &agentry_testkit::postgres::Postgres,
        db: &str,
        stack: &Stack,
    ) -> anyhow::Result<PgCost> {
        let commits = stack.store_writes().await?.commits;
        let row = server.sql(
            db,
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'), \
             pg_database_size(current_database())",
        );
        let mut columns = row
            .split('|')
            .map(|c| c.trim().parse::<f64>().unwrap_or(f64::NAN));
        let mut next = || columns.next().unwrap_or(f64::NAN);
        let (wal, size) = (next(), next());
        let mut cpu: std::collections::BTreeMap<String, f64> = stack
            .cpu_ms()
            .into_iter()
            .map(|(service, ms)| (service.to_string(), ms))
            .collect();
        if let Some(ms) = server.pid().and_then(crate::stats::tree_cpu_ms) {
            cpu.insert("postgresql".into(), ms);
        }
        // The clients driving the turns (this process): a machine's whole
        // load per turn is the sum.
        if let Some(ms) = crate::stats::cpu_ms(std::process::id()) {
            cpu.insert("clients".into(), ms);
        }
        Ok(PgCost {
            commits,
            wal,
            size,
            cpu,
        })
    }

    /// The cost of each of `turns` turns run between `before` and `self`.
    fn per_turn(&self, before: &PgCost, turns: usize) -> Value {
        let per = |x: f64| x / turns.max(1) as f64;
        let cpu: serde_json::Map<String, Value> = self
            .cpu
            .iter()
            .map(|(name, ms)| {
                let spent = ms - before.cpu.get(name).copied().unwrap_or(0.0);
                (name.clone(), json!((per(spent) * 100.0).round() / 100.0))
            })
            .collect();
        json!({
            "commits": per(self.commits - before.commits),
            "wal_bytes": per(self.wal - before.wal),
            "database_bytes": per(self.size - before.size),
            "cpu_ms": cpu,
        })
    }
}
