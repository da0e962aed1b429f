//! Consuming updates of subscribed MCP resources from every tool runner:
//! each update is delivered into its session as an `mcp_resource_updated`
//! event (which starts a turn) and acknowledged only once it is durably in
//! the log, or already was. Unacknowledged updates come back, so delivery
//! is at-least-once; the session's record of the last update of each
//! resource makes it once in the log.

use crate::reducer::Input;
use crate::runners::Replica;
use crate::service::Sessions;
use agentry_proto::sessions::v1 as pb;
use agentry_proto::tools::v1 as tpb;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Watches every tool runner replica for as long as the orchestrator runs.
pub async fn consume(service: Sessions) {
    // Dropped (the orchestrator stops) with this task: every watch ends.
    let mut tasks = tokio::task::JoinSet::new();
    let mut watching: HashMap<String, tokio::task::AbortHandle> = HashMap::new();
    loop {
        while tasks.try_join_next().is_some() {}
        for replica in service.deps().runners.replicas() {
            if watching
                .get(&replica.url)
                .is_some_and(|task| !task.is_finished())
            {
                continue;
            }
            let task = tasks.spawn(watch_replica(service.clone(), replica.clone()));
            watching.insert(replica.url.clone(), task);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Watches one replica until it leaves the pool, reconnecting with backoff.
async fn watch_replica(service: Sessions, replica: Arc<Replica>) {
    let mut delay = Duration::from_millis(200);
    loop {
        match watch_once(&service, &replica).await {
            Ok(()) => delay = Duration::from_millis(200),
            Err(status) if status.code() == tonic::Code::FailedPrecondition => {
                // The runner has no MCP servers; ask again now and then (its
                // configuration may change with a restart).
                delay = Duration::from_secs(30);
            }
            Err(status) => {
                tracing::debug!(runner = %replica.url, error = %status.message(), "MCP update stream unavailable; retrying");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
        let still_there = service
            .deps()
            .runners
            .replicas()
            .iter()
            .any(|r| r.url == replica.url);
        if !still_there {
            return;
        }
    }
}

async fn watch_once(service: &Sessions, replica: &Replica) -> Result<(), tonic::Status> {
    let (tx, rx) = mpsc::channel(64);
    let _ = tx
        .send(tpb::McpWatchRequest {
            consumer: "orchestrator".into(),
            ..tpb::McpWatchRequest::default()
        })
        .await;
    let mut updates = replica
        .client()
        .mcp_watch(ReceiverStream::new(rx))
        .await?
        .into_inner();
    tracing::info!(runner = %replica.url, "receiving MCP resource updates");
    while let Some(update) = updates.message().await? {
        let delivered = service
            .submit_input(
                &update.session_id,
                Input::McpResourceUpdated {
                    turn_id: crate::service::new_turn_id(),
                    update: pb::McpResourceUpdated {
                        server: update.server.clone(),
                        uri: update.uri.clone(),
                        update_id: update.id.clone(),
                        content: update.content,
                    },
                },
            )
            .await;
        let mut reply = tpb::McpWatchRequest::default();
        match delivered {
            Ok(_) => reply.acks.push(update.id),
            // The session is gone: nothing to deliver into, ever.
            Err(status) if status.code() == tonic::Code::NotFound => reply.gone.push(update.id),
            // Busy with a turn, or the store is down: leave it
            // unacknowledged; the runner sends it again.
            Err(status) => {
                tracing::debug!(update = %update.id, error = %status.message(), "MCP update not delivered yet");
                continue;
            }
        }
        if tx.send(reply).await.is_err() {
            break;
        }
    }
    Ok(())
}
