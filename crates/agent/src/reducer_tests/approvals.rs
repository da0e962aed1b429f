//! Policy verdicts, approvals and approval modes.

use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// Policy: allow, deny, confirm
// ---------------------------------------------------------------------------

#[test]
fn policy_allows_denies_and_asks() {
    let mut session = policed(4, ApprovalMode::Policy);
    let read = read_file("r1", "a.txt");
    let secret = read_file("r2", "secrets/key");
    let sudo = bash("b3", "sudo rm -rf /");
    let build = bash("b4", "make build");
    let status = bash("b5", "git status");
    let calls = vec![
        read.clone(),
        secret.clone(),
        sudo.clone(),
        build.clone(),
        status.clone(),
    ];
    let effects = session.ok(model_done("checking", calls.clone()));
    let denied_secret = format!("error: denied by policy: {SECRETS_RULE}");
    let denied_sudo = format!("error: denied by policy: {SUDO_RULE}");
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![first_answer(FIXED_WITH_TOOLS, first_message("checking"))],
                    calls.iter().map(requested_in_catalog).collect(),
                    vec![scheduled("r1", READ_FILE_DEFAULT)],
                    closed(&secret, ToolCallPhase::Error, &denied_secret),
                    closed(&sudo, ToolCallPhase::Error, &denied_sudo),
                    vec![
                        approval_requested(&build, BASH_DEFAULT),
                        awaiting("b4"),
                        scheduled("b5", GIT_STATUS_RULE),
                        executing("r1"),
                    ],
                ])
            ),
            ran(read.clone()),
        ]
    );
    assert_eq!(
        calls_of(&session.state),
        vec![
            call_in_catalog(&read, CallPhase::Executing, false),
            call_in_catalog(&secret, CallPhase::Error, true),
            call_in_catalog(&sudo, CallPhase::Error, true),
            call_in_catalog(&build, CallPhase::AwaitingApproval, false),
            call_in_catalog(&status, CallPhase::Scheduled, false),
        ]
    );
    assert_eq!(
        session.state.awaiting_approval(),
        vec![&call_in_catalog(&build, CallPhase::AwaitingApproval, false)]
    );
    // Denied calls are answered at once, in the model's order.
    assert_eq!(
        session.state.history[2..].to_vec(),
        vec![
            Message::tool("r2", &denied_secret),
            Message::tool("b3", &denied_sudo),
        ]
    );

    // The read finishes; the call awaiting approval holds up git status.
    let effects = session.ok(done("r1", "text"));
    assert_eq!(effects, vec![record(TURN, success("r1", "text"))]);
    assert_eq!(phase_of(&session.state, "b5"), Some(CallPhase::Scheduled));
    assert_eq!(
        session.state.history[2..].to_vec(),
        vec![
            Message::tool("r1", "text"),
            Message::tool("r2", &denied_secret),
            Message::tool("b3", &denied_sudo),
        ]
    );
}

#[test]
fn policy_denying_every_call_calls_the_model_with_the_reasons() {
    let mut session = policed(4, ApprovalMode::Policy);
    let sudo = bash("b1", "sudo ls");
    let effects = session.ok(model_done("", vec![sudo.clone()]));
    let output = format!("error: denied by policy: {SUDO_RULE}");
    let history = vec![
        Message::user("go"),
        assistant("", vec![sudo.clone()]),
        Message::tool("b1", &output),
    ];
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![
                        first_answer(FIXED_WITH_TOOLS, first_message("")),
                        requested_in_catalog(&sudo)
                    ],
                    closed(&sudo, ToolCallPhase::Error, &output),
                ])
            ),
            model_call(&session.state, history.clone()),
        ]
    );
    assert_eq!(session.state.phase, Phase::Generate);
    assert_eq!(session.state.history, history);
}

// ---------------------------------------------------------------------------
// Approvals
// ---------------------------------------------------------------------------

/// A policed session whose first response asked for `make build` (b1,
/// awaiting approval) then read_file a.txt (r2, scheduled behind it).
pub(super) fn awaiting_build() -> Session {
    let mut session = policed(4, ApprovalMode::Policy);
    let effects = session.ok(model_done(
        "",
        vec![bash("b1", "make build"), read_file("r2", "a.txt")],
    ));
    assert_eq!(run_tools(&effects), vec![]);
    session
}

#[test]
fn approval_request_names_the_matched_rule() {
    let mut session = policed(4, ApprovalMode::Policy);
    let build = bash("b1", "make build");
    let write = write_file("w2", "out.txt");
    let effects = session.ok(model_done("", vec![build.clone(), write.clone()]));
    assert_eq!(
        effects,
        vec![record(
            TURN,
            vec![
                first_answer(FIXED_WITH_TOOLS, first_message("")),
                requested_in_catalog(&build),
                requested_in_catalog(&write),
                approval_requested(&build, BASH_DEFAULT),
                awaiting("b1"),
                approval_requested(&write, WRITE_FILE_DEFAULT),
                awaiting("w2"),
            ]
        )]
    );
    assert_eq!(session.state.phase, Phase::UseTools);
    assert_eq!(
        session
            .state
            .awaiting_approval()
            .iter()
            .map(|c| c.id.as_str())
            .collect::<Vec<_>>(),
        vec!["b1", "w2"]
    );
}

#[test]
fn approve_schedules_and_runs_the_call() {
    let mut session = awaiting_build();
    let build = bash("b1", "make build");
    let effects = session.ok(approval("b1", ApprovalDecision::Approve, "looks fine", ""));
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    decided("b1", ApprovalDecision::Approve, "looks fine", "", vec![]),
                    scheduled("b1", APPROVED),
                    executing("b1"),
                ]
            ),
            ran(build.clone()),
        ]
    );
    assert!(session.state.awaiting_approval().is_empty());
    assert_eq!(session.state.session_rules, vec![]);
    // The mutating call runs alone; the read follows it.
    let effects = session.ok(done("b1", "built"));
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![success("b1", "built"), vec![executing("r2")]])
            ),
            ran(read_file("r2", "a.txt")),
        ]
    );
    let effects = session.ok(done("r2", "text"));
    assert_eq!(
        effects.last(),
        Some(&model_call(
            &session.state,
            vec![
                Message::user("go"),
                assistant("", vec![build, read_file("r2", "a.txt")]),
                Message::tool("b1", "built"),
                Message::tool("r2", "text"),
            ]
        ))
    );
}

#[test]
fn approve_for_session_records_allowances_and_later_calls_pass() {
    let mut session = policed(4, ApprovalMode::Policy);
    let both = bash("b1", "make build && make test");
    session.ok(model_done("", vec![both.clone()]));
    let effects = session.ok(approve_for_session("b1"));
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    decided(
                        "b1",
                        ApprovalDecision::ApproveForSession,
                        "",
                        "",
                        vec![
                            allowance("bash", "make build", ""),
                            allowance("bash", "make test", ""),
                        ]
                    ),
                    scheduled("b1", APPROVED_FOR_SESSION),
                    executing("b1"),
                ]
            ),
            ran(both),
        ]
    );
    let rules = vec![
        SessionRule {
            tool: "bash".into(),
            command: Some("make build".into()),
            path: None,
        },
        SessionRule {
            tool: "bash".into(),
            command: Some("make test".into()),
            path: None,
        },
    ];
    assert_eq!(session.state.session_rules, rules);
    session.ok(done("b1", "ok"));
    session.ok(model_done("done", vec![]));
    // The allowances outlive the turn.
    assert!(session.state.is_idle());
    assert_eq!(session.state.session_rules, rules);

    // A later identical command goes straight to Scheduled; others still ask,
    // and deny rules still win.
    session.ok(user_in(TURN2, "again"));
    let test = bash("b2", "make test");
    let other = bash("b3", "make clean");
    let sudo = bash("b4", "sudo make test");
    let effects = session.ok(model_done(
        "",
        vec![test.clone(), other.clone(), sudo.clone()],
    ));
    let denied = format!("error: denied by policy: {SUDO_RULE}");
    assert_eq!(
        effects,
        vec![
            record(
                TURN2,
                concat(vec![
                    vec![
                        first_message(""),
                        requested_in_catalog(&test),
                        requested_in_catalog(&other),
                        requested_in_catalog(&sudo),
                        scheduled("b2", r#"session rule: bash "make test""#),
                        approval_requested(&other, BASH_DEFAULT),
                        awaiting("b3"),
                    ],
                    closed(&sudo, ToolCallPhase::Error, &denied),
                    vec![executing("b2")],
                ])
            ),
            ran(test),
        ]
    );
}

#[test]
fn approve_for_session_of_a_file_call_allows_that_path() {
    let mut session = policed(4, ApprovalMode::Policy);
    session.ok(model_done("", vec![write_file("w1", "out.txt")]));
    let effects = session.ok(approve_for_session("w1"));
    assert_eq!(
        events_of(&effects)[0],
        decided(
            "w1",
            ApprovalDecision::ApproveForSession,
            "",
            "",
            vec![allowance("write_file", "", "out.txt")]
        )
    );
    session.ok(done("w1", "written"));
    let same = write_file("w2", "out.txt");
    let other = write_file("w3", "other.txt");
    let effects = session.ok(model_done("", vec![same.clone(), other.clone()]));
    assert_eq!(
        events_of(&effects)[3..].to_vec(),
        vec![
            scheduled("w2", r#"session rule: write_file path "out.txt""#),
            approval_requested(&other, WRITE_FILE_DEFAULT),
            awaiting("w3"),
            executing("w2"),
        ]
    );
}

#[test]
fn approve_for_session_adds_each_allowance_once() {
    let mut session = policed(4, ApprovalMode::Policy);
    session.ok(model_done("", vec![bash("b1", "make build && make test")]));
    session.ok(approve_for_session("b1"));
    session.ok(done("b1", "ok"));
    // `make test` is allowed now, `make lint` is not: the call still asks.
    let next = bash("b2", "make test && make lint");
    let effects = session.ok(model_done("", vec![next.clone()]));
    assert_eq!(
        events_of(&effects)[2..].to_vec(),
        vec![approval_requested(&next, BASH_DEFAULT), awaiting("b2")]
    );
    let effects = session.ok(approve_for_session("b2"));
    assert_eq!(
        events_of(&effects)[0],
        decided(
            "b2",
            ApprovalDecision::ApproveForSession,
            "",
            "",
            vec![
                allowance("bash", "make test", ""),
                allowance("bash", "make lint", ""),
            ]
        )
    );
    let bash_rule = |command: &str| SessionRule {
        tool: "bash".into(),
        command: Some(command.into()),
        path: None,
    };
    assert_eq!(
        session.state.session_rules,
        vec![
            bash_rule("make build"),
            bash_rule("make test"),
            bash_rule("make lint"),
        ]
    );
}

#[test]
fn deny_answers_with_the_reason() {
    let mut session = awaiting_build();
    let build = bash("b1", "make build");
    let output = "error: the person denied this call: it takes too long";
    let effects = session.ok(deny("b1", "it takes too long"));
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![decided(
                        "b1",
                        ApprovalDecision::Deny,
                        "it takes too long",
                        "",
                        vec![]
                    )],
                    closed(&build, ToolCallPhase::Error, output),
                    vec![executing("r2")],
                ])
            ),
            ran(read_file("r2", "a.txt")),
        ]
    );
    assert_eq!(session.state.history[2], Message::tool("b1", output));
    assert_eq!(phase_of(&session.state, "b1"), Some(CallPhase::Error));
}

#[test]
fn deny_without_a_reason_says_so() {
    for reason in ["", "  "] {
        let mut session = awaiting_build();
        let effects = session.ok(deny("b1", reason));
        assert_eq!(
            events_of(&effects)[2],
            closed_result(
                &bash("b1", "make build"),
                "error: the person denied this call: no reason given"
            )
        );
    }
}

#[test]
fn deny_of_the_last_call_calls_the_model() {
    let mut session = policed(4, ApprovalMode::Policy);
    session.ok(model_done("", vec![bash("b1", "make build")]));
    let effects = session.ok(deny("b1", "no"));
    assert_eq!(
        effects.last(),
        Some(&model_call(&session.state, session.state.history.clone()))
    );
    assert_eq!(session.state.phase, Phase::Generate);
}

#[test]
fn edit_into_an_allowed_call_runs_the_edited_arguments() {
    let mut session = awaiting_build();
    let original = bash("b1", "make build");
    let edited_args = r#"{"command":"git status"}"#;
    let effects = session.ok(approval(
        "b1",
        ApprovalDecision::Edit,
        "only look",
        edited_args,
    ));
    let edited = call("b1", "bash", edited_args);
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                vec![
                    decided(
                        "b1",
                        ApprovalDecision::Edit,
                        "only look",
                        edited_args,
                        vec![]
                    ),
                    scheduled("b1", EDITED),
                    executing("b1"),
                ]
            ),
            ran(edited),
        ]
    );
    assert_eq!(
        calls_of(&session.state)[0],
        Call {
            effective_arguments: edited_args.into(),
            ..call_in_catalog(&original, CallPhase::Executing, false)
        }
    );
    // The result notes the edit; the model's own request is kept as it was.
    let effects = session.ok(done("b1", "clean"));
    let noted = format!("[the person edited the arguments to {edited_args}]\nclean");
    assert_eq!(
        events_of(&effects)[..2].to_vec(),
        vec![succeeded("b1"), result_event("b1", &noted)]
    );
    assert_eq!(
        session.state.history,
        vec![
            Message::user("go"),
            assistant("", vec![original, read_file("r2", "a.txt")]),
            Message::tool("b1", &noted),
        ]
    );
}

#[test]
fn edit_counts_as_approval_unless_the_policy_denies_it() {
    // `make test` would need a confirmation; the person's edit is one.
    let mut session = awaiting_build();
    let edited_args = r#"{"command":"make test"}"#;
    let effects = session.ok(edit("b1", edited_args));
    assert_eq!(
        events_of(&effects)[1..].to_vec(),
        vec![scheduled("b1", EDITED), executing("b1")]
    );
    assert_eq!(run_tools(&effects), vec![call("b1", "bash", edited_args)]);
}

#[test]
fn edit_into_a_denied_call_answers_with_an_error() {
    let mut session = awaiting_build();
    let edited_args = r#"{"command":"sudo make build"}"#;
    let effects = session.ok(edit("b1", edited_args));
    let output = format!("error: the edited call is denied by policy: {SUDO_RULE}");
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![decided(
                        "b1",
                        ApprovalDecision::Edit,
                        "",
                        edited_args,
                        vec![]
                    )],
                    closed(&bash("b1", "make build"), ToolCallPhase::Error, &output),
                    vec![executing("r2")],
                ])
            ),
            ran(read_file("r2", "a.txt")),
        ]
    );
    assert_eq!(calls_of(&session.state)[0].effective_arguments, edited_args);
}

#[test]
fn edit_with_the_same_arguments_adds_no_note() {
    let mut session = awaiting_build();
    let same = bash("b1", "make build").arguments;
    session.ok(edit("b1", &same));
    let effects = session.ok(done("b1", "built"));
    assert_eq!(events_of(&effects)[1], result_event("b1", "built"));
}

#[test]
fn decisions_for_calls_not_awaiting_approval_are_refused() {
    let mut session = awaiting_build();
    let no_pending = |id: &str| Refusal::NoPendingApproval { call_id: id.into() };
    // Unknown, and scheduled (never asked about).
    session.refused(approve("ghost"), no_pending("ghost"));
    session.refused(approve(""), no_pending(""));
    session.refused(approve("r2"), no_pending("r2"));
    session.refused(deny("r2", "no"), no_pending("r2"));
    // Decided already (duplicate, or a second person's late decision).
    session.ok(approve("b1"));
    for input in [
        approve("b1"),
        approve_for_session("b1"),
        deny("b1", "too late"),
        edit("b1", "{}"),
        approval("b1", ApprovalDecision::Unspecified, "", ""),
    ] {
        session.refused(input, no_pending("b1"));
    }
    // From an earlier turn (stale).
    session.ok(done("b1", "built"));
    session.ok(done("r2", "text"));
    session.ok(model_done("done", vec![]));
    session.ok(user_in(TURN2, "more"));
    session.refused(approve("b1"), no_pending("b1"));
    session.ok(model_done("", vec![bash("b1-new", "make build")]));
    session.refused(deny("b1", ""), no_pending("b1"));
    session.ok(deny("b1-new", ""));
}

#[test]
fn unspecified_decision_is_invalid_and_changes_nothing() {
    let mut session = awaiting_build();
    let refusal = session
        .step(approval("b1", ApprovalDecision::Unspecified, "why", ""))
        .unwrap_err();
    assert_eq!(
        refusal,
        Refusal::InvalidDecision(
            "the decision is not set: approve, approve for session, deny or edit".into()
        )
    );
    assert!(refusal.is_invalid_argument());
    // Still waiting; a proper decision works.
    assert_eq!(
        phase_of(&session.state, "b1"),
        Some(CallPhase::AwaitingApproval)
    );
    session.ok(approve("b1"));
}

#[test]
fn edit_with_invalid_arguments_is_invalid_and_changes_nothing() {
    let session = awaiting_build();
    for (arguments, why) in [
        ("{not json", "not valid JSON ("),
        ("[1]", "expected a JSON object, got [1]"),
        (r#""ls""#, r#"expected a JSON object, got "ls""#),
        ("42", "expected a JSON object, got 42"),
    ] {
        let mut state = session.state.clone();
        let refusal = state.step(edit("b1", arguments)).unwrap_err();
        let Refusal::InvalidDecision(message) = &refusal else {
            panic!("{arguments}: expected an invalid decision, got {refusal:?}");
        };
        assert!(
            message.starts_with(&format!("the edited arguments are invalid: {why}")),
            "{arguments}: {message}"
        );
        assert!(refusal.is_invalid_argument());
        assert_eq!(state, session.state, "{arguments}");
    }
}

// ---------------------------------------------------------------------------
// Approval modes
// ---------------------------------------------------------------------------

#[test]
fn approval_mode_always_schedules_confirmed_calls_but_not_denied_ones() {
    let mut session = policed(4, ApprovalMode::Always);
    let build = bash("b1", "make build");
    let sudo = bash("b2", "sudo make install");
    let effects = session.ok(model_done("", vec![build.clone(), sudo.clone()]));
    let denied = format!("error: denied by policy: {SUDO_RULE}");
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![
                        first_answer(FIXED_WITH_TOOLS, first_message("")),
                        requested_in_catalog(&build),
                        requested_in_catalog(&sudo),
                        scheduled("b1", &format!("approved for this turn ({BASH_DEFAULT})")),
                    ],
                    closed(&sudo, ToolCallPhase::Error, &denied),
                    vec![executing("b1")],
                ])
            ),
            ran(build),
        ]
    );
    assert!(session.state.awaiting_approval().is_empty());
    // Nothing is remembered for later turns.
    assert_eq!(session.state.session_rules, vec![]);
}

#[test]
fn approval_mode_never_refuses_calls_needing_a_person() {
    let mut session = policed(4, ApprovalMode::Never);
    let build = bash("b1", "make build");
    let read = read_file("r2", "a.txt");
    let effects = session.ok(model_done("", vec![build.clone(), read.clone()]));
    let output = format!(
        "error: this call needs a person's approval ({BASH_DEFAULT}), and this turn runs \
         without one"
    );
    assert_eq!(
        effects,
        vec![
            record(
                TURN,
                concat(vec![
                    vec![
                        first_answer(FIXED_WITH_TOOLS, first_message("")),
                        requested_in_catalog(&build),
                        requested_in_catalog(&read),
                    ],
                    closed(&build, ToolCallPhase::Error, &output),
                    vec![scheduled("r2", READ_FILE_DEFAULT), executing("r2")],
                ])
            ),
            ran(read),
        ]
    );
    assert!(session.state.awaiting_approval().is_empty());
}

#[test]
fn approval_mode_applies_to_its_turn_only() {
    let mut session = policed(4, ApprovalMode::Always);
    session.ok(model_done("", vec![bash("b1", "make build")]));
    session.ok(done("b1", "built"));
    session.ok(model_done("done", vec![]));
    session.ok(user_in(TURN2, "again"));
    session.ok(model_done("", vec![bash("b2", "make build")]));
    assert_eq!(
        phase_of(&session.state, "b2"),
        Some(CallPhase::AwaitingApproval)
    );
}

#[test]
fn unspecified_approval_mode_follows_the_policy() {
    let mut session = policed(4, ApprovalMode::Unspecified);
    let build = bash("b1", "make build");
    let effects = session.ok(model_done("", vec![build.clone()]));
    assert_eq!(
        events_of(&effects)[2..].to_vec(),
        vec![approval_requested(&build, BASH_DEFAULT), awaiting("b1")]
    );
}
