//! Who may call what: the role each RPC needs.
//!
//! Every method of Agentry's services is listed here, with the least role
//! that may call it; a method not listed is for the services alone (a new
//! RPC stays closed to people until someone decides who may call it, and
//! a test checks that every RPC in the contracts is listed). Health checks
//! need no credential.
//!
//! `Submit` and `Chat` need `operator`; the orchestrator then asks for
//! `approver` for an input that answers an approval request.

use crate::auth::Role;

/// Methods that only Agentry's services may call: writing and deleting
/// session logs, running a tool without the orchestrator's policy, taking
/// due reminders.
pub const SERVICE_ONLY: &[&str] = &[
    "/agentry.sessions.v1.SessionStore/CreateSession",
    "/agentry.sessions.v1.SessionStore/DeleteSession",
    "/agentry.sessions.v1.SessionStore/ForkSession",
    "/agentry.sessions.v1.SessionStore/RenameSession",
    "/agentry.sessions.v1.SessionStore/Append",
    "/agentry.sessions.v1.SessionStore/Heartbeat",
    "/agentry.sessions.v1.SessionStore/AcquireSession",
    "/agentry.sessions.v1.SessionStore/ReleaseSession",
    "/agentry.tools.v1.ToolRunner/Execute",
    "/agentry.tools.v1.ToolRunner/McpSubscribe",
    "/agentry.tools.v1.ToolRunner/McpSessionServers",
    "/agentry.tools.v1.ToolRunner/McpReadResource",
    "/agentry.tools.v1.ToolRunner/McpWatch",
    "/agentry.tools.v1.ToolRunner/Snapshot",
    "/agentry.tools.v1.ToolRunner/RestoreSnapshot",
    "/agentry.tools.v1.ToolRunner/PruneSnapshots",
    "/agentry.tools.v1.ToolRunner/Preview",
    "/agentry.tools.v1.ToolRunner/RunHook",
    "/agentry.tools.v1.ToolRunner/OpenProject",
    "/agentry.tools.v1.ToolRunner/ReadInstructions",
    "/agentry.tools.v1.ToolRunner/ForgetSession",
    "/agentry.tools.v1.ToolRunner/ReadImage",
    "/agentry.scheduler.v1.Scheduler/StreamDue",
    "/agentry.scheduler.v1.Scheduler/RecordRun",
    "/agentry.scheduler.v1.Scheduler/Notify",
];

/// The methods people may call, with the least role each needs.
pub const FOR_PEOPLE: &[(&str, Role)] = &[
    (
        "/agentry.orchestrator.v1.Orchestrator/GetSession",
        Role::Viewer,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/ListSessions",
        Role::Viewer,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/Subscribe",
        Role::Viewer,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/ListTools",
        Role::Viewer,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/ListApprovals",
        Role::Viewer,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/ListDecisions",
        Role::Viewer,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/PreviewCall",
        Role::Viewer,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/CreateSession",
        Role::Operator,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/RenameSession",
        Role::Operator,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/Submit",
        Role::Operator,
    ),
    ("/agentry.orchestrator.v1.Orchestrator/Chat", Role::Operator),
    (
        "/agentry.orchestrator.v1.Orchestrator/ForkSession",
        Role::Operator,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/RewindSession",
        Role::Operator,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/SetSessionMcpServers",
        Role::Operator,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/DeleteSession",
        Role::Admin,
    ),
    (
        "/agentry.orchestrator.v1.Orchestrator/PruneSnapshots",
        Role::Admin,
    ),
    ("/agentry.sessions.v1.SessionStore/GetSession", Role::Viewer),
    (
        "/agentry.sessions.v1.SessionStore/ListSessions",
        Role::Viewer,
    ),
    ("/agentry.sessions.v1.SessionStore/Read", Role::Viewer),
    ("/agentry.sessions.v1.SessionStore/Watch", Role::Viewer),
    ("/agentry.tools.v1.ToolRunner/ListTools", Role::Viewer),
    (
        "/agentry.scheduler.v1.Scheduler/ListReminders",
        Role::Viewer,
    ),
    (
        "/agentry.scheduler.v1.Scheduler/CreateReminder",
        Role::Operator,
    ),
    (
        "/agentry.scheduler.v1.Scheduler/CancelReminder",
        Role::Operator,
    ),
    (
        "/agentry.scheduler.v1.Scheduler/PauseReminder",
        Role::Operator,
    ),
    ("/agentry.scheduler.v1.Scheduler/ListRuns", Role::Viewer),
];

/// The role a call to `path` (`/package.Service/Method`) needs; `None` for
/// calls open to anyone (health checks).
pub fn required_role(path: &str) -> Option<Role> {
    if path.starts_with("/grpc.health.v1.Health/") {
        return None;
    }
    if path.starts_with("/grpc.reflection.") {
        return Some(Role::Viewer);
    }
    Some(
        FOR_PEOPLE
            .iter()
            .find(|(method, _)| *method == path)
            .map_or(Role::Service, |(_, role)| *role),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use prost::Message;

    /// Every RPC of the contracts, as `/package.Service/Method`.
    fn every_rpc() -> Vec<String> {
        let set =
            prost_types::FileDescriptorSet::decode(agentry_proto::FILE_DESCRIPTOR_SET).unwrap();
        let mut paths = Vec::new();
        for file in set.file {
            let package = file.package().to_string();
            for service in &file.service {
                for method in &service.method {
                    paths.push(format!("/{package}.{}/{}", service.name(), method.name()));
                }
            }
        }
        paths
    }

    #[test]
    fn every_rpc_is_either_for_people_with_a_role_or_for_the_services_alone() {
        let rpcs = every_rpc();
        assert!(rpcs.len() > 40, "{rpcs:?}");
        for rpc in &rpcs {
            let for_people = FOR_PEOPLE.iter().any(|(m, _)| m == rpc);
            let for_services = SERVICE_ONLY.contains(&rpc.as_str());
            assert!(
                for_people != for_services,
                "{rpc} must be in exactly one of FOR_PEOPLE and SERVICE_ONLY"
            );
        }
        // And nothing listed is a method that does not exist.
        for listed in FOR_PEOPLE
            .iter()
            .map(|(m, _)| *m)
            .chain(SERVICE_ONLY.iter().copied())
        {
            assert!(rpcs.iter().any(|r| r == listed), "{listed} is no RPC");
        }
    }

    #[test]
    fn an_unknown_method_is_for_the_services_and_health_for_anyone() {
        assert_eq!(
            required_role("/agentry.x.v1.New/Thing"),
            Some(Role::Service)
        );
        assert_eq!(required_role("/grpc.health.v1.Health/Check"), None);
        assert_eq!(
            required_role("/agentry.orchestrator.v1.Orchestrator/DeleteSession"),
            Some(Role::Admin)
        );
        assert_eq!(
            required_role("/agentry.sessions.v1.SessionStore/Append"),
            Some(Role::Service)
        );
    }
}
