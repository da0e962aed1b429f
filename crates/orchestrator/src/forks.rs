//! Forks and rewinds with the workspace: the log says which snapshot held
//! the files at a point (`crate::rewind`), the tool runners keep and
//! restore snapshots.

use crate::deps::Deps;
use crate::reducer::{Effect, Input};
use crate::rewind;
use crate::settings::Settings;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1 as spb;
use agentry_proto::sessions::v1::event::Kind;
use agentry_proto::tools::v1 as tpb;
use std::time::Duration;
use tonic::Status;

/// Longest a snapshot or a restore may take.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);

/// Whether a runner's refusal means snapshots are off there.
pub fn snapshots_off(status: &Status) -> bool {
    agentry_runtime::reasons::reason_of(status) == agentry_runtime::reasons::Reason::SnapshotsOff
}

impl Deps {
    /// Records a session's workspace as a snapshot (on any runner).
    pub async fn snapshot(&self, session_id: &str) -> Result<tpb::SnapshotResponse, Status> {
        let request = tpb::SnapshotRequest {
            session_id: session_id.to_string(),
        };
        let call = self.runners.on_any(|mut client| {
            let request = request.clone();
            async move {
                client
                    .snapshot(request)
                    .await
                    .map(tonic::Response::into_inner)
            }
        });
        tokio::time::timeout(SNAPSHOT_TIMEOUT, call)
            .await
            .map_err(|_| Status::deadline_exceeded("the workspace snapshot took too long"))?
    }

    /// Puts a session's workspace back to a snapshot.
    pub async fn restore(
        &self,
        session_id: &str,
        snapshot_id: &str,
    ) -> Result<tpb::RestoreSnapshotResponse, Status> {
        let request = tpb::RestoreSnapshotRequest {
            session_id: session_id.to_string(),
            snapshot_id: snapshot_id.to_string(),
        };
        let call = self.runners.on_any(|mut client| {
            let request = request.clone();
            async move {
                client
                    .restore_snapshot(request)
                    .await
                    .map(tonic::Response::into_inner)
            }
        });
        tokio::time::timeout(SNAPSHOT_TIMEOUT, call)
            .await
            .map_err(|_| Status::deadline_exceeded("restoring the workspace took too long"))?
    }
}

/// The event recording a snapshot (or why it failed); `None` when
/// snapshots are off.
pub fn snapshot_event(
    result: Result<tpb::SnapshotResponse, Status>,
    point: spb::SnapshotPoint,
) -> Option<spb::WorkspaceSnapshot> {
    let mut event = match result {
        Ok(taken) => spb::WorkspaceSnapshot {
            snapshot_id: taken.snapshot_id,
            files: taken.files,
            bytes: taken.bytes,
            new_bytes: taken.new_bytes,
            skipped: taken.skipped,
            ..Default::default()
        },
        Err(status) if snapshots_off(&status) => return None,
        Err(status) => {
            tracing::warn!(error = %status.message(), "workspace snapshot failed");
            spb::WorkspaceSnapshot {
                error: status.message().to_string(),
                ..Default::default()
            }
        }
    };
    event.set_point(point);
    Some(event)
}

/// Where a rewind goes: the last event kept and the snapshot of the files
/// there.
pub struct RewindPlan {
    pub to_seq: u64,
    pub snapshot: Option<String>,
    pub events_rewound: u64,
}

/// Plans a rewind of `events` to the end of turn `to_turn`.
pub fn plan_rewind(
    events: &[spb::Event],
    to_turn: u32,
    with_files: bool,
) -> Result<RewindPlan, Status> {
    let effective = rewind::effective(events);
    let turns = rewind::turns(&effective);
    if to_turn as usize > turns.len() {
        return Err(Status::invalid_argument(format!(
            "the session has {} turn{}: rewind to 0..{}",
            turns.len(),
            if turns.len() == 1 { "" } else { "s" },
            turns.len()
        )));
    }
    let to_seq = match to_turn {
        0 => turns.first().map(|t| t.first_seq - 1).unwrap_or(0),
        n => turns[n as usize - 1]
            .last_seq
            .ok_or_else(|| Status::failed_precondition(format!("turn {n} has not finished")))?,
    };
    let events_rewound = effective.iter().filter(|e| e.seq > to_seq).count() as u64;
    let snapshot = if with_files {
        let (id, _) = rewind::snapshot_at(&effective, to_seq).map_err(|e| {
            Status::failed_precondition(format!(
                "cannot put the files back: {e}; rewind the conversation only with \
                 --conversation-only"
            ))
        })?;
        Some(id)
    } else {
        None
    };
    Ok(RewindPlan {
        to_seq,
        snapshot,
        events_rewound,
    })
}

/// Forks a session: the log up to `at_seq`, the workspace as it was there
/// (or, with `project_dir`, checked by the runners already, the fork works
/// there and no files are restored).
pub async fn fork(
    deps: &Deps,
    settings: &Settings,
    request: pb::ForkSessionRequest,
    project_dir: String,
    by: Option<String>,
) -> Result<pb::ForkSessionResponse, Status> {
    crate::service::check_client_session_id(&request.new_session_id)?;
    let source = deps.read_log(&request.session_id).await?;
    if source.is_empty() {
        // The store says whether it exists at all.
        deps.store
            .clone()
            .get_session(spb::GetSessionRequest {
                session_id: request.session_id.clone(),
            })
            .await?;
    }
    let last = source.last().map(|e| e.seq).unwrap_or(0);
    if request.at_seq > last {
        return Err(Status::invalid_argument(format!(
            "cannot fork session {} at seq {}: its log ends at seq {last}",
            request.session_id, request.at_seq
        )));
    }
    let at = if request.at_seq == 0 {
        last
    } else {
        request.at_seq
    };
    let kept = &source[..source.partition_point(|e| e.seq <= at)];
    // Which files the fork starts with.
    let (snapshot_id, snapshot_seq) = if request.conversation_only || !project_dir.is_empty() {
        (String::new(), 0)
    } else if request.at_seq == 0 {
        let taken = deps.snapshot(&request.session_id).await.map_err(|s| {
            agentry_runtime::reasons::restated(
                &s,
                format!(
                    "cannot snapshot the workspace of {}: {}",
                    request.session_id,
                    s.message()
                ),
            )
        })?;
        (taken.snapshot_id, 0)
    } else {
        // The log up to the fork as the fork will see it, then what came
        // after (a snapshot taken later but before the files changed again
        // holds them too).
        let mut chain = rewind::effective(kept);
        chain.extend(&source[kept.len()..]);
        rewind::snapshot_at(&chain, at).map_err(|e| {
            Status::failed_precondition(format!(
                "cannot fork the files: {e}; fork the conversation only with --conversation-only"
            ))
        })?
    };
    // The id is settled first: the fork's files go to its workspace before
    // the store has it, and an existing session's files are never touched.
    let new_id = if request.new_session_id.is_empty() {
        uuid::Uuid::now_v7().to_string()
    } else {
        request.new_session_id.clone()
    };
    match deps
        .store
        .clone()
        .get_session(spb::GetSessionRequest {
            session_id: new_id.clone(),
        })
        .await
    {
        Ok(_) => {
            return Err(Status::already_exists(format!(
                "session {new_id} already exists; fork to another id"
            )));
        }
        Err(status) if status.code() == tonic::Code::NotFound => {}
        Err(status) => return Err(status),
    }
    let forked = spb::SessionForked {
        from_session_id: request.session_id.clone(),
        at_seq: at,
    };
    let prepared = prepare_fork(deps, settings, &new_id, kept, &snapshot_id, forked, by).await;
    let (files_written, closed_open_turn, events) = match prepared {
        Ok(prepared) => prepared,
        Err(status) => {
            // Nothing half made is left behind: files restored so far go.
            if !snapshot_id.is_empty() {
                let _ = deps.forget_session(&new_id).await;
            }
            return Err(status);
        }
    };
    // The copy and the fork's own events in one transaction: a fork is
    // stored whole or not at all, whenever this process stops.
    let stored = deps
        .store
        .clone()
        .fork_session(spb::ForkSessionRequest {
            session_id: request.session_id.clone(),
            up_to_seq: at,
            new_session_id: new_id.clone(),
            project_dir,
            events,
        })
        .await;
    match stored {
        Ok(session) => Ok(pb::ForkSessionResponse {
            session: Some(session.into_inner()),
            snapshot_id,
            snapshot_seq,
            files_written,
            closed_open_turn,
        }),
        Err(status) => {
            // The files restored for it go too.
            if !snapshot_id.is_empty() {
                let _ = deps.forget_session(&new_id).await;
            }
            Err(status)
        }
    }
}

/// Restores the fork's workspace (session `new_id`, not stored yet) and
/// works out its own first events: where it comes from and who made it,
/// its files, a turn its log ended inside closed. Returns the entries
/// written, whether a turn was closed, and the events.
async fn prepare_fork(
    deps: &Deps,
    settings: &Settings,
    new_id: &str,
    kept: &[spb::Event],
    snapshot_id: &str,
    forked: spb::SessionForked,
    by: Option<String>,
) -> Result<(u64, bool, Vec<spb::Event>), Status> {
    let mut files_written = 0;
    let mut state = settings.replayed(kept);
    let mut effects = state
        .step(Input::Noted(Kind::SessionForked(forked)))
        .unwrap_or_default();
    if !snapshot_id.is_empty() {
        let restored = deps.restore(new_id, snapshot_id).await.map_err(|s| {
            agentry_runtime::reasons::restated(
                &s,
                format!("cannot restore the fork's files: {}", s.message()),
            )
        })?;
        files_written = restored.written;
        let mut event = spb::WorkspaceSnapshot {
            snapshot_id: snapshot_id.to_string(),
            ..Default::default()
        };
        event.set_point(spb::SnapshotPoint::Fork);
        effects.extend(
            state
                .step(Input::Noted(Kind::WorkspaceSnapshot(event)))
                .unwrap_or_default(),
        );
    }
    let closed = !state.is_idle();
    if closed {
        effects.extend(
            state
                .step(Input::Cancel {
                    reason: format!(
                        "forked at seq {} inside this turn",
                        kept.last().map(|e| e.seq).unwrap_or(0)
                    ),
                })
                .unwrap_or_default(),
        );
    }
    let events: Vec<spb::Event> = effects
        .into_iter()
        .filter_map(|effect| match effect {
            Effect::Record { turn_id, events } => Some((turn_id, events)),
            _ => None,
        })
        .flat_map(|(turn_id, events)| {
            let by = by.clone();
            events.into_iter().map(move |kind| spb::Event {
                turn_id: turn_id.clone(),
                time: Some(crate::actor::now()),
                // The fork is the person's doing; what it closed is not.
                by: match (&kind, &by) {
                    (Kind::SessionForked(_), Some(by)) => by.clone(),
                    _ => String::new(),
                },
                kind: Some(kind),
                ..Default::default()
            })
        })
        .collect();
    Ok((files_written, closed, events))
}
