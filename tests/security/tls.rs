//! TLS with client certificates, for services on several hosts: a turn
//! works across every service over TLS; a client without a certificate
//! signed by the deployment's CA, or speaking plaintext, gets nowhere.

use crate::support::{finished, new_session, send, tool_results, until_finished};
use agentry_proto::orchestrator::v1 as opb;
use agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient;
use agentry_runtime::Auth;
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Reply;
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
use serde_json::json;
use std::path::Path;

/// A CA and one certificate it signed for 127.0.0.1, written as PEM files.
fn write_pki(dir: &Path, name: &str) -> (String, String, String) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()]).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let path = |file: &str| dir.join(format!("{name}-{file}")).display().to_string();
    std::fs::write(path("ca.pem"), ca.pem()).unwrap();
    std::fs::write(path("cert.pem"), cert.pem()).unwrap();
    std::fs::write(path("key.pem"), key.serialize_pem()).unwrap();
    (path("cert.pem"), path("key.pem"), path("ca.pem"))
}

#[tokio::test(flavor = "multi_thread")]
async fn services_talk_tls_with_client_certificates() {
    let pki = tempfile::tempdir().unwrap();
    let (cert, key, ca) = write_pki(pki.path(), "deployment");
    let cluster = Cluster::start_with(|c| {
        c.auth.tls.cert = cert.clone();
        c.auth.tls.key = key.clone();
        c.auth.tls.ca = ca.clone();
        for url in [
            &mut c.orchestrator.url,
            &mut c.session_store.url,
            &mut c.scheduler.url,
            &mut c.tool_runner.url,
        ] {
            *url = url.replacen("http://", "https://", 1);
        }
    })
    .await
    .unwrap();

    // A whole turn: orchestrator → store, runner, scheduler, all over TLS.
    cluster.model.push(Reply::tool_call(
        "c1",
        "bash",
        json!({"command": "echo over-tls"}),
    ));
    cluster.model.push(Reply::text("done"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "go").await;
    let received = until_finished(&mut events, &turn).await;
    finished(&received);
    assert_eq!(tool_results(&received)[0].output.trim(), "over-tls");

    // Plaintext gets no answer.
    let plain_url = cluster
        .config
        .orchestrator
        .url
        .replacen("https://", "http://", 1);
    let plain = Auth::client_with(cluster.auth.client_token().cloned());
    if let Ok(channel) = plain.endpoint(&plain_url).unwrap().connect().await {
        let result = OrchestratorClient::new(plain.wrap(channel))
            .create_session(opb::CreateSessionRequest::default())
            .await;
        assert!(result.is_err(), "a plaintext call was answered");
    }

    // A certificate from another CA (with the right token) is refused at
    // the handshake.
    let (cert2, key2, _) = write_pki(pki.path(), "stranger");
    let mut stranger = cluster.config.clone();
    stranger.auth.tls.cert = cert2;
    stranger.auth.tls.key = key2;
    stranger.auth.token = cluster.auth.client_token().unwrap().secret().to_string();
    let auth = Auth::for_client(&stranger).unwrap();
    let outcome = match auth
        .endpoint(&cluster.config.orchestrator.url)
        .unwrap()
        .connect()
        .await
    {
        Err(_) => Err(()),
        Ok(channel) => OrchestratorClient::new(auth.wrap(channel))
            .create_session(opb::CreateSessionRequest::default())
            .await
            .map(|_| ())
            .map_err(|_| ()),
    };
    assert!(outcome.is_err(), "a stranger's certificate was accepted");
}
