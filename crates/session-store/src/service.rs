//! The gRPC face of the store.

use crate::backend::Backend;
use crate::store::{Change, MAX_READ_EVENTS, StoreError};
use agentry_proto::sessions::v1 as pb;
use agentry_proto::sessions::v1::session_store_server::SessionStore;
use agentry_runtime::topics::{Subscription, Topics};
use std::pin::Pin;
use std::sync::Arc;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// Maps a store error to the gRPC status a client should see.
pub fn status_of(e: StoreError) -> Status {
    use agentry_runtime::reasons::{Reason, status};
    use tonic::Code;
    let retryable = e.is_retryable();
    match e {
        StoreError::NotFound(_) => status(Code::NotFound, Reason::SessionNotFound, e.to_string()),
        StoreError::AlreadyExists(_) | StoreError::NameTaken { .. } => {
            status(Code::AlreadyExists, Reason::AlreadyExists, e.to_string())
        }
        StoreError::Conflict { .. } => status(
            Code::FailedPrecondition,
            Reason::AppendConflict,
            e.to_string(),
        ),
        StoreError::LeaseLost { .. } => {
            status(Code::FailedPrecondition, Reason::LeaseLost, e.to_string())
        }
        StoreError::NoHeartbeat(_) => {
            status(Code::FailedPrecondition, Reason::NoHeartbeat, e.to_string())
        }
        StoreError::InvalidArgument(_) => Status::invalid_argument(e.to_string()),
        StoreError::Database(_) | StoreError::Unavailable(_) if retryable => {
            Status::unavailable(e.to_string())
        }
        StoreError::Database(_)
        | StoreError::Postgres(_)
        | StoreError::Unavailable(_)
        | StoreError::Corrupt { .. }
        | StoreError::Io { .. }
        | StoreError::NewerSchema { .. }
        | StoreError::Migration { .. } => Status::internal(e.to_string()),
    }
}

/// The SessionStore gRPC service.
#[derive(Clone)]
pub struct SessionStoreService {
    store: Backend,
    closing: watch::Receiver<bool>,
    /// The store's changes, by session.
    fanout: Arc<Topics<Change>>,
    /// The store's metrics.
    pub metrics: Arc<agentry_runtime::metrics::Registry>,
}

impl SessionStoreService {
    /// Serves `store`; open Watch streams end when `closing` turns true.
    /// Call within a Tokio runtime (it starts the task that hands each
    /// change to the watchers of its session).
    pub fn new(store: Backend, closing: watch::Receiver<bool>) -> Self {
        let fanout = Topics::new(SESSION_CHANGES);
        tokio::spawn(route(fanout.clone(), store.subscribe()));
        Self {
            store,
            closing,
            fanout,
            metrics: Arc::default(),
        }
    }
}

/// Changes a watcher of a session may fall behind by before it reads the
/// log instead.
const SESSION_CHANGES: usize = 64;

/// Most bytes of the events of one Read page (half the largest message).
const MAX_PAGE_BYTES: usize = agentry_runtime::MAX_MESSAGE_BYTES / 2;

/// Hands each change to the watchers of the session it concerns, so that an
/// append wakes its session's watchers only, not every watcher of the store
/// (with a thousand sessions watched, that was a thousand wake-ups per
/// append).
async fn route(fanout: Arc<Topics<Change>>, mut changes: broadcast::Receiver<Change>) {
    loop {
        let change = match changes.recv().await {
            Ok(change) => change,
            // Changes were missed: every watcher reads what it has not seen.
            Err(broadcast::error::RecvError::Lagged(_)) => Change::Resync,
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let session = match &change {
            Change::Appended(events) => events.first().map(|e| e.session_id.clone()),
            Change::Deleted(id) => Some(id.clone()),
            Change::Advanced { session_id, .. } => Some(session_id.clone()),
            Change::Resync => None,
        };
        match session {
            Some(id) => fanout.publish(&id, change),
            None => fanout.publish_all(&change),
        }
    }
}

type EventStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::Event, Status>> + Send>>;

#[tonic::async_trait]
impl SessionStore for SessionStoreService {
    async fn create_session(
        &self,
        request: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let session = self
            .store
            .create(request.into_inner())
            .await
            .map_err(status_of)?;
        Ok(Response::new(session))
    }

    async fn rename_session(
        &self,
        request: Request<pb::RenameSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let req = request.into_inner();
        let session = self
            .store
            .rename(req.session_id, req.name)
            .await
            .map_err(status_of)?;
        Ok(Response::new(session))
    }

    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let id = request.into_inner().session_id;
        Ok(Response::new(
            self.store.get_session(id).await.map_err(status_of)?,
        ))
    }

    async fn list_sessions(
        &self,
        request: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let req = request.into_inner();
        let (sessions, total) = self
            .store
            .list_sessions(req.limit, req.offset, req.only_open_turns)
            .await
            .map_err(status_of)?;
        Ok(Response::new(pb::ListSessionsResponse { sessions, total }))
    }

    async fn delete_session(
        &self,
        request: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::DeleteSessionResponse>, Status> {
        let id = request.into_inner().session_id;
        let deleted_events = self.store.delete_session(id).await.map_err(status_of)?;
        Ok(Response::new(pb::DeleteSessionResponse { deleted_events }))
    }

    async fn fork_session(
        &self,
        request: Request<pb::ForkSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let req = request.into_inner();
        let session = self
            .store
            .fork_session(
                req.session_id,
                req.up_to_seq,
                req.new_session_id,
                req.project_dir,
                req.events,
            )
            .await
            .map_err(status_of)?;
        Ok(Response::new(session))
    }

    async fn append(
        &self,
        request: Request<pb::AppendRequest>,
    ) -> Result<Response<pb::AppendResponse>, Status> {
        let req = request.into_inner();
        let started = std::time::Instant::now();
        let count = req.events.len() as f64;
        let metrics = &self.metrics;
        let result = self
            .store
            .append_checkpointed(
                req.session_id,
                req.expected_seq,
                req.lease_epoch,
                req.events,
                req.checkpoint,
            )
            .await;
        let outcome = if result.is_ok() { "ok" } else { "refused" };
        metrics.observe(
            "agentry_store_append_seconds",
            "Durable append latency (one transaction, fsynced), by outcome.",
            &[("outcome", outcome)],
            started.elapsed(),
        );
        if result.is_ok() {
            metrics.inc(
                "agentry_store_appends_total",
                "Appends stored (a commit may hold several).",
                &[],
            );
            metrics.add(
                "agentry_store_events_appended_total",
                "Events appended to session logs.",
                &[],
                count,
            );
        }
        let stored = result.map_err(status_of)?;
        let last_seq = stored.last().map(|e| e.seq).unwrap_or_default();
        Ok(Response::new(pb::AppendResponse { last_seq }))
    }

    async fn read(
        &self,
        request: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        let req = request.into_inner();
        let mut from = req.from_seq.max(1);
        let checkpoint = if req.from_checkpoint {
            self.store
                .checkpoint(req.session_id.clone())
                .await
                .map_err(status_of)?
                .filter(|checkpoint| checkpoint.seq >= from)
        } else {
            None
        };
        if let Some(checkpoint) = &checkpoint {
            from = checkpoint.seq + 1;
        }
        let (mut events, mut has_more) = self
            .store
            .read(req.session_id, from, req.limit)
            .await
            .map_err(status_of)?;
        // A page stays well under the largest message a client takes
        // (events with images can be megabytes each): at least one event,
        // the rest on the next page.
        let mut bytes = checkpoint.as_ref().map_or(0, prost::Message::encoded_len);
        if let Some(cut) = events.iter().position(|event| {
            bytes += prost::Message::encoded_len(event);
            bytes > MAX_PAGE_BYTES
        }) {
            let keep = cut.max(1);
            has_more |= keep < events.len();
            events.truncate(keep);
        }
        let next_seq = events.last().map(|e| e.seq + 1).unwrap_or(from);
        Ok(Response::new(pb::ReadResponse {
            events,
            next_seq,
            has_more,
            checkpoint,
        }))
    }

    type WatchStream = EventStream;

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let req = request.into_inner();
        self.store
            .heartbeat(req.instance_id, req.url, req.ttl_ms)
            .await
            .map_err(status_of)?;
        Ok(Response::new(pb::HeartbeatResponse {}))
    }

    async fn acquire_session(
        &self,
        request: Request<pb::AcquireSessionRequest>,
    ) -> Result<Response<pb::AcquireSessionResponse>, Status> {
        let req = request.into_inner();
        let lease = if req.peek {
            self.store.session_driver(req.session_id).await
        } else {
            self.store
                .acquire_session(req.session_id, req.instance_id)
                .await
        }
        .map_err(status_of)?;
        Ok(Response::new(pb::AcquireSessionResponse {
            acquired: lease.acquired,
            epoch: lease.epoch,
            owner_instance_id: lease.owner,
            owner_url: lease.owner_url,
        }))
    }

    async fn release_session(
        &self,
        request: Request<pb::ReleaseSessionRequest>,
    ) -> Result<Response<pb::ReleaseSessionResponse>, Status> {
        let req = request.into_inner();
        let released = self
            .store
            .release_session(req.session_id, req.instance_id, req.epoch)
            .await
            .map_err(status_of)?;
        Ok(Response::new(pb::ReleaseSessionResponse { released }))
    }

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let req = request.into_inner();
        // Subscribe before the first read so nothing committed in between is missed.
        let live = self.fanout.subscribe(&req.session_id);
        let id = req.session_id.clone();
        self.store.get_session(id).await.map_err(status_of)?;
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(watch_session(
            self.store.clone(),
            req.session_id,
            req.from_seq.max(1),
            live,
            tx,
            self.closing.clone(),
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Sends stored events from `next`, then live ones, with no gap or duplicate.
async fn watch_session(
    store: Backend,
    session_id: String,
    mut next: u64,
    mut changes: Subscription<Change>,
    tx: mpsc::Sender<Result<pb::Event, Status>>,
    mut closing: watch::Receiver<bool>,
) {
    if catch_up(&store, &session_id, &mut next, &tx).await.is_err() {
        return;
    }
    loop {
        let batch = tokio::select! {
            batch = changes.recv() => batch,
            () = tx.closed() => return,
            () = closing_requested(&mut closing) => {
                let _ = tx.send(Err(Status::unavailable("the session store is shutting down"))).await;
                return;
            }
        };
        match batch {
            Some(Ok(Change::Deleted(id))) if id == session_id => {
                let _ = tx
                    .send(Err(Status::not_found(format!(
                        "session {session_id:?} was deleted"
                    ))))
                    .await;
                return;
            }
            Some(Ok(Change::Deleted(_))) => {}
            // Another replica appended: read what this watcher has not seen.
            Some(Ok(Change::Advanced {
                session_id: id,
                last_seq,
            })) if id == session_id && last_seq >= next => {
                if catch_up(&store, &session_id, &mut next, &tx).await.is_err() {
                    return;
                }
            }
            Some(Ok(Change::Advanced { .. })) => {}
            Some(Ok(Change::Resync)) => {
                if catch_up(&store, &session_id, &mut next, &tx).await.is_err() {
                    return;
                }
            }
            Some(Ok(Change::Appended(batch))) => {
                for e in batch.iter().filter(|e| e.session_id == session_id) {
                    if e.seq < next {
                        continue;
                    }
                    if e.seq > next {
                        // Missed something: read it from the log.
                        if catch_up(&store, &session_id, &mut next, &tx).await.is_err() {
                            return;
                        }
                        if e.seq < next {
                            continue;
                        }
                    }
                    if tx.send(Ok(e.clone())).await.is_err() {
                        return;
                    }
                    next = e.seq + 1;
                }
            }
            // Fell behind: read what was missed from the log.
            Some(Err(_missed)) => {
                if catch_up(&store, &session_id, &mut next, &tx).await.is_err() {
                    return;
                }
            }
            None => return,
        }
    }
}

/// How long a watch waits for an unreachable database before it ends.
const WATCH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

async fn catch_up(
    store: &Backend,
    session_id: &str,
    next: &mut u64,
    tx: &mpsc::Sender<Result<pb::Event, Status>>,
) -> Result<(), ()> {
    // A database that is briefly unreachable (PostgreSQL restarting) does
    // not end the watch: reading is retried for a while.
    let mut unavailable_since: Option<tokio::time::Instant> = None;
    loop {
        let id = session_id.to_string();
        let from = *next;
        let page = store.read(id, from, MAX_READ_EVENTS).await;
        let (events, more) = match page {
            Ok(page) => {
                unavailable_since = None;
                page
            }
            Err(e)
                if e.is_retryable()
                    && unavailable_since
                        .get_or_insert_with(tokio::time::Instant::now)
                        .elapsed()
                        < WATCH_PATIENCE =>
            {
                tokio::select! {
                    () = tokio::time::sleep(std::time::Duration::from_millis(250)) => continue,
                    () = tx.closed() => return Err(()),
                }
            }
            Err(e) => {
                let _ = tx.send(Err(status_of(e))).await;
                return Err(());
            }
        };
        for e in events {
            *next = e.seq + 1;
            if tx.send(Ok(e)).await.is_err() {
                return Err(());
            }
        }
        if !more {
            return Ok(());
        }
    }
}

/// Completes once the service starts closing (never, if nobody can close it).
async fn closing_requested(closing: &mut watch::Receiver<bool>) {
    if closing.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}
