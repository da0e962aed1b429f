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
