//! A request carrying a value of many kilobytes (an id, a name) is refused
//! with its status, quoting the value cut short: the answer's headers stay
//! within what a gRPC client accepts, so the caller reads the error
//! instead of a broken connection.

use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::sessions::v1 as spb;
use agentry_testkit::Cluster;

fn huge() -> String {
    // Percent-encoded, each crab is 12 bytes: 36 KB of header unbounded.
    "🦀".repeat(3000)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_session_id_is_refused_with_a_readable_status() {
    let cluster = Cluster::start().await.unwrap();

    let mut store = cluster.store().await.unwrap();
    let refused = store
        .get_session(spb::GetSessionRequest { session_id: huge() })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::NotFound, "{refused:?}");
    assert!(
        refused.message().contains("🦀🦀") && refused.message().ends_with("more characters)"),
        "{}",
        refused.message()
    );

    let mut orchestrator = cluster.orchestrator().await.unwrap();
    let refused = orchestrator
        .submit(opb::SubmitRequest {
            session_id: huge(),
            input: Some(opb::Input {
                kind: Some(opb::input::Kind::UserMessage(opb::UserInput {
                    text: huge(),
                    ..Default::default()
                })),
            }),
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused.code(),
            tonic::Code::NotFound | tonic::Code::InvalidArgument
        ),
        "{refused:?}"
    );
    assert!(
        refused.message().contains("more characters)"),
        "{}",
        refused.message()
    );

    // The same connections still serve.
    store
        .list_sessions(spb::ListSessionsRequest::default())
        .await
        .unwrap();
    orchestrator
        .list_sessions(spb::ListSessionsRequest::default())
        .await
        .unwrap();
}
