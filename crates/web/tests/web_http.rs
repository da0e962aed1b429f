//! The web tools through the plain HTTP backend, against a local page
//! server (allowlisted as 127.0.0.1): HTML to markdown, text passed
//! through, non-text refused, charsets, the body cap, redirects, HTTP
//! errors, timeouts, truncation, and the tool specs and arguments.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod web_support;

use agentry_tool::ToolError;
use agentry_tool::ToolOutcome;
use agentry_web::{BackendName, Web};
use serde_json::json;
use std::time::Duration;
use web_support::{PageServer, Reply, config};

async fn fetch(web: &Web, url: &str) -> ToolOutcome {
    web.call("web_fetch", &json!({ "url": url }).to_string())
        .await
        .expect("the call is well-formed")
}

fn ok(output: String, truncated: bool) -> ToolOutcome {
    ToolOutcome {
        output,
        truncated,
        ..ToolOutcome::default()
    }
}

fn error(output: String) -> ToolOutcome {
    ToolOutcome {
        output,
        is_error: true,
        ..ToolOutcome::default()
    }
}

const PAGE: &str = r#"<!doctype html>
<html><head><title> Hello   &amp; welcome </title><style>p { color: red }</style>
<script>var hidden = "script text";</script></head>
<body><h1>Welcome</h1>
<p>Some <b>bold</b> text and a <a href="/next">link</a>.</p>
<ul><li>one</li><li>two</li></ul>
<script>document.write("not run");</script>
</body></html>"#;

#[tokio::test]
async fn html_becomes_markdown_with_its_title() {
    let server = PageServer::start().await;
    server.route("/page", Reply::html(PAGE));
    let web = Web::new(&config(&["127.0.0.1"]), None);
    assert_eq!(web.backends(), vec![BackendName::Http]);
    let url = server.url("/page");
    assert_eq!(
        fetch(&web, &url).await,
        ok(
            format!(
                "[fetched {url} with http]\n# Hello & welcome\n# Welcome\n\nSome **bold** text and a [link](/next).\n\n*   one\n*   two"
            ),
            false
        )
    );
    // web_crawl goes through the same chain.
    let crawled = web
        .call("web_crawl", &json!({ "url": url }).to_string())
        .await
        .unwrap();
    assert_eq!(crawled, fetch(&web, &url).await);
}

#[tokio::test]
async fn text_and_json_pass_through_as_they_are() {
    let server = PageServer::start().await;
    server.route(
        "/notes.txt",
        Reply::new(
            200,
            "text/plain; charset=utf-8",
            "line one\n  <b>line two</b>\n",
        ),
    );
    server.route(
        "/data",
        Reply::new(200, "application/json", r#"{"a": [1, 2], "b": "<i>x</i>"}"#),
    );
    server.route(
        "/readme.md",
        Reply::new(200, "text/markdown", "# Title\n\n- item"),
    );
    let web = Web::new(&config(&["127.0.0.1"]), None);
    let url = server.url("/notes.txt");
    assert_eq!(
        fetch(&web, &url).await,
        ok(
            format!("[fetched {url} with http]\nline one\n  <b>line two</b>"),
            false
        )
    );
    let url = server.url("/data");
    assert_eq!(
        fetch(&web, &url).await,
        ok(
            format!("[fetched {url} with http]\n{{\"a\": [1, 2], \"b\": \"<i>x</i>\"}}"),
            false
        )
    );
    let url = server.url("/readme.md");
    assert_eq!(
        fetch(&web, &url).await,
        ok(
            format!("[fetched {url} with http]\n# Title\n\n- item"),
            false
        )
    );
}

#[tokio::test]
async fn non_text_content_is_refused() {
    let server = PageServer::start().await;
    server.route(
        "/logo.png",
        Reply::new(200, "image/png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec()),
    );
    server.route(
        "/file",
        Reply::new(200, "Application/Octet-Stream; name=x", vec![0u8; 64]),
    );
    let web = Web::new(&config(&["127.0.0.1"]), None);
    let url = server.url("/logo.png");
    assert_eq!(
        fetch(&web, &url).await,
        error(format!(
            "could not fetch {url}:\n- http: refusing image/png: not text"
        ))
    );
    let url = server.url("/file");
    assert_eq!(
        fetch(&web, &url).await,
        error(format!(
            "could not fetch {url}:\n- http: refusing application/octet-stream: not text"
        ))
    );
}

#[tokio::test]
async fn a_body_without_content_type_is_judged_by_its_bytes() {
    let server = PageServer::start().await;
    server.route(
        "/h",
        Reply::untyped("  <!DOCTYPE html><title>T</title><p>para</p>"),
    );
    server.route("/t", Reply::untyped("just words"));
    server.route("/b", Reply::untyped(vec![1u8, 0, 2, 0, 3]));
    let web = Web::new(&config(&["127.0.0.1"]), None);
    let url = server.url("/h");
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!("[fetched {url} with http]\n# T\npara"), false)
    );
    let url = server.url("/t");
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!("[fetched {url} with http]\njust words"), false)
    );
    let url = server.url("/b");
    assert_eq!(
        fetch(&web, &url).await,
        error(format!(
            "could not fetch {url}:\n- http: refusing a body without a content type: not text"
        ))
    );
}

#[tokio::test]
async fn pages_are_decoded_with_their_charset() {
    let server = PageServer::start().await;
    // "café crème" in windows-1252, named in the header.
    server.route(
        "/cp1252",
        Reply::new(
            200,
            "text/plain; charset=windows-1252",
            b"caf\xe9 cr\xe8me \x80 5".to_vec(),
        ),
    );
    // ISO-8859-1 named only in the page's <meta>.
    server.route(
        "/latin1",
        Reply::new(
            200,
            "text/html",
            b"<html><head><meta charset=\"ISO-8859-1\"><title>Caf\xe9</title></head><body><p>Un caf\xe9, s'il vous pla\xeet.</p></body></html>".to_vec(),
        ),
    );
    // Not labelled at all and not UTF-8: taken as windows-1252.
    server.route(
        "/unlabelled",
        Reply::new(200, "text/plain", b"na\xefve".to_vec()),
    );
    // UTF-8 in the header.
    server.route(
        "/utf8",
        Reply::new(
            200,
            "text/plain; charset=UTF-8",
            "naïve 日本".as_bytes().to_vec(),
        ),
    );
    let web = Web::new(&config(&["127.0.0.1"]), None);
    let url = server.url("/cp1252");
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!("[fetched {url} with http]\ncafé crème € 5"), false)
    );
    let url = server.url("/latin1");
    assert_eq!(
        fetch(&web, &url).await,
        ok(
            format!("[fetched {url} with http]\n# Café\nUn café, s'il vous plaît."),
            false
        )
    );
    let url = server.url("/unlabelled");
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!("[fetched {url} with http]\nnaïve"), false)
    );
    let url = server.url("/utf8");
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!("[fetched {url} with http]\nnaïve 日本"), false)
    );
}

#[tokio::test]
async fn the_body_is_cut_at_max_body_bytes() {
    let server = PageServer::start().await;
    server.route("/long", Reply::new(200, "text/plain", "0123456789ABCDEF"));
    server.route("/exact", Reply::new(200, "text/plain", "0123456789"));
    let mut cfg = config(&["127.0.0.1"]);
    cfg.max_body_bytes = 10;
    let web = Web::new(&cfg, None);
    let url = server.url("/long");
    assert_eq!(
        fetch(&web, &url).await,
        ok(
            format!("[fetched {url} with http]\n0123456789\n\n[body cut at 10 bytes]"),
            false
        )
    );
    // A body of exactly the cap is whole.
    let url = server.url("/exact");
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!("[fetched {url} with http]\n0123456789"), false)
    );
}

#[tokio::test]
async fn redirects_are_followed_up_to_max_redirects() {
    let server = PageServer::start().await;
    server.route("/old", Reply::redirect(301, "/middle"));
    server.route("/middle", Reply::redirect(307, "new?x=1"));
    server.route("/new?x=1", Reply::new(200, "text/plain", "arrived"));
    for i in 0..4 {
        server.route(
            &format!("/loop{i}"),
            Reply::redirect(302, &format!("/loop{}", i + 1)),
        );
    }
    server.route("/nowhere", Reply::redirect(302, ""));
    server.route(
        "/nolocation",
        Reply {
            status: 302,
            headers: Vec::new(),
            body: Vec::new(),
            delay: Duration::ZERO,
        },
    );
    let mut cfg = config(&["127.0.0.1"]);
    cfg.max_redirects = 2;
    let web = Web::new(&cfg, None);
    let url = server.url("/old");
    assert_eq!(
        fetch(&web, &url).await,
        ok(
            format!("[fetched {} with http]\narrived", server.url("/new?x=1")),
            false
        )
    );
    assert_eq!(
        (
            server.hits("/old"),
            server.hits("/middle"),
            server.hits("/new?x=1")
        ),
        (1, 1, 1)
    );
    let url = server.url("/loop0");
    assert_eq!(
        fetch(&web, &url).await,
        error(format!(
            "could not fetch {url}:\n- http: too many redirects (more than 2)"
        ))
    );
    assert_eq!(server.hits("/loop3"), 0);
    let url = server.url("/nolocation");
    assert_eq!(
        fetch(&web, &url).await,
        error(format!(
            "could not fetch {url}:\n- http: HTTP 302 Found without a Location header"
        ))
    );
}

#[tokio::test]
async fn http_errors_fail_with_their_status() {
    let server = PageServer::start().await;
    server.route("/boom", Reply::new(500, "text/html", "<p>oops</p>"));
    let web = Web::new(&config(&["127.0.0.1"]), None);
    let url = server.url("/missing");
    assert_eq!(
        fetch(&web, &url).await,
        error(format!(
            "could not fetch {url}:\n- http: HTTP 404 Not Found"
        ))
    );
    let url = server.url("/boom");
    assert_eq!(
        fetch(&web, &url).await,
        error(format!(
            "could not fetch {url}:\n- http: HTTP 500 Internal Server Error"
        ))
    );
}

#[tokio::test]
async fn a_slow_page_times_out() {
    let server = PageServer::start().await;
    server.route(
        "/slow",
        Reply::new(200, "text/plain", "late").delayed(Duration::from_secs(5)),
    );
    let mut cfg = config(&["127.0.0.1"]);
    cfg.http_timeout_secs = 1;
    let web = Web::new(&cfg, None);
    let url = server.url("/slow");
    let started = std::time::Instant::now();
    assert_eq!(
        fetch(&web, &url).await,
        error(format!(
            "could not fetch {url}:\n- http: timed out after 1s"
        ))
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn long_pages_are_truncated_at_max_chars_with_a_marker() {
    let server = PageServer::start().await;
    server.route(
        "/abc",
        Reply::new(200, "text/plain", "abcdefghijklmnopqrstuvwxyz"),
    );
    server.route(
        "/accents",
        Reply::new(200, "text/plain; charset=utf-8", "éééééèèè"),
    );
    server.route("/ten", Reply::new(200, "text/plain", "0123456789"));
    let mut cfg = config(&["127.0.0.1"]);
    cfg.max_chars = 10;
    let web = Web::new(&cfg, None);
    let url = server.url("/abc");
    assert_eq!(
        fetch(&web, &url).await,
        ok(
            format!("[fetched {url} with http]\nabcdefghij\n[… truncated: 16 more characters]"),
            true
        )
    );
    // Characters, not bytes.
    cfg.max_chars = 5;
    let web = Web::new(&cfg, None);
    let url = server.url("/accents");
    assert_eq!(
        fetch(&web, &url).await,
        ok(
            format!("[fetched {url} with http]\nééééé\n[… truncated: 3 more characters]"),
            true
        )
    );
    // Exactly max_chars is not cut.
    cfg.max_chars = 10;
    let web = Web::new(&cfg, None);
    let url = server.url("/ten");
    assert_eq!(
        fetch(&web, &url).await,
        ok(format!("[fetched {url} with http]\n0123456789"), false)
    );
}

#[tokio::test]
async fn specs_arguments_and_other_tools() {
    let specs = Web::specs();
    assert_eq!(
        specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        vec!["web_crawl", "web_fetch"]
    );
    for spec in &specs {
        assert!(
            spec.read_only && spec.parallel_safe && !spec.sensitive,
            "{}",
            spec.name
        );
        assert_eq!(
            spec.schema,
            json!({
                "type": "object",
                "properties": {
                    "url": {"type": "string", "description": "The http or https URL to fetch."}
                },
                "required": ["url"],
                "additionalProperties": false
            })
        );
    }
    let web = Web::new(&config(&[]), None);
    assert_eq!(
        web.call("web_fetch", "{}").await,
        Err(ToolError::InvalidArguments(
            "invalid arguments for web_fetch: missing field `url`".into()
        ))
    );
    assert_eq!(
        web.call("web_fetch", r#"{"url": "http://a.test/", "depth": 2}"#)
            .await,
        Err(ToolError::InvalidArguments(
            "invalid arguments for web_fetch: unknown field `depth`, expected `url`".into()
        ))
    );
    assert_eq!(
        web.call("web_crawl", r#"{"url": "  "}"#).await,
        Err(ToolError::InvalidArguments("url must not be empty".into()))
    );
    assert_eq!(
        web.call("web_crawl", r#"{"url": "http://[::1/"}"#).await,
        Err(ToolError::InvalidArguments(
            "invalid url \"http://[::1/\": invalid IPv6 address".into()
        ))
    );
}
