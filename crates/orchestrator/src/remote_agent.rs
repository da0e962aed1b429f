//! Remote agents: `[[agents]] url = "…"` names an A2A 1.0 agent elsewhere,
//! and a `delegate` call to it sends the task there over JSON-RPC
//! (`SendStreamingMessage`) instead of to a child session here. Its status
//! and the answer as it is written are the call's output, like a local
//! child's progress; its answer is the call's result.
//!
//! What the remote agent says is untrusted like any tool output: it is
//! capped, and only text reaches the model. A task that asks for input is
//! ended with what it asked (delegate cannot answer it); a failed, rejected
//! or cancelled one is a failed call saying why.

use crate::agents::Progress;
use crate::errors::ToolFailure;
use agentry_runtime::config::AgentDefinition;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};
use std::time::Duration;

/// How long fetching the agent card may take.
const CARD_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a remote task may run.
const TASK_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Most of the answer kept.
const MAX_ANSWER: usize = 256 * 1024;

/// Sends `task` to the remote agent `agent` (at `url`), reporting progress;
/// its answer, or why there is none. `message_id` names the message (the
/// call's id, so a remote agent can tell a repeat).
pub async fn delegate(
    agent: &AgentDefinition,
    url: &str,
    task: &str,
    message_id: &str,
    progress: Progress,
) -> Result<String, ToolFailure> {
    let name = &agent.name;
    let token = match &agent.token_env {
        Some(var) => Some(std::env::var(var).map_err(|_| {
            ToolFailure(format!(
                "the remote agent {name} needs a token, and ${var} is not set for the \
                 orchestrator"
            ))
        })?),
        None => None,
    };
    let http = reqwest::Client::builder()
        .connect_timeout(CARD_TIMEOUT)
        .build()
        .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
    let endpoint = endpoint(&http, url, token.as_deref()).await?;
    let _ = progress.send(format!(
        "[{name}] {} (A2A, {endpoint})\n",
        one_line(task, 200)
    ));
    let body = json!({
        "jsonrpc": "2.0",
        "id": message_id,
        "method": "SendStreamingMessage",
        "params": {"message": {
            "messageId": message_id,
            "role": "ROLE_USER",
            "parts": [{"text": task}]
        }}
    });
    let mut request = http
        .post(&endpoint)
        .header("A2A-Version", "1.0")
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .json(&body);
    if let Some(token) = &token {
        request = request.bearer_auth(token);
    }
    let run = async {
        let response = request
            .send()
            .await
            .map_err(|e| format!("the remote agent {name} at {endpoint} cannot be reached: {e}"))?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(ToolFailure(format!(
                "the remote agent {name} refused the task ({status}): {}",
                one_line(&text, 300)
            )));
        }
        let streamed = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut task = RemoteTask::default();
        if !streamed {
            // An answer in one piece (an agent that does not stream).
            let value: Value = response.json().await.map_err(|e| {
                format!("the remote agent {name} answered something unreadable: {e}")
            })?;
            task.apply(name, &value, &progress)?;
            return task.outcome(name);
        }
        let mut events = response.bytes_stream().eventsource();
        while let Some(event) = events.next().await {
            let event =
                event.map_err(|e| format!("the remote agent {name}'s stream broke: {e}"))?;
            let value: Value = serde_json::from_str(&event.data)
                .map_err(|e| format!("the remote agent {name} sent something unreadable: {e}"))?;
            if task.apply(name, &value, &progress)? {
                break;
            }
        }
        task.outcome(name)
    };
    tokio::time::timeout(TASK_TIMEOUT, run)
        .await
        .map_err(|_| format!("the remote agent {name} did not finish within 30 minutes"))?
}

/// The JSON-RPC address of the agent at `url`, from its agent card.
async fn endpoint(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
) -> Result<String, ToolFailure> {
    let card_url = if url.ends_with(".json") {
        url.to_string()
    } else {
        format!("{}/.well-known/agent-card.json", url.trim_end_matches('/'))
    };
    let mut request = http.get(&card_url).timeout(CARD_TIMEOUT);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let card: Value = request
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("cannot read the remote agent's card at {card_url}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("the remote agent's card at {card_url} is not JSON: {e}"))?;
    card.get("supportedInterfaces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|i| i.get("protocolBinding").and_then(Value::as_str) == Some("JSONRPC"))
        .and_then(|i| i.get("url").and_then(Value::as_str))
        .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
        .map(str::to_string)
        .ok_or_else(|| {
            ToolFailure(format!(
                "the remote agent's card at {card_url} names no JSON-RPC interface"
            ))
        })
}

/// What the remote task has said so far.
#[derive(Debug, Default)]
struct RemoteTask {
    state: String,
    /// The last status message's text.
    said: String,
    answer: String,
}

fn text_of(parts: Option<&Value>) -> String {
    parts
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("")
}

impl RemoteTask {
    /// Takes one JSON-RPC answer of the stream; true once the task has
    /// ended or waits for input.
    fn apply(
        &mut self,
        name: &str,
        value: &Value,
        progress: &Progress,
    ) -> Result<bool, ToolFailure> {
        if let Some(error) = value.get("error") {
            return Err(ToolFailure(format!(
                "the remote agent {name} refused the task: {}",
                one_line(
                    error
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("no reason"),
                    300
                )
            )));
        }
        let Some(result) = value.get("result") else {
            return Err(ToolFailure(format!(
                "the remote agent {name} sent an answer with neither result nor error"
            )));
        };
        if let Some(message) = result.get("message") {
            // A reply with no task: the answer itself.
            self.push(&text_of(message.get("parts")), false);
            self.state = "TASK_STATE_COMPLETED".into();
            return Ok(true);
        }
        let status = result
            .pointer("/task/status")
            .or_else(|| result.pointer("/statusUpdate/status"));
        if let Some(status) = status {
            let state = status
                .get("state")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let said = text_of(status.pointer("/message/parts"));
            if !said.is_empty() {
                self.said = said.clone();
            }
            if state != self.state && !state.is_empty() {
                let readable = state.trim_start_matches("TASK_STATE_").to_lowercase();
                let line = if said.is_empty() {
                    format!("[{name}] {readable}\n")
                } else {
                    format!("[{name}] {readable}: {}\n", one_line(&said, 200))
                };
                let _ = progress.send(line);
                self.state = state.to_string();
            }
        }
        if let Some(artifact) = result.pointer("/task/artifacts").and_then(Value::as_array) {
            for a in artifact {
                self.push(&text_of(a.get("parts")), true);
            }
        }
        if let Some(update) = result.get("artifactUpdate") {
            let text = text_of(update.pointer("/artifact/parts"));
            let append = update
                .get("append")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let last = update
                .get("lastChunk")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if append || !last || self.answer.is_empty() {
                let _ = progress.send(text.clone());
            }
            self.push(&text, append);
        }
        Ok(matches!(
            self.state.as_str(),
            "TASK_STATE_COMPLETED"
                | "TASK_STATE_FAILED"
                | "TASK_STATE_CANCELED"
                | "TASK_STATE_REJECTED"
                | "TASK_STATE_INPUT_REQUIRED"
                | "TASK_STATE_AUTH_REQUIRED"
        ))
    }

    /// Adds answer text: appended, or in place of what came before.
    fn push(&mut self, text: &str, append: bool) {
        if !append {
            self.answer.clear();
        }
        let room = MAX_ANSWER.saturating_sub(self.answer.len());
        let mut cut = text.len().min(room);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        self.answer.push_str(&text[..cut]);
    }

    fn outcome(self, name: &str) -> Result<String, ToolFailure> {
        let said = if self.said.is_empty() {
            "no reason given".to_string()
        } else {
            one_line(&self.said, 500)
        };
        match self.state.as_str() {
            "TASK_STATE_COMPLETED" if !self.answer.trim().is_empty() => Ok(self.answer),
            "TASK_STATE_COMPLETED" if !self.said.is_empty() => Ok(self.said),
            "TASK_STATE_COMPLETED" => Ok(format!(
                "(the remote agent {name} finished without an answer)"
            )),
            "TASK_STATE_INPUT_REQUIRED" => Err(ToolFailure(format!(
                "the remote agent {name} asks for more before it goes on: {said} (delegate \
                 again with a task that answers it)"
            ))),
            "TASK_STATE_AUTH_REQUIRED" => Err(ToolFailure(format!(
                "the remote agent {name} wants authentication: {said} (its token_env)"
            ))),
            "TASK_STATE_FAILED" | "TASK_STATE_REJECTED" => Err(ToolFailure(format!(
                "the remote agent {name} could not do it: {said}"
            ))),
            "TASK_STATE_CANCELED" => Err(ToolFailure(format!(
                "the remote agent {name} cancelled the task: {said}"
            ))),
            other => Err(ToolFailure(format!(
                "the remote agent {name}'s stream ended before the task did (last state {:?})",
                if other.is_empty() { "none" } else { other }
            ))),
        }
    }
}

fn one_line(text: &str, max: usize) -> String {
    let line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let line = line.trim();
    match line.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn run(answers: &[Value]) -> (Result<String, ToolFailure>, Vec<String>) {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut task = RemoteTask::default();
        for a in answers {
            match task.apply("far", a, &tx) {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => return (Err(e), Vec::new()),
            }
        }
        drop(tx);
        let mut lines = Vec::new();
        while let Ok(line) = rx.try_recv() {
            lines.push(line);
        }
        (task.outcome("far"), lines)
    }

    fn ok(result: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "result": result})
    }

    #[test]
    fn a_streamed_task_gives_its_answer_and_progress() {
        let (answer, lines) = run(&[
            ok(json!({"task": {"id": "t", "status": {"state": "TASK_STATE_SUBMITTED"}}})),
            ok(json!({"statusUpdate": {"status": {"state": "TASK_STATE_WORKING"}}})),
            ok(json!({"artifactUpdate": {"artifact": {"parts": [{"text": "Hello "}]}}})),
            ok(
                json!({"artifactUpdate": {"artifact": {"parts": [{"text": "there"}]}, "append": true}}),
            ),
            ok(json!({"statusUpdate": {"status": {"state": "TASK_STATE_COMPLETED"}}})),
        ]);
        assert_eq!(answer.unwrap(), "Hello there");
        assert!(
            lines.iter().any(|l| l.contains("[far] working")),
            "{lines:?}"
        );
        assert!(lines.iter().any(|l| l == "there"), "{lines:?}");
    }

    #[test]
    fn failures_questions_and_errors_say_why() {
        let failed = |state: &str| {
            run(&[ok(json!({"statusUpdate": {"status": {"state": state,
                "message": {"parts": [{"text": "no disk\u{1b}[2J"}]}}}}))])
            .0
            .unwrap_err()
            .0
        };
        let msg = failed("TASK_STATE_FAILED");
        assert!(msg.contains("could not do it: no disk"), "{msg}");
        assert!(
            !msg.contains('\u{1b}'),
            "control characters dropped: {msg:?}"
        );
        assert!(failed("TASK_STATE_INPUT_REQUIRED").contains("asks for more"));
        assert!(failed("TASK_STATE_CANCELED").contains("cancelled"));
        let refused = run(&[
            json!({"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": "nope"}}),
        ]);
        assert!(refused.0.unwrap_err().0.contains("refused the task: nope"));
        let cut_short = run(&[ok(
            json!({"statusUpdate": {"status": {"state": "TASK_STATE_WORKING"}}}),
        )]);
        assert!(
            cut_short
                .0
                .unwrap_err()
                .0
                .contains("ended before the task did")
        );
        let direct = run(&[ok(json!({"message": {"parts": [{"text": "just this"}]}}))]);
        assert_eq!(direct.0.unwrap(), "just this");
    }

    #[test]
    fn the_answer_is_capped() {
        let big = "x".repeat(MAX_ANSWER + 10);
        let (answer, _) = run(&[
            ok(json!({"artifactUpdate": {"artifact": {"parts": [{"text": big}]}}})),
            ok(json!({"statusUpdate": {"status": {"state": "TASK_STATE_COMPLETED"}}})),
        ]);
        assert_eq!(answer.unwrap().len(), MAX_ANSWER);
    }
}
