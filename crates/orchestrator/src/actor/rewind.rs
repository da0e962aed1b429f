//! A rewind, run by the session's actor so that nothing else happens to
//! the session meanwhile.

use super::{Actor, Broken};
use crate::reducer::{Effect, Input};
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1 as spb;
use agentry_proto::sessions::v1::event::Kind;
use tonic::Status;

/// Why a rewind did not happen.
pub(crate) enum RewindError {
    /// It does not fit the session; nothing changed.
    Refused(Status),
    /// The store refused an append: the actor stops.
    Broken(Status),
}

impl RewindError {
    pub(crate) fn into_status(self) -> Status {
        match self {
            RewindError::Refused(status) | RewindError::Broken(status) => status,
        }
    }
}

impl From<Broken> for RewindError {
    fn from(Broken(status): Broken) -> Self {
        RewindError::Broken(status)
    }
}

/// The snapshot id noted by `effects`, if any.
fn noted_snapshot(effects: &[Effect]) -> Option<String> {
    effects.iter().find_map(|effect| match effect {
        Effect::Record { events, .. } => events.iter().find_map(|kind| match kind {
            Kind::WorkspaceSnapshot(s) if !s.snapshot_id.is_empty() => Some(s.snapshot_id.clone()),
            _ => None,
        }),
        _ => None,
    })
}

impl Actor {
    /// Puts the session back to the end of turn `to_turn`: the files (when
    /// asked), then the marker that leaves the later events out of the
    /// conversation.
    pub(super) async fn rewind(
        &mut self,
        to_turn: u32,
        with_files: bool,
    ) -> Result<pb::RewindSessionResponse, RewindError> {
        // The log read below holds everything decided so far.
        self.flush().await?;
        if let Some(turn_id) = self.state.turn_id() {
            return Err(RewindError::Refused(Status::failed_precondition(format!(
                "turn {turn_id} is running: cancel it (or let it finish), then rewind"
            ))));
        }
        let events = self
            .deps
            .read_log(&self.session_id)
            .await
            .map_err(RewindError::Refused)?;
        let plan = crate::forks::plan_rewind(&events, to_turn, with_files)
            .map_err(RewindError::Refused)?;
        let mut rewound = spb::SessionRewound {
            to_turn,
            to_seq: plan.to_seq,
            ..Default::default()
        };
        if let Some(snapshot_id) = plan.snapshot {
            // The files as they are now, so that the rewind can be undone.
            if let Some(noted) = self.take_snapshot(spb::SnapshotPoint::BeforeRewind).await {
                let before = noted_snapshot(&noted);
                self.run_effects(noted).await?;
                // Without a record of the files as they are, the restore
                // would lose them for good.
                rewound.before_snapshot_id = before.ok_or_else(|| {
                    RewindError::Refused(Status::unavailable(
                        "cannot record the files as they are before putting older ones back; \
                         nothing was changed (see the workspace_snapshot event for why)",
                    ))
                })?;
            }
            let restored = self
                .deps
                .restore(&self.session_id, &snapshot_id)
                .await
                .map_err(|s| {
                    RewindError::Refused(agentry_runtime::reasons::restated(
                        &s,
                        format!("cannot put the files back: {}", s.message()),
                    ))
                })?;
            rewound.snapshot_id = snapshot_id;
            rewound.files_written = restored.written;
            rewound.files_deleted = restored.deleted;
            rewound.files_left_alone = restored.left_alone;
        }
        let effects = self
            .state
            .step(Input::Noted(Kind::SessionRewound(rewound.clone())))
            .map_err(|r| RewindError::Refused(Status::failed_precondition(r.to_string())))?;
        let seq = self
            .run_effects(effects)
            .await?
            .unwrap_or(self.next_seq - 1);
        // The conversation goes on from the rewind's point: the state is
        // what the log now gives.
        let events = self
            .deps
            .read_log(&self.session_id)
            .await
            .map_err(RewindError::Broken)?;
        // A sub-agent's session keeps its agent's view and step limit.
        self.state = match &self.child {
            Some(child) => self.settings.replayed_as(&child.agent, &events),
            None => self.settings.replayed(&events),
        };
        // A checkpoint after the point rewound to no longer stands for the
        // log's start: the next idle moment writes a new one.
        if rewound.to_seq < self.checkpointed_at {
            self.checkpointed_at = 0;
        }
        self.offered = None;
        self.snapshotted_turn = None;
        self.files_changed = false;
        tracing::info!(session_id = %self.session_id, to_turn, to_seq = rewound.to_seq, "session rewound");
        Ok(pb::RewindSessionResponse {
            rewound: Some(rewound),
            seq,
            events_rewound: plan.events_rewound,
        })
    }
}
