#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;
use agentry_proto::sessions::v1::{ModelTextDelta, UserMessage};
use pretty_assertions::assert_eq;

fn user(text: &str) -> Event {
    Event {
        turn_id: "t1".into(),
        kind: Some(event::Kind::UserMessage(UserMessage {
            text: text.into(),
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn delta(text: &str) -> Event {
    Event {
        turn_id: "t1".into(),
        kind: Some(event::Kind::ModelTextDelta(ModelTextDelta {
            text: text.into(),
        })),
        ..Default::default()
    }
}

#[test]
fn the_wal_is_checkpointed_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let store = Store::open(&path).unwrap();
    store.create_session("s", "").unwrap();
    let before = std::fs::metadata(&path).unwrap().len();
    for seq in 1..=200u64 {
        let text = "x".repeat(2000);
        store.append("s", seq, vec![user(&text)]).unwrap();
    }
    // Appends never checkpoint; only the background thread moves the
    // WAL's pages into the database file.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while std::fs::metadata(&path).unwrap().len() < before + 200 * 2000 {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint happened"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(store);
    // The last checkpoint truncates the WAL.
    let wal = dir.path().join("s.db-wal");
    assert!(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0) == 0);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.read("s", 1, 1000).unwrap().0.len(), 200);
}

#[test]
fn concurrent_appends_share_commits_and_keep_every_log_in_order() {
    const WRITERS: usize = 16;
    const APPENDS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Store::open(&dir.path().join("s.db")).unwrap());
    for w in 0..WRITERS {
        store.create_session(&format!("s{w}"), "").unwrap();
    }
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = store.clone();
            std::thread::spawn(move || {
                for seq in 1..=APPENDS {
                    let events = vec![user(&format!("{w}/{seq}"))];
                    let stored = store.append(&format!("s{w}"), seq, events).unwrap();
                    assert_eq!(stored[0].seq, seq);
                    // A stale expected seq is refused, batched or not.
                    let stale = store.append(&format!("s{w}"), seq, vec![delta("x")]);
                    assert!(
                        matches!(stale, Err(StoreError::Conflict { .. })),
                        "{stale:?}"
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for w in 0..WRITERS {
        let (events, _) = store.read(&format!("s{w}"), 1, 1000).unwrap();
        let texts: Vec<String> = events
            .iter()
            .map(|e| match &e.kind {
                Some(event::Kind::UserMessage(m)) => m.text.clone(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        let expected: Vec<String> = (1..=APPENDS).map(|s| format!("{w}/{s}")).collect();
        assert_eq!(texts, expected);
    }
    let appends = WRITERS as u64 * APPENDS;
    let commits = store.commits();
    assert!(
        commits >= 1 && commits <= appends,
        "{commits} commits for {appends} appends"
    );
    eprintln!("{appends} successful appends took {commits} commits");
}

#[test]
fn append_assigns_gap_free_seqs_and_enforces_expected_seq() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    store.create_session("s1", "").unwrap();
    let stored = store
        .append("s1", 1, vec![user("hello"), delta("hi")])
        .unwrap();
    assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
    assert!(
        stored
            .iter()
            .all(|e| e.session_id == "s1" && e.time.is_some())
    );
    let err = store.append("s1", 2, vec![delta("x")]).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Conflict {
                expected: 2,
                actual: 3,
                ..
            }
        ),
        "{err}"
    );
    let err = store.append("s1", 4, vec![delta("x")]).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Conflict {
                expected: 4,
                actual: 3,
                ..
            }
        ),
        "{err}"
    );
    store.append("s1", 3, vec![delta("!")]).unwrap();
    let (events, more) = store.read("s1", 2, 0).unwrap();
    assert!(!more);
    assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![2, 3]);
    let (page, more) = store.read("s1", 1, 2).unwrap();
    assert_eq!(page.len(), 2);
    assert!(more);
}

#[test]
fn bad_appends_are_refused_and_store_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    store.create_session("s1", "").unwrap();
    assert!(matches!(
        store.append("nope", 1, vec![user("x")]).unwrap_err(),
        StoreError::NotFound(_)
    ));
    assert!(matches!(
        store.append("s1", 1, vec![]).unwrap_err(),
        StoreError::InvalidArgument(_)
    ));
    let no_kind = Event::default();
    assert!(matches!(
        store.append("s1", 1, vec![user("a"), no_kind]).unwrap_err(),
        StoreError::InvalidArgument(_)
    ));
    assert_eq!(store.get_session("s1").unwrap().event_count, 0);
    assert!(matches!(
        store.create_session("bad id!", "").unwrap_err(),
        StoreError::InvalidArgument(_)
    ));
    assert!(matches!(
        store.create_session("s1", "").unwrap_err(),
        StoreError::AlreadyExists(_)
    ));
}

#[test]
fn data_survives_reopen_and_listing_is_newest_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    {
        let store = Store::open(&path).unwrap();
        store.create_session("a", "").unwrap();
        store.create_session("b", "Given title").unwrap();
        store
            .append("a", 1, vec![user("first question\nmore")])
            .unwrap();
    }
    let store = Store::open(&path).unwrap();
    let (sessions, total) = store.list_sessions(0, 0, false).unwrap();
    assert_eq!(total, 2);
    assert_eq!(sessions[0].id, "a");
    assert_eq!(sessions[0].title, "first question");
    assert_eq!(sessions[0].preview, "first question");
    assert_eq!(sessions[0].user_message_count, 1);
    assert_eq!(sessions[0].event_count, 1);
    assert_eq!(sessions[1].title, "Given title");
    let (events, _) = store.read("a", 0, 0).unwrap();
    assert_eq!(
        events,
        vec![Event {
            seq: 1,
            session_id: "a".into(),
            ..events[0].clone()
        }]
    );
}

#[test]
fn delete_and_fork() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db")).unwrap();
    store.create_session("a", "").unwrap();
    store
        .append("a", 1, vec![user("q"), delta("x"), delta("y")])
        .unwrap();
    let fork = store.fork_session("a", 2, "f", "", Vec::new()).unwrap();
    assert_eq!(fork.event_count, 2);
    assert_eq!(fork.forked_from, "a");
    let (events, _) = store.read("f", 1, 0).unwrap();
    assert!(events.iter().all(|e| e.session_id == "f"));
    assert!(matches!(
        store.fork_session("a", 9, "g", "", Vec::new()).unwrap_err(),
        StoreError::InvalidArgument(_)
    ));
    assert_eq!(store.delete_session("a").unwrap(), 3);
    assert!(matches!(
        store.get_session("a").unwrap_err(),
        StoreError::NotFound(_)
    ));
    assert!(matches!(
        store.read("a", 1, 0).unwrap_err(),
        StoreError::NotFound(_)
    ));
    assert_eq!(store.read("f", 1, 0).unwrap().0.len(), 2);
}
