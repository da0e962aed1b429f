//! One tool call: a built-in tool in the orchestrator, anything else on the
//! least busy tool runner, its output streamed back to the actor.

use super::*;
use agentry_proto::tools::v1::{ExecuteRequest, OutputChunk};

pub(super) fn tool_error(call: &ToolCall, output: String, started: Instant) -> pb::ToolResult {
    pb::ToolResult {
        truncated: false,
        timed_out: false,
        sub_agent_usage: None,
        call_id: call.id.clone(),
        tool: call.name.clone(),
        output,
        is_error: true,
        exit_code: None,
        duration_ms: started.elapsed().as_millis() as u64,
        runner_id: String::new(),
        secrets_used: Vec::new(),
    }
}

/// Where a call acts: the workspace's session (its parent's, for a
/// sub-agent), the turn, how the turn's calls are approved.
pub(super) struct Place {
    pub workspace: String,
    pub turn_id: String,
    /// The model response of the turn the call came in.
    pub step: u32,
    pub approval_mode: pb::ApprovalMode,
}

/// How a call ended: with its result, or waiting for a person's answers to
/// its MCP server's questions.
pub(super) enum Ended {
    Done(pb::ToolResult),
    Asks(pb::McpInputRequested),
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn tool_call(
    sessions: &crate::service::Sessions,
    session_id: &str,
    place: &Place,
    call: ToolCall,
    read_only: bool,
    network: bool,
    resume: Option<pb::McpResume>,
    task: u64,
    tx: &mpsc::Sender<Outcome>,
) -> Ended {
    let started = Instant::now();
    let deps = sessions.deps();
    let request = ExecuteRequest {
        call_id: call.id.clone(),
        session_id: place.workspace.clone(),
        tool: call.name.clone(),
        arguments_json: call.arguments.clone(),
        timeout_ms: 0,
        network,
        resume,
    };
    if let Some(tool) = crate::builtin::own().get(&call.name) {
        return Ended::Done(
            own_call(sessions, session_id, place, call, tool.as_ref(), task, tx).await,
        );
    }
    let call_id = call.id.clone();
    let outcome = deps
        .runners
        .execute(request, read_only, |chunk: OutputChunk| {
            let stream =
                pb::OutputStream::try_from(chunk.stream).unwrap_or(pb::OutputStream::Unspecified);
            let input = Input::ToolChunk {
                call_id: call_id.clone(),
                stream,
                text: chunk.text,
            };
            let tx = tx.clone();
            async move { tx.send(Box::new((task, input))).await.is_ok() }
        })
        .await;
    // Instruction files of directories the call touched come first.
    if let Ok(result) = &outcome
        && !result.instructions.is_empty()
    {
        let input = Input::Instructions(result.instructions.clone());
        let _ = tx.send(Box::new((task, input))).await;
    }
    match outcome {
        Ok(result) if result.input_required.is_some() => {
            let mut asked = result.input_required.unwrap_or_default();
            asked.call_id = call.id.clone();
            Ended::Asks(asked)
        }
        Ok(result) => Ended::Done(pb::ToolResult {
            sub_agent_usage: None,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            output: result.output,
            is_error: result.is_error,
            exit_code: result.exit_code,
            duration_ms: result.duration_ms,
            runner_id: result.runner_id,
            truncated: result.truncated,
            timed_out: result.timed_out,
            secrets_used: result.secrets_used,
        }),
        Err(failure) => {
            let mut result = tool_error(&call, failure.message, started);
            result.runner_id = failure.runner;
            Ended::Done(result)
        }
    }
}

/// A call of one of the orchestrator's own tools; its progress lines (a
/// delegated task's) are the call's output, all out before the result.
async fn own_call(
    sessions: &crate::service::Sessions,
    session_id: &str,
    place: &Place,
    call: ToolCall,
    tool: &dyn agentry_tool::Tool<crate::builtin::TurnCall>,
    task: u64,
    tx: &mpsc::Sender<Outcome>,
) -> pb::ToolResult {
    let (progress, mut lines) = mpsc::unbounded_channel::<String>();
    let forward = {
        let tx = tx.clone();
        let call_id = call.id.clone();
        tokio::spawn(async move {
            while let Some(text) = lines.recv().await {
                let input = Input::ToolChunk {
                    call_id: call_id.clone(),
                    stream: pb::OutputStream::Stdout,
                    text,
                };
                if tx.send(Box::new((task, input))).await.is_err() {
                    return;
                }
            }
        })
    };
    let arguments = call.arguments.clone();
    let turn_call = crate::builtin::TurnCall {
        sessions: sessions.clone(),
        session_id: session_id.to_string(),
        turn_id: place.turn_id.clone(),
        step: place.step,
        approval_mode: place.approval_mode,
        call,
        progress,
    };
    let result = tool.run(&turn_call, &arguments).await;
    drop(turn_call);
    // The progress so far is out before the result.
    let _ = forward.await;
    result
}
