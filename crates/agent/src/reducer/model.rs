//! Each model call decided whole: the exact request (system prompt, the
//! turn's instructions, the recorded tool catalog, the conversation fitted
//! to the context window), or first a summary of the oldest messages, or
//! the end of the turn when the request cannot fit at all.

use super::*;
use crate::prompt::{Fit, Parts};

impl SessionState {
    /// The model is to be called now: emits the request (or the summary it
    /// needs first; `may_summarise` is false right after one).
    pub(super) fn call_model(&mut self, out: &mut Out, turn_id: &str, may_summarise: bool) {
        // What a person sent during the turn goes with this call.
        if !self.steering.is_empty() {
            let count = self.steering.len() as u32;
            self.emit(
                out,
                turn_id,
                Kind::SteeringDelivered(pb::SteeringDelivered { count }),
            );
        }
        let prompt = self.prompt();
        let counts = self
            .history_tokens
            .counts(&self.history, self.view.0.tokenizer);
        let fitted = self.fit(
            &prompt,
            &self.history,
            &self.history_spans,
            Some(&counts),
            may_summarise,
        );
        self.model_effect(out, turn_id, prompt, fitted);
    }

    /// How `history` goes into a request with `prompt`'s head.
    fn fit(
        &self,
        prompt: &crate::prompt::Prompt,
        history: &[Message],
        spans: &[(u64, u64)],
        counts: Option<&[usize]>,
        may_summarise: bool,
    ) -> Fit {
        let view = &self.view.0;
        // The running turn began with the latest person's (or reminder's)
        // message.
        let turn_start = history
            .iter()
            .rposition(|m| matches!(m, Message::User { .. }))
            .unwrap_or(history.len());
        crate::prompt::fit(
            &view.compaction,
            view.tokenizer,
            &prompt.head,
            prompt.tool_tokens,
            history,
            counts,
            spans,
            turn_start,
            may_summarise,
        )
    }

    /// Emits what a fitted request calls for: the model call, the summary
    /// it needs first, or the end of a turn whose request cannot fit.
    fn model_effect(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        prompt: crate::prompt::Prompt,
        fitted: Fit,
    ) {
        let view = self.view.0.clone();
        match fitted {
            Fit::Send {
                history,
                truncated,
                tokens,
                overhead,
            } => {
                let window = view.compaction.context_window;
                if view.compaction.enabled && tokens > window {
                    let message = format!(
                        "model call not sent: the request would take about {tokens} tokens, more \
                         than the model's context window of {window} ({}; the system prompt, \
                         instructions and tool definitions alone take about {overhead}): give the \
                         model a larger window (the server's context size and \
                         model_profiles.context_window), offer it fewer tools, or shorten the \
                         message",
                        view.compaction.window_source
                    );
                    let error = error_event(ErrorSource::Model, message.clone(), false);
                    self.emit(out, turn_id, error);
                    let finished = self.finish(TurnOutcome::Failed, message);
                    self.emit(out, turn_id, finished);
                    return;
                }
                let mut request = prompt.into_request(history, truncated, view.temperature);
                if let Some((text, error)) = self.turn.as_ref().and_then(|t| t.unreadable.clone()) {
                    crate::prompt::ask_to_rewrite(&mut request.history, text, &error);
                }
                out.after.push(Effect::CallModel { request });
            }
            Fit::Summarise(job) => {
                let messages = self.history[..job.messages].to_vec();
                out.after.push(Effect::Summarise { job, messages });
            }
        }
    }

    /// The request this state makes with `history` as the conversation.
    #[cfg(test)]
    pub(crate) fn request_for(&self, history: Vec<Message>) -> ModelRequest {
        self.prompt()
            .into_request(history, 0, self.view.0.temperature)
    }

    /// The head of the next request: the system prompt, the turn's
    /// skillset and plan guidance, and the tools (the plan tools too while
    /// a plan is being worked on).
    pub(super) fn prompt(&self) -> crate::prompt::Prompt {
        let view = &self.view.0;
        let mut extra: Vec<String> = self
            .turn_skillset()
            .and_then(|name| view.skillsets.text(name))
            .map(str::to_string)
            .into_iter()
            .collect();
        extra.extend(self.plan_guidance());
        let plan_mode = self.turn_plan().is_some_and(|p| !p.is_finishing());
        crate::prompt::build(
            Parts {
                system_prompt: &view.system_prompt,
                instructions: &self.instructions,
                extra: &extra,
                tools: &self.catalog.definitions,
                tools_tokens: self.catalog.tokens(&view.tokenizer),
                plan_mode,
                native: view.native,
                lean: view.lean,
                skillset: self.turn_skillset().unwrap_or_default(),
                require_tool: view.require_first_tool
                    && self.turn.as_ref().is_some_and(|t| t.steps == 0),
            },
            &view.tokenizer,
        )
    }

    /// The tools offered changed before a model call: recorded, and the
    /// call decided again with them.
    pub(super) fn offer_tools(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        catalog: Arc<Catalog>,
    ) -> Result<(), Refusal> {
        if self.phase != Phase::Generate {
            return Err(Refusal::Unexpected {
                input: "tool catalog",
                phase: self.phase,
            });
        }
        if *catalog == *self.catalog {
            return Ok(());
        }
        // The catalog given is the copy the sessions share.
        let catalog = self.view.0.catalogs.interned(catalog);
        self.emit(out, turn_id, Kind::ToolsOffered(catalog.to_event()));
        // A compaction asked for stays one (its summary is decided again).
        if self.turn.as_ref().is_some_and(|t| t.compact) {
            self.compact_now(out, turn_id);
        } else {
            self.call_model(out, turn_id, true);
        }
        Ok(())
    }

    /// Instruction files found: those the model has not been given (a new
    /// path, or new text) are recorded; while generating (fed in place of a
    /// model call), the call is decided again with them.
    pub(super) fn take_instructions(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        files: Vec<pb::InstructionFile>,
    ) {
        let new: Vec<pb::InstructionFile> = files
            .into_iter()
            .filter(|f| !self.instructions.contains(f))
            .collect();
        if new.is_empty() {
            return;
        }
        self.emit(
            out,
            turn_id,
            Kind::InstructionsLoaded(pb::InstructionsLoaded { files: new }),
        );
        if self.phase == Phase::Generate {
            if self.turn.as_ref().is_some_and(|t| t.compact) {
                self.compact_now(out, turn_id);
            } else {
                self.call_model(out, turn_id, true);
            }
        }
    }

    /// A summary for `job` came back: the compaction is recorded (the
    /// oldest messages left out with a note when there is no summary),
    /// then the model is called with the shorter conversation.
    pub(super) fn summarised(
        &mut self,
        out: &mut Out,
        turn_id: &str,
        job: CompactionJob,
        summary: Result<String, String>,
    ) -> Result<(), Refusal> {
        if self.phase != Phase::Generate {
            return Err(Refusal::Unexpected {
                input: "compaction",
                phase: self.phase,
            });
        }
        let compact = self.turn.as_ref().is_some_and(|t| t.compact);
        if compact && let Err(failure) = &summary {
            // Asked for, a compaction that failed replaces nothing (the
            // automatic one leaves the oldest messages out instead).
            let message = format!(
                "the conversation could not be summarised ({failure}); nothing was replaced"
            );
            let error = error_event(ErrorSource::Model, message.clone(), true);
            self.emit(out, turn_id, error);
            let finished = self.finish(TurnOutcome::Failed, message);
            self.emit(out, turn_id, finished);
            return Ok(());
        }
        let mut event = crate::prompt::compaction_event(&job, &self.history, summary);
        if !self.compaction_fits(&event) {
            return Err(Refusal::Unexpected {
                input: "compaction of another conversation",
                phase: self.phase,
            });
        }
        // The request as it will be sent (no second summary for it): its
        // tokens are the compaction's tokens after.
        let prompt = self.prompt();
        let after = crate::prompt::compacted(&event, &self.history);
        let fitted = self.fit(&prompt, &after, &[], None, false);
        if let Fit::Send { tokens, .. } = &fitted {
            event.tokens_after = *tokens as u64;
        }
        if compact {
            let message = format!(
                "compacted: {} earlier messages summarised, ~{} → ~{} tokens",
                event.messages, event.tokens_before, event.tokens_after
            );
            self.emit(out, turn_id, Kind::ContextCompacted(event));
            let finished = self.finish(TurnOutcome::Completed, message);
            self.emit(out, turn_id, finished);
            return Ok(());
        }
        self.emit(out, turn_id, Kind::ContextCompacted(event));
        self.model_effect(out, turn_id, prompt, fitted);
        Ok(())
    }

    /// A compaction the person asked for: every message but the last
    /// `keep_last` (never splitting a tool call from its result) is to be
    /// summarised, whatever the window; with nothing to summarise the turn
    /// ends saying so.
    pub(super) fn compact_now(&mut self, out: &mut Out, turn_id: &str) {
        let keep = self.view.0.compaction.keep_last.max(1);
        let budget = self.view.0.compaction.budget();
        let mut split = self.history.len().saturating_sub(keep);
        while split > 0 && matches!(self.history[split], Message::Tool { .. }) {
            split -= 1;
        }
        // Replacing only an earlier summary gains nothing.
        let only_summary = split == 1 && matches!(self.history[0], Message::System { .. });
        if split == 0 || only_summary || self.history_spans.len() != self.history.len() {
            let message = format!(
                "nothing to compact: the conversation has {} messages, and the last {keep} are \
                 always kept",
                self.history.len()
            );
            let finished = self.finish(TurnOutcome::Completed, message);
            self.emit(out, turn_id, finished);
            return;
        }
        let prompt = self.prompt();
        let counts = self
            .history_tokens
            .counts(&self.history, self.view.0.tokenizer);
        let overhead = prompt.tool_tokens
            + prompt
                .head
                .iter()
                .map(|m| self.view.0.tokenizer.message(m))
                .sum::<usize>();
        let first_seq = self.history_spans[0].0;
        let last_seq = self.history_spans[..split]
            .iter()
            .map(|s| s.1)
            .max()
            .unwrap_or(first_seq);
        let job = CompactionJob {
            messages: split,
            first_seq,
            last_seq,
            tokens_before: overhead + counts.iter().sum::<usize>(),
            max_tokens: (budget / 4).clamp(256, 2_000),
        };
        let messages = self.history[..split].to_vec();
        out.after.push(Effect::Summarise { job, messages });
    }
}
