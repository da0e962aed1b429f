//! Malformed decisions and regressions once found.

use super::approvals::awaiting_build;
use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// Malformed decisions and other regressions once found
// ---------------------------------------------------------------------------

/// The proto says an edit carries "replacement arguments (a JSON object)";
/// an edit without any is a malformed decision (a client that forgot the
/// arguments), yet the reducer takes `""` as `{}`, schedules the call as
/// "edited and approved by a person" and runs the tool with empty
/// arguments, noting "[the person edited the arguments to ]".
#[test]
fn edit_without_arguments_is_invalid() {
    for arguments in ["", "  "] {
        let session = awaiting_build();
        let mut state = session.state.clone();
        let refusal = state.step(edit("b1", arguments));
        assert!(
            matches!(&refusal, Err(r @ Refusal::InvalidDecision(_)) if r.is_invalid_argument()),
            "{arguments:?}: {refusal:?}"
        );
        assert_eq!(state, session.state);
    }
}

/// "Approve for this session" records a standing allowance for the call
/// (listed in the `approval_decided` event and kept in `session_rules`), but
/// when the call was confirmed by an explicit confirm *rule* rather than by
/// the tool's default, `Policy::check` never consults session rules, so the
/// identical call asks again: the allowance the person was shown never takes
/// effect.
#[test]
fn approve_for_session_of_a_call_confirmed_by_a_rule_takes_effect() {
    let policy = Arc::new(
        Policy::from_config(&PolicyConfig {
            tools: BTreeMap::from([("bash".to_string(), PolicyDecision::Confirm)]),
            rules: vec![rule(
                "bash",
                Some("git push*"),
                None,
                PolicyDecision::Confirm,
                Some("pushes are public"),
            )],
            network: false,
        })
        .unwrap(),
    );
    let mut session = Session::with_policy(4, policy, catalog());
    session.ok(user("go"));
    session.ok(model_done("", vec![bash("b1", "git push origin")]));
    let effects = session.ok(approve_for_session("b1"));
    assert_eq!(
        events_of(&effects)[0],
        decided(
            "b1",
            ApprovalDecision::ApproveForSession,
            "",
            "",
            vec![allowance("bash", "git push origin", "")]
        )
    );
    session.ok(done("b1", "pushed"));
    let again = bash("b2", "git push origin");
    let effects = session.ok(model_done("", vec![again.clone()]));
    assert_eq!(
        events_of(&effects)[2..].to_vec(),
        vec![
            scheduled("b2", r#"session rule: bash "git push origin""#),
            executing("b2"),
        ]
    );
}

/// After "approve for this session", an identical call of the same response
/// that is already waiting for a decision keeps waiting: the person is asked
/// again about exactly what they just approved for the whole session (and
/// after a restart the re-sent `approval_requested` ignores the allowance
/// too).
#[test]
fn approve_for_session_releases_identical_calls_already_waiting() {
    let mut session = policed(4, ApprovalMode::Policy);
    let b1 = bash("b1", "make build");
    let b2 = bash("b2", "make build");
    session.ok(model_done("", vec![b1.clone(), b2]));
    session.ok(approve_for_session("b1"));
    assert_eq!(
        phase_of(&session.state, "b2"),
        Some(CallPhase::Scheduled),
        "b2 should be allowed by the new session rule"
    );
    let effects = session.ok(done("b1", "built"));
    assert_eq!(
        run_tools(&effects),
        vec![bash("b2", "make build")],
        "b2 should run after b1"
    );
}
