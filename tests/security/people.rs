//! People with roles: each token gets its person's role and no more, on
//! every service, however the call is sent; a person removed is refused.

use crate::support::*;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_proto::scheduler::v1 as rpb;
use agentry_proto::scheduler::v1::scheduler_client::SchedulerClient;
use agentry_proto::sessions::v1::{self as spb, ApprovalDecision, ApprovalMode};
use agentry_runtime::Auth;
use agentry_runtime::auth::{ON_BEHALF_OF, Role, Token};
use agentry_runtime::people::People;
use agentry_runtime::reasons::{Reason, reason_of};
use agentry_testkit::Cluster;
use agentry_testkit::cluster::{Channel, connect_as};
use agentry_testkit::fake_model::Reply;
use serde_json::json;
use std::time::Duration;
use tonic::Code;

/// Long enough for every service to read the people file again.
const NOTICED: Duration = Duration::from_millis(1300);

async fn orchestrator_as(cluster: &Cluster, token: &Token) -> OrchestratorClient<Channel> {
    let auth = Auth::client_with(Some(token.clone()));
    OrchestratorClient::new(
        connect_as(&auth, &cluster.config.orchestrator.url)
            .await
            .unwrap(),
    )
}

fn assert_role_too_low(what: &str, status: tonic::Status, person: &str, needed: &str) {
    assert_eq!(status.code(), Code::PermissionDenied, "{what}: {status:?}");
    assert_eq!(reason_of(&status), Reason::RoleTooLow, "{what}: {status:?}");
    assert!(
        status.message().starts_with(person) && status.message().contains(needed),
        "{what}: the refusal names the person and the role needed: {}",
        status.message()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn each_person_may_do_what_their_role_allows_and_nothing_more() {
    let cluster = Cluster::start().await.unwrap();
    let file = cluster.config.people_file();
    let viewer = People::add(&file, "vera", Role::Viewer, "test").unwrap();
    let operator = People::add(&file, "otto", Role::Operator, "test").unwrap();
    let approver = People::add(&file, "abe", Role::Approver, "test").unwrap();
    tokio::time::sleep(NOTICED).await;
    cluster.model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "touch approved.txt"}),
    ));
    cluster.model.push(Reply::text("done"));

    // A viewer reads, and is refused anything that changes a thing.
    let mut vera = orchestrator_as(&cluster, &viewer).await;
    vera.list_sessions(spb::ListSessionsRequest::default())
        .await
        .unwrap();
    let refused = vera
        .create_session(pb::CreateSessionRequest::default())
        .await
        .unwrap_err();
    assert_role_too_low("a viewer creating a session", refused, "vera", "operator");

    // An operator chats but cannot answer the approval the turn asks for.
    let mut otto = orchestrator_as(&cluster, &operator).await;
    let (session, mut events) = new_session(&mut otto).await;
    let turn = send_with(
        &mut otto,
        &session.id,
        "make a file",
        ApprovalMode::Policy,
        false,
    )
    .await;
    let (request, _) = until_approval(&mut events).await;
    let refused = decide(
        &mut otto,
        &session.id,
        &request.call_id,
        ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap_err();
    assert_role_too_low("an operator approving", refused, "otto", "approver");
    // Nor can the viewer, by hand, on any path.
    let refused = decide(
        &mut vera,
        &session.id,
        &request.call_id,
        ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap_err();
    assert_role_too_low("a viewer approving", refused, "vera", "operator");
    let refused = vera
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::Cancel(pb::CancelInput {
                    reason: "stop".into(),
                })),
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);

    // The approver answers; the call runs.
    let mut abe = orchestrator_as(&cluster, &approver).await;
    decide(
        &mut abe,
        &session.id,
        &request.call_id,
        ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap();
    until_finished(&mut events, &turn).await;
    assert!(
        cluster
            .workspace_root()
            .join(&session.id)
            .join("approved.txt")
            .exists()
    );

    // The log says who sent the message and who approved the call; the
    // agent's own events name nobody.
    let mut store = cluster.store().await.unwrap();
    let log = read_log(&mut store, &session.id).await;
    let by = |wanted: fn(&spb::event::Kind) -> bool| -> Vec<String> {
        log.iter()
            .filter(|e| e.kind.as_ref().is_some_and(wanted))
            .map(|e| e.by.clone())
            .collect()
    };
    assert_eq!(
        by(|k| matches!(k, spb::event::Kind::UserMessage(_))),
        ["otto"]
    );
    assert_eq!(
        by(|k| matches!(k, spb::event::Kind::ApprovalDecided(_))),
        ["abe"]
    );
    // And that a person, not a rule, let the call run.
    let allowed: Vec<spb::AllowedBy> = log
        .iter()
        .filter_map(|e| match &e.kind {
            Some(spb::event::Kind::ToolCallState(s))
                if s.phase() == spb::ToolCallPhase::Scheduled =>
            {
                Some(s.allowed_by())
            }
            _ => None,
        })
        .collect();
    assert_eq!(allowed, [spb::AllowedBy::Person]);
    assert!(
        by(|k| matches!(
            k,
            spb::event::Kind::ModelMessage(_) | spb::event::Kind::ToolResult(_)
        ))
        .iter()
        .all(String::is_empty)
    );

    // Deleting is for admins: not the approver, but the client token.
    let refused = abe
        .delete_session(spb::DeleteSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap_err();
    assert_role_too_low("an approver deleting", refused, "abe", "admin");

    // The same roles hold on the scheduler.
    let mut reminders = SchedulerClient::new(
        connect_as(
            &Auth::client_with(Some(viewer.clone())),
            &cluster.config.scheduler.url,
        )
        .await
        .unwrap(),
    );
    reminders
        .list_reminders(rpb::ListRemindersRequest::default())
        .await
        .unwrap();
    let refused = reminders
        .create_reminder(rpb::CreateReminderRequest {
            session_id: session.id.clone(),
            due: "in 1h".into(),
            message: "look again".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);

    // A service acting for the viewer has the viewer's role, not its own.
    let mut for_vera = OrchestratorClient::new(
        connect_as(&cluster.auth, &cluster.config.orchestrator.url)
            .await
            .unwrap(),
    );
    let mut request = tonic::Request::new(pb::CreateSessionRequest::default());
    request
        .metadata_mut()
        .insert(ON_BEHALF_OF, "vera".parse().unwrap());
    let refused = for_vera.create_session(request).await.unwrap_err();
    assert_role_too_low("a service acting for a viewer", refused, "vera", "operator");

    // A person removed is refused within a second, everywhere.
    People::remove(&file, "otto").unwrap();
    tokio::time::sleep(NOTICED).await;
    let gone = otto
        .list_sessions(spb::ListSessionsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::Unauthenticated);
    let mut store = agentry_proto::sessions::v1::session_store_client::SessionStoreClient::new(
        connect_as(
            &Auth::client_with(Some(operator.clone())),
            &cluster.config.session_store.url,
        )
        .await
        .unwrap(),
    );
    let gone = store
        .list_sessions(spb::ListSessionsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::Unauthenticated);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rule_naming_approvers_takes_those_people_and_as_many_as_it_says() {
    let cluster = Cluster::start_with(|config| {
        config.policy.rules.insert(
            0,
            agentry_runtime::config::PolicyRule {
                approvers: vec!["role:admin".into(), "user:alice".into()],
                approvals_required: Some(2),
                tool: "bash".into(),
                command: Some("touch *".into()),
                path: None,
                read_only_hint: None,
                decision: agentry_runtime::config::PolicyDecision::Confirm,
                reason: Some("two people".into()),
                check_arguments: true,
                network: false,
            },
        );
    })
    .await
    .unwrap();
    let file = cluster.config.people_file();
    let alice = People::add(&file, "alice", Role::Approver, "test").unwrap();
    let bob = People::add(&file, "bob", Role::Approver, "test").unwrap();
    let otto = People::add(&file, "otto", Role::Operator, "test").unwrap();
    tokio::time::sleep(NOTICED).await;
    cluster.model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "touch twice.txt"}),
    ));
    cluster.model.push(Reply::text("done"));

    // An operator may not approve a whole turn ahead.
    let mut otto = orchestrator_as(&cluster, &otto).await;
    let (session, _) = new_session(&mut otto).await;
    let refused = otto
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::UserMessage(pb::UserInput {
                    text: "make a file".into(),
                    approval_mode: ApprovalMode::Always as i32,
                    ..Default::default()
                })),
            }),
        })
        .await
        .unwrap_err();
    assert_role_too_low(
        "an operator approving a turn ahead",
        refused,
        "otto",
        "approver",
    );

    // Even a turn approved ahead by an approver asks for this call.
    let mut alice = orchestrator_as(&cluster, &alice).await;
    let (session, mut events) = new_session(&mut alice).await;
    let turn = send_with(
        &mut alice,
        &session.id,
        "make a file",
        ApprovalMode::Always,
        false,
    )
    .await;
    let (request, _) = until_approval(&mut events).await;
    assert_eq!(request.approvals_required, 2);

    // Bob answers approvals, but this rule does not name him.
    let mut bob = orchestrator_as(&cluster, &bob).await;
    let refused = decide(
        &mut bob,
        &session.id,
        &request.call_id,
        ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert_eq!(reason_of(&refused), Reason::NotAnApprover, "{refused:?}");
    assert!(
        refused.message().starts_with("bob may not approve"),
        "{}",
        refused.message()
    );

    // Alice's approval counts, and the inbox says so; the call waits.
    decide(
        &mut alice,
        &session.id,
        &request.call_id,
        ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap();
    let inbox = alice
        .list_approvals(pb::ListApprovalsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let waiting = inbox
        .approvals
        .iter()
        .find(|p| p.call_id == request.call_id)
        .expect("still in the inbox");
    assert_eq!(waiting.approved_by, ["alice"]);
    assert_eq!(
        waiting.approvers,
        "2 different people: role:admin or user:alice"
    );
    let twice = decide(
        &mut alice,
        &session.id,
        &request.call_id,
        ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap_err();
    assert_eq!(reason_of(&twice), Reason::NotAnApprover, "{twice:?}");

    // The admin (the client token) is the second person: it runs.
    let mut admin = cluster.orchestrator().await.unwrap();
    decide(
        &mut admin,
        &session.id,
        &request.call_id,
        ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap();
    until_finished(&mut events, &turn).await;
    assert!(
        cluster
            .workspace_root()
            .join(&session.id)
            .join("twice.txt")
            .exists()
    );
    let mut store = cluster.store().await.unwrap();
    let log = read_log(&mut store, &session.id).await;
    let records = agentry_client::audit::records(&log);
    let ran = records
        .iter()
        .find(|r| r.action == "tool_call")
        .expect("the call is in the audit");
    assert_eq!(
        ran.allowed,
        Some(agentry_client::audit::Allowed::Person(
            "alice and admin".into()
        )),
        "{records:?}"
    );
}
