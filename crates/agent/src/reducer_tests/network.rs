//! The person's network switch.

use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// The person's network switch
// ---------------------------------------------------------------------------

#[test]
fn a_turn_keeps_the_persons_network_switch_through_a_replay_and_no_other_turn_inherits_it() {
    let mut session = Session::new(4);
    let effects = session.ok(Input::UserMessage {
        images: Vec::new(),
        turn_id: TURN.into(),
        text: "fetch it".into(),
        approval_mode: ApprovalMode::Policy,
        plan: false,
        network: true,
        budget: None,
    });
    assert_eq!(
        events_of(&effects),
        vec![Kind::UserMessage(pb::UserMessage {
            images: Vec::new(),
            text: "fetch it".into(),
            approval_mode: ApprovalMode::Policy as i32,
            plan: false,
            network: true,
            budget: None,
            compact: false,
        })]
    );
    // `step` has checked that the replayed log gives the same state.
    assert!(session.state.turn.as_ref().unwrap().network);
    session.ok(model_done("fetched", vec![]));
    assert_eq!(session.state.turn, None);

    // The next message does not say network: none.
    session.ok(user_in(TURN2, "again"));
    assert!(!session.state.turn.as_ref().unwrap().network);
    session.ok(model_done("done", vec![]));

    // Nor does a turn a reminder starts, with nobody there to give it.
    session.ok(Input::ReminderDue {
        turn_id: "turn-3".into(),
        reminder: pb::ReminderDue {
            reminder_id: "r1".into(),
            firing_id: "f1".into(),
            message: "check the page".into(),
            kind: pb::ReminderKind::Task as i32,
            ..Default::default()
        },
    });
    assert!(!session.state.turn.as_ref().unwrap().network);
}

#[test]
fn an_approval_request_says_when_the_call_would_get_network() {
    let mut config = test_policy_config();
    config.rules.push(PolicyRule {
        read_only_hint: None,
        tool: "bash".into(),
        command: Some("curl *".into()),
        path: None,
        decision: PolicyDecision::Confirm,
        reason: None,
        check_arguments: true,
        network: true,
        approvers: Vec::new(),
        approvals_required: None,
    });
    let policy = Arc::new(Policy::from_config(&config).unwrap());
    let asked = |session: &mut Session, call: ToolCall| -> bool {
        let effects = session.ok(model_done("", vec![call]));
        events_of(&effects)
            .iter()
            .find_map(|k| match k {
                Kind::ApprovalRequested(a) => Some(a.network),
                _ => None,
            })
            .expect("an approval request")
    };

    // A rule with network: the person is told.
    let mut session = Session::with_policy(4, policy.clone(), catalog());
    session.ok(user("fetch"));
    assert!(asked(&mut session, bash("b1", "curl https://example.org")));
    // Another command in the same turn: no network.
    session.ok(deny("b1", ""));
    assert!(!asked(&mut session, bash("b2", "make build")));
    assert!(
        !session
            .state
            .network_for("bash", r#"{"command":"make build"}"#)
    );

    // A turn the person gave network: every bash call has it, other tools not.
    let mut session = Session::with_policy(4, policy, catalog());
    session.ok(Input::UserMessage {
        images: Vec::new(),
        turn_id: TURN.into(),
        text: "build".into(),
        approval_mode: ApprovalMode::Policy,
        plan: false,
        network: true,
        budget: None,
    });
    assert!(asked(&mut session, bash("b1", "make build")));
    assert!(
        !session
            .state
            .network_for("write_file", r#"{"path":"a","content":""}"#)
    );
}

#[test]
fn a_turn_given_network_grants_it_to_the_tools_the_catalog_says_take_it() {
    // A tool of an MCP server that takes network, beside bash that does
    // not (a runner may say so): the catalog decides, not the name.
    let fetching = ToolFlags {
        network: true,
        ..MUTATING
    };
    let catalog = catalog_of(&[("web__get", fetching), ("bash", MUTATING)]);
    let mut session = Session::with_policy(4, test_policy(), catalog);
    session.ok(Input::UserMessage {
        images: Vec::new(),
        turn_id: TURN.into(),
        text: "get it".into(),
        approval_mode: ApprovalMode::Policy,
        plan: false,
        network: true,
        budget: None,
    });
    assert!(session.state.network_for("web__get", "{}"));
    assert!(
        !session
            .state
            .network_for("bash", r#"{"command":"curl https://example.org"}"#)
    );
    assert!(!session.state.network_for("unknown", "{}"));
}

#[test]
fn a_catalog_recorded_before_the_network_flag_gives_network_to_bash_alone() {
    let offered = |name: &str, network: Option<bool>| pb::OfferedTool {
        name: name.into(),
        description: String::new(),
        parameters_json_schema: r#"{"type":"object"}"#.into(),
        read_only: false,
        parallel_safe: false,
        read_only_hint: false,
        network,
    };
    let old = Catalog::from_event(&pb::ToolsOffered {
        tools: vec![offered("bash", None), offered("fetch", None)],
    });
    assert!(old.flags["bash"].network);
    assert!(!old.flags["fetch"].network);

    // Recorded now, the flag says, whatever the name.
    let new = Catalog::from_event(&pb::ToolsOffered {
        tools: vec![offered("bash", Some(false)), offered("fetch", Some(true))],
    });
    assert!(!new.flags["bash"].network);
    assert!(new.flags["fetch"].network);
    // And survives being recorded again.
    assert_eq!(Catalog::from_event(&new.to_event()), new);
}
