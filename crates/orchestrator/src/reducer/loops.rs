//! The loop detector: a model that asks for the same call (same tool, same
//! arguments) again and again in one turn. At `agent.loop_repeats` the
//! call is not run: its result tells the model that the answer would not
//! change. Asked once more after that, the turn stops.
//!
//! Counted from the turn's own messages (the running turn is never
//! compacted), so replaying the log decides the same.

use super::*;

/// Tool and arguments, the arguments read as JSON where they are (so that
/// key order and spacing do not matter).
fn loop_key(tool: &str, arguments: &str) -> (String, String) {
    let arguments = match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(value) => value.to_string(),
        Err(_) => arguments.trim().to_string(),
    };
    (tool.to_string(), arguments)
}

impl SessionState {
    /// How many times the running turn has asked for the call `call_id` of
    /// the latest response (its tool and arguments), counting it.
    pub(super) fn repeats(&self, call_id: &str) -> u32 {
        let Some(turn) = self.turn.as_ref() else {
            return 0;
        };
        let Some(call) = turn.call(call_id) else {
            return 0;
        };
        let key = loop_key(&call.tool, &call.arguments);
        let start = self
            .history
            .iter()
            .rposition(|m| matches!(m, Message::User { .. }))
            .unwrap_or(0);
        let mut n = 0;
        for (i, message) in self.history.iter().enumerate().skip(start) {
            let Message::Assistant { tool_calls, .. } = message else {
                continue;
            };
            for c in tool_calls {
                if loop_key(&c.name, &c.arguments) == key {
                    n += 1;
                }
                if i == turn.assistant_index && c.id == call_id {
                    return n;
                }
            }
        }
        n
    }

    /// The limit, when the detector is on.
    fn loop_limit(&self) -> Option<u32> {
        Some(self.view.0.loop_repeats).filter(|&n| n > 0)
    }

    /// Whether the call is one the detector watches: every call but the
    /// plan tools, which the reducer answers itself (and whose own rail
    /// bounds them).
    fn watched(&self, call_id: &str) -> bool {
        !crate::plan::is_plan_tool(&call_tool(self, call_id))
    }

    fn loop_event(&self, call_id: &str, repeats: u32, stopped: bool) -> Kind {
        let (tool, arguments) = self
            .turn
            .as_ref()
            .and_then(|t| t.call(call_id))
            .map(|c| (c.tool.clone(), c.arguments.clone()))
            .unwrap_or_default();
        Kind::LoopDetected(pb::LoopDetected {
            tool,
            arguments_json: arguments,
            repeats,
            stopped,
        })
    }

    /// The call reaches the limit: it is not run, and its result tells the
    /// model why. `false` when it is not a repeat to tell of.
    pub(super) fn tell_of_a_loop(&mut self, out: &mut Out, turn_id: &str, call_id: &str) -> bool {
        let Some(limit) = self.loop_limit() else {
            return false;
        };
        let repeats = self.repeats(call_id);
        if repeats != limit || !self.watched(call_id) {
            return false;
        }
        let tool = call_tool(self, call_id);
        let event = self.loop_event(call_id, repeats, false);
        self.emit(out, turn_id, event);
        let output = format!(
            "error: not run: this is call number {repeats} of {tool} with exactly these arguments \
             in this turn, and its result would be the same as before. Use the earlier result, \
             change the arguments, or give your answer."
        );
        self.refuse_call(out, turn_id, call_id, CallPhase::Error, output);
        true
    }

    /// A call of the response passes the limit although the model was told:
    /// none of the response's calls runs and the turn stops. `true` when it
    /// stopped.
    pub(super) fn stop_a_loop(&mut self, out: &mut Out, turn_id: &str, ids: &[String]) -> bool {
        let Some(limit) = self.loop_limit() else {
            return false;
        };
        let Some((looping, repeats)) = ids
            .iter()
            .filter(|id| self.watched(id))
            .map(|id| (id, self.repeats(id)))
            .find(|(_, n)| *n > limit)
        else {
            return false;
        };
        let tool = call_tool(self, looping);
        let event = self.loop_event(looping, repeats, true);
        self.emit(out, turn_id, event);
        let message = format!(
            "stopped: the model asked for the same {tool} call {repeats} times in this turn, \
             after it was told that the result would not change"
        );
        self.close_unrun(out, turn_id, ids, &message);
        let error = error_event(ErrorSource::Model, message.clone(), false);
        self.emit(out, turn_id, error);
        let finished = self.finish(TurnOutcome::Failed, message);
        self.emit(out, turn_id, finished);
        true
    }
}
