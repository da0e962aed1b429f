//! Spending limits: a turn stops at one before its next tool calls run, a
//! session that used its limit stops new turns at once, and a person's
//! message raises a limit.

use super::*;
use pretty_assertions::assert_eq;

fn with_limits(budget: pb::Budget) -> Session {
    let mut s = Session::new(20);
    s.state = s.state.clone().with_view(Arc::new(View {
        budget,
        ..View::default()
    }));
    s
}

fn raising(text: &str, budget: pb::Budget) -> Input {
    Input::UserMessage {
        images: Vec::new(),
        turn_id: TURN.into(),
        text: text.into(),
        approval_mode: ApprovalMode::Policy,
        plan: false,
        network: false,
        budget: Some(budget),
    }
}

/// A response with one tool call that used `tokens` tokens in all.
fn costly_call(id: &str, tokens: u64) -> Input {
    Input::ModelDone(completion_with_usage(
        "",
        vec![bash(id, &format!("echo {id}"))],
        Some(usage(tokens - 10, 10)),
    ))
}

fn exceeded(effects: &[Effect]) -> Option<pb::BudgetExceeded> {
    events_of(effects).into_iter().find_map(|k| match k {
        Kind::BudgetExceeded(b) => Some(b),
        _ => None,
    })
}

fn finished_with(effects: &[Effect]) -> Option<pb::TurnFinished> {
    events_of(effects).into_iter().find_map(|k| match k {
        Kind::TurnFinished(f) => Some(f),
        _ => None,
    })
}

#[test]
fn a_turn_stops_at_its_token_limit_before_the_next_calls_run() {
    let mut s = with_limits(pb::Budget {
        turn_tokens: 1_000,
        ..Default::default()
    });
    s.ok(user("work"));
    let effects = s.ok(costly_call("a", 600));
    assert_eq!(run_tools(&effects).len(), 1, "under the limit: runs");
    s.ok(done("a", "ok"));
    let effects = s.ok(costly_call("b", 600));
    assert!(
        run_tools(&effects).is_empty(),
        "over the limit: does not run"
    );
    assert_eq!(
        exceeded(&effects),
        Some(pb::BudgetExceeded {
            scope: "turn".into(),
            measure: "tokens".into(),
            used: 1_200.0,
            limit: 1_000.0,
            currency: String::new(),
        })
    );
    let finished = finished_with(&effects).unwrap();
    assert_eq!(finished.outcome, TurnOutcome::Budget as i32);
    assert!(
        finished.message.contains("1200 tokens used of 1000")
            && finished.message.contains("--budget-tokens"),
        "{}",
        finished.message
    );
    assert!(s.state.is_idle());
    // The next turn has a limit of its own and runs.
    s.ok(user_in("turn-2", "more"));
    let effects = s.ok(costly_call("c", 600));
    assert_eq!(run_tools(&effects).len(), 1);
}

#[test]
fn a_spent_session_stops_new_turns_until_the_person_raises_its_limit() {
    let mut s = with_limits(pb::Budget {
        session_tokens: 1_000,
        ..Default::default()
    });
    s.ok(user("work"));
    let effects = s.ok(costly_call("a", 900));
    assert_eq!(run_tools(&effects).len(), 1, "under the limit: runs");
    s.ok(done("a", "ok"));
    // An answer ends its turn normally (limits only stop tool calls).
    s.ok(model_done("done", vec![]));
    // The next turn passes the session's limit with its first call ...
    s.ok(user_in("turn-2", "more"));
    let effects = s.ok(costly_call("b", 200));
    assert!(run_tools(&effects).is_empty());
    assert_eq!(exceeded(&effects).unwrap().scope, "session");
    // ... and a turn after that stops at once, without calling the model.
    let effects = s.ok(user_in("turn-3", "again"));
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, Effect::CallModel { .. }))
    );
    assert_eq!(exceeded(&effects).unwrap().scope, "session");
    assert_eq!(
        finished_with(&effects).unwrap().outcome,
        TurnOutcome::Budget as i32
    );
    // Raised with a message, the session goes on.
    let effects = s.ok(raising(
        "continue",
        pb::Budget {
            session_tokens: 5_000,
            ..Default::default()
        },
    ));
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::CallModel { .. }))
    );
    assert_eq!(s.state.limits.session_tokens, 5_000);
    // A restarted orchestrator rebuilds the raise and the spending.
    let restarted = s.restarted();
    assert_eq!(restarted.state.limits.session_tokens, 5_000);
    assert_eq!(restarted.state.spent_tokens, 900 + 12 + 200);
}

#[test]
fn cost_limits_use_the_configured_price() {
    let mut s = with_limits(pb::Budget {
        turn_cost: 0.01,
        ..Default::default()
    });
    let mut view = (*s.state.view.0).clone();
    view.price = Some(crate::settings::ModelPrice {
        pattern: "*".into(),
        input: 10.0,
        output: 10.0,
        cached_input: None,
        cache_write: None,
        currency: Some("EUR".into()),
    });
    s.state = s.state.clone().with_view(Arc::new(view));
    s.ok(user("work"));
    // 1,100 tokens at 10 per million: 0.011 EUR, over 0.01.
    let effects = s.ok(costly_call("a", 1_100));
    assert!(run_tools(&effects).is_empty());
    let over = exceeded(&effects).unwrap();
    assert_eq!(
        (over.scope.as_str(), over.measure.as_str()),
        ("turn", "cost")
    );
    assert_eq!(over.currency, "EUR");
    assert!((over.used - 0.011).abs() < 1e-12);
}

#[test]
fn a_sub_agents_tokens_count_toward_the_turn_and_the_session() {
    let mut s = with_limits(pb::Budget {
        turn_tokens: 1_000,
        ..Default::default()
    });
    s.ok(user("work"));
    let effects = s.ok(costly_call("a", 100));
    assert_eq!(run_tools(&effects).len(), 1);
    // The call ran a sub-agent's task, which used 950 tokens.
    let mut result = tool_result("a", "the task's answer");
    result.sub_agent_usage = Some(token_usage(900, 50));
    s.ok(Input::ToolDone(result));
    let effects = s.ok(costly_call("b", 100));
    assert!(
        run_tools(&effects).is_empty(),
        "over the limit: {effects:?}"
    );
    let passed = exceeded(&effects).unwrap();
    assert_eq!((passed.used, passed.limit), (1_150.0, 1_000.0));
    let finished = finished_with(&effects).unwrap();
    assert_eq!(finished.usage.unwrap().total_tokens, 1_150);
    // A replay of the log counts the same.
    let replayed = SessionState::replay(20, &s.log);
    assert_eq!(s.state.spent_tokens, 1_150);
    assert_eq!(replayed.spent_tokens, s.state.spent_tokens);
}
