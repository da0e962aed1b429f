//! Percentiles and the process memory readings.

/// The `p`th percentile (nearest rank) of `values`, which it sorts.
pub fn percentile(values: &mut [f64], p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * (values.len() - 1) as f64).round() as usize;
    values[rank.min(values.len() - 1)]
}

/// p50, p99 and max of `values` (milliseconds in, milliseconds out).
pub fn summary(values: &mut [f64]) -> (f64, f64, f64) {
    let p50 = percentile(values, 50.0);
    let p99 = percentile(values, 99.0);
    let max = values.last().copied().unwrap_or(f64::NAN);
    (p50, p99, max)
}

/// A field of `/proc/<pid>/status` in KiB (`VmRSS`, `VmHWM`).
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// CPU time a process has used so far (user and system), in ms.
pub fn cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command's name (which may hold spaces), from
    // the third: utime and stime are the 14th and 15th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // Linux reports them in clock ticks of 1/100 s (USER_HZ).
    Some(ticks * 10.0)
}

/// CPU time in ms of process `pid` and its children, those still running
/// and those it has waited for (a server's connection processes: the
/// PostgreSQL postmaster's backends come and go).
pub fn tree_cpu_ms(pid: u32) -> Option<f64> {
    let fields = |stat: &str| -> Option<Vec<f64>> {
        let rest = &stat[stat.rfind(')')? + 2..];
        // The state is not a number: keep the ppid onwards.
        rest.split_whitespace()
            .skip(1)
            .take(14)
            .map(|f| f.parse::<f64>().ok())
            .collect()
    };
    // From the ppid (index 0): utime 10, stime 11, cutime 12, cstime 13.
    let own = fields(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
    let mut ticks = own.get(10..14)?.iter().sum::<f64>();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some(child) = fields(&stat)
            && child.first() == Some(&f64::from(pid))
        {
            ticks += child.get(10..12).map_or(0.0, |t| t.iter().sum::<f64>());
        }
    }
    Some(ticks * 10.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).rev().collect();
        assert_eq!(percentile(&mut v, 50.0), 51.0);
        assert_eq!(percentile(&mut v, 99.0), 99.0);
        let (p50, _, max) = summary(&mut v);
        assert_eq!((p50, max), (51.0, 100.0));
        assert!(percentile(&mut [], 50.0).is_nan());
    }

    #[test]
    fn reads_this_process_cpu_time() {
        let before = cpu_ms(std::process::id()).unwrap_or(f64::NAN);
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < std::time::Duration::from_millis(60) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        let after = cpu_ms(std::process::id()).unwrap_or(f64::NAN);
        assert!(x > 0 && after > before, "{before} → {after}");
    }

    #[test]
    fn counts_the_cpu_of_children_running_and_waited_for() {
        let spin = "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done";
        let before = tree_cpu_ms(std::process::id()).unwrap_or(f64::NAN);
        // One child waited for here, one still running when measured.
        let done = std::process::Command::new("sh").args(["-c", spin]).status();
        assert!(done.is_ok_and(|s| s.success()));
        let mut running = std::process::Command::new("sh")
            .args(["-c", &format!("{spin}; sleep 5")])
            .spawn()
            .unwrap_or_else(|e| panic!("sh: {e}"));
        let child_cpu = || cpu_ms(running.id()).unwrap_or(0.0);
        let start = std::time::Instant::now();
        while child_cpu() < 50.0 && start.elapsed() < std::time::Duration::from_secs(20) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let running_ms = child_cpu();
        let after = tree_cpu_ms(std::process::id()).unwrap_or(f64::NAN);
        let _ = running.kill();
        let _ = running.wait();
        assert!(running_ms >= 50.0, "the running child used {running_ms} ms");
        // The waited-for child's time is in cutime; the running one's in
        // its own stat: both count.
        assert!(
            after - before >= running_ms + 50.0,
            "{before} -> {after} ({running_ms} running)"
        );
    }

    #[test]
    fn reads_this_process_memory() {
        let rss = status_kib(std::process::id(), "VmRSS").unwrap_or(0);
        let peak = status_kib(std::process::id(), "VmHWM").unwrap_or(0);
        assert!(rss > 0 && peak >= rss, "rss {rss} peak {peak}");
    }
}
