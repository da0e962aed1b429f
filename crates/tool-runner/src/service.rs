//! The gRPC face of the tool runner.

use crate::sandbox::Sandbox;
use crate::tools::{self, ToolOutcome};
use crate::workspace::Workspace;
use crate::{Limits, ToolError};
use agentry_proto::tools::v1 as pb;
use agentry_proto::tools::v1::tool_runner_server::ToolRunner;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// The ToolRunner gRPC service.
#[derive(Clone)]
pub struct ToolRunnerService {
    inner: Arc<Inner>,
}

struct Inner {
    workspace_root: PathBuf,
    limits: Limits,
    runner_id: String,
    sandbox: Sandbox,
    web: Option<Arc<crate::web::Web>>,
    calls: Arc<crate::metrics::ToolCalls>,
}

impl ToolRunnerService {
    /// A runner working under `workspace_root`.
    pub fn new(workspace_root: PathBuf, limits: Limits, runner_id: String) -> Self {
        Self {
            inner: Arc::new(Inner {
                workspace_root,
                limits,
                runner_id,
                sandbox: Sandbox::unconfined(),
                web: None,
                calls: Arc::default(),
            }),
        }
    }

    /// The same runner confining commands with `sandbox`.
    pub fn with_sandbox(self, sandbox: Sandbox) -> Self {
        let inner = Arc::new(Inner {
            workspace_root: self.inner.workspace_root.clone(),
            limits: self.inner.limits.clone(),
            runner_id: self.inner.runner_id.clone(),
            sandbox,
            web: self.inner.web.clone(),
            calls: self.inner.calls.clone(),
        });
        Self { inner }
    }

    /// The metrics page (Prometheus text).
    pub fn metrics_page(&self) -> String {
        crate::metrics::render(
            &self.inner.runner_id,
            &self.inner.calls,
            self.inner.web.as_deref(),
        )
    }

    /// The same runner serving the web tools with `web`.
    pub fn with_web(self, web: Arc<crate::web::Web>) -> Self {
        let inner = Arc::new(Inner {
            workspace_root: self.inner.workspace_root.clone(),
            limits: self.inner.limits.clone(),
            runner_id: self.inner.runner_id.clone(),
            sandbox: self.inner.sandbox.clone(),
            web: Some(web),
            calls: self.inner.calls.clone(),
        });
        Self { inner }
    }
}

type ExecuteStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::ExecuteResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ToolRunner for ToolRunnerService {
    async fn list_tools(
        &self,
        _request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        let tools = tools::specs()
            .into_iter()
            .map(|s| pb::ToolSpec {
                name: s.name.to_string(),
                description: s.description.to_string(),
                parameters_json_schema: s.schema.to_string(),
                read_only: s.read_only,
                parallel_safe: s.parallel_safe,
                sensitive: s.sensitive,
            })
            .collect();
        Ok(Response::new(pb::ListToolsResponse {
            tools,
            runner_id: self.inner.runner_id.clone(),
            sandbox: self.inner.sandbox.describe(),
        }))
    }

    type ExecuteStream = ExecuteStream;

    async fn execute(
        &self,
        request: Request<pb::ExecuteRequest>,
    ) -> Result<Response<Self::ExecuteStream>, Status> {
        let req = request.into_inner();
        if req.tool.is_empty() {
            return Err(Status::invalid_argument("tool must be set"));
        }
        let workspace = Workspace::open(&self.inner.workspace_root, &req.session_id)
            .and_then(|ws| {
                for dir in [ws.root(), ws.tmp()] {
                    self.inner
                        .sandbox
                        .hand_over(&req.session_id, dir)
                        .map_err(|e| ToolError::Io(format!("cannot prepare the workspace: {e}")))?;
                }
                Ok(ws)
            })
            .map_err(|e| match e {
                ToolError::InvalidRequest(m) => Status::invalid_argument(m),
                other => Status::internal(other.to_string()),
            })?;
        let (tx, rx) = mpsc::channel(64);
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let call_id = req.call_id.clone();
            let tool = req.tool.clone();
            let started = Instant::now();
            tracing::debug!(call_id, tool, "tool call started");
            let (sink, mut chunks) = mpsc::channel(64);
            let timeout = (req.timeout_ms > 0).then(|| Duration::from_millis(req.timeout_ms));
            let run = tools::execute(
                &req.tool,
                &req.arguments_json,
                &workspace,
                &inner.limits,
                timeout,
                &inner.sandbox,
                inner.web.as_deref(),
                sink,
            );
            tokio::pin!(run);
            // Live output is stored in the session log: like the result the
            // model sees, it is capped per call. Past the cap it is counted,
            // not sent; the result keeps the head and tail.
            let mut live = LiveCap::new(inner.limits.max_output_bytes);
            let outcome = loop {
                tokio::select! {
                    Some((stream, text)) = chunks.recv() => {
                        let Some(text) = live.admit(text) else { continue };
                        if tx.send(Ok(chunk_message(stream, text))).await.is_err() {
                            // The caller went away: dropping `run` kills the call.
                            tracing::info!(call_id, tool, "tool call cancelled by the caller");
                            inner.calls.record(&tool, "cancelled");
                            return;
                        }
                    }
                    outcome = &mut run => break outcome,
                    () = tx.closed() => {
                        tracing::info!(call_id, tool, "tool call cancelled by the caller");
                        inner.calls.record(&tool, "cancelled");
                        return;
                    }
                }
            };
            // Forward output produced just before the end.
            while let Ok((stream, text)) = chunks.try_recv() {
                let Some(text) = live.admit(text) else {
                    continue;
                };
                if tx.send(Ok(chunk_message(stream, text))).await.is_err() {
                    return;
                }
            }
            if let Some(note) = live.note() {
                let _ = tx
                    .send(Ok(chunk_message(
                        agentry_proto::sessions::v1::OutputStream::Stderr,
                        note,
                    )))
                    .await;
            }
            let outcome = outcome.unwrap_or_else(|e| ToolOutcome {
                output: e.to_string(),
                is_error: true,
                ..ToolOutcome::default()
            });
            let duration_ms = started.elapsed().as_millis() as u64;
            let outcome_name = match (outcome.timed_out, outcome.is_error) {
                (true, _) => "timeout",
                (false, true) => "error",
                (false, false) => "ok",
            };
            inner.calls.record(&tool, outcome_name);
            tracing::debug!(
                call_id,
                tool,
                is_error = outcome.is_error,
                duration_ms,
                "tool call finished"
            );
            let result = pb::ExecuteResponse {
                kind: Some(pb::execute_response::Kind::Result(pb::ExecuteResult {
                    output: outcome.output,
                    is_error: outcome.is_error,
                    exit_code: outcome.exit_code,
                    duration_ms,
                    runner_id: inner.runner_id.clone(),
                    truncated: outcome.truncated,
                    timed_out: outcome.timed_out,
                })),
            };
            let _ = tx.send(Ok(result)).await;
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Caps the live output of one call.
struct LiveCap {
    left: usize,
    dropped: u64,
}

impl LiveCap {
    fn new(limit: usize) -> Self {
        LiveCap {
            left: limit,
            dropped: 0,
        }
    }

    /// The part of `text` still within the cap, if any.
    fn admit(&mut self, mut text: String) -> Option<String> {
        if text.len() <= self.left {
            self.left -= text.len();
            return Some(text);
        }
        let mut keep = self.left;
        while !text.is_char_boundary(keep) {
            keep -= 1;
        }
        self.dropped += (text.len() - keep) as u64;
        self.left = 0;
        text.truncate(keep);
        (!text.is_empty()).then_some(text)
    }

    /// The closing note when output was held back.
    fn note(&self) -> Option<String> {
        (self.dropped > 0).then(|| {
            format!(
                "\n[{} more bytes of live output not shown; the result keeps the head and tail]\n",
                self.dropped
            )
        })
    }
}

fn chunk_message(
    stream: agentry_proto::sessions::v1::OutputStream,
    text: String,
) -> pb::ExecuteResponse {
    pb::ExecuteResponse {
        kind: Some(pb::execute_response::Kind::Chunk(pb::OutputChunk {
            stream: stream as i32,
            text,
        })),
    }
}
