//! An output flood: a command that prints 200 MB must leave a log of about
//! one output cap, not of the flood, and the model sees the head, the tail
//! and how much was cut.

use crate::support::{finished, new_session, read_log, send, tool_results, until_finished};
use agentry_proto::sessions::v1::event::Kind;
use agentry_testkit::Cluster;
use agentry_testkit::fake_model::Reply;
use prost::Message;
use serde_json::json;

const FLOOD: u64 = 200_000_000;

#[tokio::test(flavor = "multi_thread")]
async fn a_200_mb_flood_stores_about_one_output_cap() {
    let cluster = Cluster::start().await.unwrap();
    let cap = cluster.config.tool_runner.max_output_bytes;
    cluster.model.push(Reply::tool_call(
        "flood",
        "bash",
        json!({
            "command": format!(
                "echo THE-START; head -c {FLOOD} /dev/zero | tr '\\0' a; echo; echo THE-END"
            ),
            "timeout_secs": 300,
        }),
    ));
    cluster.model.push(Reply::text("done"));
    let mut client = cluster.orchestrator().await.unwrap();
    let (session, mut events) = new_session(&mut client).await;
    let turn = send(&mut client, &session.id, "flood").await;
    let received = until_finished(&mut events, &turn).await;
    finished(&received);

    // What the model sees: head, tail, and the number of bytes cut.
    let results = tool_results(&received);
    assert_eq!(results.len(), 1, "{received:?}");
    let output = &results[0].output;
    assert!(!results[0].is_error, "{output}");
    assert!(output.len() <= cap + 200, "{} bytes shown", output.len());
    assert!(
        output.starts_with("THE-START") && output.trim_end().ends_with("THE-END"),
        "head and tail are kept"
    );
    let cut: u64 = output
        .split("[... ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count of cut bytes in the output"));
    assert!(
        cut > FLOOD - cap as u64 && cut <= FLOOD,
        "{cut} bytes said to be cut"
    );

    // What the log keeps.
    let mut store = cluster.store().await.unwrap();
    let log = read_log(&mut store, &session.id).await;
    let chunk_bytes: usize = log
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ToolOutputChunk(c)) => Some(c.text.len()),
            _ => None,
        })
        .sum();
    let log_bytes: usize = log.iter().map(|e| e.encoded_len()).sum();
    eprintln!(
        "{FLOOD} bytes printed; {chunk_bytes} bytes of live output and {log_bytes} bytes of \
         events stored"
    );
    assert!(
        chunk_bytes <= cap + 200,
        "{chunk_bytes} bytes of live output stored (cap {cap})"
    );
    assert!(
        log_bytes <= 4 * cap + 64 * 1024,
        "the log of the turn takes {log_bytes} bytes"
    );
}
