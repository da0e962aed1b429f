//! The loop detector: a model that asks for the same call (same tool, same
//! arguments) again and again in one turn. At `agent.loop_repeats` the
//! call is not run: its result tells the model that the answer would not
//! change. Asked once more after that, the turn stops.
//!
//! Its other half watches progress: `agent.no_progress_steps` steps in a
//! row whose tool calls all failed or only returned what earlier calls of
//! the turn returned, and the model is told what it sees (the calls of its
//! next response are not run); one more such step after that, and the turn
//! stops.
//!
//! Both are counted from the turn's own messages (the running turn is never
//! compacted), so replaying the log decides the same.

use super::*;

/// What makes two calls the same: the tool, and the arguments read as JSON
/// where they are (compared as values, so key order and spacing do not
/// matter, whichever order a JSON map keeps its keys in).
#[derive(PartialEq)]
enum Arguments {
    Json(serde_json::Value),
    Text(String),
}

fn loop_key(tool: &str, arguments: &str) -> (String, Arguments) {
    let arguments = match serde_json::from_str::<serde_json::Value>(arguments) {
        Ok(value) => Arguments::Json(value),
        Err(_) => Arguments::Text(arguments.trim().to_string()),
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
            no_progress: false,
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

    /// The steps of the running turn so far, and whether each made
    /// progress: `None` for the step whose calls were refused to tell the
    /// model it made none (it counts for neither side), `Some(true)` when a
    /// call succeeded with output no earlier call of the turn returned.
    fn progress_of_steps(&self) -> Vec<Option<bool>> {
        let start = self
            .history
            .iter()
            .rposition(|m| matches!(m, Message::User { .. }))
            .unwrap_or(0);
        let mut seen: Vec<&str> = Vec::new();
        let mut steps: Vec<Option<bool>> = Vec::new();
        let mut current: Option<(bool, bool)> = None; // (progress, told)
        for message in self.history.iter().skip(start) {
            match message {
                Message::Assistant { tool_calls, .. } if !tool_calls.is_empty() => {
                    if let Some((progress, told)) = current.take() {
                        steps.push((!told).then_some(progress));
                    }
                    current = Some((false, false));
                }
                Message::Tool {
                    tool_call_id,
                    content,
                } => {
                    let Some((progress, told)) = current.as_mut() else {
                        continue;
                    };
                    let failed = self.failed_calls.contains(tool_call_id);
                    if content.starts_with(NO_PROGRESS_NOTE) {
                        *told = true;
                    } else if !failed && !seen.contains(&content.as_str()) {
                        *progress = true;
                    }
                    seen.push(content);
                }
                _ => {}
            }
        }
        if let Some((progress, told)) = current {
            steps.push((!told).then_some(progress));
        }
        steps
    }

    /// Before the calls of a new response run: tell the model after
    /// `no_progress_steps` steps without progress (its calls are not run),
    /// or stop the turn when it made none since it was told. `true` when
    /// the response's calls were handled here.
    pub(super) fn check_progress(&mut self, out: &mut Out, turn_id: &str, ids: &[String]) -> bool {
        let limit = self.view.0.no_progress_steps;
        // Plan mode has its own rail (`agent.plan_max_steps`) and repairs
        // failed steps on purpose.
        if limit == 0 || ids.is_empty() || self.turn_plan().is_some() {
            return false;
        }
        // The steps before this response (its own is the last one).
        let mut steps = self.progress_of_steps();
        steps.pop();
        let told_at = steps.iter().rposition(Option::is_none);
        let after: Vec<bool> = steps
            .iter()
            .skip(told_at.map_or(0, |i| i + 1))
            .filter_map(|s| *s)
            .collect();
        let stalled = after.iter().rev().take_while(|p| !**p).count();
        let (tool, arguments) = self
            .turn
            .as_ref()
            .and_then(|t| t.call(&ids[0]))
            .map(|c| (c.tool.clone(), c.arguments.clone()))
            .unwrap_or_default();
        let event = |repeats: usize, stopped: bool| {
            Kind::LoopDetected(pb::LoopDetected {
                tool: tool.clone(),
                arguments_json: arguments.clone(),
                repeats: u32::try_from(repeats).unwrap_or(u32::MAX),
                stopped,
                no_progress: true,
            })
        };
        // Told, and no progress since: stop. Progress since the model was
        // told starts the count again (it is told again at the limit).
        let progressed = after.contains(&true);
        if told_at.is_some() && !progressed && stalled >= 1 {
            // The steps before the model was told, and those since.
            let without = limit as usize + stalled;
            self.emit(out, turn_id, event(without, true));
            let message = format!(
                "stopped: the last {without} steps of this turn made no progress (their tool calls \
                 failed or returned what earlier ones had), and the model was told"
            );
            self.close_unrun(out, turn_id, ids, &message);
            let error = error_event(ErrorSource::Model, message.clone(), false);
            self.emit(out, turn_id, error);
            let finished = self.finish(TurnOutcome::Failed, message);
            self.emit(out, turn_id, finished);
            return true;
        }
        if (told_at.is_none() || progressed) && stalled >= limit as usize {
            self.emit(out, turn_id, event(stalled, false));
            let output = format!(
                "{NO_PROGRESS_NOTE} in the last {stalled} steps: every tool call failed or \
                 returned what an earlier call had. Step back: say what you tried and what you \
                 learned, then try something different, or give your answer."
            );
            for id in ids {
                self.refuse_call(out, turn_id, id, CallPhase::Error, output.clone());
            }
            return true;
        }
        false
    }
}

/// How the note that tells the model it makes no progress begins (the
/// detector finds it again in the history).
const NO_PROGRESS_NOTE: &str = "error: not run: no progress";
