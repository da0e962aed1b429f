//! Live sessions for the console: one fold of each watched session's events
//! ([`SessionView`]) shared by every page watching it, sent as server-sent
//! events: first the whole view, then what each event changed.
//!
//! Every message carries an id `FEED.SEQ.REVISION`: the fold it comes from
//! (random, so two gateways' or two folds' ids never match), the last
//! stored event folded and the view's revision. A page that reconnects (a
//! dropped connection, a restarted gateway) sends the last id it saw; when
//! it is still current, nothing is sent again; otherwise the page gets the
//! whole view as of now, which replaces what it shows. Nothing is lost and
//! nothing shown twice.

use crate::wire;
use agentry_client::view::SessionView;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_runtime::telemetry::TracedChannel;
use axum::response::sse::Event;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;

/// How many messages a slow page may fall behind before it is sent the
/// whole view again.
const BACKLOG: usize = 1024;

/// How long a session nobody watches keeps its fold.
const IDLE: Duration = Duration::from_secs(30);

/// How often a follower looks whether anyone still watches.
const CHECK: Duration = Duration::from_secs(5);

/// A message for the pages watching a session.
#[derive(Debug, Clone)]
pub struct Message {
    /// `SEQ.REVISION`.
    pub id: String,
    /// `snapshot` or `patch`.
    pub kind: &'static str,
    /// The JSON.
    pub data: Arc<str>,
}

impl Message {
    /// As a server-sent event.
    pub fn event(&self) -> Event {
        Event::default()
            .id(self.id.clone())
            .event(self.kind)
            .data(&*self.data)
    }
}

/// The fold of one session and its watchers.
struct Feed {
    state: Mutex<FeedState>,
    tx: broadcast::Sender<Message>,
}

struct FeedState {
    /// This fold, in ids.
    epoch: String,
    view: SessionView,
    /// The revision sent last.
    sent: u64,
    /// Why the session cannot be followed (gone), if so.
    ended: Option<String>,
    /// The answer streaming now and how much of it was sent.
    streamed: Option<(usize, usize)>,
}

impl FeedState {
    fn id(&self) -> String {
        format!(
            "{}.{}.{}",
            self.epoch,
            self.view.last_seq,
            self.view.revision()
        )
    }

    fn snapshot(&self) -> Message {
        let mut data = wire::snapshot(&self.view);
        if let Some(ended) = &self.ended {
            data["ended"] = serde_json::json!(ended);
        }
        Message {
            id: self.id(),
            kind: "snapshot",
            data: data.to_string().into(),
        }
    }
}

/// Every watched session's fold.
#[derive(Clone)]
pub struct Hub {
    feeds: Arc<Mutex<HashMap<String, Arc<Feed>>>>,
    orchestrator: OrchestratorClient<TracedChannel>,
}

/// What a page watching a session receives.
pub struct Watch {
    /// Sent first: the whole view, unless the page's last id is current.
    pub first: Option<Message>,
    /// What follows.
    pub rx: broadcast::Receiver<Message>,
    feed: Arc<Feed>,
}

impl Watch {
    /// After falling behind: the whole view as of now, and what follows it
    /// from now on (nothing older, which the view already holds).
    pub fn resync(&mut self) -> Option<Message> {
        let state = self.feed.state.lock().ok()?;
        self.rx = self.feed.tx.subscribe();
        Some(state.snapshot())
    }
}

impl Hub {
    /// A hub reading sessions from `orchestrator`.
    pub fn new(orchestrator: OrchestratorClient<TracedChannel>) -> Hub {
        Hub {
            feeds: Arc::new(Mutex::new(HashMap::new())),
            orchestrator,
        }
    }

    /// Starts watching `session_id` for a page whose last id was
    /// `last_id`.
    pub fn watch(&self, session_id: &str, last_id: Option<&str>) -> Watch {
        let Ok(mut feeds) = self.feeds.lock() else {
            // A poisoned lock: a fresh feed, unshared.
            return self.fresh_watch(session_id);
        };
        let feed = match feeds.get(session_id) {
            Some(feed) => feed.clone(),
            None => {
                let feed = self.start(session_id);
                feeds.insert(session_id.to_string(), feed.clone());
                feed
            }
        };
        // Attached under the hub's lock: a follower deciding nobody watches
        // (under the same lock) sees this page.
        Self::attach(feed, last_id)
    }

    fn fresh_watch(&self, session_id: &str) -> Watch {
        Self::attach(self.start(session_id), None)
    }

    fn attach(feed: Arc<Feed>, last_id: Option<&str>) -> Watch {
        // Subscribed under the lock: nothing falls between the snapshot and
        // the first change after it.
        let (first, rx) = match feed.state.lock() {
            Ok(state) => {
                let current = last_id == Some(state.id().as_str()) && state.ended.is_none();
                let first = (!current).then(|| state.snapshot());
                (first, feed.tx.subscribe())
            }
            Err(_) => (None, feed.tx.subscribe()),
        };
        Watch { first, rx, feed }
    }

    fn start(&self, session_id: &str) -> Arc<Feed> {
        let (tx, _) = broadcast::channel(BACKLOG);
        let feed = Arc::new(Feed {
            state: Mutex::new(FeedState {
                epoch: epoch(),
                view: SessionView::new(session_id, wire::web_text),
                sent: 0,
                ended: None,
                streamed: None,
            }),
            tx,
        });
        tokio::spawn(follow(self.clone(), session_id.to_string(), feed.clone()));
        feed
    }

    /// Drops `feed` if nobody watches it (looked at under the hub's lock,
    /// which pages attach under); whether it was dropped.
    fn forget(&self, session_id: &str, feed: &Arc<Feed>) -> bool {
        let Ok(mut feeds) = self.feeds.lock() else {
            return true;
        };
        if feed.tx.receiver_count() > 0 {
            return false;
        }
        if feeds.get(session_id).is_some_and(|f| Arc::ptr_eq(f, feed)) {
            feeds.remove(session_id);
        }
        true
    }
}

/// A random name for one fold.
fn epoch() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("{:x}", hasher.finish() & 0xffff_ffff)
}

/// Counts how long nobody has watched a feed.
struct Idle(Option<tokio::time::Instant>);

impl Idle {
    /// Whether nobody has watched `feed` for [`IDLE`] and it was dropped.
    fn over(&mut self, hub: &Hub, session_id: &str, feed: &Arc<Feed>) -> bool {
        if feed.tx.receiver_count() > 0 {
            self.0 = None;
            return false;
        }
        let since = *self.0.get_or_insert_with(tokio::time::Instant::now);
        since.elapsed() >= IDLE && hub.forget(session_id, feed)
    }
}

/// Folds the session's events into the feed as they come, from the
/// orchestrator (again from the last one after a broken stream), until
/// nobody has watched for [`IDLE`].
async fn follow(hub: Hub, session_id: String, feed: Arc<Feed>) {
    use futures::StreamExt;
    let mut idle = Idle(None);
    let mut backoff = Duration::from_millis(100);
    loop {
        let from_seq = feed.state.lock().map(|s| s.view.last_seq + 1).unwrap_or(1);
        let mut client = hub.orchestrator.clone();
        let stream = client
            .subscribe(pb::SubscribeRequest {
                session_id: session_id.clone(),
                from_seq,
                live_only: false,
            })
            .await;
        let mut stream = match stream {
            Ok(s) => s.into_inner(),
            Err(status) => {
                if status.code() == tonic::Code::NotFound {
                    end(&feed, status.message());
                } else {
                    tracing::debug!(%session_id, error = %status.message(), "cannot follow a session yet");
                }
                tokio::time::sleep(backoff.min(CHECK)).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                if idle.over(&hub, &session_id, &feed) {
                    return;
                }
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        loop {
            tokio::select! {
                next = stream.next() => match next {
                    Some(Ok(event)) => fold(&feed, &event),
                    Some(Err(status)) => {
                        tracing::debug!(%session_id, error = %status.message(), "the session's stream broke; following again");
                        break;
                    }
                    None => break,
                },
                () = tokio::time::sleep(CHECK) => {}
            }
            if idle.over(&hub, &session_id, &feed) {
                return;
            }
        }
    }
}

/// Applies one event and sends what it changed.
fn fold(feed: &Feed, event: &agentry_proto::sessions::v1::Event) {
    let Ok(mut state) = feed.state.lock() else {
        return;
    };
    // A stored event seen already (a stream followed again) is skipped.
    if !event.live && event.seq != 0 && event.seq <= state.view.last_seq {
        return;
    }
    let applied = state.view.apply(event);
    let revision = state.view.revision();
    // A live event that changed nothing shown (not even a sub-agent's
    // question, relayed) sends nothing.
    let questions_changed =
        applied.asked.is_some() || !applied.resolved.is_empty() || applied.cleared;
    if revision == state.sent && event.live && !questions_changed {
        return;
    }
    let since = state.sent;
    let mut streamed = state.streamed;
    let data = wire::patch(&state.view, since, &mut streamed);
    state.streamed = streamed;
    state.sent = revision;
    let message = Message {
        id: state.id(),
        kind: "patch",
        data: data.to_string().into(),
    };
    // Nobody watching is fine: the fold goes on for the next page.
    let _ = feed.tx.send(message);
}

fn end(feed: &Feed, why: &str) {
    if let Ok(mut state) = feed.state.lock()
        && state.ended.is_none()
    {
        state.ended = Some(why.to_string());
        let _ = feed.tx.send(state.snapshot());
    }
}
