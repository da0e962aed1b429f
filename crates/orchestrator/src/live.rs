//! Live events: what a subscriber sees as it happens and the log does not
//! keep, the model's streamed text. The complete answer is logged as one
//! `model_message` when the model finishes; a crash in between loses only
//! text that the model is asked for again anyway. So a delta goes from the
//! model call straight to the session's subscribers, without waiting for a
//! durable append (docs/architecture.md, "Streamed text is live").
//!
//! A live event carries the seq of the last logged event before it. A
//! subscription merges the live events into the log's: one is held until
//! the logged event it follows has been sent, and dropped once a logged
//! event that ends its model call (the answer, an error, the end of the
//! turn) has been sent, so a reader sees text in place and never after the
//! answer it belongs to.
//!
//! Events the actor appended reach the subscribers of this replica the same
//! way, straight after the store acknowledged them ([`LiveHub::logged`]),
//! instead of after a round trip through the store's watch; the watch stays
//! for the history before a subscription and for what another replica
//! appends. A subscription sends each logged event once, in seq order,
//! whichever way it came first.
//!
//! With several orchestrators, the replica that drives a session has its
//! live events; another replica following the session asks the driver for
//! them (`Subscribe` with `live_only`).

use crate::cluster::Cluster;
use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::sessions::v1 as spb;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_runtime::telemetry::TracedChannel;
use agentry_runtime::topics::{Subscription, Topics};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, mpsc};
use tokio_stream::StreamExt;
use tonic::{Status, Streaming};

/// Live events a slow subscriber may fall behind by before it misses some
/// (they are dropped for it; the logged answer still comes).
const LIVE_BUFFER: usize = 256;
/// Live events held for a logged event not sent yet.
const MAX_HELD: usize = 4096;
/// How often a replica following a session looks again for a driver
/// elsewhere when it found none (a turn starting is noticed at once, from
/// the log; this catches a takeover).
const FIND_DRIVER_EVERY: Duration = Duration::from_secs(10);

type Live = Arc<spb::Event>;

/// The live events of the sessions this replica drives, by session.
pub struct LiveHub(Arc<Topics<Live>>);

impl Default for LiveHub {
    fn default() -> Self {
        LiveHub(Topics::new(LIVE_BUFFER))
    }
}

impl LiveHub {
    /// Shows `event` to the session's subscribers now (nobody: dropped).
    pub fn publish(&self, event: spb::Event) {
        let session_id = event.session_id.clone();
        self.0.publish(&session_id, Arc::new(event));
    }

    /// Shows the events just appended to `session_id`'s log, from seq
    /// `first` on, to its subscribers here (nobody: nothing is copied).
    pub fn logged(&self, session_id: &str, first: u64, events: &[spb::Event]) {
        if !self.0.has(session_id) {
            return;
        }
        for (seq, event) in (first..).zip(events) {
            let mut event = event.clone();
            event.session_id = session_id.to_string();
            event.seq = seq;
            event.live = false;
            self.0.publish(session_id, Arc::new(event));
        }
    }

    /// Shows `event` (another session's: a sub-agent's question) to the
    /// subscribers of `session_id`.
    pub fn publish_to(&self, session_id: &str, event: spb::Event) {
        self.0.publish(session_id, Arc::new(event));
    }

    /// Follows the live events of `session_id` from now on.
    pub fn follow(&self, session_id: &str) -> LiveFeed {
        LiveFeed(self.0.subscribe(session_id))
    }

    /// Sessions with a subscriber now.
    pub fn followed(&self) -> usize {
        self.0.len()
    }
}

/// One subscriber's live events of a session.
pub struct LiveFeed(Subscription<Live>);

impl LiveFeed {
    /// The next live event; `None` when the hub is gone. Events missed by
    /// falling behind are skipped.
    pub async fn next(&mut self) -> Option<Live> {
        loop {
            match self.0.recv().await? {
                Ok(event) => return Some(event),
                Err(missed) => {
                    tracing::debug!(missed, "a subscriber fell behind the streamed text");
                }
            }
        }
    }
}

/// The live event a model call streams: `text`, after logged event
/// `after_seq`.
pub fn text_delta(session_id: &str, turn_id: &str, after_seq: u64, text: String) -> spb::Event {
    spb::Event {
        session_id: session_id.to_string(),
        seq: after_seq,
        turn_id: turn_id.to_string(),
        time: Some(crate::actor::now()),
        kind: Some(spb::event::Kind::ModelTextDelta(spb::ModelTextDelta {
            text,
        })),
        live: true,
        by: String::new(),
    }
}

/// Whether a logged event ends the model output before it: live text that
/// follows an earlier event is not shown after it.
fn ends_model_output(event: &spb::Event) -> bool {
    use spb::event::Kind;
    matches!(
        event.kind,
        Some(Kind::ModelMessage(_) | Kind::TurnFinished(_) | Kind::Error(_))
    )
}

/// Whether a logged event starts a turn.
fn starts_turn(event: &spb::Event) -> bool {
    use spb::event::Kind;
    matches!(
        event.kind,
        Some(Kind::UserMessage(_) | Kind::ReminderDue(_) | Kind::McpResourceUpdated(_))
    )
}

/// Where a merged subscription is in the log.
struct Merge {
    /// The seq of the last logged event sent.
    sent: u64,
    /// The seq of the last logged event sent that ended model output.
    closed_at: u64,
    /// Live events waiting for the logged event they follow.
    held: VecDeque<Live>,
    /// Logged events that came straight from this replica's actor ahead of
    /// those before them (the watch is still replaying), by seq.
    ahead: BTreeMap<u64, spb::Event>,
}

impl Merge {
    /// What to do with a live event now: `Some(true)` send, `Some(false)`
    /// drop, `None` hold.
    fn place(&self, event: &spb::Event) -> Option<bool> {
        use spb::event::Kind;
        // A sub-agent's question (or its end), relayed: shown at once.
        if matches!(
            event.kind,
            Some(Kind::ApprovalRequested(_) | Kind::ToolCallState(_))
        ) {
            return Some(true);
        }
        if self.closed_at > event.seq {
            Some(false)
        } else if event.seq <= self.sent {
            Some(true)
        } else {
            None
        }
    }
}

/// A session's logged events (from the store's watch) with its live events
/// merged in, for one subscriber. `remote` carries live events fetched from
/// another replica that drives the session.
pub fn merge(
    mut logged: Streaming<spb::Event>,
    mut local: LiveFeed,
    mut remote: Option<mpsc::Receiver<Live>>,
    from_seq: u64,
    nudge: Option<Arc<Notify>>,
) -> mpsc::Receiver<Result<spb::Event, Status>> {
    let (tx, rx) = mpsc::channel(256);
    tokio::spawn(async move {
        let mut at = Merge {
            sent: from_seq.saturating_sub(1),
            closed_at: 0,
            held: VecDeque::new(),
            ahead: BTreeMap::new(),
        };
        loop {
            let live = tokio::select! {
                biased;
                event = logged.next() => {
                    let event = match event {
                        Some(Ok(event)) => event,
                        Some(Err(status)) => {
                            let _ = tx.send(Err(status)).await;
                            return;
                        }
                        None => return,
                    };
                    if at.send_logged(event, true, &tx, nudge.as_deref()).await.is_err() {
                        return;
                    }
                    continue;
                }
                event = local.next() => event,
                event = async { remote.as_mut()?.recv().await }, if remote.is_some() => {
                    if event.is_none() {
                        remote = None;
                    }
                    event
                }
                _ = tx.closed() => return,
            };
            let Some(event) = live else { continue };
            // An event this replica's actor appended, straight after the
            // store acknowledged it.
            if !event.live {
                let event = Live::unwrap_or_clone(event);
                if at
                    .send_logged(event, false, &tx, nudge.as_deref())
                    .await
                    .is_err()
                {
                    return;
                }
                continue;
            }
            match at.place(&event) {
                Some(true) => {
                    if tx.send(Ok(Live::unwrap_or_clone(event))).await.is_err() {
                        return;
                    }
                }
                Some(false) => {}
                None => {
                    if at.held.len() == MAX_HELD {
                        at.held.pop_front();
                    }
                    at.held.push_back(event);
                }
            }
        }
    });
    rx
}

/// Logged events a subscription keeps ahead of the watch at most (past
/// that, the watch brings them).
const MAX_AHEAD: usize = 4096;

type Sent = Result<(), ()>;

impl Merge {
    /// Sends a logged event, from the watch (`from_store`, which is the
    /// log's order) or from this replica's actor, once and in seq order:
    /// one already sent is dropped, one of the actor's ahead of those
    /// before it waits for them; then the logged events and the live text
    /// that were waiting for it.
    async fn send_logged(
        &mut self,
        event: spb::Event,
        from_store: bool,
        tx: &mpsc::Sender<Result<spb::Event, Status>>,
        nudge: Option<&Notify>,
    ) -> Sent {
        if event.seq <= self.sent {
            return Ok(());
        }
        if event.seq > self.sent + 1 && !from_store {
            if self.ahead.len() < MAX_AHEAD {
                self.ahead.insert(event.seq, event);
            }
            return Ok(());
        }
        let mut next = Some(event);
        while let Some(event) = next {
            self.sent = event.seq;
            if ends_model_output(&event) {
                self.closed_at = event.seq;
            }
            // A turn may start on another replica: look for it.
            if let Some(nudge) = nudge
                && starts_turn(&event)
            {
                nudge.notify_one();
            }
            tx.send(Ok(event)).await.map_err(|_| ())?;
            // Held live text whose logged event has come.
            while let Some(show) = self.held.front().and_then(|e| self.place(e)) {
                let Some(live) = self.held.pop_front() else {
                    break;
                };
                if show {
                    tx.send(Ok(Live::unwrap_or_clone(live)))
                        .await
                        .map_err(|_| ())?;
                }
            }
            self.ahead.retain(|seq, _| *seq > self.sent);
            next = self.ahead.remove(&(self.sent + 1));
        }
        Ok(())
    }
}

/// The live events of a session another replica drives, for as long as
/// `tx` is open: asks the store who drives it, follows that replica's live
/// events, and looks again when they end, when `nudge` says a turn started,
/// or every ten seconds while no other replica drives it.
pub async fn follow_driver(
    cluster: Arc<Cluster>,
    store: SessionStoreClient<TracedChannel>,
    session_id: String,
    tx: mpsc::Sender<Live>,
    nudge: Arc<Notify>,
) {
    loop {
        let driver = store
            .clone()
            .acquire_session(spb::AcquireSessionRequest {
                session_id: session_id.clone(),
                instance_id: cluster.instance_id.clone(),
                peek: true,
            })
            .await
            .map(tonic::Response::into_inner);
        match driver {
            Ok(lease)
                if !lease.owner_url.is_empty()
                    && lease.owner_instance_id != cluster.instance_id =>
            {
                if let Ok(mut peer) = cluster.peer(&lease.owner_url) {
                    let request = crate::cluster::forwarded(
                        opb::SubscribeRequest {
                            session_id: session_id.clone(),
                            from_seq: 0,
                            live_only: true,
                        },
                        None,
                    );
                    if let Ok(response) = peer.subscribe(request).await {
                        let mut events = response.into_inner();
                        loop {
                            tokio::select! {
                                event = events.next() => match event {
                                    Some(Ok(event)) => {
                                        if tx.send(Arc::new(event)).await.is_err() {
                                            return;
                                        }
                                    }
                                    _ => break,
                                },
                                _ = tx.closed() => return,
                            }
                        }
                    }
                }
            }
            Ok(_) => {}
            Err(status) if status.code() == tonic::Code::NotFound => return,
            Err(_) => {}
        }
        tokio::select! {
            _ = nudge.notified() => {}
            _ = tokio::time::sleep(FIND_DRIVER_EVERY) => {}
            _ = tx.closed() => return,
        }
    }
}

/// The live events of a session driven here, as a stream (what another
/// replica asks for with `live_only`).
pub fn live_only(mut feed: LiveFeed) -> mpsc::Receiver<Result<spb::Event, Status>> {
    let (tx, rx) = mpsc::channel(LIVE_BUFFER);
    tokio::spawn(async move {
        loop {
            tokio::select! {
                event = feed.next() => match event {
                    // Logged events reach other replicas through the store.
                    Some(event) if !event.live => {}
                    Some(event) => {
                        if tx.send(Ok(Live::unwrap_or_clone(event))).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                },
                _ = tx.closed() => return,
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    fn logged(seq: u64, kind: spb::event::Kind) -> spb::Event {
        spb::Event {
            seq,
            kind: Some(kind),
            ..Default::default()
        }
    }

    #[test]
    fn live_text_waits_for_its_logged_event_and_never_follows_its_answer() {
        let mut at = Merge {
            sent: 4,
            closed_at: 0,
            held: VecDeque::new(),
            ahead: BTreeMap::new(),
        };
        // After an event already sent: now.
        assert_eq!(at.place(&text_delta("s", "t", 4, "a".into())), Some(true));
        // After one not sent yet: held.
        assert_eq!(at.place(&text_delta("s", "t", 6, "b".into())), None);
        // The answer of the call that streamed after seq 6 is logged at 9.
        let answer = logged(
            9,
            spb::event::Kind::ModelMessage(spb::ModelMessage::default()),
        );
        assert!(ends_model_output(&answer));
        at.sent = 9;
        at.closed_at = 9;
        // Text of that call arriving late: dropped.
        assert_eq!(at.place(&text_delta("s", "t", 6, "c".into())), Some(false));
        // Text of the next call (it follows the answer): shown.
        assert_eq!(at.place(&text_delta("s", "t", 9, "d".into())), Some(true));
        let tool = logged(10, spb::event::Kind::ToolResult(spb::ToolResult::default()));
        assert!(!ends_model_output(&tool));
    }

    #[tokio::test]
    async fn logged_events_go_out_once_in_order_whichever_way_they_came() {
        let (tx, mut rx) = mpsc::channel(16);
        let mut at = Merge {
            sent: 2,
            closed_at: 0,
            held: VecDeque::new(),
            ahead: BTreeMap::new(),
        };
        let result = |seq| {
            logged(
                seq,
                spb::event::Kind::ToolResult(spb::ToolResult::default()),
            )
        };
        // The actor's 4 and 5 come before the watch has replayed 3: they
        // wait, and so does text streamed after 4.
        at.send_logged(result(4), false, &tx, None)
            .await
            .expect("sent");
        at.send_logged(result(5), false, &tx, None)
            .await
            .expect("sent");
        at.held
            .push_back(Arc::new(text_delta("s", "t", 4, "after four".into())));
        assert!(rx.try_recv().is_err(), "nothing before 3");
        at.send_logged(result(3), true, &tx, None)
            .await
            .expect("sent");
        // Again from the watch, and the actor's 3 late: dropped.
        for (seq, from_store) in [(4, true), (5, true), (3, false)] {
            at.send_logged(result(seq), from_store, &tx, None)
                .await
                .expect("sent");
        }
        let mut out = Vec::new();
        while let Ok(event) = rx.try_recv() {
            let event = event.expect("an event");
            out.push((event.seq, event.live));
        }
        assert_eq!(out, [(3, false), (4, false), (4, true), (5, false)]);
        // The store's order is the log's: an event of the watch past a gap
        // goes out at once.
        at.send_logged(result(8), true, &tx, None)
            .await
            .expect("sent");
        assert_eq!(rx.try_recv().expect("sent").expect("an event").seq, 8);
    }

    #[tokio::test]
    async fn appended_events_reach_this_replicas_subscribers_but_not_other_replicas() {
        let hub = LiveHub::default();
        let mut here = hub.follow("s1");
        let elsewhere = live_only(hub.follow("s1"));
        let appended = [
            logged(0, spb::event::Kind::ToolResult(spb::ToolResult::default())),
            logged(
                0,
                spb::event::Kind::TurnFinished(spb::TurnFinished::default()),
            ),
        ];
        hub.logged("s1", 7, &appended);
        hub.publish(text_delta("s1", "t", 8, "after".into()));
        // This replica's subscribers get them as stored: the session, the
        // seqs the store gave them, not live.
        for seq in [7, 8] {
            let event = here.next().await.expect("an event");
            assert_eq!(
                (event.session_id.as_str(), event.seq, event.live),
                ("s1", seq, false)
            );
        }
        assert!(here.next().await.expect("the text").live);
        // Another replica asking for the live events gets the text alone
        // (the logged ones reach it through the store).
        let mut elsewhere = elsewhere;
        let first = elsewhere.recv().await.expect("an event").expect("ok");
        assert!(first.live, "{first:?}");
        assert_eq!(first.seq, 8);
    }

    #[tokio::test]
    async fn a_session_leaves_the_hub_with_its_last_subscriber() {
        let hub = LiveHub::default();
        let mut first = hub.follow("s1");
        let second = hub.follow("s1");
        let _other = hub.follow("s2");
        assert_eq!(hub.followed(), 2);
        hub.publish(text_delta("s1", "t", 3, "hello".into()));
        let event = first.next().await.expect("an event");
        assert!(event.live);
        assert_eq!(event.seq, 3);
        drop(second);
        assert_eq!(hub.followed(), 2, "s1 still has a subscriber");
        drop(first);
        assert_eq!(hub.followed(), 1);
        // Nobody follows s1: publishing keeps nothing.
        hub.publish(text_delta("s1", "t", 4, "lost".into()));
        assert_eq!(hub.followed(), 1);
    }
}
