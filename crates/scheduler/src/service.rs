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
    /// The first wait before a failed notification is tried again.
    pub notify_retry: Duration,
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
    /// The `[[notify]]` webhooks.
    targets: Arc<Vec<crate::notify::Target>>,
    /// Wakes the notifier when deliveries are queued.
    notify_wake: Arc<Notify>,
    /// The scheduler's metrics.
    pub metrics: Arc<agentry_runtime::metrics::Registry>,
}

fn status_of(e: StoreError) -> GrpcStatus {
    match e {
        StoreError::NotFound(_) => GrpcStatus::not_found(e.to_string()),
        StoreError::NotPending { .. } | StoreError::NotRecurring(_) => {
            GrpcStatus::failed_precondition(e.to_string())
        }
        _ if e.is_retryable() => GrpcStatus::unavailable(e.to_string()),
        StoreError::Database(_)
        | StoreError::Postgres(_)
        | StoreError::Unavailable(_)
        | StoreError::Corrupt { .. } => GrpcStatus::internal(e.to_string()),
    }
}

use crate::store::timestamp;

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
            Status::Paused => pb::ReminderStatus::Paused,
        } as i32,
        created_at: Some(timestamp(r.created)),
        fire_count: r.fire_count,
        task: r.task.clone(),
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
            targets: Arc::default(),
            notify_wake: Arc::default(),
            metrics: Arc::default(),
        })
    }

    /// The same core, sending notifications to `targets`.
    pub fn with_notify(self: Arc<Self>, targets: Arc<Vec<crate::notify::Target>>) -> Arc<Self> {
        match Arc::try_unwrap(self) {
            Ok(mut core) => {
                core.targets = targets;
                Arc::new(core)
            }
            Err(shared) => shared,
        }
    }

    /// What wakes the notifier.
    pub fn notify_wake(&self) -> Arc<Notify> {
        self.notify_wake.clone()
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
        let task = match req.task {
            Some(task) => Some(check_task(task, kind, recurrence.is_some())?),
            None => None,
        };
        if task.as_ref().is_some_and(|t| !t.agent.is_empty()) && !req.session_id.is_empty() {
            return Err(invalid(
                "a scheduled task runs as an agent only in a new session per run; drop the session or the agent".into(),
            ));
        }
        if task.is_none() || !req.session_id.is_empty() {
            self.check_session(&req.session_id).await?;
        }
        let new = NewReminder {
            session_id: req.session_id,
            message,
            kind,
            due,
            recurrence,
            missed,
            task,
        };
        let reminder = self.store.create(new, now).await.map_err(status_of)?;
        self.changed.notify_one();
        Ok(reminder)
    }
}

/// A scheduled task's settings, checked.
fn check_task(
    task: pb::ScheduledTask,
    kind: Kind,
    recurring: bool,
) -> Result<pb::ScheduledTask, GrpcStatus> {
    use agentry_proto::sessions::v1::ApprovalMode;
    let invalid = |m: &str| Err(GrpcStatus::invalid_argument(m.to_string()));
    if kind != Kind::Task {
        return invalid("a scheduled task's kind must be task");
    }
    if !recurring {
        return invalid("a scheduled task needs a recurrence (a cron expression)");
    }
    match ApprovalMode::try_from(task.approval_mode) {
        Ok(ApprovalMode::Unspecified | ApprovalMode::Policy | ApprovalMode::Never) => {}
        Ok(ApprovalMode::Always) | Err(_) => {
            return invalid(
                "a scheduled task's calls are approved by the policy (a call that needs a \
                 person waits for one) or never; approving every call unattended is not offered",
            );
        }
    }
    if !task.agent.is_empty()
        && (task.agent.chars().count() > 64
            || !task
                .agent
                .chars()
                .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return invalid("the agent's name is not one an [[agents]] entry can have");
    }
    if !task.project_dir.is_empty() && !task.project_dir.starts_with('/') {
        return invalid("a scheduled task's project directory must be an absolute path");
    }
    Ok(task)
}

/// The outcome of a run whose turn ended, from its `turn_finished`.
fn run_outcome(finished: &agentry_proto::sessions::v1::TurnFinished) -> (pb::RunState, String) {
    use agentry_proto::sessions::v1::TurnOutcome;
    let state = match TurnOutcome::try_from(finished.outcome) {
        Ok(TurnOutcome::Completed) => pb::RunState::Completed,
        Ok(TurnOutcome::Cancelled) => pb::RunState::Cancelled,
        _ => pb::RunState::Failed,
    };
    let note: String = finished.message.chars().take(200).collect();
    (state, note)
}

impl Core {
    /// Pauses or resumes a scheduled task (or any recurring reminder).
    pub async fn set_paused(&self, id: String, paused: bool) -> Result<Reminder, GrpcStatus> {
        let reminder = self.store.get(id.clone()).await.map_err(status_of)?;
        let now = self.clock.now();
        let resume_at = match &reminder.cron {
            Some(cron) => {
                let rec = Recurrence::parse(cron, &reminder.time_zone)
                    .map_err(|e| GrpcStatus::internal(e.to_string()))?;
                schedule::first_due(&rec, now).unwrap_or(now)
            }
            None => now,
        };
        let reminder = self
            .store
            .set_paused(id, paused, resume_at)
            .await
            .map_err(status_of)?;
        self.changed.notify_one();
        Ok(reminder)
    }

    /// A scheduled task's runs, newest first; a run whose turn has ended
    /// since it was recorded gets its outcome from the session's log.
    pub async fn runs(
        &self,
        reminder_id: String,
        limit: u32,
    ) -> Result<Vec<pb::ScheduledRun>, GrpcStatus> {
        let limit = match limit {
            0 => 20,
            n => n.min(1000),
        };
        let mut runs = self
            .store
            .runs(reminder_id, limit)
            .await
            .map_err(status_of)?;
        for run in &mut runs {
            if run.state != pb::RunState::Running as i32 || run.session_id.is_empty() {
                continue;
            }
            match self.turn_end(run).await {
                Ok(Some((state, note))) => {
                    run.state = state as i32;
                    run.note = note;
                    let now = self.clock.now();
                    if let Err(e) = self.store.record_run(run.clone(), now).await {
                        tracing::warn!(firing_id = %run.firing_id, error = %e, "cannot keep a run's outcome");
                    }
                }
                Ok(None) => {}
                // The session store is away: the run shows as running.
                Err(status) => {
                    tracing::debug!(firing_id = %run.firing_id, error = %status.message(), "cannot read a run's session");
                }
            }
        }
        Ok(runs)
    }

    /// How a run's turn ended, read from its session's log (`None`: not
    /// yet).
    async fn turn_end(
        &self,
        run: &pb::ScheduledRun,
    ) -> Result<Option<(pb::RunState, String)>, GrpcStatus> {
        use agentry_proto::sessions::v1::{ReadRequest, event::Kind as EventKind};
        let mut from_seq = run.from_seq.max(1);
        // At most 20 pages: a run's turn is near where it started.
        for _ in 0..20 {
            let page = match self
                .sessions
                .clone()
                .read(ReadRequest {
                    session_id: run.session_id.clone(),
                    from_seq,
                    limit: 1000,
                    ..Default::default()
                })
                .await
            {
                Ok(page) => page.into_inner(),
                Err(s) if s.code() == tonic::Code::NotFound => {
                    return Ok(Some((
                        pb::RunState::Failed,
                        "its session was deleted before the run ended".into(),
                    )));
                }
                Err(s) => return Err(s),
            };
            for event in &page.events {
                if event.turn_id != run.turn_id {
                    continue;
                }
                if let Some(EventKind::TurnFinished(finished)) = &event.kind {
                    return Ok(Some(run_outcome(finished)));
                }
            }
            if !page.has_more {
                return Ok(None);
            }
            from_seq = page.next_seq;
        }
        Ok(None)
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
            Ok(pb::ReminderStatus::Paused) => Some(Status::Paused),
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

    async fn pause_reminder(
        &self,
        request: Request<pb::PauseReminderRequest>,
    ) -> Result<Response<pb::Reminder>, GrpcStatus> {
        let req = request.into_inner();
        if req.reminder_id.is_empty() {
            return Err(GrpcStatus::invalid_argument("reminder_id must be set"));
        }
        let reminder = self.core.set_paused(req.reminder_id, req.paused).await?;
        Ok(Response::new(reminder_to_proto(&reminder)))
    }

    async fn record_run(
        &self,
        request: Request<pb::RecordRunRequest>,
    ) -> Result<Response<pb::ScheduledRun>, GrpcStatus> {
        let run = request
            .into_inner()
            .run
            .ok_or_else(|| GrpcStatus::invalid_argument("run must be set"))?;
        if run.firing_id.is_empty() || run.reminder_id.is_empty() {
            return Err(GrpcStatus::invalid_argument(
                "a run's firing_id and reminder_id must be set",
            ));
        }
        if pb::RunState::try_from(run.state).is_err() || run.state == 0 {
            return Err(GrpcStatus::invalid_argument("a run's state must be set"));
        }
        let mut run = run;
        run.note = run.note.chars().take(1000).collect();
        let now = self.core.clock.now();
        run.recorded_at = Some(timestamp(now));
        self.core
            .store
            .record_run(run.clone(), now)
            .await
            .map_err(status_of)?;
        Ok(Response::new(run))
    }

    async fn list_runs(
        &self,
        request: Request<pb::ListRunsRequest>,
    ) -> Result<Response<pb::ListRunsResponse>, GrpcStatus> {
        let req = request.into_inner();
        if req.reminder_id.is_empty() {
            return Err(GrpcStatus::invalid_argument("reminder_id must be set"));
        }
        let runs = self.core.runs(req.reminder_id, req.limit).await?;
        Ok(Response::new(pb::ListRunsResponse { runs }))
    }

    async fn notify(
        &self,
        request: Request<pb::NotifyRequest>,
    ) -> Result<Response<pb::NotifyResponse>, GrpcStatus> {
        let notifications = request.into_inner().notifications;
        if notifications.len() > 1000 {
            return Err(GrpcStatus::invalid_argument(
                "at most 1000 notifications at once",
            ));
        }
        for n in &notifications {
            if n.id.is_empty() || n.id.len() > 300 || n.event.is_empty() {
                return Err(GrpcStatus::invalid_argument(
                    "a notification needs an id (at most 300 bytes) and an event",
                ));
            }
            if n.payload_json.len() + n.text.len() > 64 * 1024 {
                return Err(GrpcStatus::invalid_argument(
                    "a notification is at most 64 KiB",
                ));
            }
        }
        let deliveries = crate::notify::deliveries(&self.core.targets, &notifications);
        if deliveries.is_empty() {
            return Ok(Response::new(pb::NotifyResponse { queued: 0 }));
        }
        let now = self.core.clock.now();
        let queued = self
            .core
            .store
            .enqueue(deliveries, now)
            .await
            .map_err(status_of)?;
        self.core.notify_wake.notify_one();
        Ok(Response::new(pb::NotifyResponse { queued }))
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
