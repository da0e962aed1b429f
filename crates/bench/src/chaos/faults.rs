//! Faults injected at random, several at once: a process killed
//! (SIGKILL) and started again, paused (SIGSTOP) past a lease and resumed,
//! its connections cut or slowed at its proxy, the data directory's disk
//! filled and freed, PostgreSQL killed and started again. The schedule
//! (when, what, which, how long) comes from the seed alone.

use super::Rng;
use super::fleet::{Fleet, Link, Proc};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The kinds of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// SIGKILL, then started again.
    Kill,
    /// SIGSTOP past a lease, then SIGCONT.
    Pause,
    /// Connections to a service dropped and refused for a while.
    Cut,
    /// Every piece of data to and from a service delayed for a while.
    Slow,
    /// The data directory's file system filled, then freed.
    DiskFull,
    /// PostgreSQL killed (immediate stop), then started again.
    Database,
    /// A scheduler's wall clock moved forwards or backwards, then back.
    ClockJump,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::Pause => "pause",
            Kind::Cut => "cut",
            Kind::Slow => "slow",
            Kind::DiskFull => "disk-full",
            Kind::Database => "postgres-kill",
            Kind::ClockJump => "clock-jump",
        }
    }
}

/// One fault as it happened.
#[derive(Debug, Clone)]
pub struct Fault {
    pub kind: Kind,
    pub target: String,
    /// When it began, from the start of the faults.
    pub at: Duration,
    /// From its end until the target answered again.
    pub recovery: Option<Duration>,
    /// What went wrong bringing the target back.
    pub problem: Option<String>,
}

/// What faults can be injected besides the processes'.
pub struct Extras {
    /// A small file system holding the data directory (`DiskFull`).
    pub disk: Option<PathBuf>,
    /// PostgreSQL (`Database`).
    pub postgres: Option<Arc<std::sync::Mutex<agentry_testkit::postgres::Postgres>>>,
}

/// How long a paused process stays paused: past the orchestrators'
/// session lease and the scheduler's firing lease.
const PAUSE: (u64, u64) = (3_000, 12_000);

/// Injects faults for `length`, returns them in the order they began.
pub async fn inject(
    fleet: Arc<Fleet>,
    extras: Arc<Extras>,
    seed: u64,
    length: Duration,
) -> Vec<Fault> {
    let mut rng = Rng::new(seed ^ 0x00fa_0170);
    let started = Instant::now();
    let mut kinds = vec![Kind::Kill, Kind::Pause, Kind::Cut, Kind::Slow];
    if extras.disk.is_some() {
        kinds.push(Kind::DiskFull);
    }
    if extras.postgres.is_some() {
        kinds.push(Kind::Database);
    }
    let clocks: Vec<Arc<Proc>> = fleet
        .procs
        .iter()
        .filter(|p| p.clock.is_some())
        .cloned()
        .collect();
    if !clocks.is_empty() {
        kinds.push(Kind::ClockJump);
    }
    let busy: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>> = Arc::default();
    let mut running = Vec::new();
    let mut at = Duration::ZERO;
    loop {
        // The next fault: 0.5–3 s after the last one began.
        at += Duration::from_millis(500 + rng.below(2_500));
        if at >= length {
            break;
        }
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let pick = rng.below(fleet.procs.len() as u64) as usize;
        let proc = match kind {
            Kind::ClockJump => clocks[pick % clocks.len().max(1)].clone(),
            _ => fleet.procs[pick].clone(),
        };
        let hold = match kind {
            Kind::Kill => Duration::from_millis(200 + rng.below(1_800)),
            Kind::Pause => Duration::from_millis(PAUSE.0 + rng.below(PAUSE.1 - PAUSE.0)),
            Kind::Cut => Duration::from_millis(1_000 + rng.below(4_000)),
            Kind::Slow => Duration::from_millis(3_000 + rng.below(7_000)),
            Kind::DiskFull => Duration::from_millis(2_000 + rng.below(4_000)),
            Kind::Database => Duration::from_millis(500 + rng.below(2_500)),
            Kind::ClockJump => Duration::from_millis(5_000 + rng.below(10_000)),
        };
        // A clock jump: 30 s to 10 min, forwards or backwards.
        let jump = (30 + rng.below(570)) as i64 * if rng.chance(0.5) { 1 } else { -1 };
        let delay = Duration::from_millis(50 + rng.below(350));
        let target = match kind {
            Kind::DiskFull => "data directory".to_string(),
            Kind::Database => "postgresql".to_string(),
            _ => proc.name.clone(),
        };
        tokio::time::sleep_until((started + at).into()).await;
        if !busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(target.clone())
        {
            println!(
                "  {:>7.1}s {:<13} {target}: skipped (a fault holds it)",
                at.as_secs_f64(),
                kind.name()
            );
            continue;
        }
        let by = match kind {
            Kind::ClockJump => format!(" by {jump:+}s"),
            _ => String::new(),
        };
        println!(
            "  {:>7.1}s {:<13} {target}{by} for {:.1}s",
            at.as_secs_f64(),
            kind.name(),
            hold.as_secs_f64()
        );
        let (fleet, extras, busy) = (fleet.clone(), extras.clone(), busy.clone());
        running.push(tokio::spawn(async move {
            let (recovery, problem) = one(&fleet, &extras, kind, &proc, hold, delay, jump).await;
            busy.lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&target);
            Fault {
                kind,
                target,
                at,
                recovery,
                problem,
            }
        }));
    }
    let mut faults = Vec::new();
    for task in running {
        if let Ok(fault) = task.await {
            faults.push(fault);
        }
    }
    faults
}

/// Runs one fault and brings the target back; the recovery time, or what
/// went wrong.
async fn one(
    fleet: &Fleet,
    extras: &Extras,
    kind: Kind,
    proc: &Arc<Proc>,
    hold: Duration,
    delay: Duration,
    jump: i64,
) -> (Option<Duration>, Option<String>) {
    use nix::sys::signal::Signal;
    let back_to = |result: anyhow::Result<Duration>| match result {
        Ok(took) => (Some(took), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    let limit = Duration::from_secs(60);
    match kind {
        Kind::Kill => {
            fleet.kill(proc);
            tokio::time::sleep(hold).await;
            if let Err(e) = fleet.spawn(proc) {
                return (None, Some(format!("{e:#}")));
            }
            back_to(fleet.until_serving(proc, limit).await)
        }
        Kind::Pause => {
            fleet.signal(proc, Signal::SIGSTOP);
            tokio::time::sleep(hold).await;
            fleet.signal(proc, Signal::SIGCONT);
            back_to(fleet.until_serving(proc, limit).await)
        }
        Kind::Cut => {
            proc.proxy.set(Link::Cut);
            tokio::time::sleep(hold).await;
            proc.proxy.set(Link::Open);
            back_to(fleet.until_serving(proc, limit).await)
        }
        Kind::Slow => {
            proc.proxy.set(Link::Slow(delay));
            tokio::time::sleep(hold).await;
            proc.proxy.set(Link::Open);
            back_to(fleet.until_serving(proc, limit).await)
        }
        Kind::DiskFull => {
            let Some(dir) = &extras.disk else {
                return (None, Some("no small file system".into()));
            };
            let filler = dir.join("chaos-fill");
            let written = fill(&filler).await;
            tokio::time::sleep(hold).await;
            let _ = tokio::fs::remove_file(&filler).await;
            if let Err(e) = written {
                return (None, Some(format!("cannot fill the disk: {e}")));
            }
            let started = Instant::now();
            for proc in &fleet.procs {
                if let Err(e) = fleet.until_serving(proc, limit).await {
                    return (None, Some(format!("{e:#}")));
                }
            }
            (Some(started.elapsed()), None)
        }
        Kind::ClockJump => {
            let Some(clock) = &proc.clock else {
                return (None, Some("its clock cannot be moved".into()));
            };
            let moved = std::fs::write(clock, format!("{jump:+}\n"));
            tokio::time::sleep(hold).await;
            let reset = std::fs::write(clock, "+0\n");
            if let Err(e) = moved.and(reset) {
                return (None, Some(format!("cannot move the clock: {e}")));
            }
            // libfaketime reads the file again within a second.
            tokio::time::sleep(Duration::from_millis(1_100)).await;
            back_to(fleet.until_serving(proc, limit).await)
        }
        Kind::Database => {
            let Some(postgres) = extras.postgres.clone() else {
                return (None, Some("no PostgreSQL".into()));
            };
            let stopped = postgres.clone();
            let _ = tokio::task::spawn_blocking(move || {
                stopped.lock().unwrap_or_else(|e| e.into_inner()).stop()
            })
            .await;
            tokio::time::sleep(hold).await;
            let started = Instant::now();
            let restarted = tokio::task::spawn_blocking(move || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    postgres
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .start_again()
                }))
            })
            .await;
            match restarted {
                Ok(Ok(())) => (Some(started.elapsed()), None),
                _ => (None, Some("PostgreSQL did not start again".into())),
            }
        }
    }
}

/// Writes zeros to `path` until the file system is full.
async fn fill(path: &std::path::Path) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut file = tokio::fs::File::create(path).await?;
    let block = vec![0u8; 1 << 20];
    loop {
        match file.write_all(&block).await {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => return Ok(()),
            Err(e) => return Err(e),
        }
        if file.flush().await.is_err() {
            return Ok(());
        }
    }
}
