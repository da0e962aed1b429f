//! A job's hooks, run one after the other on a tool runner where the
//! session's tools act; their outcomes go back to the actor.

use super::*;

/// Where the hooks run: the session they are for, and the session whose
/// workspace its tools act on.
pub(super) struct Place {
    pub session_id: String,
    pub workspace: String,
}

pub(super) async fn run_hooks(
    deps: Arc<Deps>,
    place: Place,
    job: crate::hooks::HookJob,
    task: u64,
    tx: mpsc::Sender<Outcome>,
) {
    let Place {
        session_id,
        workspace,
    } = place;
    let mut input = job.input.clone();
    if let Some(object) = input.as_object_mut() {
        object.insert("session_id".into(), session_id.clone().into());
    }
    let input = input.to_string();
    let mut outcomes = Vec::new();
    for hook in &job.hooks {
        let request = agentry_proto::tools::v1::RunHookRequest {
            session_id: workspace.clone(),
            command: hook.command.clone(),
            input: input.clone(),
            timeout_secs: u32::try_from(hook.timeout_secs).unwrap_or(u32::MAX),
        };
        // A runner that stops answering does not hold the call.
        let deadline = Duration::from_secs(hook.timeout_secs + HOOK_RPC_MARGIN_SECS);
        let ran = tokio::time::timeout(deadline, deps.run_hook(request))
            .await
            .unwrap_or_else(|_| {
                Err(tonic::Status::deadline_exceeded(format!(
                    "the tool runner gave no outcome within {} s",
                    deadline.as_secs()
                )))
            });
        outcomes.push(match ran {
            Ok(r) => crate::hooks::HookOutcome {
                exit_code: r.exit_code,
                stdout: r.stdout,
                stderr: r.stderr,
                timed_out: r.timed_out,
                duration_ms: r.duration_ms,
                error: r.error,
            },
            Err(status) => crate::hooks::HookOutcome {
                error: format!("no tool runner could run it: {}", status.message()),
                ..Default::default()
            },
        });
    }
    let _ = tx
        .send(Box::new((
            task,
            Input::HooksDone {
                job: Box::new(job),
                outcomes,
            },
        )))
        .await;
}
