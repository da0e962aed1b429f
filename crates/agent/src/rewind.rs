//! Rewinds and forks, read from the log.
//!
//! A rewind appends a `session_rewound` marker: the events after its
//! `to_seq` and before it stay in the log but leave the conversation. The
//! *effective* log is what is left; the state, the turn numbers and the
//! files' history are all read from it, so a replayed log decides the same.
//!
//! Which snapshot holds the files as they were at a position of the log:
//! files change only while a call that is not read-only runs (its result
//! closes the change) and at a rewind (which restores a snapshot). Between
//! two such changes the files stay as they were, so any snapshot taken
//! between the same two changes as the position holds them.

use agentry_proto::sessions::v1 as pb;
use agentry_proto::sessions::v1::event::Kind;
use std::collections::HashSet;

/// The events that make the conversation: those a later rewind made
/// history are left out (the rewind markers themselves stay).
pub fn effective(events: &[pb::Event]) -> Vec<&pb::Event> {
    let mut kept: Vec<&pb::Event> = Vec::with_capacity(events.len());
    for event in events {
        if let Some(Kind::SessionRewound(r)) = &event.kind {
            let to = r.to_seq;
            let cut = kept.partition_point(|e| e.seq <= to);
            kept.truncate(cut);
        }
        kept.push(event);
    }
    kept
}

/// One turn of the effective log, numbered from 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnSpan {
    pub number: u32,
    pub turn_id: String,
    /// The event that started it.
    pub first_seq: u64,
    /// Its `turn_finished`, if it finished.
    pub last_seq: Option<u64>,
}

/// Whether `kind` starts a turn.
pub fn starts_turn(kind: &Kind) -> bool {
    match kind {
        Kind::UserMessage(_) | Kind::McpResourceUpdated(_) => true,
        Kind::ReminderDue(r) => r.reminder_kind() == pb::ReminderKind::Task,
        _ => false,
    }
}

/// The turns of the effective log, in order.
pub fn turns(effective: &[&pb::Event]) -> Vec<TurnSpan> {
    let mut turns: Vec<TurnSpan> = Vec::new();
    for event in effective {
        let Some(kind) = &event.kind else { continue };
        if starts_turn(kind) && !event.turn_id.is_empty() {
            turns.push(TurnSpan {
                number: turns.len() as u32 + 1,
                turn_id: event.turn_id.clone(),
                first_seq: event.seq,
                last_seq: None,
            });
        } else if let Kind::TurnFinished(_) = kind
            && let Some(turn) = turns.last_mut()
            && turn.turn_id == event.turn_id
        {
            turn.last_seq = Some(event.seq);
        }
    }
    turns
}

/// The snapshot that holds the files as they were just after event `at`
/// of the effective log: its id and the seq of the event recording it.
pub fn snapshot_at(effective: &[&pb::Event], at: u64) -> Result<(String, u64), String> {
    // The change number of each position: how many changes happened at or
    // before it.
    let mut changing_calls: HashSet<&str> = HashSet::new();
    let mut change = 0u32;
    let mut at_change = None;
    let mut candidates: Vec<(u32, String, u64)> = Vec::new();
    let mut failures: Vec<(u32, String)> = Vec::new();
    for event in effective {
        if event.seq > at && at_change.is_none() {
            at_change = Some(change);
        }
        match &event.kind {
            Some(Kind::ToolCallRequested(c)) if !c.read_only => {
                changing_calls.insert(c.call_id.as_str());
            }
            Some(Kind::ToolResult(r)) if changing_calls.contains(r.call_id.as_str()) => {
                change += 1;
            }
            Some(Kind::SessionRewound(r)) => {
                change += 1;
                if !r.snapshot_id.is_empty() {
                    candidates.push((change, r.snapshot_id.clone(), event.seq));
                }
            }
            Some(Kind::WorkspaceSnapshot(s)) if s.snapshot_id.is_empty() => {
                failures.push((change, s.error.clone()));
            }
            Some(Kind::WorkspaceSnapshot(s)) => {
                candidates.push((change, s.snapshot_id.clone(), event.seq));
            }
            _ => {}
        }
    }
    let at_change = at_change.unwrap_or(change);
    // The closest one: a snapshot taken before the position is preferred.
    let best = candidates
        .iter()
        .filter(|(c, _, _)| *c == at_change)
        .min_by_key(|(_, _, seq)| (*seq > at, seq.abs_diff(at)));
    match best {
        Some((_, id, seq)) => Ok((id.clone(), *seq)),
        None => {
            let why = failures
                .iter()
                .find(|(c, _)| *c == at_change)
                .map(|(_, e)| format!(" (the snapshot then failed: {e})"))
                .unwrap_or_default();
            Err(format!(
                "the files as they were at seq {at} were not recorded{why}: snapshots are \
                 taken before a turn's first call that may change files and when such a \
                 turn ends"
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn event(seq: u64, turn: &str, kind: Kind) -> pb::Event {
        pb::Event {
            seq,
            turn_id: turn.to_string(),
            kind: Some(kind),
            ..Default::default()
        }
    }

    fn user(seq: u64, turn: &str) -> pb::Event {
        event(seq, turn, Kind::UserMessage(pb::UserMessage::default()))
    }

    fn finished(seq: u64, turn: &str) -> pb::Event {
        event(seq, turn, Kind::TurnFinished(pb::TurnFinished::default()))
    }

    fn snapshot(seq: u64, turn: &str, id: &str) -> pb::Event {
        event(
            seq,
            turn,
            Kind::WorkspaceSnapshot(pb::WorkspaceSnapshot {
                snapshot_id: id.to_string(),
                ..Default::default()
            }),
        )
    }

    fn call(seq: u64, turn: &str, id: &str, read_only: bool) -> [pb::Event; 2] {
        [
            event(
                seq,
                turn,
                Kind::ToolCallRequested(pb::ToolCallRequested {
                    call_id: id.to_string(),
                    read_only,
                    ..Default::default()
                }),
            ),
            event(
                seq + 1,
                turn,
                Kind::ToolResult(pb::ToolResult {
                    call_id: id.to_string(),
                    ..Default::default()
                }),
            ),
        ]
    }

    fn rewound(seq: u64, to_seq: u64, id: &str) -> pb::Event {
        event(
            seq,
            "",
            Kind::SessionRewound(pb::SessionRewound {
                to_seq,
                snapshot_id: id.to_string(),
                ..Default::default()
            }),
        )
    }

    /// Two turns: the first reads, then changes files (snapshots A before,
    /// B after); the second changes them again (B before... C after).
    fn log() -> Vec<pb::Event> {
        let mut log = vec![user(1, "t1")];
        log.extend(call(2, "t1", "r1", true));
        log.push(snapshot(4, "t1", "A"));
        log.extend(call(5, "t1", "w1", false));
        log.push(finished(7, "t1"));
        log.push(snapshot(8, "", "B"));
        log.push(user(9, "t2"));
        log.push(snapshot(10, "t2", "B"));
        log.extend(call(11, "t2", "w2", false));
        log.push(finished(13, "t2"));
        log.push(snapshot(14, "", "C"));
        log
    }

    #[test]
    fn each_position_finds_the_snapshot_of_its_files() {
        let log = log();
        let all = effective(&log);
        assert_eq!(snapshot_at(&all, 1).unwrap(), ("A".to_string(), 4));
        assert_eq!(snapshot_at(&all, 3).unwrap(), ("A".to_string(), 4));
        assert_eq!(snapshot_at(&all, 5).unwrap(), ("A".to_string(), 4));
        // After the first change: the turn's end snapshot.
        assert_eq!(snapshot_at(&all, 6).unwrap(), ("B".to_string(), 8));
        assert_eq!(snapshot_at(&all, 7).unwrap(), ("B".to_string(), 8));
        assert_eq!(snapshot_at(&all, 9).unwrap(), ("B".to_string(), 8));
        assert_eq!(snapshot_at(&all, 13).unwrap(), ("C".to_string(), 14));
        assert_eq!(snapshot_at(&all, 14).unwrap(), ("C".to_string(), 14));
    }

    #[test]
    fn a_change_nobody_recorded_is_reported_with_the_failure() {
        let mut log = log();
        log.truncate(13); // The end snapshot of turn 2 failed:
        log.push(event(
            14,
            "",
            Kind::WorkspaceSnapshot(pb::WorkspaceSnapshot {
                error: "disk full".into(),
                ..Default::default()
            }),
        ));
        let all = effective(&log);
        let error = snapshot_at(&all, 13).unwrap_err();
        assert!(error.contains("disk full"), "{error}");
        assert!(error.contains("seq 13"), "{error}");
    }

    #[test]
    fn a_rewind_leaves_the_events_after_its_point_out_and_restores_files() {
        let mut log = log();
        log.push(snapshot(15, "", "C"));
        log.push(rewound(16, 8, "B"));
        log.push(user(17, "t3"));
        let all = effective(&log);
        let seqs: Vec<u64> = all.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5, 6, 7, 8, 16, 17]);
        let numbered = turns(&all);
        assert_eq!(numbered.len(), 2);
        assert_eq!(
            (numbered[1].number, numbered[1].turn_id.as_str()),
            (2, "t3")
        );
        assert_eq!(numbered[0].last_seq, Some(7));
        // After the rewind the files are B's, recorded by the marker.
        assert_eq!(snapshot_at(&all, 17).unwrap(), ("B".to_string(), 16));
        // A rewind of a rewind: back to before the first turn's change.
        log.push(rewound(18, 3, "A"));
        let all = effective(&log);
        let seqs: Vec<u64> = all.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, [1, 2, 3, 18]);
        assert_eq!(turns(&all)[0].last_seq, None);
    }

    #[test]
    fn turns_started_by_reminders_and_updates_count() {
        let log = vec![
            user(1, "t1"),
            finished(2, "t1"),
            event(
                3,
                "",
                Kind::ReminderDue(pb::ReminderDue {
                    kind: pb::ReminderKind::Notify as i32,
                    ..Default::default()
                }),
            ),
            event(
                4,
                "t2",
                Kind::ReminderDue(pb::ReminderDue {
                    kind: pb::ReminderKind::Task as i32,
                    ..Default::default()
                }),
            ),
            finished(5, "t2"),
            event(
                6,
                "t3",
                Kind::McpResourceUpdated(pb::McpResourceUpdated::default()),
            ),
        ];
        let numbered = turns(&effective(&log));
        assert_eq!(numbered.len(), 3);
        assert_eq!(numbered[1].last_seq, Some(5));
        assert_eq!(numbered[2].last_seq, None);
    }
}
