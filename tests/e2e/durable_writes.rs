//! What a turn costs in durable writes: everything a session decides while
//! one append runs goes to the store together in the next one.

use crate::support::*;
use agentry_proto::sessions::v1::TurnOutcome;
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Reply;
use pretty_assertions::assert_eq;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Forwards each connection to the store at `target`, holding every chunk
/// sent to it for `delay`: a store whose commits are slow, as its clients
/// see it.
async fn slow_store(listener: TcpListener, target: Arc<OnceLock<SocketAddr>>, delay: Duration) {
    while let Ok((client, _)) = listener.accept().await {
        let Some(addr) = target.get().copied() else {
            return;
        };
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(addr).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_server, mut to_server) = server.into_split();
            let up = async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = from_client.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    tokio::time::sleep(delay).await;
                    if to_server.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = to_server.shutdown().await;
            };
            let down = async move {
                let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
                let _ = to_client.shutdown().await;
            };
            tokio::join!(up, down);
        });
    }
}

/// The store's durable commits so far, from its metrics page.
async fn commits(metrics: &str) -> u64 {
    metric(metrics, "agentry_store_commits_total").await as u64
}

#[tokio::test(flavor = "multi_thread")]
async fn a_one_tool_turn_takes_at_most_three_commits_when_the_store_is_slower_than_the_work() {
    // Every request to the store waits 150 ms on the way: the model and the
    // read-only tool answer well within one append.
    let path = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let via = path.local_addr().unwrap();
    let target = Arc::new(OnceLock::new());
    tokio::spawn(slow_store(path, target.clone(), Duration::from_millis(150)));
    let metrics = metrics_addr();
    let metrics_listen = metrics.clone();
    let cluster = Cluster::start_with(move |c| {
        let _ = target.set(c.session_store.listen);
        c.session_store.url = format!("http://{via}");
        c.session_store.metrics_listen = metrics_listen;
    })
    .await
    .unwrap();
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    // The session's first turn records its tools and looks for its
    // instruction files; the second is the plain one-tool turn.
    cluster.model.push(Reply::text("hello"));
    converse(&mut client, &session.id, &mut events, &["hello"]).await;

    cluster
        .model
        .push(Reply::tool_call("call_1", "list_dir", json!({"path": "."})));
    cluster.model.push(Reply::text("nothing there yet"));
    let before = commits(&metrics).await;
    let turn = send(&mut client, &session.id, "what is in the workspace?").await;
    let received = until_finished(&mut events, &turn).await;
    let after = commits(&metrics).await;
    assert_eq!(finished(&received).outcome, TurnOutcome::Completed as i32);

    // The message (stored before the submit is answered); then the
    // model's answer with its call, the call's result, the second answer
    // and the turn's end, decided while an append ran or while the quick
    // work they wait for was in flight: in one commit or two. One append
    // per step would take four.
    let commits = after - before;
    assert!(
        (2..=3).contains(&commits),
        "{commits} commits: {:#?}",
        kinds(&received)
    );

    // Nothing is lost or reordered by writing ahead: the log holds every
    // event the client saw, in the same order, gap-free.
    let mut store = cluster.store().await.unwrap();
    let log = read_log(&mut store, &session.id).await;
    let seqs: Vec<u64> = log.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=log.len() as u64).collect::<Vec<_>>());
    let seen: Vec<(u64, &str)> = received
        .iter()
        .filter(|e| !e.live)
        .map(|e| (e.seq, kinds(std::slice::from_ref(e))[0]))
        .collect();
    let stored: Vec<(u64, &str)> = log
        .iter()
        .filter(|e| e.turn_id == turn)
        .map(|e| (e.seq, kinds(std::slice::from_ref(e))[0]))
        .collect();
    assert_eq!(seen, stored);
    assert!(
        stored.iter().any(|(_, kind)| *kind == "tool_result"),
        "{stored:?}"
    );
}
