//! The check between batches: everything the services stored must read
//! back. Every session's log is read through the session store's `Read`
//! (each event must decode and have its `kind` set, seqs must follow one
//! another), every reminder through the scheduler's `ListReminders`.
//!
//! Logs are append-only, so each session is read from where the last
//! check stopped; a full re-read runs every [`FULL_EVERY`]. Reminders are
//! listed at most every [`REMINDERS_EVERY`] (and at the end), as the list
//! only grows. Sessions beyond [`MAX_SESSIONS`] are deleted (the oldest
//! first), so that a long campaign's checks stay cheap.

use crate::oracle::{Evidence, Finding};
use crate::schema::{Method, Schema};
use crate::target::{Credential, Target};
use agentry_proto::scheduler::v1 as scheduler;
use agentry_proto::sessions::v1 as sessions;
use bytes::Bytes;
use prost::Message;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often every log is read again from its start.
const FULL_EVERY: Duration = Duration::from_secs(60);
/// How often the reminders are listed.
const REMINDERS_EVERY: Duration = Duration::from_secs(5);
/// Sessions kept; older ones are deleted.
const MAX_SESSIONS: usize = 300;
/// Events per `Read` page.
const PAGE: u32 = 500;

/// Where each session's log was read up to.
pub struct Readback {
    list_sessions: Method,
    read: Method,
    list_reminders: Method,
    delete: Method,
    next_seq: HashMap<String, u64>,
    last_full: Instant,
    last_reminders: Option<Instant>,
    /// Sessions never deleted (the run's own).
    keep: Vec<String>,
}

fn method(schema: &Schema, path: &str) -> anyhow::Result<Method> {
    schema
        .methods
        .iter()
        .find(|m| m.path == path)
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("the contracts have no {path}"))
}

fn stored(detail: String) -> Finding {
    Finding {
        rpc: "stored data".into(),
        kind: "stored",
        detail,
        evidence: Evidence::None,
    }
}

impl Readback {
    pub fn new(schema: &Schema, keep: Vec<String>) -> anyhow::Result<Readback> {
        Ok(Readback {
            list_sessions: method(schema, "/agentry.sessions.v1.SessionStore/ListSessions")?,
            read: method(schema, "/agentry.sessions.v1.SessionStore/Read")?,
            list_reminders: method(schema, "/agentry.scheduler.v1.Scheduler/ListReminders")?,
            delete: method(schema, "/agentry.orchestrator.v1.Orchestrator/DeleteSession")?,
            next_seq: HashMap::new(),
            last_full: Instant::now(),
            last_reminders: None,
            keep,
        })
    }

    /// Reads back what was stored since the last check; `last`: the final
    /// check of the run (everything, reminders included).
    pub async fn check(&mut self, target: &Target, last: bool) -> Vec<Finding> {
        let mut findings = Vec::new();
        if last || self.last_full.elapsed() >= FULL_EVERY {
            self.next_seq.clear();
            self.last_full = Instant::now();
        }
        let ids = match self.session_ids(target).await {
            Ok(ids) => ids,
            Err(problem) => return vec![stored(problem)],
        };
        self.next_seq.retain(|id, _| ids.contains(id));
        for id in &ids {
            if let Some(problem) = self.read_log(target, id).await {
                findings.push(stored(problem));
            }
        }
        if ids.len() > MAX_SESSIONS {
            self.prune(target, &ids).await;
        }
        let reminders_due = self
            .last_reminders
            .is_none_or(|at| at.elapsed() >= REMINDERS_EVERY);
        if last || reminders_due {
            findings.extend(self.reminders(target).await.into_iter().map(stored));
            self.last_reminders = Some(Instant::now());
        }
        findings
    }

    /// Every session the store lists, newest first.
    async fn session_ids(&self, target: &Target) -> Result<Vec<String>, String> {
        let mut ids = Vec::new();
        loop {
            let request = sessions::ListSessionsRequest {
                limit: 200,
                offset: ids.len() as u32,
                only_open_turns: false,
            };
            let outcome = target
                .call(
                    &self.list_sessions,
                    vec![Bytes::from(request.encode_to_vec())],
                    Credential::Service,
                    None,
                    false,
                )
                .await;
            if let Some(status) = outcome.status {
                return Err(format!("ListSessions failed: {status:?}"));
            }
            let Some(bytes) = outcome.responses.first() else {
                return Err("ListSessions answered nothing".into());
            };
            let page = sessions::ListSessionsResponse::decode(bytes.as_ref())
                .map_err(|e| format!("ListSessions answer does not decode: {e}"))?;
            let count = page.sessions.len();
            ids.extend(page.sessions.into_iter().map(|s| s.id));
            if count == 0 || ids.len() as u64 >= page.total {
                return Ok(ids);
            }
        }
    }

    /// Reads one log from where the last check stopped; the problem found.
    async fn read_log(&mut self, target: &Target, id: &str) -> Option<String> {
        let mut from = self.next_seq.get(id).copied().unwrap_or(1);
        let mut previous = from.checked_sub(1);
        loop {
            let request = sessions::ReadRequest {
                session_id: id.to_string(),
                from_seq: from,
                limit: PAGE,
            };
            let outcome = target
                .call(
                    &self.read,
                    vec![Bytes::from(request.encode_to_vec())],
                    Credential::Service,
                    None,
                    false,
                )
                .await;
            if let Some(hung) = outcome.hung {
                return Some(format!("Read of session {id:?} from seq {from}: {hung}"));
            }
            if let Some(status) = outcome.status {
                // Deleted since it was listed.
                if status.code() == tonic::Code::NotFound {
                    self.next_seq.remove(id);
                    return None;
                }
                return Some(format!(
                    "Read of session {id:?} from seq {from} failed: {:?}: {}",
                    status.code(),
                    status.message()
                ));
            }
            let bytes = outcome.responses.first()?;
            let page = match sessions::ReadResponse::decode(bytes.as_ref()) {
                Ok(page) => page,
                Err(e) => {
                    return Some(format!(
                        "Read of session {id:?} from seq {from} does not decode: {e}"
                    ));
                }
            };
            for event in &page.events {
                if event.kind.is_none() {
                    return Some(format!(
                        "session {id:?}: event seq {} has no kind: {event:?}",
                        event.seq
                    ));
                }
                if previous.is_some_and(|p| event.seq != p + 1) {
                    return Some(format!(
                        "session {id:?}: event seq {} follows seq {}",
                        event.seq,
                        previous.unwrap_or_default()
                    ));
                }
                previous = Some(event.seq);
            }
            from = page.next_seq.max(from);
            self.next_seq.insert(id.to_string(), from);
            if !page.has_more || page.events.is_empty() {
                return None;
            }
        }
    }

    /// Every reminder must decode and say its id, status and kind.
    async fn reminders(&self, target: &Target) -> Vec<String> {
        let request = scheduler::ListRemindersRequest::default();
        let outcome = target
            .call(
                &self.list_reminders,
                vec![Bytes::from(request.encode_to_vec())],
                Credential::Service,
                None,
                false,
            )
            .await;
        if let Some(hung) = outcome.hung {
            return vec![format!("ListReminders: {hung}")];
        }
        if let Some(status) = outcome.status {
            return vec![format!("ListReminders failed: {status:?}")];
        }
        let Some(bytes) = outcome.responses.first() else {
            return vec!["ListReminders answered nothing".into()];
        };
        let list = match scheduler::ListRemindersResponse::decode(bytes.as_ref()) {
            Ok(list) => list,
            Err(e) => return vec![format!("ListReminders answer does not decode: {e}")],
        };
        let mut problems = Vec::new();
        for r in &list.reminders {
            let status_known = scheduler::ReminderStatus::try_from(r.status)
                .is_ok_and(|s| s != scheduler::ReminderStatus::Unspecified);
            let kind_known = sessions::ReminderKind::try_from(r.kind).is_ok();
            if r.id.is_empty() || !status_known || !kind_known {
                problems.push(format!("a stored reminder reads back malformed: {r:?}"));
            }
        }
        problems
    }

    /// Deletes the oldest sessions beyond the cap (not the run's own).
    async fn prune(&mut self, target: &Target, ids: &[String]) {
        for id in ids.iter().skip(MAX_SESSIONS / 2) {
            if self.keep.contains(id) {
                continue;
            }
            let request = sessions::DeleteSessionRequest {
                session_id: id.clone(),
            };
            let _ = target
                .call(
                    &self.delete,
                    vec![Bytes::from(request.encode_to_vec())],
                    Credential::Client,
                    None,
                    false,
                )
                .await;
            self.next_seq.remove(id);
        }
    }
}
