//! The SSRF guard: every internal address form is refused, directly and as
//! a redirect target, unless its host is allowlisted; the HTTP client
//! resolves through the guard so it connects only to checked addresses.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod web_support;

use agentry_tool::ToolOutcome;
use agentry_web::http::{HttpBackend, HttpSettings};
use agentry_web::ssrf::{Guard, GuardedResolver};
use agentry_web::{Backend, FetchError, Web};
use reqwest::dns::Resolve;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use web_support::{PageServer, Reply, config};

async fn fetch(web: &Web, url: &str) -> ToolOutcome {
    web.call("web_fetch", &json!({ "url": url }).to_string())
        .await
        .unwrap()
}

fn error(output: String) -> ToolOutcome {
    ToolOutcome {
        output,
        is_error: true,
        ..ToolOutcome::default()
    }
}

/// Every refused form: the URL as given, the URL as normalized, and why.
/// `{port}` is the page server's port (so that a wrongly accepted loopback
/// URL would reach it).
const REFUSED: &[(&str, &str, &str)] = &[
    (
        "http://127.0.0.1:{port}/",
        "http://127.0.0.1:{port}/",
        "127.0.0.1 is a loopback address",
    ),
    (
        "http://127.8.9.10/",
        "http://127.8.9.10/",
        "127.8.9.10 is a loopback address",
    ),
    (
        "http://2130706433:{port}/",
        "http://127.0.0.1:{port}/",
        "127.0.0.1 is a loopback address",
    ),
    (
        "http://0x7f.1:{port}/",
        "http://127.0.0.1:{port}/",
        "127.0.0.1 is a loopback address",
    ),
    (
        "http://017700000001:{port}/",
        "http://127.0.0.1:{port}/",
        "127.0.0.1 is a loopback address",
    ),
    (
        "http://0x7f000001/",
        "http://127.0.0.1/",
        "127.0.0.1 is a loopback address",
    ),
    (
        "http://127.1/",
        "http://127.0.0.1/",
        "127.0.0.1 is a loopback address",
    ),
    (
        "http://0.0.0.0:{port}/",
        "http://0.0.0.0:{port}/",
        "0.0.0.0 is a \"this network\" address",
    ),
    (
        "http://0/",
        "http://0.0.0.0/",
        "0.0.0.0 is a \"this network\" address",
    ),
    (
        "http://10.1.2.3/",
        "http://10.1.2.3/",
        "10.1.2.3 is a private address",
    ),
    (
        "http://172.16.0.1/",
        "http://172.16.0.1/",
        "172.16.0.1 is a private address",
    ),
    (
        "http://172.31.255.254/",
        "http://172.31.255.254/",
        "172.31.255.254 is a private address",
    ),
    (
        "http://192.168.1.1/",
        "http://192.168.1.1/",
        "192.168.1.1 is a private address",
    ),
    (
        "http://169.254.1.1/",
        "http://169.254.1.1/",
        "169.254.1.1 is a link-local address",
    ),
    (
        "http://169.254.169.254/latest/meta-data/",
        "http://169.254.169.254/latest/meta-data/",
        "169.254.169.254 is the cloud metadata address",
    ),
    (
        "http://100.64.0.1/",
        "http://100.64.0.1/",
        "100.64.0.1 is a shared (CGNAT) address",
    ),
    (
        "http://[::1]:{port}/",
        "http://[::1]:{port}/",
        "::1 is a loopback address",
    ),
    (
        "http://[::]/",
        "http://[::]/",
        ":: is the unspecified address",
    ),
    (
        "http://[fc00::1]/",
        "http://[fc00::1]/",
        "fc00::1 is a unique local (private) address",
    ),
    (
        "http://[fd12:3456::1]/",
        "http://[fd12:3456::1]/",
        "fd12:3456::1 is a unique local (private) address",
    ),
    (
        "http://[fe80::1]/",
        "http://[fe80::1]/",
        "fe80::1 is a link-local address",
    ),
    (
        "http://[::ffff:127.0.0.1]:{port}/",
        "http://[::ffff:7f00:1]:{port}/",
        "::ffff:127.0.0.1 is an IPv4-mapped form of 127.0.0.1, a loopback address",
    ),
    (
        "http://[::ffff:7f00:1]/",
        "http://[::ffff:7f00:1]/",
        "::ffff:127.0.0.1 is an IPv4-mapped form of 127.0.0.1, a loopback address",
    ),
    (
        "http://[0:0:0:0:0:ffff:a9fe:a9fe]/",
        "http://[::ffff:a9fe:a9fe]/",
        "::ffff:169.254.169.254 is an IPv4-mapped form of 169.254.169.254, the cloud metadata address",
    ),
    (
        "http://[::ffff:10.0.0.1]/",
        "http://[::ffff:a00:1]/",
        "::ffff:10.0.0.1 is an IPv4-mapped form of 10.0.0.1, a private address",
    ),
    (
        "http://[::127.0.0.1]/",
        "http://[::7f00:1]/",
        "::7f00:1 is an IPv4-compatible form of 127.0.0.1, a loopback address",
    ),
    (
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[64:ff9b::a9fe:a9fe]/",
        "64:ff9b::a9fe:a9fe is a NAT64 form of 169.254.169.254, the cloud metadata address",
    ),
    (
        "http://[2002:c0a8:101::1]/",
        "http://[2002:c0a8:101::1]/",
        "2002:c0a8:101::1 is a 6to4 form of 192.168.1.1, a private address",
    ),
    (
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "metadata.google.internal is a cloud metadata host",
    ),
    (
        "http://METADATA.Google.Internal./",
        "http://metadata.google.internal./",
        "metadata.google.internal is a cloud metadata host",
    ),
    (
        "http://metadata/",
        "http://metadata/",
        "metadata is a cloud metadata host",
    ),
    (
        "http://localhost:{port}/",
        "http://localhost:{port}/",
        "localhost resolves to 127.0.0.1, a loopback address",
    ),
];

fn fill(s: &str, port: u16) -> String {
    s.replace("{port}", &port.to_string())
}

#[tokio::test]
async fn every_internal_form_is_refused_without_a_connection() {
    let server = PageServer::start().await;
    server.route("/", Reply::new(200, "text/plain", "internal secret"));
    let port = server.addr.port();
    let web = Web::new(&config(&[]), None);
    for (given, normalized, reason) in REFUSED {
        let given = fill(given, port);
        let normalized = fill(normalized, port);
        assert_eq!(
            fetch(&web, &given).await,
            error(format!("refusing {normalized}: {reason}")),
            "{given}"
        );
    }
    assert_eq!(server.hits("/"), 0);
}

#[tokio::test]
async fn only_http_and_https_are_fetched() {
    let web = Web::new(&config(&["127.0.0.1"]), None);
    for (given, shown, scheme) in [
        ("ftp://example.com/x", "ftp://example.com/x", "ftp"),
        ("file:///etc/passwd", "file:///etc/passwd", "file"),
        ("gopher://127.0.0.1:70/", "gopher://127.0.0.1:70/", "gopher"),
        ("data:text/plain,hello", "data:text/plain,hello", "data"),
        ("localhost:8080/admin", "localhost:8080/admin", "localhost"),
    ] {
        assert_eq!(
            fetch(&web, given).await,
            error(format!(
                "refusing {shown}: only http and https URLs can be fetched, not {scheme}"
            )),
            "{given}"
        );
    }
}

#[tokio::test]
async fn every_internal_form_is_refused_as_a_redirect_target() {
    let server = PageServer::start().await;
    server.route("/", Reply::new(200, "text/plain", "internal secret"));
    let port = server.addr.port();
    // The page server itself is allowlisted; where it redirects to is not.
    let web = Web::new(&config(&["127.0.0.1"]), None);
    let mut cases: Vec<(String, String, String)> = REFUSED
        .iter()
        // 127.0.0.1 itself is allowlisted here, in either spelling.
        .filter(|(_, normalized, reason)| {
            !normalized.starts_with("http://127.0.0.1")
                && !reason.contains("IPv4-mapped form of 127.0.0.1")
        })
        .map(|(given, normalized, reason)| {
            (
                fill(given, port),
                fill(normalized, port),
                reason.to_string(),
            )
        })
        .collect();
    cases.push((
        "ftp://127.0.0.1/".into(),
        "ftp://127.0.0.1/".into(),
        "only http and https URLs can be fetched, not ftp".into(),
    ));
    assert_eq!(cases.len(), 25);
    for (i, (target, normalized, reason)) in cases.iter().enumerate() {
        let path = format!("/go{i}");
        server.route(&path, Reply::redirect(302, target));
        let url = server.url(&path);
        assert_eq!(
            fetch(&web, &url).await,
            error(format!(
                "could not fetch {url}:\n- http: redirect from {url}: refusing {normalized}: {reason}"
            )),
            "{target}"
        );
        assert_eq!(server.hits(&path), 1);
    }
    assert_eq!(server.hits("/"), 0);
}

#[tokio::test]
async fn allowlisted_hosts_are_fetched() {
    let server = PageServer::start().await;
    server.route("/", Reply::new(200, "text/plain", "hello"));
    server.route(
        "/to-localhost",
        Reply::redirect(302, &format!("http://localhost:{}/", server.addr.port())),
    );
    let port = server.addr.port();
    // By name: localhost (and only localhost) passes.
    let web = Web::new(&config(&["LOCALHOST"]), None);
    let url = format!("http://localhost:{port}/");
    assert_eq!(
        fetch(&web, &url).await.output,
        format!("[fetched {url} with http]\nhello")
    );
    assert_eq!(
        fetch(&web, &server.url("/")).await,
        error(format!(
            "refusing {}: 127.0.0.1 is a loopback address",
            server.url("/")
        ))
    );
    // By address, in either IPv4 spelling; the name localhost stays refused.
    let web = Web::new(&config(&["::ffff:127.0.0.1"]), None);
    assert_eq!(
        fetch(&web, &server.url("/")).await.output,
        format!("[fetched {} with http]\nhello", server.url("/"))
    );
    let web = Web::new(&config(&["127.0.0.1", "localhost"]), None);
    let url = server.url("/to-localhost");
    assert_eq!(
        fetch(&web, &url).await.output,
        format!("[fetched http://localhost:{port}/ with http]\nhello")
    );
    assert_eq!(server.hits("/"), 3);
}

#[tokio::test]
async fn the_client_resolves_through_the_guard() {
    // The resolver the HTTP client uses applies the guard to the addresses
    // it returns, so a name cannot be switched to an internal address
    // between the check and the connection.
    let resolver = GuardedResolver::new(Arc::new(Guard::new(&[])));
    let err = resolver
        .resolve("localhost".parse().unwrap())
        .await
        .err()
        .expect("localhost is refused");
    assert_eq!(
        err.downcast_ref::<FetchError>(),
        Some(&FetchError::Blocked(
            "refusing localhost: it resolves to 127.0.0.1, a loopback address".into()
        ))
    );
    let err = resolver
        .resolve("metadata.google.internal".parse().unwrap())
        .await
        .err()
        .expect("metadata is refused");
    assert_eq!(
        err.to_string(),
        "refusing metadata.google.internal: metadata.google.internal is a cloud metadata host"
    );
    let allowing = GuardedResolver::new(Arc::new(Guard::new(&["localhost".into()])));
    let addrs: Vec<_> = allowing
        .resolve("localhost".parse().unwrap())
        .await
        .unwrap()
        .map(|a| a.ip())
        .collect();
    assert!(addrs.contains(&"127.0.0.1".parse().unwrap()), "{addrs:?}");

    // A client built on it never connects to a refused address.
    let server = PageServer::start().await;
    server.route("/", Reply::new(200, "text/plain", "hello"));
    let client = reqwest::Client::builder()
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver::new(Arc::new(Guard::new(&[])))))
        .build()
        .unwrap();
    let err = client
        .get(format!("http://localhost:{}/", server.addr.port()))
        .send()
        .await
        .unwrap_err();
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    let mut blocked = None;
    while let Some(s) = source {
        if let Some(e) = s.downcast_ref::<FetchError>() {
            blocked = Some(e.clone());
        }
        source = s.source();
    }
    assert_eq!(
        blocked,
        Some(FetchError::Blocked(
            "refusing localhost: it resolves to 127.0.0.1, a loopback address".into()
        ))
    );
    assert_eq!(server.hits("/"), 0);

    // The backend on its own (without the chain's check) refuses too.
    let backend = HttpBackend::new(
        HttpSettings {
            timeout: Duration::from_secs(5),
            max_body_bytes: 1024,
            max_redirects: 3,
        },
        Arc::new(Guard::new(&[])),
    )
    .unwrap();
    let url = url::Url::parse(&format!("http://localhost:{}/", server.addr.port())).unwrap();
    assert_eq!(
        backend.fetch(&url).await,
        Err(FetchError::Blocked(format!(
            "refusing {url}: localhost resolves to 127.0.0.1, a loopback address"
        )))
    );
    assert_eq!(server.hits("/"), 0);
}

#[tokio::test]
async fn an_unresolvable_host_is_not_fetched() {
    let web = Web::new(&config(&[]), None);
    let outcome = fetch(&web, "http://no-such-host.invalid/").await;
    assert!(outcome.is_error);
    assert!(
        outcome.output.starts_with(
            "cannot fetch http://no-such-host.invalid/: cannot resolve no-such-host.invalid: "
        ),
        "{}",
        outcome.output
    );
}
