//! Live sessions for the console: one fold of each watched session's events
//! ([`SessionView`]) shared by every page watching it, sent as server-sent
//! events: first the whole view, then what each event changed.
//!
//! Every message carries an id `SEQ.REVISION`: the last stored event folded
//! and the view's revision. A page that reconnects (a dropped connection, a
//! restarted gateway) sends the last id it saw; when it is still current,
//! nothing is sent again; otherwise the page gets the whole view as of now,
//! which replaces what it shows. Nothing is lost and nothing shown twice.

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
        format!("{}.{}", self.view.last_seq, self.view.revision())
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
    /// The whole view as of now (after falling behind).
    pub fn snapshot(&self) -> Option<Message> {
        self.feed.state.lock().ok().map(|s| s.snapshot())
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

    /// Sessions being followed now.
    pub fn followed(&self) -> usize {
        self.feeds.lock().map(|f| f.len()).unwrap_or_default()
    }

    /// Starts watching `session_id` for a page whose last id was
    /// `last_id`.
    pub fn watch(&self, session_id: &str, last_id: Option<&str>) -> Watch {
        let feed = {
            let Ok(mut feeds) = self.feeds.lock() else {
                // A poisoned lock: a fresh feed, unshared.
                return self.fresh_watch(session_id);
            };
            match feeds.get(session_id) {
                Some(feed) => feed.clone(),
                None => {
                    let feed = self.start(session_id);
                    feeds.insert(session_id.to_string(), feed.clone());
                    feed
                }
            }
        };
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

    fn forget(&self, session_id: &str, feed: &Arc<Feed>) {
        if let Ok(mut feeds) = self.feeds.lock()
            && feeds.get(session_id).is_some_and(|f| Arc::ptr_eq(f, feed))
        {
            feeds.remove(session_id);
        }
    }
}

/// Folds the session's events into the feed as they come, from the
/// orchestrator (again from the last one after a broken stream), until
/// nobody has watched for [`IDLE`].
async fn follow(hub: Hub, session_id: String, feed: Arc<Feed>) {
    use futures::StreamExt;
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
            Err(status) if status.code() == tonic::Code::NotFound => {
                end(&feed, status.message());
                wait_unwatched(&feed).await;
                hub.forget(&session_id, &feed);
                return;
            }
            Err(status) => {
                tracing::debug!(%session_id, error = %status.message(), "cannot follow a session yet");
                if unwatched_for(&feed, backoff).await {
                    hub.forget(&session_id, &feed);
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        loop {
            let next = tokio::time::timeout(IDLE, stream.next()).await;
            match next {
                Ok(Some(Ok(event))) => fold(&feed, &event),
                Ok(Some(Err(status))) => {
                    tracing::debug!(%session_id, error = %status.message(), "the session's stream broke; following again");
                    break;
                }
                Ok(None) => break,
                Err(_) => {}
            }
            if feed.tx.receiver_count() == 0 && unwatched_for(&feed, Duration::ZERO).await {
                hub.forget(&session_id, &feed);
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
    state.view.apply(event);
    let revision = state.view.revision();
    if revision == state.sent && event.live {
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
    if let Ok(mut state) = feed.state.lock() {
        state.ended = Some(why.to_string());
        let _ = feed.tx.send(state.snapshot());
    }
}

/// Waits until nobody has watched the feed for [`IDLE`].
async fn wait_unwatched(feed: &Feed) {
    while !unwatched_for(feed, IDLE).await {}
}

/// Waits `wait`; whether nobody watched the feed meanwhile (checked at
/// the end, and for `IDLE` more when nobody watches now).
async fn unwatched_for(feed: &Feed, wait: Duration) -> bool {
    tokio::time::sleep(wait).await;
    if feed.tx.receiver_count() > 0 {
        return false;
    }
    tokio::time::sleep(IDLE).await;
    feed.tx.receiver_count() == 0
}
