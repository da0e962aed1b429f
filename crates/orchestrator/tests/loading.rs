//! Loading a session (reading and replaying its log) holds up only that
//! session: a session store that keeps one session's read waiting must not
//! delay a message to another session.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_orchestrator::OrchestratorService;
use agentry_orchestrator::reducer::Input;
use agentry_orchestrator::service::new_turn_id;
use agentry_proto::sessions::v1::session_store_server::{SessionStore, SessionStoreServer};
use agentry_proto::sessions::v1::{self as spb, ApprovalMode};
use agentry_runtime::{Auth, Config, ConfigSource};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The session whose log is slow to read.
const SLOW: &str = "slow-session";

/// An in-memory session store (only what a submit needs) whose reads of
/// [`SLOW`] wait until the test opens the gate.
struct GatedStore {
    logs: Mutex<HashMap<String, Vec<spb::Event>>>,
    /// Set once the slow read has begun.
    slow_read_started: watch::Sender<bool>,
    /// The slow read waits for `true`.
    gate: watch::Receiver<bool>,
    /// The next append is stored, but answered as if the store had been
    /// unreachable (the answer lost on the way).
    lose_next_answer: std::sync::atomic::AtomicBool,
}

#[tonic::async_trait]
impl SessionStore for GatedStore {
    async fn create_session(
        &self,
        _: Request<spb::CreateSessionRequest>,
    ) -> Result<Response<spb::Session>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn get_session(
        &self,
        _: Request<spb::GetSessionRequest>,
    ) -> Result<Response<spb::Session>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn list_sessions(
        &self,
        _: Request<spb::ListSessionsRequest>,
    ) -> Result<Response<spb::ListSessionsResponse>, Status> {
        Ok(Response::new(spb::ListSessionsResponse::default()))
    }

    async fn delete_session(
        &self,
        _: Request<spb::DeleteSessionRequest>,
    ) -> Result<Response<spb::DeleteSessionResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn fork_session(
        &self,
        _: Request<spb::ForkSessionRequest>,
    ) -> Result<Response<spb::Session>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn rename_session(
        &self,
        _: Request<spb::RenameSessionRequest>,
    ) -> Result<Response<spb::Session>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn heartbeat(
        &self,
        _: Request<spb::HeartbeatRequest>,
    ) -> Result<Response<spb::HeartbeatResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn acquire_session(
        &self,
        _: Request<spb::AcquireSessionRequest>,
    ) -> Result<Response<spb::AcquireSessionResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn release_session(
        &self,
        _: Request<spb::ReleaseSessionRequest>,
    ) -> Result<Response<spb::ReleaseSessionResponse>, Status> {
        Err(Status::unimplemented("not in this test"))
    }

    async fn append(
        &self,
        request: Request<spb::AppendRequest>,
    ) -> Result<Response<spb::AppendResponse>, Status> {
        let request = request.into_inner();
        let mut logs = self.logs.lock().unwrap();
        let log = logs.entry(request.session_id.clone()).or_default();
        if request.expected_seq != log.len() as u64 + 1 {
            return Err(Status::failed_precondition(format!(
                "expected next seq {} but the log's next seq is {}",
                request.expected_seq,
                log.len() + 1
            )));
        }
        let lose = self
            .lose_next_answer
            .swap(false, std::sync::atomic::Ordering::SeqCst);
        for mut event in request.events {
            event.seq = log.len() as u64 + 1;
            event.session_id = request.session_id.clone();
            log.push(event);
        }
        if lose {
            return Err(Status::unavailable("the answer was lost"));
        }
        Ok(Response::new(spb::AppendResponse {
            last_seq: log.len() as u64,
        }))
    }

    async fn read(
        &self,
        request: Request<spb::ReadRequest>,
    ) -> Result<Response<spb::ReadResponse>, Status> {
        let request = request.into_inner();
        if request.session_id == SLOW {
            self.slow_read_started.send_replace(true);
            let mut gate = self.gate.clone();
            gate.wait_for(|open| *open).await.unwrap();
        }
        let logs = self.logs.lock().unwrap();
        let events: Vec<spb::Event> = logs
            .get(&request.session_id)
            .map(|log| {
                log.iter()
                    .filter(|e| e.seq >= request.from_seq)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        let next_seq = events.last().map_or(request.from_seq, |e| e.seq + 1);
        Ok(Response::new(spb::ReadResponse {
            events,
            next_seq,
            has_more: false,
            ..Default::default()
        }))
    }

    type WatchStream = Pin<Box<dyn futures::Stream<Item = Result<spb::Event, Status>> + Send>>;

    async fn watch(
        &self,
        _: Request<spb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

fn message(text: &str) -> Input {
    Input::UserMessage {
        images: Vec::new(),
        turn_id: new_turn_id(),
        text: text.into(),
        approval_mode: ApprovalMode::Policy,
        plan: false,
        network: false,
        budget: None,
    }
}

/// Serves `store` on a loopback port and starts an orchestrator on it.
/// Nothing answers at the model's address: turns fail at their model call,
/// after the message is recorded, which is all these tests need.
async fn orchestrator_on(store: Arc<GatedStore>) -> OrchestratorService {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let store_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(SessionStoreServer::from_arc(store))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut config = Config::load(&ConfigSource::default()).unwrap();
    config.session_store.url = store_url;
    config.llm.base_url = "http://127.0.0.1:9/v1".into();
    config.llm.max_retries = 0;
    let deps = agentry_orchestrator::deps_from_config(&config, &Auth::off()).unwrap();
    let settings = agentry_orchestrator::Settings::from_config(&config).unwrap();
    OrchestratorService::new(Arc::new(deps), Arc::new(settings))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_being_loaded_holds_up_only_itself() {
    let (started_tx, mut started) = watch::channel(false);
    let (open_gate, gate) = watch::channel(false);
    let store = Arc::new(GatedStore {
        logs: Mutex::default(),
        slow_read_started: started_tx,
        gate,
        lose_next_answer: false.into(),
    });
    let service = orchestrator_on(store).await;

    let slow = tokio::spawn({
        let service = service.clone();
        async move { service.submit_input(SLOW, message("first")).await }
    });
    tokio::time::timeout(Duration::from_secs(10), started.wait_for(|s| *s))
        .await
        .expect("the slow session's log was never read")
        .unwrap();

    // The slow session is loading; another session's message goes through.
    let other = tokio::time::timeout(
        Duration::from_secs(10),
        service.submit_input("other-session", message("hello")),
    )
    .await
    .expect("a message to another session waited for the slow session's load")
    .unwrap();
    assert_eq!(other.seq, 1);
    assert!(
        !slow.is_finished(),
        "the slow session did not wait for its log"
    );

    // A second message to the slow session waits for the same load and
    // shares its actor: once the read is let go, both are recorded, in
    // order, in one log.
    let second = tokio::spawn({
        let service = service.clone();
        async move { service.submit_input(SLOW, message("second")).await }
    });
    open_gate.send_replace(true);
    let first = tokio::time::timeout(Duration::from_secs(10), slow)
        .await
        .expect("the slow session never loaded")
        .unwrap()
        .unwrap();
    assert_eq!(first.seq, 1);
    let second = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .unwrap()
        .unwrap();
    // The first turn is still running (or failed at the model): the second
    // message is either refused as busy or recorded after the first turn.
    match second {
        Ok(submitted) => assert!(submitted.seq > first.seq),
        Err(status) => assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status}"),
    }
}

/// An append the store kept but whose answer was lost: the retry is refused
/// as out of order, and the orchestrator sees its events already there and
/// goes on instead of giving the session up.
#[tokio::test(flavor = "multi_thread")]
async fn an_append_stored_with_its_answer_lost_counts_as_stored() {
    let (started_tx, _started) = watch::channel(false);
    let (_open_gate, gate) = watch::channel(true);
    let store = Arc::new(GatedStore {
        logs: Mutex::default(),
        slow_read_started: started_tx,
        gate,
        lose_next_answer: false.into(),
    });
    let service = orchestrator_on(store.clone()).await;

    store
        .lose_next_answer
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let submitted = tokio::time::timeout(
        Duration::from_secs(10),
        service.submit_input("lost-answer", message("hello")),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(submitted.seq, 1);
    // Stored once, and the session goes on: the next message follows it.
    let log_len = || store.logs.lock().unwrap()["lost-answer"].len();
    let first_len = log_len();
    assert!(first_len >= 1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // The turn fails at its model call (nothing answers there), then the
    // session takes the next message.
    let next = loop {
        match service.submit_input("lost-answer", message("again")).await {
            Ok(next) => break next,
            Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                assert!(tokio::time::Instant::now() < deadline, "{status}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("the session was given up: {status}"),
        }
    };
    assert!(next.seq > submitted.seq);
    let texts: Vec<String> = store.logs.lock().unwrap()["lost-answer"]
        .iter()
        .filter_map(|e| match &e.kind {
            Some(spb::event::Kind::UserMessage(m)) => Some(m.text.clone()),
            // Sent while the first turn still runs, it steers that turn.
            Some(spb::event::Kind::SteeringQueued(q)) => Some(q.text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["hello", "again"]);
}
