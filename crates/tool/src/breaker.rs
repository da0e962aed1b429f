//! A circuit breaker with an injectable clock.
//!
//! Closed: calls go through; after `failure_threshold` consecutive failed
//! calls it opens. Open: calls are refused without touching the network
//! until `open_for` has passed. Half-open: exactly one call (the probe) goes
//! through; its success closes the breaker, its failure opens it again for
//! another `open_for`. A probe dropped before it reported (a cancelled
//! call) frees the slot for the next caller.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Where the breaker gets the time from.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Instant;
}

/// The real monotonic clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    offset: Mutex<Duration>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl ManualClock {
    /// A clock standing at the current instant.
    pub fn new() -> ManualClock {
        ManualClock {
            start: Instant::now(),
            offset: Mutex::new(Duration::ZERO),
        }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        let mut offset = self.offset.lock().unwrap_or_else(|e| e.into_inner());
        *offset += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + *self.offset.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The breaker's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerSettings {
    /// Consecutive failed calls that open the breaker.
    pub failure_threshold: u32,
    /// How long it stays open before letting a probe through.
    pub open_for: Duration,
}

impl Default for BreakerSettings {
    /// 5 failures, 5 minutes.
    fn default() -> Self {
        BreakerSettings {
            failure_threshold: 5,
            open_for: Duration::from_secs(300),
        }
    }
}

/// The breaker's state as seen from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Calls go through.
    Closed,
    /// Calls are refused.
    Open,
    /// The cool-down is over: the next call is a probe (or one is running).
    HalfOpen,
}

impl std::fmt::Display for BreakerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half-open",
        })
    }
}

/// Counters since the breaker was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BreakerStats {
    /// Calls let through.
    pub fetches: u64,
    /// Calls that failed (each counted once, whatever its retries).
    pub failures: u64,
    /// Times the breaker opened (re-opening after a failed probe included).
    pub opens: u64,
    /// Calls refused because the breaker was open (or a probe was running).
    pub rejected: u64,
}

#[derive(Debug)]
enum Inner {
    Closed { consecutive_failures: u32 },
    Open { since: Instant },
    HalfOpen { probing: bool },
}

/// A circuit breaker.
pub struct Breaker {
    name: std::borrow::Cow<'static, str>,
    settings: BreakerSettings,
    clock: Arc<dyn Clock>,
    inner: Mutex<Inner>,
    fetches: AtomicU64,
    failures: AtomicU64,
    opens: AtomicU64,
    rejected: AtomicU64,
}

impl std::fmt::Debug for Breaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Breaker")
            .field("name", &self.name)
            .field("settings", &self.settings)
            .field("state", &self.state())
            .field("stats", &self.stats())
            .finish()
    }
}

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The breaker is open.
    Open,
    /// The breaker is half-open and its one probe is running.
    ProbeRunning,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::Open => "circuit open",
            Refused::ProbeRunning => "circuit half-open, a probe is running",
        })
    }
}

impl Breaker {
    /// A closed breaker; `name` (the backend's) goes into its log lines.
    pub fn new(
        name: impl Into<std::borrow::Cow<'static, str>>,
        settings: BreakerSettings,
        clock: Arc<dyn Clock>,
    ) -> Breaker {
        Breaker {
            name: name.into(),
            settings,
            clock,
            inner: Mutex::new(Inner::Closed {
                consecutive_failures: 0,
            }),
            fetches: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            opens: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The state now (an open breaker whose cool-down is over reads as
    /// half-open).
    pub fn state(&self) -> BreakerState {
        match &*self.lock() {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { since } => {
                if self.cooled_down(*since) {
                    BreakerState::HalfOpen
                } else {
                    BreakerState::Open
                }
            }
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// The counters.
    pub fn stats(&self) -> BreakerStats {
        BreakerStats {
            fetches: self.fetches.load(Ordering::Relaxed),
            failures: self.failures.load(Ordering::Relaxed),
            opens: self.opens.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }

    fn cooled_down(&self, since: Instant) -> bool {
        self.clock.now().saturating_duration_since(since) >= self.settings.open_for
    }

    /// Lets a call through, or refuses it. The permit must be told how the
    /// call went.
    pub fn try_acquire(&self) -> Result<Permit<'_>, Refused> {
        let mut inner = self.lock();
        let probe = match &mut *inner {
            Inner::Closed { .. } => false,
            Inner::Open { since } => {
                if !self.cooled_down(*since) {
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    return Err(Refused::Open);
                }
                tracing::info!(
                    backend = %self.name,
                    "circuit half-open: letting one probe through"
                );
                *inner = Inner::HalfOpen { probing: true };
                true
            }
            Inner::HalfOpen { probing } => {
                if *probing {
                    self.rejected.fetch_add(1, Ordering::Relaxed);
                    return Err(Refused::ProbeRunning);
                }
                *probing = true;
                true
            }
        };
        self.fetches.fetch_add(1, Ordering::Relaxed);
        Ok(Permit {
            breaker: self,
            probe,
            done: false,
        })
    }

    fn open(&self, inner: &mut Inner, why: &str) {
        *inner = Inner::Open {
            since: self.clock.now(),
        };
        self.opens.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            backend = %self.name,
            open_for_secs = self.settings.open_for.as_secs(),
            "circuit open: {why}"
        );
    }

    fn record(&self, probe: bool, ok: bool) {
        if !ok {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        let mut inner = self.lock();
        match (&mut *inner, probe, ok) {
            (Inner::HalfOpen { .. }, true, true) => {
                *inner = Inner::Closed {
                    consecutive_failures: 0,
                };
                tracing::info!(backend = %self.name, "circuit closed: the probe succeeded");
            }
            (Inner::HalfOpen { .. }, true, false) => {
                self.open(&mut inner, "the probe failed");
            }
            (
                Inner::Closed {
                    consecutive_failures,
                },
                _,
                true,
            ) => *consecutive_failures = 0,
            (
                Inner::Closed {
                    consecutive_failures,
                },
                _,
                false,
            ) => {
                *consecutive_failures += 1;
                if *consecutive_failures >= self.settings.failure_threshold {
                    let why = format!("{consecutive_failures} consecutive failures");
                    self.open(&mut inner, &why);
                }
            }
            // Calls that started before the breaker opened (or a stale
            // probe) do not change an open or half-open breaker.
            (Inner::Open { .. }, _, _) | (Inner::HalfOpen { .. }, false, _) => {}
        }
    }

    fn release_probe(&self) {
        let mut inner = self.lock();
        if let Inner::HalfOpen { probing } = &mut *inner {
            *probing = false;
        }
    }
}

/// A call let through by a [`Breaker`]. Report how it went with
/// [`Permit::success`] or [`Permit::failure`]; a permit dropped without a
/// report counts as neither (a probe's slot is freed).
#[derive(Debug)]
pub struct Permit<'a> {
    breaker: &'a Breaker,
    probe: bool,
    done: bool,
}

impl Permit<'_> {
    /// Whether this call is the half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The call succeeded.
    pub fn success(mut self) {
        self.done = true;
        self.breaker.record(self.probe, true);
    }

    /// The call failed.
    pub fn failure(mut self) {
        self.done = true;
        self.breaker.record(self.probe, false);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.done && self.probe {
            self.breaker.release_probe();
        }
    }
}
