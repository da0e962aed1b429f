#![allow(clippy::expect_used)]
//! The audit read from a log: who did what, and what let each call run.

use agentry_client::audit::{Allowed, records};
use agentry_proto::sessions::v1::{self as pb, event::Kind};

fn event(seq: u64, by: &str, kind: Kind) -> pb::Event {
    pb::Event {
        session_id: "s1".into(),
        seq,
        turn_id: "t1".into(),
        by: by.into(),
        kind: Some(kind),
        ..Default::default()
    }
}

fn requested(call_id: &str, tool: &str, arguments: &str) -> Kind {
    Kind::ToolCallRequested(pb::ToolCallRequested {
        call_id: call_id.into(),
        tool: tool.into(),
        arguments_json: arguments.into(),
        ..Default::default()
    })
}

fn scheduled(call_id: &str, allowed_by: pb::AllowedBy, detail: &str) -> Kind {
    let mut state = pb::ToolCallState {
        call_id: call_id.into(),
        detail: detail.into(),
        ..Default::default()
    };
    state.set_phase(pb::ToolCallPhase::Scheduled);
    state.set_allowed_by(allowed_by);
    Kind::ToolCallState(state)
}

#[test]
fn each_call_names_what_let_it_run_and_each_input_who_sent_it() {
    let log = vec![
        event(
            1,
            "otto",
            Kind::UserMessage(pb::UserMessage {
                text: "build and write the notes".into(),
                approval_mode: pb::ApprovalMode::Always as i32,
                ..Default::default()
            }),
        ),
        event(2, "", requested("c1", "bash", r#"{"command":"make"}"#)),
        event(
            3,
            "",
            scheduled("c1", pb::AllowedBy::Turn, "approved for this turn"),
        ),
        event(
            4,
            "",
            requested("c2", "write_file", r#"{"path":"notes.txt","content":"x"}"#),
        ),
        event(
            5,
            "abe",
            Kind::ApprovalDecided(pb::ApprovalDecided {
                call_id: "c2".into(),
                decision: pb::ApprovalDecision::ApproveForSession as i32,
                allowances: vec![pb::SessionAllowance {
                    tool: "write_file".into(),
                    command: String::new(),
                    path: "notes.txt".into(),
                }],
                ..Default::default()
            }),
        ),
        event(
            6,
            "",
            scheduled("c2", pb::AllowedBy::Person, "approved by a person"),
        ),
        event(
            7,
            "",
            requested("c3", "write_file", r#"{"path":"notes.txt","content":"y"}"#),
        ),
        event(
            8,
            "",
            scheduled("c3", pb::AllowedBy::Session, "session rule: write_file"),
        ),
        event(
            9,
            "",
            requested("c4", "read_file", r#"{"path":"notes.txt"}"#),
        ),
        event(
            10,
            "",
            scheduled("c4", pb::AllowedBy::Rule, "default for read_file: allow"),
        ),
        event(11, "", requested("c5", "bash", r#"{"command":"ls"}"#)),
        event(
            12,
            "",
            scheduled("c5", pb::AllowedBy::Unspecified, "old words"),
        ),
        event(
            13,
            "vera",
            Kind::CancelRequested(pb::CancelRequested {
                reason: "enough".into(),
            }),
        ),
    ];
    let all = records(&log);
    let got: Vec<(&str, &str, &str, Option<Allowed>)> = all
        .iter()
        .map(|r| {
            (
                r.by.as_str(),
                r.action,
                r.subject.as_str(),
                r.allowed.clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("otto", "message", "build and write the notes", None),
            (
                "",
                "tool_call",
                "bash make",
                Some(Allowed::Turn("otto".into()))
            ),
            ("abe", "approve_for_session", "write_file notes.txt", None),
            (
                "",
                "tool_call",
                "write_file notes.txt",
                Some(Allowed::Person("abe".into()))
            ),
            (
                "",
                "tool_call",
                "write_file notes.txt",
                Some(Allowed::Session(vec!["abe".into()]))
            ),
            (
                "",
                "tool_call",
                "read_file notes.txt",
                Some(Allowed::Rule("default for read_file: allow".into()))
            ),
            (
                "",
                "tool_call",
                "bash ls",
                Some(Allowed::NotRecorded("old words".into()))
            ),
            ("vera", "cancel", "enough", None),
        ]
    );
    let json = records(&log)[4].to_json();
    assert_eq!(json["allowed"]["kind"], "session");
    assert_eq!(json["allowed"]["granted_by"][0], "abe");
    assert_eq!(
        Allowed::Session(vec!["abe".into()]).describe(),
        "allowed for this session by abe"
    );
}

#[test]
fn a_session_grant_for_another_path_does_not_count() {
    let log = vec![
        event(
            1,
            "abe",
            Kind::ApprovalDecided(pb::ApprovalDecided {
                call_id: "c0".into(),
                decision: pb::ApprovalDecision::ApproveForSession as i32,
                allowances: vec![pb::SessionAllowance {
                    tool: "write_file".into(),
                    command: String::new(),
                    path: "other.txt".into(),
                }],
                ..Default::default()
            }),
        ),
        event(
            2,
            "",
            requested("c1", "write_file", r#"{"path":"notes.txt","content":"y"}"#),
        ),
        event(
            3,
            "",
            scheduled("c1", pb::AllowedBy::Session, "session rule"),
        ),
    ];
    let last = records(&log).pop().expect("a record");
    assert_eq!(last.allowed, Some(Allowed::Session(Vec::new())));
}
