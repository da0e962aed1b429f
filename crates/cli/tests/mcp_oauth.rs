//! A remote MCP server behind OAuth (`crates/fakes/mcp/oauth_server.py`:
//! written with the official Python SDK, its own authorization server):
//! `agentry up` cannot use it until `agentry mcp login` signs in (protected-
//! resource metadata, dynamic client registration, PKCE; the test plays the
//! browser); then a turn calls its tool, and once the access token expires
//! the runner refreshes it and the next turn's call works too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentry_testkit::fake_model::{FakeModel, Reply};
use common::install::{Install, Up, text};
use serde_json::json;
use std::io::BufRead;
use std::os::unix::fs::MetadataExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// `agentry mcp list` until `ready(listing)`, at most a minute.
fn listing_until(install: &Install, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (stdout, stderr) = text(&install.run(&["mcp", "list"]));
        if ready(&stdout) {
            return stdout;
        }
        assert!(Instant::now() < deadline, "{what}: {stdout}\n{stderr}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// A browser's GET of a loopback `url` that follows no redirect: its
/// status, head and body.
fn get(url: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap();
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut stream = std::net::TcpStream::connect(authority).unwrap();
    write!(
        stream,
        "GET {} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n\r\n",
        if path.is_empty() { "/" } else { path }
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

/// A headless turn; its standard output.
async fn run(install: &Install, prompt: &str) -> String {
    let cmd = install.command(&["run", "--approve", "always", prompt]);
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = cmd;
        cmd.stdin(Stdio::null()).output().unwrap()
    })
    .await
    .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    stdout
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_behind_oauth_is_reached_after_agentry_mcp_login_and_its_token_is_refreshed() {
    let Some(venv) = agentry_fakes::mcp_servers::venv() else {
        return;
    };
    let server = agentry_fakes::mcp_servers::HttpFixture::oauth(&venv, 4).unwrap();
    let model = FakeModel::start().await.unwrap();
    for turn in ["first", "second"] {
        model.push(Reply::tool_call(
            &format!("w-{turn}"),
            "secure__whoami",
            json!({}),
        ));
        model.push(Reply::text(&format!("{turn} answer")));
    }
    let (install, up, _log) = Up::start_configured(
        &model.base_url(),
        &format!(
            "[[mcp_servers]]\nname = \"secure\"\nurl = \"{}\"\n",
            server.url()
        ),
    );

    // Before the sign-in the server refuses, and the listing says what to do.
    let before = listing_until(&install, "the refusal", |l| {
        l.contains("agentry mcp login secure")
    });
    assert!(
        before
            .lines()
            .any(|l| l.starts_with("secure") && l.contains("failed")),
        "{before}"
    );

    // The login prints the authorization address and waits for the browser.
    let mut login = install
        .command(&["mcp", "login", "secure", "--wait", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(login.stdout.take().unwrap()).lines();
    let address = loop {
        let line = lines
            .next()
            .expect("the login ended before printing an address")
            .unwrap();
        if let Some(address) = line.trim().strip_prefix("http") {
            break format!("http{address}");
        }
    };
    assert!(address.contains("code_challenge="), "{address}");
    assert!(address.contains("code_challenge_method=S256"), "{address}");
    // The browser: the authorization server approves at once and sends it
    // back to the login's loopback address.
    let (status, head, _) = get(&address);
    assert!((300..400).contains(&status), "{status}\n{head}");
    let back = head
        .lines()
        .find_map(|l| {
            l.split_once(':')
                .filter(|(k, _)| k.eq_ignore_ascii_case("location"))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap();
    assert!(back.starts_with("http://127.0.0.1:"), "{back}");
    let (status, _, page) = get(&back);
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("signed in"), "{page}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = login.wait().unwrap();
    let said = rest.join("\n");
    assert!(status.success(), "{said}");
    assert!(said.contains("signed in to secure as client"), "{said}");
    let path = said
        .split("tokens kept in ")
        .nth(1)
        .and_then(|rest| rest.split(" (refreshed").next())
        .unwrap()
        .to_string();
    let mode = std::fs::metadata(&path).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o600, "{path}");
    let stats = server.get_json("/stats");
    assert_eq!(stats["registered"], 1, "{stats}");

    // The runners notice the sign-in and reach the server with the token.
    listing_until(&install, "the server ready", |l| {
        l.lines()
            .any(|l| l.starts_with("secure") && l.contains("ready"))
    });
    let first = run(&install, "who am I?").await;
    assert_eq!(first.trim(), "first answer");
    let told = model.requests()[1].to_string();
    assert!(told.contains("authorized as "), "{told}");
    let tokens_before = std::fs::read_to_string(&path).unwrap();

    // The access token expires; the next call refreshes it and goes on.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let second = run(&install, "and now?").await;
    assert_eq!(second.trim(), "second answer");
    let told = model.requests()[3].to_string();
    assert!(told.contains("authorized as "), "{told}");
    let stats = server.get_json("/stats");
    assert!(stats["refreshes"].as_u64().unwrap() >= 1, "{stats}");
    let tokens_after = std::fs::read_to_string(&path).unwrap();
    assert_ne!(tokens_before, tokens_after, "the refreshed token is kept");
    assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
    assert!(!tokens_after.is_empty());
    drop(up);
}
