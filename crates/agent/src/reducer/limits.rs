//! Spending limits: tokens (prompt and completion, as the server reports
//! them) and money (at the configured model price) per turn and per
//! session. The configuration sets the first limits; a person's message
//! may raise or set them (`UserMessage.budget`) for that turn and the ones
//! after. A turn stops at a limit before its next tool calls run (an answer
//! already given still ends the turn normally); a new turn in a session
//! that has used up its limit stops at once, before any model call.
//!
//! Everything here is read from the log (the raises, the usage of every
//! model message), so a replay decides the same.

use super::*;

/// One limit passed: scope, measure, used, limit.
struct Passed {
    scope: &'static str,
    measure: &'static str,
    used: f64,
    limit: f64,
}

impl SessionState {
    /// Takes the non-zero limits of a person's message.
    /// Adds what a rewound model response spent to the session's total.
    pub(super) fn count_spent(&mut self, usage: Option<&pb::TokenUsage>) {
        let Some(u) = usage else { return };
        self.spent_tokens += u.total_tokens;
        if let Some(price) = self.view.0.price.as_ref() {
            self.spent_cost += price.cost(u);
        }
    }

    pub(super) fn raise_limits(&mut self, raised: &pb::Budget) {
        let limits = &mut self.limits;
        if raised.turn_tokens > 0 {
            limits.turn_tokens = raised.turn_tokens;
        }
        if raised.session_tokens > 0 {
            limits.session_tokens = raised.session_tokens;
        }
        if raised.turn_cost > 0.0 {
            limits.turn_cost = raised.turn_cost;
        }
        if raised.session_cost > 0.0 {
            limits.session_cost = raised.session_cost;
        }
    }

    /// The limits in force: the person's, else the configured ones.
    fn limits_in_force(&self) -> pb::Budget {
        let configured = &self.view.0.budget;
        let pick_u = |own: u64, base: u64| if own > 0 { own } else { base };
        let pick_f = |own: f64, base: f64| if own > 0.0 { own } else { base };
        pb::Budget {
            turn_tokens: pick_u(self.limits.turn_tokens, configured.turn_tokens),
            session_tokens: pick_u(self.limits.session_tokens, configured.session_tokens),
            turn_cost: pick_f(self.limits.turn_cost, configured.turn_cost),
            session_cost: pick_f(self.limits.session_cost, configured.session_cost),
        }
    }

    /// The first limit the session has reached, if any.
    fn passed(&self) -> Option<Passed> {
        let limits = self.limits_in_force();
        let (turn_tokens, turn_cost) = self
            .turn
            .as_ref()
            .map(|t| (t.usage.total_tokens, t.cost))
            .unwrap_or_default();
        let checks = [
            (
                "turn",
                "tokens",
                turn_tokens as f64,
                limits.turn_tokens as f64,
            ),
            (
                "session",
                "tokens",
                self.spent_tokens as f64,
                limits.session_tokens as f64,
            ),
            ("turn", "cost", turn_cost, limits.turn_cost),
            ("session", "cost", self.spent_cost, limits.session_cost),
        ];
        checks
            .into_iter()
            .find(|&(_, _, used, limit)| limit > 0.0 && used >= limit)
            .map(|(scope, measure, used, limit)| Passed {
                scope,
                measure,
                used,
                limit,
            })
    }

    /// A limit is reached: the response's calls `ids` do not run and the
    /// turn stops. `true` when it stopped.
    pub(super) fn stop_at_a_limit(&mut self, out: &mut Out, turn_id: &str, ids: &[String]) -> bool {
        let Some(passed) = self.passed() else {
            return false;
        };
        let currency = self
            .view
            .0
            .price
            .as_ref()
            .map(|p| p.currency().to_string())
            .unwrap_or_default();
        let amount = |value: f64| match passed.measure {
            "tokens" => format!("{value:.0} tokens"),
            _ => format!("{value:.4} {currency}"),
        };
        let raise = match (passed.scope, passed.measure) {
            ("turn", "tokens") => "--budget-tokens",
            ("session", "tokens") => "--session-budget-tokens",
            ("turn", _) => "--budget-cost",
            _ => "--session-budget-cost",
        };
        let message = format!(
            "stopped at the {} limit: {} used of {}; raise it ({raise} with agentry run, or \
             UserInput.budget) and continue with another message",
            passed.scope,
            amount(passed.used),
            amount(passed.limit),
        );
        let park = self.view.0.park_on_budget.then(|| {
            format!(
                "paused at the {} limit: {} used of {}; it goes on when someone raises the limit \
                 (agentry approvals raise)",
                passed.scope,
                amount(passed.used),
                amount(passed.limit),
            )
        });
        self.emit(
            out,
            turn_id,
            Kind::BudgetExceeded(pb::BudgetExceeded {
                scope: passed.scope.into(),
                measure: passed.measure.into(),
                used: passed.used,
                limit: passed.limit,
                currency: if passed.measure == "cost" {
                    currency
                } else {
                    String::new()
                },
            }),
        );
        if let Some(message) = park {
            // The turn waits for someone to raise the limit; the calls of
            // this answer do not run (the model is asked again then).
            self.close_unrun(out, turn_id, ids, &message);
            self.emit(
                out,
                turn_id,
                Kind::TurnParked(pb::TurnParked {
                    reason: pb::ParkReason::Budget as i32,
                    until: None,
                    message,
                }),
            );
            return true;
        }
        self.close_unrun(out, turn_id, ids, &message);
        let finished = self.finish(TurnOutcome::Budget, message);
        self.emit(out, turn_id, finished);
        true
    }

    /// Someone raised the limits of a turn parked at one: it goes on, or
    /// parks again when a limit it passed is still too low.
    pub(super) fn raise_parked(&mut self, out: &mut Out, turn_id: &str, budget: pb::Budget) {
        self.emit(
            out,
            turn_id,
            Kind::TurnResumed(pb::TurnResumed {
                reason: pb::ParkReason::Budget as i32,
                budget: Some(budget),
            }),
        );
        if !self.stop_at_a_limit(out, turn_id, &[]) {
            self.call_model(out, turn_id, true);
        }
    }
}
