//! The gRPC face of the scheduler, its firing worker and its delivery
//! streams.

use crate::backend::Backend;
use crate::schedule::{self, MissedPolicy, Recurrence};
use crate::store::{Firing, Kind, NewReminder, Reminder, Status, StoreError};
use agentry_proto::scheduler::v1 as pb;
use agentry_proto::scheduler::v1::scheduler_server::Scheduler;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_proto::sessions::v1::{GetSessionRequest, ReminderKind};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status as GrpcStatus, Streaming};

/// The longest reminder message accepted, in characters.
pub const MAX_MESSAGE_CHARS: usize = 4000;

/// Where "now" comes from; tests inject their own.
pub trait Clock: Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// Scheduler settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// What to do with missed occurrences when a reminder names no policy.
    pub missed: MissedPolicy,
    /// How late an occurrence may fire and still count as on time.
    pub grace: chrono::Duration,
    /// How long a delivered firing may stay unacknowledged before it is
    /// sent again.
    pub redeliver_after: Duration,
    /// Serve Prometheus metrics here; empty: not served.
    pub metrics_listen: String,
}

impl Default for Settings {
    /// The built-in configuration's settings.
    fn default() -> Self {
        crate::settings_from_config(agentry_runtime::Config::builtin())
    }
}

/// How often a scheduler sharing its database looks for due reminders.
const SHARED_POLL: Duration = Duration::from_secs(1);

/// Shared state of the scheduler.
pub struct Core {
    store: Backend,
    clock: Arc<dyn Clock>,
    settings: Settings,
    sessions: SessionStoreClient<agentry_runtime::telemetry::TracedChannel>,
    sessions_url: String,
    changed: Notify,
    fired: broadcast::Sender<Firing>,
    /// The scheduler's metrics.
    pub metrics: Arc<agentry_runtime::metrics::Registry>,
}

fn status_of(e: StoreError) -> GrpcStatus {
    match e {
        StoreError::NotFound(_) => GrpcStatus::not_found(e.to_string()),
        StoreError::NotPending { .. } => GrpcStatus::failed_precondition(e.to_string()),
        _ if e.is_retryable() => GrpcStatus::unavailable(e.to_string()),
        StoreError::Database(_)
        | StoreError::Postgres(_)
        | StoreError::Unavailable(_)
        | StoreError::Corrupt { .. } => GrpcStatus::internal(e.to_string()),
    }
}

fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

fn missed_to_proto(m: MissedPolicy) -> pb::MissedPolicy {
    match m {
        MissedPolicy::Once => pb::MissedPolicy::Once,
        MissedPolicy::All => pb::MissedPolicy::All,
        MissedPolicy::Skip => pb::MissedPolicy::Skip,
    }
}

/// A reminder as the contract describes it.
pub fn reminder_to_proto(r: &Reminder) -> pb::Reminder {
    pb::Reminder {
        id: r.id.clone(),
        session_id: r.session_id.clone(),
        message: r.message.clone(),
        kind: match r.kind {
            Kind::Notify => ReminderKind::Notify,
            Kind::Task => ReminderKind::Task,
        } as i32,
        next_due: r.next_due.map(timestamp),
        recurrence: r.cron.as_ref().map(|cron| pb::Recurrence {
            cron: cron.clone(),
            time_zone: r.time_zone.clone(),
            missed: missed_to_proto(r.missed) as i32,
        }),
        status: match r.status {
            Status::Pending => pb::ReminderStatus::Pending,
            Status::Completed => pb::ReminderStatus::Completed,
            Status::Cancelled => pb::ReminderStatus::Cancelled,
        } as i32,
        created_at: Some(timestamp(r.created)),
        fire_count: r.fire_count,
    }
}

fn firing_to_proto(f: &Firing) -> pb::DueReminder {
    pb::DueReminder {
        firing_id: f.firing_id.clone(),
        reminder: Some(reminder_to_proto(&f.reminder)),
        due_time: Some(timestamp(f.due)),
        late_ms: f.late_ms,
        occurrences: f.occurrences,
    }
}

impl Core {
    /// The scheduler over `store`.
    pub fn new(
        store: Backend,
        clock: Arc<dyn Clock>,
        settings: Settings,
        sessions: SessionStoreClient<agentry_runtime::telemetry::TracedChannel>,
        sessions_url: String,
    ) -> Arc<Core> {
        let (fired, _) = broadcast::channel(4096);
        Arc::new(Core {
            store,
            clock,
            settings,
            sessions,
            sessions_url,
            changed: Notify::new(),
            fired,
            metrics: Arc::default(),
        })
    }

    /// Receives every firing from now on, as it fires.
    pub fn subscribe_fired(&self) -> broadcast::Receiver<Firing> {
        self.fired.subscribe()
    }

    /// Wakes the worker after reminders were added behind its back.
    pub fn reminders_changed(&self) {
        self.changed.notify_one();
    }

    /// Where metrics are served ("" for nowhere).
    pub fn metrics_listen(&self) -> &str {
        &self.settings.metrics_listen
    }

    /// The metrics page (the pending count as the worker last read it).
    pub fn metrics_page(&self) -> String {
        self.metrics.render()
    }

    /// The store.
    pub fn store(&self) -> &Backend {
        &self.store
    }

    /// Fires reminders as they fall due until `stop` turns true: a timer set
    /// to the next due reminder, re-armed whenever reminders change.
    pub async fn run_worker(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        const BATCH: usize = 500;
        loop {
            let now = self.clock.now();
            let grace = self.settings.grace;
            match self.store.fire_due(now, grace, BATCH).await {
                Ok(firings) => {
                    let full = firings.len() >= BATCH;
                    for f in firings {
                        tracing::info!(
                            firing_id = %f.firing_id,
                            session_id = %f.reminder.session_id,
                            late_ms = f.late_ms,
                            "reminder fired"
                        );
                        self.metrics.observe(
                            "agentry_reminder_lateness_seconds",
                            "How late reminders fired after their due time.",
                            &[],
                            Duration::from_millis(f.late_ms),
                        );
                        self.metrics.inc(
                            "agentry_reminder_firings_total",
                            "Reminder occurrences fired.",
                            &[],
                        );
                        // Nobody listening is fine: unacked firings are
                        // sent to the next consumer from the database.
                        let _ = self.fired.send(f);
                    }
                    if full {
                        continue;
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "firing due reminders failed");
                }
            }
            if let Ok(pending) = self.store.pending_count().await {
                self.metrics.set(
                    "agentry_reminders_pending",
                    "Reminders waiting to fall due.",
                    &[],
                    pending as f64,
                );
            }
            let next = self.store.next_due().await.ok().flatten();
            let mut wait = match next {
                Some(next) => (next - self.clock.now()).to_std().unwrap_or(Duration::ZERO),
                None => Duration::from_secs(3600),
            };
            // Other schedulers add reminders without telling this one.
            if self.store.shared() {
                wait = wait.min(SHARED_POLL);
            }
            if wait.is_zero() {
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.changed.notified() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    async fn check_session(&self, session_id: &str) -> Result<(), GrpcStatus> {
        if session_id.is_empty() {
            return Err(GrpcStatus::invalid_argument("session_id must be set"));
        }
        match self
            .sessions
            .clone()
            .get_session(GetSessionRequest {
                session_id: session_id.to_string(),
            })
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::NotFound => Err(GrpcStatus::not_found(format!(
                "session {session_id:?} not found"
            ))),
            Err(s) => Err(GrpcStatus::unavailable(format!(
                "cannot check the session: the session store at {} answered: {}",
                self.sessions_url,
                s.message()
            ))),
        }
    }

    /// Validates and stores a reminder.
    pub async fn create(&self, req: pb::CreateReminderRequest) -> Result<Reminder, GrpcStatus> {
        let invalid = |m: String| GrpcStatus::invalid_argument(m);
        let message = req.message.trim().to_string();
        if message.is_empty() {
            return Err(invalid("the reminder's message is empty".into()));
        }
        let chars = message.chars().count();
        if chars > MAX_MESSAGE_CHARS {
            return Err(invalid(format!(
                "the reminder's message is {chars} characters; at most {MAX_MESSAGE_CHARS} are accepted"
            )));
        }
        let kind = match ReminderKind::try_from(req.kind) {
            Ok(ReminderKind::Notify) => Kind::Notify,
            Ok(ReminderKind::Task) => Kind::Task,
            Ok(ReminderKind::Unspecified) | Err(_) => {
                return Err(invalid("kind must be notify or task".into()));
            }
        };
        let now = self.clock.now();
        let (recurrence, missed) = match &req.recurrence {
            Some(r) => {
                let rec =
                    Recurrence::parse(&r.cron, &r.time_zone).map_err(|e| invalid(e.to_string()))?;
                let missed = match pb::MissedPolicy::try_from(r.missed) {
                    Ok(pb::MissedPolicy::Once) => MissedPolicy::Once,
                    Ok(pb::MissedPolicy::All) => MissedPolicy::All,
                    Ok(pb::MissedPolicy::Skip) => MissedPolicy::Skip,
                    Ok(pb::MissedPolicy::Unspecified) | Err(_) => self.settings.missed,
                };
                (Some(rec), missed)
            }
            None => (None, self.settings.missed),
        };
        let due = match (&recurrence, req.due.trim().is_empty()) {
            (_, false) => schedule::parse_due(&req.due, now).map_err(|e| invalid(e.to_string()))?,
            (Some(rec), true) => schedule::first_due(rec, now).ok_or_else(|| {
                invalid(format!("the cron expression {:?} never fires", rec.cron()))
            })?,
            (None, true) => {
                return Err(invalid(
                    "due must be set: an RFC 3339 time with offset or a duration like \"in 10m\""
                        .into(),
                ));
            }
        };
        self.check_session(&req.session_id).await?;
        let new = NewReminder {
            session_id: req.session_id,
            message,
            kind,
            due,
            recurrence,
            missed,
        };
        let reminder = self.store.create(new, now).await.map_err(status_of)?;
        self.changed.notify_one();
        Ok(reminder)
    }
}

/// The Scheduler gRPC service.
#[derive(Clone)]
pub struct SchedulerService {
    core: Arc<Core>,
}

impl SchedulerService {
    /// A service over `core`.
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }
}

type DueStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::DueReminder, GrpcStatus>> + Send>>;

#[tonic::async_trait]
impl Scheduler for SchedulerService {
    async fn create_reminder(
        &self,
        request: Request<pb::CreateReminderRequest>,
    ) -> Result<Response<pb::Reminder>, GrpcStatus> {
        let reminder = self.core.create(request.into_inner()).await?;
        Ok(Response::new(reminder_to_proto(&reminder)))
    }

    async fn list_reminders(
        &self,
        request: Request<pb::ListRemindersRequest>,
    ) -> Result<Response<pb::ListRemindersResponse>, GrpcStatus> {
        let req = request.into_inner();
        let status = match pb::ReminderStatus::try_from(req.status) {
            Ok(pb::ReminderStatus::Unspecified) | Err(_) => None,
            Ok(pb::ReminderStatus::Pending) => Some(Status::Pending),
            Ok(pb::ReminderStatus::Completed) => Some(Status::Completed),
            Ok(pb::ReminderStatus::Cancelled) => Some(Status::Cancelled),
        };
        let session = (!req.session_id.is_empty()).then_some(req.session_id);
        let reminders = self
            .core
            .store
            .list(session, status)
            .await
            .map_err(status_of)?;
        Ok(Response::new(pb::ListRemindersResponse {
            reminders: reminders.iter().map(reminder_to_proto).collect(),
        }))
    }

    async fn cancel_reminder(
        &self,
        request: Request<pb::CancelReminderRequest>,
    ) -> Result<Response<pb::Reminder>, GrpcStatus> {
        let req = request.into_inner();
        if req.reminder_id.is_empty() {
            return Err(GrpcStatus::invalid_argument("reminder_id must be set"));
        }
        let session = (!req.session_id.is_empty()).then_some(req.session_id);
        let reminder = self
            .core
            .store
            .cancel(req.reminder_id, session)
            .await
            .map_err(status_of)?;
        self.core.changed.notify_one();
        Ok(Response::new(reminder_to_proto(&reminder)))
    }

    type StreamDueStream = DueStream;

    async fn stream_due(
        &self,
        request: Request<Streaming<pb::StreamDueRequest>>,
    ) -> Result<Response<Self::StreamDueStream>, GrpcStatus> {
        let mut inbound = request.into_inner();
        let first = inbound.message().await?.ok_or_else(|| {
            GrpcStatus::invalid_argument("the stream closed before its subscribe message")
        })?;
        let consumer = match first.kind {
            Some(pb::stream_due_request::Kind::Subscribe(s)) => s.consumer,
            _ => {
                return Err(GrpcStatus::invalid_argument(
                    "the first message of StreamDue must be `subscribe`",
                ));
            }
        };
        tracing::info!(consumer, "reminder consumer subscribed");
        let live = self.core.fired.subscribe();
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(deliver(self.core.clone(), inbound, live, tx));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Sends unacknowledged firings, then new ones; resends what stays
/// unacknowledged; records acks.
async fn deliver(
    core: Arc<Core>,
    mut inbound: Streaming<pb::StreamDueRequest>,
    mut live: broadcast::Receiver<Firing>,
    tx: mpsc::Sender<Result<pb::DueReminder, GrpcStatus>>,
) {
    let mut sent: HashMap<String, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate: it sends the backlog.
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let backlog = match core.store.unacked().await {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::error!(error = %e, "cannot read unacknowledged firings");
                        continue;
                    }
                };
                for f in backlog {
                    let due_again = sent
                        .get(&f.firing_id)
                        .is_none_or(|at| at.elapsed() >= core.settings.redeliver_after);
                    if due_again {
                        sent.insert(f.firing_id.clone(), Instant::now());
                        if tx.send(Ok(firing_to_proto(&f))).await.is_err() {
                            return;
                        }
                    }
                }
            }
            firing = live.recv() => match firing {
                Ok(f) => {
                    if !sent.contains_key(&f.firing_id) {
                        sent.insert(f.firing_id.clone(), Instant::now());
                        if tx.send(Ok(firing_to_proto(&f))).await.is_err() {
                            return;
                        }
                    }
                }
                // Missed some: the next tick sends them from the database.
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            },
            message = inbound.message() => match message {
                Ok(Some(pb::StreamDueRequest { kind: Some(pb::stream_due_request::Kind::Ack(ack)) })) => {
                    sent.remove(&ack.firing_id);
                    if let Err(e) = core.store.ack(ack.firing_id.clone()).await {
                        tracing::error!(error = %e, "cannot record an ack");
                    }
                }
                Ok(Some(_)) => {
                    let _ = tx.send(Err(GrpcStatus::invalid_argument("only acks may follow `subscribe`"))).await;
                    return;
                }
                Ok(None) | Err(_) => return,
            },
            () = tx.closed() => return,
        }
    }
}
