//! Policy, human approval, the tool-call lifecycle and parallel calls.

use crate::support::*;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1::{
    self as spb, ApprovalDecision, ApprovalMode, ToolCallPhase, TurnOutcome, event::Kind,
};
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Channel;
use agentry_testkit::fake_model::{Reply, finish, tool_call, usage};
use pretty_assertions::assert_eq;
use serde_json::json;

type Client = pb::orchestrator_client::OrchestratorClient<Channel>;

async fn send_mode(
    client: &mut Client,
    session_id: &str,
    text: &str,
    mode: ApprovalMode,
) -> String {
    send_with(client, session_id, text, mode, false).await
}

fn phases_of(events: &[spb::Event], call_id: &str) -> Vec<ToolCallPhase> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ToolCallState(s)) if s.call_id == call_id => {
                Some(ToolCallPhase::try_from(s.phase).unwrap())
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sensitive_call_waits_for_approval_and_runs_once_approved() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "touch made.txt && echo made"}),
    ));
    cluster.model.push(Reply::text("done"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_mode(
        &mut client,
        &session.id,
        "make a file",
        ApprovalMode::Policy,
    )
    .await;
    let (request, _) = until_approval(&mut events).await;
    assert_eq!(request.call_id, "t1");
    assert_eq!(request.tool, "bash");
    assert!(
        request.matched_rule.contains("bash"),
        "{}",
        request.matched_rule
    );
    // Nothing ran yet.
    let file = cluster.workspace_root().join(&session.id).join("made.txt");
    assert!(!file.exists());
    // A message while waiting steers the turn: the model gets it with the
    // call's result.
    let steered = client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(user("hello?")),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(steered.turn_id, turn);

    decide(
        &mut client,
        &session.id,
        "t1",
        ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap();
    let rest = until_finished(&mut events, &turn).await;
    assert_eq!(finished(&rest).outcome, TurnOutcome::Completed as i32);
    assert!(file.exists());
    assert_eq!(tool_results(&rest)[0].output, "made\n");
    let second = &cluster.model.requests()[1];
    let messages = second["messages"].as_array().unwrap();
    assert_eq!(messages.last().unwrap()["content"], "hello?");
    // The whole lifecycle is in the log, forward only.
    let log = read_log(&mut cluster.store().await.unwrap(), &session.id).await;
    assert_eq!(
        phases_of(&log, "t1"),
        vec![
            ToolCallPhase::AwaitingApproval,
            ToolCallPhase::Scheduled,
            ToolCallPhase::Executing,
            ToolCallPhase::Success
        ]
    );
    // A second, stale decision for the same call is refused.
    let stale = decide(
        &mut client,
        &session.id,
        "t1",
        ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap_err();
    assert_eq!(stale.code(), tonic::Code::FailedPrecondition);
    assert_eq!(
        agentry_runtime::reasons::reason_of(&stale),
        agentry_runtime::reasons::Reason::NoPendingApproval
    );
    assert!(
        stale.message().contains("no approval is pending"),
        "{}",
        stale.message()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_denial_goes_to_the_model_with_the_reason() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "make deploy"}),
    ));
    cluster.model.push(Reply::text("ok, I won't"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_mode(&mut client, &session.id, "deploy", ApprovalMode::Policy).await;
    until_approval(&mut events).await;
    // Bad decisions are refused with clear errors and change nothing.
    let err = decide(
        &mut client,
        &session.id,
        "nope",
        ApprovalDecision::Approve,
        "",
        "",
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    let err = decide(
        &mut client,
        &session.id,
        "t1",
        ApprovalDecision::Unspecified,
        "",
        "",
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let err = decide(
        &mut client,
        &session.id,
        "t1",
        ApprovalDecision::Edit,
        "",
        "{not json",
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    decide(
        &mut client,
        &session.id,
        "t1",
        ApprovalDecision::Deny,
        "not on a Friday",
        "",
    )
    .await
    .unwrap();
    let rest = until_finished(&mut events, &turn).await;
    let result = &tool_results(&rest)[0];
    assert!(result.is_error);
    assert!(
        result.output.contains("not on a Friday"),
        "{}",
        result.output
    );
    let requests = cluster.model.requests();
    let last = requests[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "tool");
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .contains("not on a Friday")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn approve_for_session_adds_a_rule_that_later_calls_use() {
    let cluster = Cluster::start().await.unwrap();
    for id in ["t1", "t2"] {
        cluster.model.push(Reply::tool_call(
            id,
            "bash",
            json!({"command": "make build"}),
        ));
        cluster.model.push(Reply::text("built"));
    }
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_mode(&mut client, &session.id, "build", ApprovalMode::Policy).await;
    until_approval(&mut events).await;
    decide(
        &mut client,
        &session.id,
        "t1",
        ApprovalDecision::ApproveForSession,
        "",
        "",
    )
    .await
    .unwrap();
    let first = until_finished(&mut events, &turn).await;
    let allowances: Vec<spb::SessionAllowance> = first
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::ApprovalDecided(d)) => Some(d.allowances.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(
        allowances,
        vec![spb::SessionAllowance {
            tool: "bash".into(),
            command: "make build".into(),
            path: String::new()
        }]
    );
    // The same command in a later turn runs without asking.
    let turn = send_mode(
        &mut client,
        &session.id,
        "build again",
        ApprovalMode::Policy,
    )
    .await;
    let second = until_finished(&mut events, &turn).await;
    assert!(
        !second
            .iter()
            .any(|e| matches!(e.kind, Some(Kind::ApprovalRequested(_))))
    );
    assert_eq!(phases_of(&second, "t2")[0], ToolCallPhase::Scheduled);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_edited_call_is_checked_by_the_policy_again() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "make clean"}),
    ));
    cluster.model.push(Reply::tool_call(
        "t2",
        "bash",
        json!({"command": "make clean"}),
    ));
    cluster.model.push(Reply::text("finished"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_mode(&mut client, &session.id, "clean", ApprovalMode::Policy).await;
    until_approval(&mut events).await;
    // Edited into something the policy denies: refused, never run.
    let denied = json!({"command": "sudo make clean"}).to_string();
    decide(
        &mut client,
        &session.id,
        "t1",
        ApprovalDecision::Edit,
        "",
        &denied,
    )
    .await
    .unwrap();
    until_approval(&mut events).await;
    // Edited into something harmless: runs with the edited arguments.
    let edited = json!({"command": "echo edited"}).to_string();
    decide(
        &mut client,
        &session.id,
        "t2",
        ApprovalDecision::Edit,
        "",
        &edited,
    )
    .await
    .unwrap();
    until_finished(&mut events, &turn).await;
    let log = read_log(&mut cluster.store().await.unwrap(), &session.id).await;
    let results = tool_results(&log);
    assert!(results[0].is_error);
    assert!(
        results[0].output.contains("denied by policy"),
        "{}",
        results[0].output
    );
    assert!(results[0].output.contains("sudo"), "{}", results[0].output);
    assert!(!results[1].is_error, "{}", results[1].output);
    assert!(
        results[1].output.ends_with("edited\n"),
        "{}",
        results[1].output
    );
    assert!(
        results[1].output.contains("edited the arguments"),
        "{}",
        results[1].output
    );
    // The log keeps both versions: the model's and the person's.
    let requested: Vec<String> = log
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ToolCallRequested(c)) if c.call_id == "t2" => Some(c.arguments_json.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        requested,
        vec![json!({"command": "make clean"}).to_string()]
    );
    let decided: Vec<String> = log
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ApprovalDecided(d)) if d.call_id == "t2" => {
                Some(d.edited_arguments_json.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(decided, vec![edited]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_denied_segment_cannot_hide_in_a_compound_command() {
    let cluster = Cluster::start().await.unwrap();
    for (i, command) in [
        "ls && sudo rm -rf x",
        "echo $(sudo id)",
        "bash -c 'sudo ls'",
    ]
    .iter()
    .enumerate()
    {
        cluster.model.push(Reply::tool_call(
            &format!("c{i}"),
            "bash",
            json!({"command": command}),
        ));
    }
    cluster.model.push(Reply::text("understood"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    // Even with --approve always, a deny rule wins.
    let turn = send_mode(&mut client, &session.id, "try it", ApprovalMode::Always).await;
    let got = until_finished(&mut events, &turn).await;
    let results = tool_results(&got);
    assert_eq!(results.len(), 3);
    for r in &results {
        assert!(r.is_error);
        assert!(r.output.contains("denied by policy"), "{}", r.output);
        assert!(r.output.contains("sudo"), "{}", r.output);
        assert_eq!(phases_of(&got, &r.call_id), vec![ToolCallPhase::Error]);
    }
    assert!(
        !got.iter()
            .any(|e| matches!(e.kind, Some(Kind::ApprovalRequested(_))))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn approval_mode_never_refuses_what_would_need_a_person() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "t1",
        "write_file",
        json!({"path": "a.txt", "content": "x"}),
    ));
    cluster.model.push(Reply::text("could not"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send_mode(&mut client, &session.id, "write", ApprovalMode::Never).await;
    let got = until_finished(&mut events, &turn).await;
    let result = &tool_results(&got)[0];
    assert!(result.is_error);
    assert!(
        result.output.contains("needs a person's approval"),
        "{}",
        result.output
    );
    assert!(
        !cluster
            .workspace_root()
            .join(&session.id)
            .join("a.txt")
            .exists()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn read_only_calls_run_together_and_mutating_ones_in_order() {
    let cluster = Cluster::start().await.unwrap();
    let workspace = cluster.workspace_root();
    cluster.model.push(Reply::stream(vec![
        tool_call(0, "r1", "read_file", &[r#"{"path":"a.txt"}"#]),
        tool_call(1, "r2", "read_file", &[r#"{"path":"b.txt"}"#]),
        tool_call(2, "r3", "read_file", &[r#"{"path":"c.txt"}"#]),
        tool_call(3, "w1", "bash", &[r#"{"command":"echo one >> log.txt"}"#]),
        tool_call(4, "w2", "bash", &[r#"{"command":"echo two >> log.txt"}"#]),
        finish("tool_calls"),
        usage(10, 10),
    ]));
    cluster.model.push(Reply::text("read them all"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let dir = workspace.join(&session.id);
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["a", "b", "c"] {
        std::fs::write(
            dir.join(format!("{name}.txt")),
            format!("content of {name}"),
        )
        .unwrap();
    }
    let turn = send_mode(&mut client, &session.id, "read", ApprovalMode::Always).await;
    let got = until_finished(&mut events, &turn).await;
    let seq_of = |call: &str, phase: ToolCallPhase| -> u64 {
        got.iter()
            .find(|e| matches!(&e.kind, Some(Kind::ToolCallState(s)) if s.call_id == call && s.phase == phase as i32))
            .map(|e| e.seq)
            .unwrap_or_else(|| panic!("no {phase:?} for {call}"))
    };
    let time_of = |call: &str, phase: ToolCallPhase| -> prost_types::Timestamp {
        got.iter()
            .find(|e| matches!(&e.kind, Some(Kind::ToolCallState(s)) if s.call_id == call && s.phase == phase as i32))
            .and_then(|e| e.time)
            .unwrap()
    };
    let ts = |t: prost_types::Timestamp| (t.seconds, t.nanos);
    // The three reads all started before any of them finished.
    let first_done = ["r1", "r2", "r3"]
        .iter()
        .map(|c| seq_of(c, ToolCallPhase::Success))
        .min()
        .unwrap();
    for c in ["r1", "r2", "r3"] {
        assert!(seq_of(c, ToolCallPhase::Executing) < first_done);
        let started = ts(time_of(c, ToolCallPhase::Executing));
        let earliest_end = ["r1", "r2", "r3"]
            .iter()
            .map(|c| ts(time_of(c, ToolCallPhase::Success)))
            .min()
            .unwrap();
        assert!(started <= earliest_end);
    }
    // The writes ran one after the other, after the reads.
    let last_read = ["r1", "r2", "r3"]
        .iter()
        .map(|c| seq_of(c, ToolCallPhase::Success))
        .max()
        .unwrap();
    assert!(seq_of("w1", ToolCallPhase::Executing) > last_read);
    assert!(seq_of("w2", ToolCallPhase::Executing) > seq_of("w1", ToolCallPhase::Success));
    assert!(
        ts(time_of("w2", ToolCallPhase::Executing)) >= ts(time_of("w1", ToolCallPhase::Success))
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("log.txt")).unwrap(),
        "one\ntwo\n"
    );
    // Results went back to the model in the model's order.
    let messages = cluster.model.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .clone();
    let tool_ids: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(tool_ids, vec!["r1", "r2", "r3", "w1", "w2"]);
    assert_eq!(
        messages.iter().find(|m| m["tool_call_id"] == "r2").unwrap()["content"],
        "content of b"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_second_client_and_a_resumed_client_see_every_event_once() {
    let cluster = Cluster::start().await.unwrap();
    cluster.model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "echo $((6*7))"}),
    ));
    cluster.model.push(Reply::text("forty-two it is"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut first) = new_session(&mut client).await;
    let mut second = client
        .subscribe(pb::SubscribeRequest {
            session_id: session.id.clone(),
            from_seq: 1,
            live_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    let turn = send_mode(&mut client, &session.id, "compute", ApprovalMode::Always).await;
    // A third client reads three events, disconnects, and resumes by seq.
    let mut third = client
        .subscribe(pb::SubscribeRequest {
            session_id: session.id.clone(),
            from_seq: 1,
            live_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut resumed = Vec::new();
    for _ in 0..3 {
        resumed.push(third.message().await.unwrap().unwrap());
    }
    drop(third);
    let mut again = client
        .subscribe(pb::SubscribeRequest {
            session_id: session.id.clone(),
            from_seq: resumed.last().unwrap().seq + 1,
            live_only: false,
        })
        .await
        .unwrap()
        .into_inner();
    resumed.extend(until_finished(&mut again, &turn).await);
    let a = until_finished(&mut first, &turn).await;
    let b = until_finished(&mut second, &turn).await;
    assert_eq!(a, b);
    assert_eq!(resumed, a);
    let logged: Vec<u64> = a.iter().filter(|e| !e.live).map(|e| e.seq).collect();
    assert_eq!(logged, (1..=logged.len() as u64).collect::<Vec<_>>());
}
