//! Notifications: the orchestrator hands over events a person may want to
//! hear about; each goes into the durable outbox once per `[[notify]]`
//! webhook subscribed to its event, and a worker POSTs them, signed, with
//! retries and backoff until delivered (for a day). A delivery is leased
//! while it is tried, so several schedulers on one database send it once.

use crate::backend::Backend;
use crate::store::{Delivery, DeliveryState};
use agentry_proto::scheduler::v1 as pb;
use agentry_runtime::config::{NotifyConfig, NotifyFormat};
use chrono::{DateTime, Utc};
use hmac::{KeyInit, Mac};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// How long a delivery is tried before it is given up.
const GIVE_UP_AFTER: chrono::Duration = chrono::Duration::hours(24);
/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// How long one attempt may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a claimed delivery is kept from other schedulers.
const LEASE: chrono::Duration = chrono::Duration::seconds(60);

/// A `[[notify]]` webhook that cannot be used: a sentence naming it and
/// what to change.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotifySetupError(String);

/// Why one attempt to deliver failed (kept with the delivery).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct DeliveryFailed(String);

/// A webhook, ready to send to.
#[derive(Clone)]
pub struct Target {
    /// Its name.
    pub name: String,
    url: String,
    events: Vec<String>,
    format: NotifyFormat,
    headers: Vec<(String, String)>,
    secret: Option<Vec<u8>>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("url", &agentry_runtime::config::redact_url(&self.url))
            .field("events", &self.events)
            .field("signed", &self.secret.is_some())
            .finish()
    }
}

/// The webhooks the configuration names, with their keys read from the
/// environment; an error names a key that is not set.
pub fn targets(configs: &[NotifyConfig]) -> Result<Vec<Target>, NotifySetupError> {
    configs
        .iter()
        .map(|c| {
            let secret = match (c.secret_env.trim(), c.secret_file.trim()) {
                ("", "") => None,
                ("", file) => Some(read_key(&c.name, file)?),
                (name, _) => Some(
                    std::env::var(name)
                        .ok()
                        .filter(|v| !v.is_empty())
                        .ok_or_else(|| {
                            NotifySetupError(format!(
                                "notify {:?}: secret_env names {name}, which is not set in the \
                                 scheduler's environment",
                                c.name
                            ))
                        })?
                        .into_bytes(),
                ),
            };
            Ok(Target {
                name: c.name.clone(),
                url: c.url.clone(),
                events: c.events.clone(),
                format: c.format,
                headers: c
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                secret,
            })
        })
        .collect()
}

/// A key from a file of the scheduler's own (not readable by others).
fn read_key(name: &str, path: &str) -> Result<Vec<u8>, NotifySetupError> {
    use std::os::unix::fs::PermissionsExt;
    let failed =
        |why: String| NotifySetupError(format!("notify {name:?}: secret_file {path}: {why}"));
    let meta = std::fs::metadata(path).map_err(|e| failed(e.to_string()))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(failed("others can read it; chmod 600 it".into()));
    }
    let key = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(failed("it is empty".into()));
    }
    Ok(key.as_bytes().to_vec())
}

/// The deliveries `notifications` make for `targets`.
pub fn deliveries(targets: &[Target], notifications: &[pb::Notification]) -> Vec<Delivery> {
    let mut out = Vec::new();
    for n in notifications {
        for t in targets.iter().filter(|t| t.events.contains(&n.event)) {
            let body = match t.format {
                NotifyFormat::Json => {
                    let payload: serde_json::Value =
                        serde_json::from_str(&n.payload_json).unwrap_or(serde_json::Value::Null);
                    serde_json::json!({
                        "id": n.id,
                        "event": n.event,
                        "session_id": n.session_id,
                        "turn_id": n.turn_id,
                        "title": n.title,
                        "text": n.text,
                        "time": n.time.map(|t| t.seconds),
                        "details": payload,
                    })
                    .to_string()
                }
                NotifyFormat::Text => {
                    format!("{}\nsession {}", n.text, n.session_id)
                }
            };
            out.push(Delivery {
                id: format!("{}/{}", n.id, t.name),
                target: t.name.clone(),
                event: n.event.clone(),
                title: n.title.clone(),
                body,
                created: Utc::now(),
                attempts: 0,
            });
        }
    }
    out
}

/// The signature header's value: `sha256=` and the hex HMAC-SHA256 of
/// `<timestamp>.<body>` under `key`.
pub fn signature(key: &[u8], timestamp: i64, body: &str) -> String {
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(key) else {
        return String::new();
    };
    mac.update(format!("{timestamp}.{body}").as_bytes());
    let bytes = mac.finalize().into_bytes();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={hex}")
}

/// The wait before attempt `attempts + 1`.
fn backoff(base: Duration, attempts: u32) -> Duration {
    base.saturating_mul(1 << attempts.min(16)).min(MAX_BACKOFF)
}

/// Sends what is due until `stop` turns true.
pub async fn run(
    store: Backend,
    targets: Arc<Vec<Target>>,
    retry: Duration,
    wake: Arc<Notify>,
    mut stop: watch::Receiver<bool>,
) {
    if targets.is_empty() {
        return;
    }
    let http = match reqwest::Client::builder()
        .timeout(ATTEMPT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(http) => http,
        Err(e) => {
            tracing::error!(error = %e, "notifications cannot be sent: no HTTP client");
            return;
        }
    };
    loop {
        let now = Utc::now();
        match store.claim_deliveries(now, now + LEASE, 50).await {
            Ok(due) => {
                for delivery in due {
                    attempt(&store, &http, &targets, retry, delivery).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot read the notifications' outbox"),
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
            () = wake.notified() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

async fn attempt(
    store: &Backend,
    http: &reqwest::Client,
    targets: &[Target],
    retry: Duration,
    delivery: Delivery,
) {
    let now = Utc::now();
    let Some(target) = targets.iter().find(|t| t.name == delivery.target) else {
        // The webhook left the configuration: nobody to send it to.
        let _ = store
            .delivery_attempted(
                delivery.id.clone(),
                DeliveryState::Failed,
                now,
                "no [[notify]] webhook has this name any more".into(),
            )
            .await;
        return;
    };
    let outcome = send(http, target, &delivery).await;
    let (state, next, error) = match outcome {
        Ok(()) => (DeliveryState::Delivered, now, String::new()),
        Err(why) if now - delivery.created >= GIVE_UP_AFTER => {
            tracing::error!(delivery = %delivery.id, webhook = %target.name, error = %why,
                "a notification was given up after a day of failed attempts");
            (DeliveryState::Failed, now, why.to_string())
        }
        Err(why) => {
            let wait = backoff(retry, delivery.attempts);
            tracing::info!(delivery = %delivery.id, webhook = %target.name, error = %why,
                wait_ms = wait.as_millis() as u64, "a notification was not delivered; trying again later");
            let next: DateTime<Utc> =
                now + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::seconds(300));
            (DeliveryState::Pending, next, why.to_string())
        }
    };
    if let Err(e) = store
        .delivery_attempted(delivery.id.clone(), state, next, error)
        .await
    {
        tracing::warn!(delivery = %delivery.id, error = %e, "cannot record a notification attempt");
    }
}

async fn send(
    http: &reqwest::Client,
    target: &Target,
    delivery: &Delivery,
) -> Result<(), DeliveryFailed> {
    let timestamp = Utc::now().timestamp();
    let content_type = match target.format {
        NotifyFormat::Json => "application/json",
        NotifyFormat::Text => "text/plain; charset=utf-8",
    };
    let mut request = http
        .post(&target.url)
        .header("content-type", content_type)
        .header("x-agentry-event", &delivery.event)
        .header("x-agentry-delivery", &delivery.id)
        .header("x-agentry-timestamp", timestamp.to_string());
    if target.format == NotifyFormat::Text {
        request = request.header("title", title_header(&delivery.title));
    }
    if let Some(key) = &target.secret {
        request = request.header(
            "x-agentry-signature",
            signature(key, timestamp, &delivery.body),
        );
    }
    for (name, value) in &target.headers {
        request = request.header(name, value);
    }
    match request.body(delivery.body.clone()).send().await {
        Ok(response) if response.status().is_success() => Ok(()),
        Ok(response) => Err(DeliveryFailed(format!(
            "the webhook answered HTTP {}",
            response.status()
        ))),
        Err(e) => Err(DeliveryFailed(format!(
            "the webhook cannot be reached: {e}"
        ))),
    }
}

/// A title as a header can carry it (printable ASCII; others replaced).
fn title_header(title: &str) -> String {
    title
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(200)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_and_body() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let mut mac =
            hmac::Hmac::<sha2::Sha256>::new_from_slice(b"Jefe").unwrap_or_else(|_| unreachable!());
        mac.update(b"what do ya want for nothing?");
        let known: String = mac
            .finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            known,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            signature(b"k", 1700000000, "{}"),
            signature(b"k", 1700000000, "{}")
        );
        assert_ne!(
            signature(b"k", 1700000000, "{}"),
            signature(b"k", 1700000001, "{}")
        );
        assert!(signature(b"k", 1, "x").starts_with("sha256="));
    }

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        let base = Duration::from_secs(5);
        assert_eq!(backoff(base, 0), Duration::from_secs(5));
        assert_eq!(backoff(base, 1), Duration::from_secs(10));
        assert_eq!(backoff(base, 3), Duration::from_secs(40));
        assert_eq!(backoff(base, 30), MAX_BACKOFF);
    }
}
