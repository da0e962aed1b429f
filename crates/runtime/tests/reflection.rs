//! Every service answers server reflection in both versions clients speak:
//! v1 (grpcurl) and v1alpha (Postman, grpc_cli, Evans, older grpcurl).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_runtime::{Auth, serve};
use tonic_reflection::pb::{v1, v1alpha};

/// Serves nothing but health and reflection on a loopback port; returns
/// its URL and the means to stop it.
async fn server() -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        serve(
            listener,
            tonic::service::Routes::default(),
            &["agentry.orchestrator.v1.Orchestrator"],
            &Auth::off(),
            async {
                let _ = stopped.await;
            },
        )
        .await
        .unwrap();
    });
    (url, stop)
}

const EXPECTED: [&str; 5] = [
    "agentry.orchestrator.v1.Orchestrator",
    "agentry.scheduler.v1.Scheduler",
    "agentry.sessions.v1.SessionStore",
    "agentry.tools.v1.ToolRunner",
    "grpc.health.v1.Health",
];

#[tokio::test]
async fn reflection_answers_in_v1_and_v1alpha() {
    let (url, _stop) = server().await;

    let channel = tonic::transport::Endpoint::from_shared(url)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::once(request))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("not a service list: {answer:?}");
    };
    let v1_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();

    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(channel);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::once(request))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        answer.message_response
    else {
        panic!("not a service list: {answer:?}");
    };
    let v1alpha_names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();

    for (names, itself) in [
        (&v1_names, "grpc.reflection.v1.ServerReflection"),
        (&v1alpha_names, "grpc.reflection.v1alpha.ServerReflection"),
    ] {
        for expected in EXPECTED.into_iter().chain([itself]) {
            assert!(
                names.iter().any(|n| n == expected),
                "{expected} missing from {names:?}"
            );
        }
    }
    let without_reflection = |names: &[String]| -> Vec<String> {
        let mut names: Vec<String> = names
            .iter()
            .filter(|n| !n.starts_with("grpc.reflection."))
            .cloned()
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        without_reflection(&v1_names),
        without_reflection(&v1alpha_names)
    );
}
