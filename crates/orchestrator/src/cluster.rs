//! Several orchestrators behind one address. Each session is driven by one
//! replica at a time, through a lease kept in the session store: a replica
//! heartbeats while it lives, takes a session nobody alive drives (the
//! store raises the lease epoch), and writes to it with that epoch, so a
//! replica that lost a session can never append to it again. An input for
//! a session driven elsewhere is forwarded to its driver; the sessions of a
//! replica that died are taken over by the others within seconds and
//! resume from their logs.
//!
//! Off (one orchestrator, no leases) unless `orchestrator.advertise_url`
//! says where the other replicas reach this one.

use crate::reducer::Input;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_proto::sessions::v1 as spb;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_runtime::Auth;
use agentry_runtime::telemetry::TracedChannel;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use tonic::Status;

/// How often a replica renews its heartbeat, and how long it lasts.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
pub const HEARTBEAT_TTL: Duration = Duration::from_secs(6);
/// How often a replica looks for open sessions nobody alive drives.
pub const TAKEOVER_EVERY: Duration = Duration::from_secs(2);

/// The metadata key marking an input forwarded by another replica: it is
/// taken as it is (attachments already read) and never forwarded again.
pub const FORWARDED: &str = "x-agentry-forwarded";

/// Who drives a session.
pub enum Driver {
    /// This replica, with this lease epoch.
    Here(u64),
    /// Another replica, reached at this URL.
    Elsewhere(String),
}

/// This replica's place in the cluster.
pub struct Cluster {
    /// Unique per process.
    pub instance_id: String,
    /// Where the other replicas reach this one.
    pub url: String,
    auth: Auth,
    peers: Mutex<HashMap<String, OrchestratorClient<TracedChannel>>>,
    /// Whether the store counts this replica alive (its last heartbeat
    /// landed less than a lease ago).
    alive: tokio::sync::watch::Sender<bool>,
}

impl Cluster {
    /// A replica reached at `url`; `auto`: at this host's own address
    /// (its first non-loopback IPv4 address, as a container or a pod has)
    /// on the port of `listen`.
    pub fn new(
        url: &str,
        listen: std::net::SocketAddr,
        auth: &Auth,
    ) -> Result<Cluster, crate::errors::SettingError> {
        let url = if url == "auto" {
            let ip = own_address().ok_or(
                "orchestrator.advertise_url = \"auto\": this host has no address other \
                 replicas could reach; set the URL",
            )?;
            format!("http://{ip}:{}", listen.port())
        } else if url.starts_with("http://") || url.starts_with("https://") {
            url.trim_end_matches('/').to_string()
        } else {
            return Err(format!(
                "orchestrator.advertise_url {url:?} is not an http(s) URL (or \"auto\")"
            )
            .into());
        };
        Ok(Cluster {
            instance_id: uuid::Uuid::now_v7().to_string(),
            url,
            auth: auth.clone(),
            peers: Mutex::default(),
            alive: tokio::sync::watch::Sender::new(false),
        })
    }

    /// Whether the store counts this replica alive: it may drive sessions.
    pub fn is_alive(&self) -> bool {
        *self.alive.borrow()
    }

    /// Whether the replica is alive, waiting up to `wait` for a heartbeat
    /// to land (a replica just started has not renewed one yet).
    pub async fn alive_within(&self, wait: Duration) -> bool {
        if self.is_alive() {
            return true;
        }
        let mut alive = self.alive.subscribe();
        tokio::time::timeout(wait, alive.wait_for(|a| *a))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Follows [`Cluster::is_alive`].
    pub fn watch_alive(&self) -> tokio::sync::watch::Receiver<bool> {
        self.alive.subscribe()
    }

    /// Takes `session_id` unless a live replica drives it.
    pub async fn acquire(
        &self,
        store: &SessionStoreClient<TracedChannel>,
        session_id: &str,
    ) -> Result<Driver, Status> {
        let lease = store
            .clone()
            .acquire_session(spb::AcquireSessionRequest {
                session_id: session_id.to_string(),
                instance_id: self.instance_id.clone(),
                peek: false,
            })
            .await?
            .into_inner();
        Ok(if lease.acquired {
            Driver::Here(lease.epoch)
        } else {
            Driver::Elsewhere(lease.owner_url)
        })
    }

    /// A client of the replica at `url`.
    pub fn peer(&self, url: &str) -> Result<OrchestratorClient<TracedChannel>, Status> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = peers.get(url) {
            return Ok(client.clone());
        }
        let channel = self.auth.lazy_channel(url).map_err(|e| {
            Status::unavailable(format!("cannot reach the orchestrator at {url}: {e}"))
        })?;
        let client = OrchestratorClient::new(channel);
        peers.insert(url.to_string(), client.clone());
        Ok(client)
    }

    /// Keeps this replica alive in the store until `stop`, then ends it at
    /// once so its sessions go to the others without waiting.
    pub async fn heartbeat(
        &self,
        store: SessionStoreClient<TracedChannel>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let beat = |ttl: Duration| {
            let mut store = store.clone();
            let request = spb::HeartbeatRequest {
                instance_id: self.instance_id.clone(),
                url: self.url.clone(),
                ttl_ms: ttl.as_millis() as u64,
            };
            async move { store.heartbeat(request).await }
        };
        let mut landed: Option<std::time::Instant> = None;
        loop {
            // A beat that takes longer than the interval counts as failed:
            // the lease must not lapse while one hangs.
            match tokio::time::timeout(HEARTBEAT_EVERY, beat(HEARTBEAT_TTL)).await {
                Ok(Ok(_)) => {
                    landed = Some(std::time::Instant::now());
                    self.alive
                        .send_if_modified(|alive| !std::mem::replace(alive, true));
                }
                failed => {
                    let why = match failed {
                        Ok(Err(status)) => status.message().to_string(),
                        _ => "no answer in time".to_string(),
                    };
                    tracing::warn!(error = %why, "cannot renew this orchestrator's heartbeat; its sessions go to other replicas if it lapses");
                    // Past a lease without a beat, others may drive this
                    // replica's sessions: it stops driving them.
                    if landed.is_none_or(|at| at.elapsed() >= HEARTBEAT_TTL) {
                        self.alive
                            .send_if_modified(|alive| std::mem::replace(alive, false));
                    }
                }
            }
            let stopping = tokio::select! {
                () = tokio::time::sleep(HEARTBEAT_EVERY) => false,
                _ = stop.wait_for(|s| *s) => true,
            };
            if stopping {
                self.alive.send_replace(false);
                let _ = tokio::time::timeout(HEARTBEAT_EVERY, beat(Duration::ZERO)).await;
                return;
            }
        }
    }
}

/// The address this host reaches others from: the local end of a UDP
/// socket "connected" to a public address (nothing is sent).
fn own_address() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// The wire form of an input a person gave (what another replica takes);
/// `None` for inputs that come from elsewhere (reminders, MCP updates),
/// which the driver receives itself.
pub fn forwardable(input: &Input) -> Option<pb::Input> {
    let kind = match input {
        Input::UserMessage {
            text,
            approval_mode,
            plan,
            network,
            budget,
            images,
            ..
        } => pb::input::Kind::UserMessage(pb::UserInput {
            text: text.clone(),
            approval_mode: *approval_mode as i32,
            plan: *plan,
            network: *network,
            budget: *budget,
            compact: false,
            images: images.clone(),
            interrupt: false,
        }),
        Input::Approval {
            call_id,
            decision,
            reason,
            edited_arguments_json,
            by: _,
        } => pb::input::Kind::Approval(pb::ApprovalInput {
            call_id: call_id.clone(),
            decision: *decision as i32,
            reason: reason.clone(),
            edited_arguments_json: edited_arguments_json.clone(),
        }),
        Input::Cancel { reason } => pb::input::Kind::Cancel(pb::CancelInput {
            reason: reason.clone(),
        }),
        Input::Compact { text, .. } => pb::input::Kind::UserMessage(pb::UserInput {
            text: text.clone(),
            compact: true,
            ..Default::default()
        }),
        _ => return None,
    };
    Some(pb::Input { kind: Some(kind) })
}

/// A request to another replica, marked as forwarded, made for `by` (the
/// replica checks that person's role again, and records them).
pub fn forwarded<T>(
    message: T,
    by: Option<&agentry_runtime::auth::Principal>,
) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
    if let Some(by) = by.filter(|p| p.role != agentry_runtime::auth::Role::Service)
        && let Ok(name) = tonic::metadata::AsciiMetadataValue::try_from(by.name.as_str())
    {
        request
            .metadata_mut()
            .insert(agentry_runtime::auth::ON_BEHALF_OF, name);
    }
    request
}

/// Whether a request was forwarded by another replica.
pub fn was_forwarded<T>(request: &tonic::Request<T>) -> bool {
    request.metadata().contains_key(FORWARDED)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    use agentry_runtime::auth::ON_BEHALF_OF;

    #[test]
    fn the_advertised_url_is_checked_and_auto_is_this_hosts_address() {
        let listen: std::net::SocketAddr = "0.0.0.0:7741".parse().unwrap();
        let auth = Auth::off();
        let given = Cluster::new("http://orchestrator-1:7741/", listen, &auth).unwrap();
        assert_eq!(given.url, "http://orchestrator-1:7741");
        let error = Cluster::new("orchestrator-1:7741", listen, &auth)
            .err()
            .unwrap();
        assert!(error.0.contains("not an http(s) URL"), "{error}");
        // Each replica is its own instance.
        let other = Cluster::new("http://orchestrator-1:7741", listen, &auth).unwrap();
        assert_ne!(given.instance_id, other.instance_id);
        match Cluster::new("auto", listen, &auth) {
            Ok(auto) => {
                assert!(auto.url.starts_with("http://"), "{}", auto.url);
                assert!(auto.url.ends_with(":7741"), "{}", auto.url);
                assert!(!auto.url.contains("127.0.0.1"), "{}", auto.url);
            }
            // A machine with no route anywhere has no such address.
            Err(e) => assert!(e.0.contains("set the URL"), "{e}"),
        }
    }

    #[test]
    fn only_a_persons_inputs_are_forwarded() {
        let user = Input::UserMessage {
            images: Vec::new(),
            turn_id: "t".into(),
            text: "hi".into(),
            approval_mode: spb::ApprovalMode::Always,
            plan: true,
            network: false,
            budget: None,
        };
        let Some(pb::Input {
            kind: Some(pb::input::Kind::UserMessage(m)),
        }) = forwardable(&user)
        else {
            panic!("a message is forwarded");
        };
        assert_eq!((m.text.as_str(), m.plan), ("hi", true));
        assert_eq!(m.approval_mode, spb::ApprovalMode::Always as i32);
        assert!(forwardable(&Input::Interrupted).is_none());
        let request = forwarded((), None);
        assert!(was_forwarded(&request));
        assert!(!was_forwarded(&tonic::Request::new(())));
        assert!(request.metadata().get(ON_BEHALF_OF).is_none());
        // A person's call passed on names them; a service's names nobody.
        let alice = agentry_runtime::auth::Principal {
            name: "alice".into(),
            role: agentry_runtime::auth::Role::Approver,
        };
        let request = forwarded((), Some(&alice));
        assert_eq!(request.metadata().get(ON_BEHALF_OF).unwrap(), "alice");
        let service = agentry_runtime::auth::Principal::service();
        assert!(
            forwarded((), Some(&service))
                .metadata()
                .get(ON_BEHALF_OF)
                .is_none()
        );
    }
}
