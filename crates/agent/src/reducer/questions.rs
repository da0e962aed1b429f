//! A call whose MCP server asks a person for input: the questions are
//! recorded and the call waits (across restarts) until someone answers;
//! then it goes on with the answers. A turn that asks nobody (approval
//! mode never) fails the call instead, and a cancelled turn tells the
//! server to stop.

use super::*;

impl SessionState {
    /// The server of a running call asked for input.
    pub(super) fn asked(&mut self, out: &mut Out, turn_id: &str, asked: pb::McpInputRequested) {
        let mode = self
            .turn
            .as_ref()
            .map_or(ApprovalMode::Policy, |t| t.approval_mode);
        // A turn whose calls are all approved still has a person to ask
        // (a question is not an approval); one that approves nothing
        // (headless) has nobody.
        if mode != ApprovalMode::Never {
            self.emit(out, turn_id, Kind::McpInputRequested(asked));
            return;
        }
        // Nobody is asked in this turn: the call fails, and the server is
        // told to stop what waits for the answers.
        if let Some(call) = self.turn.as_ref().and_then(|t| t.call(&asked.call_id)) {
            out.after.push(Effect::StopAsking {
                call: call.as_tool_call(),
                resume_json: asked.resume_json.clone(),
            });
        }
        let questions: Vec<String> = asked
            .questions
            .iter()
            .map(crate::questions::describe)
            .collect();
        let output = format!(
            "error: the MCP server {} asked a person for input, and this turn asks nobody \
             (approval mode {}); its questions were:\n{}",
            asked.server,
            mode.as_str_name()
                .trim_start_matches("APPROVAL_MODE_")
                .to_lowercase(),
            questions.join("\n")
        );
        self.refuse_call(out, turn_id, &asked.call_id, CallPhase::Error, output);
        self.dispatch(out, turn_id);
    }

    /// A person's answer to the questions of a call's server.
    pub(super) fn answer_question(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        call_id: &str,
        action: &str,
        content_json: &str,
        by: &Answerer,
    ) -> Result<(), Refusal> {
        let Some(asked) = self
            .awaiting_input()
            .into_iter()
            .find(|c| c.id == call_id)
            .and_then(|c| c.asking.clone())
        else {
            return Err(Refusal::NoPendingQuestion {
                call_id: call_id.to_string(),
            });
        };
        // The service checked the role (approver); who answered is on the
        // event.
        let _ = by;
        let answers_json = crate::questions::answers(&asked, action, content_json)
            .map_err(Refusal::InvalidDecision)?;
        let given = pb::McpInputProvided {
            call_id: call_id.to_string(),
            action: action.to_string(),
            answers_json,
        };
        self.emit(out, turn_id, Kind::McpInputProvided(given));
        if let Some(call) = self.turn.as_ref().and_then(|t| t.call(call_id)) {
            out.after.push(self.run_tool(call));
        }
        Ok(())
    }

    /// The turn ends: the servers of calls waiting for answers are told to
    /// stop.
    pub(super) fn stop_asking(&self, out: &mut Out) {
        for call in self.awaiting_input() {
            if let Some(asked) = &call.asking {
                out.after.push(Effect::StopAsking {
                    call: call.as_tool_call(),
                    resume_json: asked.resume_json.clone(),
                });
            }
        }
    }
}
