//! MCP: resource updates that start turns, and the policy's use of a
//! server's read-only hint.

use super::*;
use pretty_assertions::assert_eq;

fn update(id: &str, content: &str) -> Input {
    Input::McpResourceUpdated {
        turn_id: "turn-mcp".into(),
        update: pb::McpResourceUpdated {
            server: "fx".into(),
            uri: "watch://file".into(),
            update_id: id.into(),
            content: content.into(),
        },
    }
}

#[test]
fn a_resource_update_starts_a_turn_once() {
    let mut session = Session::new(4);
    let effects = session.ok(update("u1", "new text"));
    let events = events_of(&effects);
    assert!(
        matches!(&events[0], Kind::McpResourceUpdated(u) if u.update_id == "u1"),
        "{events:?}"
    );
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::CallModel { .. })),
        "the update wakes the model: {effects:?}"
    );
    let told = session.state.history.last().unwrap();
    assert!(
        matches!(told, Message::User { content, .. } if content.contains("watch://file") && content.contains("new text")),
        "{told:?}"
    );
    assert_eq!(session.state.turn.as_ref().unwrap().id, "turn-mcp");

    // Busy: the update waits (the runner sends it again).
    session.refused(update("u2", "newer"), Refusal::Busy);
    session.ok(model_done("noted", vec![]));
    assert_eq!(session.state.phase, Phase::Idle);

    // The same update delivered again enters the log once.
    assert!(session.ok(update("u1", "new text")).is_empty());
    assert_eq!(session.state.phase, Phase::Idle, "u1 again starts nothing");
    // A new one does.
    session.ok(update("u2", "newer"));
    assert_eq!(session.state.phase, Phase::Generate);
    assert_eq!(
        session
            .state
            .last_mcp_updates
            .get(&("fx".to_string(), "watch://file".to_string())),
        Some(&"u2".to_string())
    );
}

#[test]
fn a_policy_rule_may_trust_a_servers_read_only_hint() {
    let hinted = ToolFlags {
        read_only_hint: true,
        ..MUTATING
    };
    let catalog = catalog_of(&[("time__now", hinted), ("time__set", MUTATING)]);
    let mut config = test_policy_config();
    config.rules.push(PolicyRule {
        read_only_hint: Some(true),
        tool: "time__*".into(),
        command: None,
        path: None,
        decision: PolicyDecision::Allow,
        reason: Some("reads the clock".into()),
        check_arguments: true,
        network: false,
        approvers: Vec::new(),
        approvals_required: None,
    });
    let policy = Arc::new(Policy::from_config(&config).unwrap());
    let mut session = Session::with_policy(4, policy, catalog);
    session.ok(user("what time is it"));
    let effects = session.ok(model_done(
        "",
        vec![call("t1", "time__now", "{}"), call("t2", "time__set", "{}")],
    ));
    let runs: Vec<String> = run_tools(&effects).into_iter().map(|c| c.id).collect();
    assert_eq!(runs, ["t1"], "the hinted tool runs without asking");
    let asked: Vec<String> = events_of(&effects)
        .into_iter()
        .filter_map(|k| match k {
            Kind::ApprovalRequested(a) => Some(a.call_id),
            _ => None,
        })
        .collect();
    assert_eq!(asked, ["t2"], "the other one asks a person");
}

// ---------------------------------------------------------------------------
// Questions a server asks a person during a call
// ---------------------------------------------------------------------------

fn asked(call_id: &str) -> pb::McpInputRequested {
    pb::McpInputRequested {
        call_id: call_id.into(),
        server: "ask".into(),
        questions: vec![pb::McpQuestion {
            key: "approval".into(),
            mode: "form".into(),
            message: "Deploy?".into(),
            schema_json: r#"{"type":"object","properties":{"confirm":{"type":"boolean"}},"required":["confirm"]}"#.into(),
            url: String::new(),
        }],
        resume_json: r#"{"task":"t-1"}"#.into(),
    }
}

fn reply(call_id: &str, action: &str, content: &str) -> Input {
    Input::McpAnswer {
        call_id: call_id.into(),
        action: action.into(),
        content_json: content.into(),
        by: None,
    }
}

/// A session whose turn runs one call of a server's tool (`d1`).
fn running_deploy(mode: ApprovalMode) -> (Session, ToolCall) {
    let mut session = Session::new(4);
    session.ok(user_with(TURN, "deploy", mode));
    let deploy = call("d1", "ask__deploy", r#"{"target":"web"}"#);
    session.ok(model_done("", vec![deploy.clone()]));
    assert_eq!(phase_of(&session.state, "d1"), Some(CallPhase::Executing));
    (session, deploy)
}

#[test]
fn a_question_waits_across_a_restart_and_the_answer_goes_on_with_the_call() {
    let (mut session, deploy) = running_deploy(ApprovalMode::Policy);
    let effects = session.ok(Input::ToolNeedsInput(asked("d1")));
    assert_eq!(
        effects,
        vec![record(TURN, vec![Kind::McpInputRequested(asked("d1"))])]
    );
    assert_eq!(phase_of(&session.state, "d1"), Some(CallPhase::Executing));
    assert_eq!(session.state.awaiting_input().len(), 1);

    // A restart finds it still waiting: nobody is asked about its outcome,
    // nothing runs.
    let mut session = session.restarted();
    let effects = session.ok(Input::Interrupted);
    assert!(run_tools(&effects).is_empty(), "{effects:?}");
    assert!(
        !events_of(&effects)
            .iter()
            .any(|e| matches!(e, Kind::ApprovalRequested(_))),
        "{effects:?}"
    );
    assert_eq!(session.state.awaiting_input().len(), 1);

    // An answer that does not fit is refused; one that does is recorded and
    // the call goes on with it.
    session.refused(
        reply("d1", "accept", r#"{"confirm": "perhaps"}"#),
        Refusal::InvalidDecision(
            "field \"confirm\" of question approval must be true or false".into(),
        ),
    );
    session.refused(
        reply("nope", "accept", "{}"),
        Refusal::NoPendingQuestion {
            call_id: "nope".into(),
        },
    );
    let effects = session.ok(reply("d1", "accept", r#"{"confirm": "yes"}"#));
    let answers = r#"{"approval":{"action":"accept","content":{"confirm":true}}}"#;
    let resume = pb::McpResume {
        resume_json: r#"{"task":"t-1"}"#.into(),
        answers_json: answers.into(),
        cancel: false,
    };
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![Kind::McpInputProvided(pb::McpInputProvided {
                    call_id: "d1".into(),
                    action: "accept".into(),
                    answers_json: answers.into(),
                })]
            ),
            Effect::RunTool {
                call: deploy,
                read_only: false,
                network: false,
                resume: Some(resume),
            },
        ]
    );
    assert!(session.state.awaiting_input().is_empty());
    // A second answer finds nothing waiting; the result ends the call.
    session.refused(
        reply("d1", "decline", ""),
        Refusal::NoPendingQuestion {
            call_id: "d1".into(),
        },
    );
    session.ok(done("d1", "deployed web"));
    assert_eq!(phase_of(&session.state, "d1"), Some(CallPhase::Success));
}

#[test]
fn a_cancelled_turn_tells_the_waiting_server_to_stop() {
    let (mut session, deploy) = running_deploy(ApprovalMode::Policy);
    session.ok(Input::ToolNeedsInput(asked("d1")));
    let effects = session.ok(cancel("enough"));
    assert!(
        effects.contains(&Effect::StopAsking {
            call: deploy,
            resume_json: r#"{"task":"t-1"}"#.into(),
        }),
        "{effects:?}"
    );
    assert!(session.state.is_idle());
    assert!(session.state.awaiting_input().is_empty());
}

#[test]
fn a_turn_that_asks_nobody_fails_the_call_with_the_questions() {
    let (mut session, deploy) = running_deploy(ApprovalMode::Never);
    let effects = session.ok(Input::ToolNeedsInput(asked("d1")));
    assert!(
        effects.contains(&Effect::StopAsking {
            call: deploy,
            resume_json: r#"{"task":"t-1"}"#.into(),
        }),
        "{effects:?}"
    );
    assert_eq!(phase_of(&session.state, "d1"), Some(CallPhase::Error));
    let result = events_of(&effects)
        .into_iter()
        .find_map(|e| match e {
            Kind::ToolResult(r) => Some(r.output),
            _ => None,
        })
        .unwrap();
    assert!(
        result.contains("asks nobody (approval mode never)") && result.contains("Deploy?"),
        "{result}"
    );
}
