//! Randomized runs: invariants and replay after every step.

use super::*;
use pretty_assertions::assert_eq;

// ---------------------------------------------------------------------------
// Randomized: invariants and replay after every step
// ---------------------------------------------------------------------------

/// A small deterministic generator (no dependencies).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Calls the random model makes: under the test policy they are allowed,
/// denied, confirmed, or invalid; with the test catalog some are read-only.
const CALL_MENU: &[(&str, &str)] = &[
    ("bash", r#"{"command":"make build"}"#),
    ("bash", r#"{"command":"make build && make test"}"#),
    ("bash", r#"{"command":"git status"}"#),
    ("bash", r#"{"command":"sudo rm -rf /"}"#),
    ("read_file", r#"{"path":"a.txt"}"#),
    ("read_file", r#"{"path":"b.txt"}"#),
    ("read_file", r#"{"path":"secrets/key"}"#),
    ("grep", r#"{"pattern":"x"}"#),
    ("stat", r#"{"path":"a.txt"}"#),
    ("write_file", r#"{"path":"out.txt","content":"x"}"#),
    ("read_file", "not json"),
];

/// Edits a person may make: allowed, denied, confirmed, and invalid ones.
const EDIT_MENU: &[&str] = &[
    r#"{"command":"git status"}"#,
    r#"{"command":"sudo ls"}"#,
    r#"{"command":"ls && sudo ls"}"#,
    r#"{"command":"make test"}"#,
    r#"{"path":"secrets/x"}"#,
    r#"{"path":"c.txt"}"#,
    "not json",
    "[1]",
];

const MODES: &[ApprovalMode] = &[
    ApprovalMode::Policy,
    ApprovalMode::Policy,
    ApprovalMode::Policy,
    ApprovalMode::Always,
    ApprovalMode::Never,
    ApprovalMode::Unspecified,
];

const DECISIONS: &[ApprovalDecision] = &[
    ApprovalDecision::Approve,
    ApprovalDecision::Approve,
    ApprovalDecision::Approve,
    ApprovalDecision::ApproveForSession,
    ApprovalDecision::ApproveForSession,
    ApprovalDecision::Deny,
    ApprovalDecision::Deny,
    ApprovalDecision::Edit,
    ApprovalDecision::Edit,
    ApprovalDecision::Unspecified,
];

struct Generator {
    rng: Lcg,
    ids: u32,
    turns: u32,
}

impl Generator {
    /// Usually one of `preferred`, else any call of the turn, else a ghost.
    fn pick_id(&mut self, preferred: &[String], all: &[String]) -> String {
        if !preferred.is_empty() && self.rng.below(8) > 0 {
            return self.rng.pick(preferred).clone();
        }
        if !all.is_empty() && self.rng.below(2) == 0 {
            return self.rng.pick(all).clone();
        }
        "ghost".into()
    }

    /// A summary of a prefix of the conversation: usually one that fits
    /// it, sometimes one that names the wrong events, or a failed one.
    fn summarised(&mut self, state: &SessionState) -> Input {
        let spans = &state.history_spans;
        let messages = 1 + self.rng.below(spans.len().max(1) as u64) as usize;
        let first_seq = spans.first().map(|s| s.0).unwrap_or(1);
        let mut last_seq = spans
            .iter()
            .take(messages)
            .map(|s| s.1)
            .max()
            .unwrap_or(first_seq);
        if self.rng.below(5) == 0 {
            last_seq += 1;
        }
        let summary = if self.rng.below(4) == 0 {
            Err("down".to_string())
        } else {
            Ok("summary".to_string())
        };
        Input::Summarised {
            job: CompactionJob {
                messages,
                first_seq,
                last_seq,
                tokens_before: 10,
                max_tokens: 10,
            },
            summary,
        }
    }

    fn calls(&mut self) -> Vec<ToolCall> {
        let mut calls: Vec<ToolCall> = Vec::new();
        for _ in 0..self.rng.below(5) {
            let (tool, arguments) = *self.rng.pick(CALL_MENU);
            let id = if !calls.is_empty() && self.rng.below(8) == 0 {
                calls[0].id.clone()
            } else {
                self.ids += 1;
                format!("c{}", self.ids)
            };
            calls.push(call(&id, tool, arguments));
        }
        calls
    }

    /// A random input, biased towards inputs that fit the state.
    fn input(&mut self, state: &SessionState) -> Input {
        let calls = calls_of(state);
        let ids_in = |phase: CallPhase| -> Vec<String> {
            calls
                .iter()
                .filter(|c| c.phase == phase)
                .map(|c| c.id.clone())
                .collect()
        };
        let all: Vec<String> = calls.iter().map(|c| c.id.clone()).collect();
        let executing = ids_in(CallPhase::Executing);
        let awaiting = ids_in(CallPhase::AwaitingApproval);
        match self.rng.below(25) {
            0..=2 => {
                self.turns += 1;
                let text = if self.rng.below(6) == 0 { " " } else { "msg" };
                let mode = *self.rng.pick(MODES);
                user_with(&format!("t{}", self.turns), text, mode)
            }
            3..=5 => {
                let calls = self.calls();
                let used =
                    (self.rng.below(3) > 0).then(|| usage(self.rng.below(50), self.rng.below(50)));
                Input::ModelDone(completion_with_usage("text", calls, used))
            }
            6 if self.rng.below(2) == 0 => Input::ModelUnreadable {
                text: "TOOL:bash {".into(),
                error: "not valid JSON".into(),
                usage: (self.rng.below(2) == 0).then(|| usage(3, 1)),
            },
            6 => model_failed("x", self.rng.below(2) == 0),
            7 => chunk(&self.pick_id(&executing, &all), OutputStream::Stdout, "o"),
            8..=12 | 22 => {
                let id = self.pick_id(&executing, &all);
                Input::ToolDone(pb::ToolResult {
                    is_error: self.rng.below(5) == 0,
                    ..tool_result(&id, "out")
                })
            }
            13..=17 => {
                let id = self.pick_id(&awaiting, &all);
                let decision = *self.rng.pick(DECISIONS);
                let edited = if decision == ApprovalDecision::Edit {
                    *self.rng.pick(EDIT_MENU)
                } else {
                    ""
                };
                let reason = *self.rng.pick(&["", "because"]);
                approval(&id, decision, reason, edited)
            }
            18 => cancel("r"),
            19 => Input::ToolCatalog(if self.rng.below(3) == 0 {
                Arc::default()
            } else {
                catalog()
            }),
            20 if self.rng.below(2) == 0 => Input::Interrupted,
            23 if self.rng.below(2) == 0 => self.summarised(state),
            _ => {
                let id = self.pick_id(&executing, &[]);
                done(&id, "out")
            }
        }
    }
}

/// What the random test reached, so it proves it exercises every path.
#[derive(Debug, Default)]
struct Coverage {
    outcomes: [u32; 5],
    ok_results: u32,
    decisions: [u32; 5],
    invalid_decisions: u32,
    batches: u32,
    reruns: u32,
    unknown_outcomes: u32,
    asked_again: u32,
    policy_denials: u32,
    never_refusals: u32,
    always_approvals: u32,
    session_rule_passes: u32,
    edit_denials: u32,
    edit_notes: u32,
    person_denials: u32,
    cancelled_calls: u32,
    compactions: u32,
    catalogs: u32,
}

impl Coverage {
    fn count(&mut self, input: &Input, result: &Result<Vec<Effect>, Refusal>) {
        let effects = match result {
            Ok(effects) => effects,
            Err(refusal) => {
                if matches!(refusal, Refusal::InvalidDecision(_)) {
                    self.invalid_decisions += 1;
                }
                return;
            }
        };
        if let Input::Approval { decision, .. } = input {
            self.decisions[*decision as usize] += 1;
        }
        if run_tools(effects).len() >= 2 && !matches!(input, Input::Interrupted) {
            self.batches += 1;
        }
        for kind in events_of(effects) {
            match kind {
                Kind::TurnFinished(f) => self.outcomes[f.outcome as usize] += 1,
                Kind::ContextCompacted(_) => self.compactions += 1,
                Kind::ToolsOffered(_) => self.catalogs += 1,
                Kind::ToolResult(r) if !r.is_error => {
                    self.ok_results += 1;
                    if r.output.starts_with("[the person edited the arguments to ") {
                        self.edit_notes += 1;
                    }
                }
                Kind::ToolResult(r) => {
                    let o = r.output.as_str();
                    let counter = if o.starts_with("error: outcome unknown") {
                        &mut self.unknown_outcomes
                    } else if o.starts_with("error: denied by policy: ") {
                        &mut self.policy_denials
                    } else if o.starts_with("error: this call needs a person's approval") {
                        &mut self.never_refusals
                    } else if o.starts_with("error: the edited call is denied by policy") {
                        &mut self.edit_denials
                    } else if o.starts_with("error: the person denied this call") {
                        &mut self.person_denials
                    } else if o == CANCELLED_OUTPUT {
                        &mut self.cancelled_calls
                    } else {
                        continue;
                    };
                    *counter += 1;
                }
                Kind::ToolCallState(s) if s.detail.starts_with("approved for this turn") => {
                    self.always_approvals += 1;
                }
                Kind::ToolCallState(s) if s.detail.starts_with("session rule: ") => {
                    self.session_rule_passes += 1;
                }
                Kind::ApprovalRequested(_) if matches!(input, Input::Interrupted) => {
                    self.asked_again += 1;
                }
                _ => {}
            }
        }
    }
}

fn concurrent(call: &Call) -> bool {
    call.read_only && call.parallel_safe
}

/// Checks the invariants that hold after every accepted step, given the
/// state before it and the log so far (including this step's events).
fn check_step(
    before: &SessionState,
    input: &Input,
    after: &SessionState,
    effects: &[Effect],
    log: &[pb::Event],
    coverage: &mut Coverage,
) {
    let what = format!("{input:?}");
    // Phase and turn agree.
    assert_eq!(after.phase == Phase::Idle, after.turn.is_none(), "{what}");
    let calls = calls_of(after);
    if let Some(turn) = &after.turn {
        assert!(turn.steps <= after.max_steps, "{what}");
        assert_eq!(
            after.phase == Phase::UseTools,
            calls.iter().any(|c| !c.answered),
            "unanswered calls exactly while using tools, after {what}"
        );
    }
    for c in &calls {
        assert_eq!(c.answered, c.phase.is_terminal(), "{} after {what}", c.id);
    }
    // The token counts kept beside the conversation (filled by each model
    // call, then updated as messages come, change and are summarised) are
    // those of the conversation as it is.
    let tokenizer = after.view.0.tokenizer;
    let fresh: Vec<usize> = after.history.iter().map(|m| tokenizer.message(m)).collect();
    assert_eq!(
        after
            .history_tokens
            .clone()
            .counts(&after.history, tokenizer),
        fresh,
        "token counts after {what}"
    );

    // Each recorded state event moves its call strictly forward, and the
    // events fold into the new state.
    // A message starts its own turn; one sent during a turn steers it.
    let record_turn = match input {
        Input::UserMessage { turn_id, .. } if before.is_idle() => turn_id.clone(),
        _ => before.turn_id().unwrap_or_default().to_string(),
    };
    // (The catalog is not an event.)
    let mut folded = SessionState {
        catalog: after.catalog.clone(),
        ..before.clone()
    };
    for kind in events_of(effects) {
        if let Kind::ToolCallState(s) = &kind {
            let from = phase_of(&folded, &s.call_id);
            let to = match ToolCallPhase::try_from(s.phase) {
                Ok(ToolCallPhase::Validating) => CallPhase::Validating,
                Ok(ToolCallPhase::AwaitingApproval) => CallPhase::AwaitingApproval,
                Ok(ToolCallPhase::Scheduled) => CallPhase::Scheduled,
                Ok(ToolCallPhase::Executing) => CallPhase::Executing,
                Ok(ToolCallPhase::Success) => CallPhase::Success,
                Ok(ToolCallPhase::Error) => CallPhase::Error,
                Ok(ToolCallPhase::Cancelled) => CallPhase::Cancelled,
                other => panic!("recorded phase {other:?} after {what}"),
            };
            assert!(
                from.is_some_and(|f| f.can_move_to(to)),
                "{} recorded {from:?} -> {to:?} after {what}",
                s.call_id
            );
        }
        folded.apply(&record_turn, &kind);
    }
    assert_eq!(
        &folded, after,
        "the step's events do not fold into its state"
    );

    // Within one response, calls only move forward.
    if let (Some(b), Some(a)) = (&before.turn, &after.turn)
        && b.id == a.id
        && b.steps == a.steps
    {
        assert_eq!(b.calls.len(), a.calls.len(), "{what}");
        for (bc, ac) in b.calls.iter().zip(&a.calls) {
            assert_eq!(bc.id, ac.id);
            assert!(
                bc.phase == ac.phase || bc.phase.can_move_to(ac.phase),
                "{}: {:?} -> {:?} after {what}",
                bc.id,
                bc.phase,
                ac.phase
            );
        }
    }

    // Every answered call of the response has exactly one result, matching
    // its terminal phase; unanswered calls have none.
    if !calls.is_empty() {
        let start = log
            .iter()
            .rposition(|e| matches!(e.kind, Some(Kind::ModelMessage(_))))
            .unwrap();
        for c in &calls {
            let results: Vec<&pb::ToolResult> = log[start..]
                .iter()
                .filter_map(|e| match &e.kind {
                    Some(Kind::ToolResult(r)) if r.call_id == c.id => Some(r),
                    _ => None,
                })
                .collect();
            assert_eq!(
                results.len(),
                usize::from(c.answered),
                "results of {} after {what}",
                c.id
            );
            if let Some(r) = results.first() {
                assert_eq!(r.is_error, c.phase != CallPhase::Success, "{}", c.id);
            }
        }
    }

    // Dispatch: model order, mutating calls alone, approvals hold up later
    // calls, and nothing that may start is left waiting.
    for (i, c) in calls.iter().enumerate() {
        let earlier = &calls[..i];
        match c.phase {
            CallPhase::Executing => {
                for e in earlier {
                    assert!(
                        e.phase.is_terminal()
                            || (e.phase == CallPhase::Executing && concurrent(e) && concurrent(c)),
                        "{} runs while {} is {:?}, after {what}",
                        c.id,
                        e.id,
                        e.phase
                    );
                }
            }
            CallPhase::Scheduled => {
                let may_start = earlier.iter().all(|e| {
                    e.phase.is_terminal()
                        || (concurrent(e)
                            && concurrent(c)
                            && matches!(e.phase, CallPhase::Executing | CallPhase::Scheduled))
                });
                assert!(!may_start, "{} could start, after {what}", c.id);
            }
            CallPhase::Validating => panic!("{} left validating after {what}", c.id),
            _ => {}
        }
    }

    // Effects.
    let recorded = events_of(effects);
    let started: Vec<&str> = recorded
        .iter()
        .filter_map(|k| match k {
            Kind::ToolCallState(s) if s.phase == ToolCallPhase::Executing as i32 => {
                Some(s.call_id.as_str())
            }
            _ => None,
        })
        .collect();
    let runs = run_tools(effects);
    let mut run_ids: Vec<&str> = runs.iter().map(|c| c.id.as_str()).collect();
    for run in &runs {
        let c = calls
            .iter()
            .find(|c| c.id == run.id)
            .unwrap_or_else(|| panic!("RunTool {} of no call, after {what}", run.id));
        assert_eq!(c.phase, CallPhase::Executing, "{what}");
        assert_eq!(run.name, c.tool);
        assert_eq!(run.arguments, c.effective_arguments);
        if !started.contains(&run.id.as_str()) {
            // A re-run after a restart: of a read-only call on its own, of
            // a mutating one only when a person said "run it again".
            let person_said_so = matches!(
                input,
                Input::Approval { call_id, decision: ApprovalDecision::Approve, .. }
                    if *call_id == c.id
            );
            assert!(
                matches!(input, Input::Interrupted) || person_said_so,
                "{what}"
            );
            assert!(
                c.read_only || person_said_so,
                "re-ran mutating {} after {what}",
                c.id
            );
            assert_eq!(phase_of(before, &c.id), Some(CallPhase::Executing));
            coverage.reruns += 1;
        }
    }
    for id in &started {
        assert!(run_ids.contains(id), "{id} executing without a RunTool");
    }
    run_ids.sort_unstable();
    run_ids.dedup();
    assert_eq!(run_ids.len(), runs.len(), "a call ran twice: {effects:?}");
    let model_calls: Vec<&Vec<Message>> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::CallModel { request } => Some(&request.history),
            _ => None,
        })
        .collect();
    assert!(model_calls.len() <= 1, "{effects:?}");
    if let Some(history) = model_calls.first() {
        assert_eq!(after.phase, Phase::Generate);
        // The conversation, and an unreadable answer shown back to the
        // model with the correction.
        let mut expected = after.history.clone();
        if let Some((text, error)) = after.turn.as_ref().and_then(|t| t.unreadable.clone()) {
            crate::prompt::ask_to_rewrite(&mut expected, text, &error);
        }
        assert_eq!(*history, &expected);
        assert!(runs.is_empty(), "{effects:?}");
    }
    assert_eq!(
        effects.first() == Some(&Effect::AbortInFlight),
        matches!(input, Input::Cancel { .. }),
        "{what}"
    );
    if recorded.iter().any(|k| matches!(k, Kind::TurnFinished(_))) {
        assert!(after.is_idle());
    }
    if let Some(Effect::Record { turn_id, .. }) =
        effects.iter().find(|e| matches!(e, Effect::Record { .. }))
    {
        assert_eq!(turn_id, &record_turn);
        assert!(!turn_id.is_empty());
    }

    // History: after each assistant message come the answers to its calls,
    // in the model's order (only the answered ones for the running
    // response).
    let current = after
        .turn
        .as_ref()
        .filter(|t| t.steps > 0)
        .map(|t| t.assistant_index);
    for (i, message) in after.history.iter().enumerate() {
        let Message::Assistant { tool_calls, .. } = message else {
            continue;
        };
        let expected: Vec<&str> = if Some(i) == current {
            calls
                .iter()
                .filter(|c| c.answered)
                .map(|c| c.id.as_str())
                .collect()
        } else {
            tool_calls.iter().map(|c| c.id.as_str()).collect()
        };
        let answers: Vec<&str> = after.history[i + 1..]
            .iter()
            .map_while(|m| match m {
                Message::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(answers, expected, "answers to message {i} after {what}");
    }
}

#[test]
fn random_inputs_keep_invariants_and_replay() {
    let policy = test_policy();
    let mut coverage = Coverage::default();
    for seed in 0..60u64 {
        let max_steps = (seed % 4 + 1) as u32;
        let mut session = match seed % 3 {
            0 => Session::new(max_steps),
            1 => Session::with_policy(max_steps, policy.clone(), Arc::default()),
            _ => Session::with_policy(max_steps, policy.clone(), catalog()),
        };
        let mut generator = Generator {
            rng: Lcg(seed),
            ids: 0,
            turns: 0,
        };
        for _ in 0..400 {
            let input = generator.input(&session.state);
            let before = session.state.clone();
            // `Session::step` checks replay, the effects' shape, and that a
            // refusal changes nothing.
            let result = session.step(input.clone());
            coverage.count(&input, &result);
            if let Ok(effects) = &result {
                check_step(
                    &before,
                    &input,
                    &session.state,
                    effects,
                    &session.log,
                    &mut coverage,
                );
            }
        }
    }
    eprintln!("{coverage:#?}");
    for outcome in [
        TurnOutcome::Completed,
        TurnOutcome::Cancelled,
        TurnOutcome::Failed,
        TurnOutcome::StepLimit,
    ] {
        assert!(
            coverage.outcomes[outcome as usize] >= 10,
            "{outcome:?} reached only {} times",
            coverage.outcomes[outcome as usize]
        );
    }
    for decision in [
        ApprovalDecision::Approve,
        ApprovalDecision::ApproveForSession,
        ApprovalDecision::Deny,
        ApprovalDecision::Edit,
    ] {
        assert!(
            coverage.decisions[decision as usize] >= 10,
            "{decision:?} accepted only {} times",
            coverage.decisions[decision as usize]
        );
    }
    let Coverage {
        ok_results,
        invalid_decisions,
        batches,
        reruns,
        unknown_outcomes,
        asked_again,
        policy_denials,
        never_refusals,
        always_approvals,
        session_rule_passes,
        edit_denials,
        edit_notes,
        person_denials,
        cancelled_calls,
        compactions,
        catalogs,
        ..
    } = coverage;
    for (name, count, least) in [
        ("successful results", ok_results, 100),
        ("invalid decisions", invalid_decisions, 10),
        ("parallel batches", batches, 10),
        ("re-runs after a restart", reruns, 3),
        ("unknown outcomes after a restart", unknown_outcomes, 3),
        ("approvals asked again after a restart", asked_again, 3),
        ("policy denials", policy_denials, 10),
        ("refusals without approval", never_refusals, 5),
        ("approvals for the turn", always_approvals, 5),
        ("session rule passes", session_rule_passes, 5),
        ("edits denied by policy", edit_denials, 3),
        ("results noting an edit", edit_notes, 3),
        ("calls denied by a person", person_denials, 10),
        ("cancelled calls", cancelled_calls, 10),
        ("compactions", compactions, 10),
        ("tool catalogs recorded", catalogs, 10),
    ] {
        assert!(count >= least, "only {count} {name}");
    }
}
