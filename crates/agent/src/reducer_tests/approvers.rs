//! Rules that name who approves, and calls that need several people.

use super::*;
use crate::inbox;
use crate::reducer::Answerer;
use pretty_assertions::assert_eq;

const DEPLOY_RULE: &str = r#"rule 4 (bash "deploy *"): production"#;

fn person(name: &str, role: &str) -> Option<Answerer> {
    Some(Answerer {
        name: name.into(),
        role: role.into(),
    })
}

fn answer(call_id: &str, decision: ApprovalDecision, edited: &str, by: Option<Answerer>) -> Input {
    Input::Approval {
        call_id: call_id.into(),
        decision,
        reason: String::new(),
        edited_arguments_json: edited.into(),
        by,
    }
}

/// The test policy plus `deploy *`: confirmed, approved by two people among
/// the admins and alice.
fn two_person_session(mode: ApprovalMode) -> Session {
    let mut config = test_policy_config();
    config.rules.push(PolicyRule {
        approvers: vec!["role:admin".into(), "user:alice".into()],
        approvals_required: Some(2),
        ..rule(
            "bash",
            Some("deploy *"),
            None,
            PolicyDecision::Confirm,
            Some("production"),
        )
    });
    let policy = Arc::new(Policy::from_config(&config).unwrap());
    let mut session = Session::with_policy(4, policy, catalog());
    session.ok(user_with(TURN, "ship it", mode));
    session
}

fn asked(effects: &[Effect]) -> Vec<pb::ApprovalRequested> {
    events_of(effects)
        .into_iter()
        .filter_map(|k| match k {
            Kind::ApprovalRequested(a) => Some(a),
            _ => None,
        })
        .collect()
}

fn decided_of(effects: &[Effect]) -> Vec<pb::ApprovalDecided> {
    events_of(effects)
        .into_iter()
        .filter_map(|k| match k {
            Kind::ApprovalDecided(d) => Some(d),
            _ => None,
        })
        .collect()
}

fn pending(session: &Session) -> Vec<agentry_proto::orchestrator::v1::PendingApproval> {
    inbox::pending(&pb::Session::default(), &session.log)
}

#[test]
fn a_two_person_rule_waits_for_two_named_people() {
    let mut session = two_person_session(ApprovalMode::Policy);
    let deploy = bash("d1", "deploy prod");
    let effects = session.ok(model_done("", vec![deploy.clone()]));
    let ask = asked(&effects);
    assert_eq!(ask.len(), 1);
    assert_eq!(ask[0].matched_rule, DEPLOY_RULE);
    assert_eq!(ask[0].approvals_required, 2);
    assert_eq!(
        ask[0].approvers,
        vec![pb::Approvers {
            any_of: vec!["role:admin".into(), "user:alice".into()]
        }]
    );
    assert_eq!(
        pending(&session)[0].approvers,
        "2 different people: role:admin or user:alice"
    );

    // Bob is an approver, but the rule names others.
    let refused = session
        .step(answer(
            "d1",
            ApprovalDecision::Approve,
            "",
            person("bob", "approver"),
        ))
        .unwrap_err();
    assert!(matches!(&refused, Refusal::NotAnApprover(m) if m.starts_with("bob may not approve")));
    // Nor may anyone approve the session for such a call.
    let refused = session
        .step(answer(
            "d1",
            ApprovalDecision::ApproveForSession,
            "",
            person("carol", "admin"),
        ))
        .unwrap_err();
    assert!(
        matches!(refused, Refusal::InvalidDecision(_)),
        "{refused:?}"
    );

    // Alice's approval counts; the call still waits.
    let effects = session.ok(answer(
        "d1",
        ApprovalDecision::Approve,
        "",
        person("alice", "approver"),
    ));
    assert!(run_tools(&effects).is_empty(), "{effects:?}");
    let d = decided_of(&effects);
    assert_eq!(
        (d[0].approved_by.clone(), d[0].approvals_missing),
        (vec!["alice".to_string()], 1)
    );
    assert_eq!(
        phase_of(&session.state, "d1"),
        Some(CallPhase::AwaitingApproval)
    );
    assert_eq!(pending(&session)[0].approved_by, ["alice"]);
    // She cannot be the second person too.
    let refused = session
        .step(answer(
            "d1",
            ApprovalDecision::Approve,
            "",
            person("alice", "approver"),
        ))
        .unwrap_err();
    assert!(
        matches!(&refused, Refusal::NotAnApprover(m) if m.contains("already")),
        "{refused:?}"
    );

    // After a restart the first approval still counts.
    let mut session = session.restarted();
    session.ok(Input::Interrupted);
    assert_eq!(calls_of(&session.state)[0].approved_by, ["alice"]);
    assert_eq!(pending(&session)[0].approved_by, ["alice"]);

    // An admin makes two: it runs.
    let effects = session.ok(answer(
        "d1",
        ApprovalDecision::Approve,
        "",
        person("carol", "admin"),
    ));
    let d = decided_of(&effects);
    assert_eq!(
        (d[0].approved_by.clone(), d[0].approvals_missing),
        (vec!["alice".to_string(), "carol".to_string()], 0)
    );
    assert!(events_of(&effects).contains(&scheduled("d1", "approved by 2 people")));
    assert_eq!(run_tools(&effects), vec![deploy]);
    assert!(pending(&session).is_empty());
}

#[test]
fn anyone_who_answers_approvals_may_deny_a_named_call() {
    let mut session = two_person_session(ApprovalMode::Policy);
    session.ok(model_done("", vec![bash("d1", "deploy prod")]));
    let effects = session.ok(Input::Approval {
        call_id: "d1".into(),
        decision: ApprovalDecision::Deny,
        reason: "not today".into(),
        edited_arguments_json: String::new(),
        by: person("bob", "approver"),
    });
    assert_eq!(phase_of(&session.state, "d1"), Some(CallPhase::Error));
    assert!(run_tools(&effects).is_empty());
    assert!(pending(&session).is_empty());
}

#[test]
fn a_turn_approved_ahead_still_asks_for_a_named_call() {
    let mut session = two_person_session(ApprovalMode::Always);
    let effects = session.ok(model_done(
        "",
        vec![bash("d1", "deploy prod"), bash("b2", "make build")],
    ));
    // make build is confirmed by the default: the turn's approval covers it
    // (it runs once the call before it is answered).
    assert!(events_of(&effects).contains(&scheduled(
        "b2",
        "approved for this turn (default for bash: confirm)"
    )));
    let ask = asked(&effects);
    assert_eq!(ask.len(), 1, "{ask:?}");
    assert_eq!(ask[0].call_id, "d1");
}

#[test]
fn an_edit_counts_as_its_authors_approval_and_earlier_ones_lapse() {
    let mut session = two_person_session(ApprovalMode::Policy);
    session.ok(model_done("", vec![bash("d1", "deploy prod")]));
    session.ok(answer(
        "d1",
        ApprovalDecision::Approve,
        "",
        person("carol", "admin"),
    ));
    let edited = r#"{"command":"deploy staging"}"#;
    let effects = session.ok(answer(
        "d1",
        ApprovalDecision::Edit,
        edited,
        person("alice", "approver"),
    ));
    assert!(run_tools(&effects).is_empty());
    let d = decided_of(&effects);
    assert_eq!(
        (d[0].approved_by.clone(), d[0].approvals_missing),
        (vec!["alice".to_string()], 1)
    );
    // Asked again with the new arguments, for the others to see.
    let ask = asked(&effects);
    assert_eq!(ask[0].arguments_json, edited);
    assert_eq!(pending(&session)[0].arguments_json, edited);
    assert_eq!(pending(&session)[0].approved_by, ["alice"]);
    // Carol approved the old arguments: she approves the new ones too.
    let effects = session.ok(answer(
        "d1",
        ApprovalDecision::Approve,
        "",
        person("carol", "admin"),
    ));
    assert_eq!(run_tools(&effects), vec![call("d1", "bash", edited)]);
}

#[test]
fn an_unrestricted_call_takes_one_approver_as_before() {
    let mut session = two_person_session(ApprovalMode::Policy);
    let build = bash("b1", "make build");
    let effects = session.ok(model_done("", vec![build.clone()]));
    assert_eq!(asked(&effects)[0].approvers, Vec::new());
    assert_eq!(asked(&effects)[0].approvals_required, 0);
    let effects = session.ok(answer(
        "b1",
        ApprovalDecision::Approve,
        "",
        person("bob", "approver"),
    ));
    assert_eq!(decided_of(&effects)[0].approvals_missing, 0);
    assert!(decided_of(&effects)[0].approved_by.is_empty());
    assert_eq!(run_tools(&effects), vec![build]);
}
