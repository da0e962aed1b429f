//! The generated types of every RPC's input and output, by full name: to
//! print a failing input as the message the service decoded, and to check
//! that what the services answer decodes.

use agentry_proto::orchestrator::v1 as orchestrator;
use agentry_proto::scheduler::v1 as scheduler;
use agentry_proto::sessions::v1 as sessions;
use agentry_proto::tools::v1 as tools;

macro_rules! decoders {
    ($($package:literal => $module:ident { $($ty:ident),* $(,)? })*) => {
        /// `bytes` decoded as the message `name` and printed with `Debug`;
        /// `None` for a message this table does not have.
        pub fn debug(name: &str, bytes: &[u8]) -> Option<Result<String, prost::DecodeError>> {
            $($(
                if name == concat!($package, ".", stringify!($ty)) {
                    return Some(
                        <$module::$ty as prost::Message>::decode(bytes).map(|m| format!("{m:#?}")),
                    );
                }
            )*)*
            None
        }
    };
}

decoders! {
    "agentry.sessions.v1" => sessions {
        AcquireSessionRequest, AcquireSessionResponse, AppendRequest, AppendResponse,
        CreateSessionRequest, DeleteSessionRequest, DeleteSessionResponse, Event,
        ForkSessionRequest, GetSessionRequest, HeartbeatRequest, HeartbeatResponse,
        ListSessionsRequest, ListSessionsResponse, ReadRequest, ReadResponse,
        ReleaseSessionRequest, ReleaseSessionResponse, RenameSessionRequest, Session,
        WatchRequest,
    }
    "agentry.tools.v1" => tools {
        ExecuteRequest, ExecuteResponse, ForgetSessionRequest, ForgetSessionResponse,
        ListToolsRequest, ListToolsResponse, McpReadResourceRequest, McpReadResourceResponse,
        McpResourceUpdate, McpSessionServersRequest, McpSessionServersResponse,
        McpSubscribeRequest, McpSubscribeResponse, McpWatchRequest, OpenProjectRequest,
        OpenProjectResponse, PreviewRequest, PreviewResponse, PruneSnapshotsRequest,
        PruneSnapshotsResponse, ReadImageRequest, ReadImageResponse, ReadInstructionsRequest,
        ReadInstructionsResponse, RestoreSnapshotRequest, RestoreSnapshotResponse,
        RunHookRequest, RunHookResponse, SnapshotRequest, SnapshotResponse,
    }
    "agentry.scheduler.v1" => scheduler {
        CancelReminderRequest, CreateReminderRequest, DueReminder, ListRemindersRequest,
        ListRemindersResponse, ListRunsRequest, ListRunsResponse, NotifyRequest, NotifyResponse,
        PauseReminderRequest, RecordRunRequest, Reminder, ScheduledRun, StreamDueRequest,
    }
    "agentry.orchestrator.v1" => orchestrator {
        ChatRequest, ChatResponse, CreateSessionRequest, ForkSessionRequest, ForkSessionResponse,
        GetSessionRequest, ListApprovalsRequest, ListApprovalsResponse, ListDecisionsRequest,
        ListDecisionsResponse, ListToolsRequest, ListToolsResponse, PreviewCallRequest,
        PruneSnapshotsRequest, RewindSessionRequest, RewindSessionResponse,
        SetSessionMcpServersRequest, SetSessionMcpServersResponse, SubmitRequest,
        SubmitResponse, SubscribeRequest,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::dict::Pools;
    use crate::generate::{self, Places, Source};
    use crate::rng::Rng;
    use crate::schema::Schema;

    #[test]
    fn every_rpc_input_and_output_has_a_decoder() {
        let schema = Schema::decode(agentry_proto::FILE_DESCRIPTOR_SET).unwrap();
        for method in &schema.methods {
            for name in [&method.input, &method.output] {
                assert!(debug(name, &[]).is_some(), "no decoder for {name}");
            }
        }
    }

    /// The generator's promise: what it does not mutate, prost decodes.
    #[test]
    fn generated_inputs_are_wire_valid() {
        let schema = Schema::decode(agentry_proto::FILE_DESCRIPTOR_SET).unwrap();
        let pools = Pools::default();
        let places = Places {
            project: "/tmp/p".into(),
            inside: vec!["/tmp/p/a".into()],
            outside: vec!["/tmp/outside/secret.txt".into()],
        };
        let src = Source {
            schema: &schema,
            pools: &pools,
            places: &places,
        };
        let mut rng = Rng::new(42);
        for method in &schema.methods {
            for _ in 0..200 {
                let bytes = generate::valid(&src, &mut rng, &method.input);
                let decoded = debug(&method.input, &bytes).unwrap();
                assert!(decoded.is_ok(), "{}: {decoded:?} {bytes:02x?}", method.path);
            }
        }
    }
}
