//! The Chromium backend against real headless Chromium: text that a page
//! writes with JavaScript comes through (it is absent from the raw HTML);
//! a dead browser is replaced; a page that never finishes times out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_web::Backend;
use agentry_web::chromium::{Chromium, ChromiumSettings};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PAGE: &str = r#"<!doctype html>
<html><head><title>Scripted page</title></head>
<body><p id="static">Written in HTML.</p><div id="out"></div>
<script>
  document.getElementById("out").textContent = "Written by JavaScript: " + (6 * 7);
</script></body></html>"#;

/// A tiny HTTP server: `/` is the scripted page, `/hang` never answers.
async fn serve() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = socket.read(&mut buf).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&buf[..n]).to_string();
                if request.starts_with("GET /hang") {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    return;
                }
                let (status, body) = if request.starts_with("GET / ") {
                    ("200 OK", PAGE)
                } else {
                    ("404 Not Found", "<p>nothing here</p>")
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    addr
}

fn chromium(timeout: Duration) -> Option<Chromium> {
    chromium_guarded(timeout, &["127.0.0.1".to_string()])
}

fn chromium_guarded(timeout: Duration, allow: &[String]) -> Option<Chromium> {
    let backend = Chromium::new(ChromiumSettings {
        executable: None,
        max_pages: 2,
        page_timeout: timeout,
        guard: Some(std::sync::Arc::new(agentry_web::ssrf::Guard::new(allow))),
        sandbox: true,
    });
    if backend.executable().is_none() {
        assert!(
            std::env::var("CI").ok().as_deref() != Some("true"),
            "Chromium is required in CI (apt-get install chromium)"
        );
        eprintln!("skipped: no chromium on PATH (apt-get install chromium)");
        return None;
    }
    Some(backend)
}

#[tokio::test(flavor = "multi_thread")]
async fn javascript_rendered_text_comes_through_and_a_dead_browser_is_replaced() {
    let Some(backend) = chromium(Duration::from_secs(20)) else {
        return;
    };
    let addr = serve().await;
    let url = url::Url::parse(&format!("http://{addr}/")).unwrap();
    // The raw HTML does not contain the scripted text...
    assert!(!PAGE.contains("Written by JavaScript: 42"));
    // ...the rendered page does.
    let page = backend.fetch(&url).await.unwrap();
    assert!(
        page.markdown.contains("Written by JavaScript: 42"),
        "{}",
        page.markdown
    );
    assert!(
        page.markdown.contains("Written in HTML."),
        "{}",
        page.markdown
    );
    assert_eq!(page.title.as_deref(), Some("Scripted page"));
    assert_eq!(backend.launches(), 1);
    // The warm browser serves the next call.
    backend.fetch(&url).await.unwrap();
    assert_eq!(backend.launches(), 1);
    // A browser that died is replaced on the next call.
    backend.kill_browser().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let page = backend.fetch(&url).await.unwrap();
    assert!(page.markdown.contains("Written by JavaScript: 42"));
    assert_eq!(backend.launches(), 2);
    backend.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_page_that_never_loads_times_out() {
    let Some(backend) = chromium(Duration::from_secs(2)) else {
        return;
    };
    let addr = serve().await;
    // Start the browser first (a cold start on a loaded machine can take
    // many seconds): only the page's own time is measured.
    let warm = url::Url::parse(&format!("http://{addr}/")).unwrap();
    let _ = backend.fetch(&warm).await;
    let url = url::Url::parse(&format!("http://{addr}/hang")).unwrap();
    let started = std::time::Instant::now();
    let err = backend.fetch(&url).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(err.to_string().contains("timed out"), "{err}");
    backend.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn every_request_of_the_page_goes_through_the_guard() {
    // Nothing local is allowed: the page itself is refused...
    let Some(backend) = chromium_guarded(Duration::from_secs(10), &[]) else {
        return;
    };
    let addr = serve().await;
    let url = url::Url::parse(&format!("http://{addr}/")).unwrap();
    let err = backend.fetch(&url).await.unwrap_err();
    assert!(matches!(err, agentry_web::FetchError::Blocked(_)), "{err}");
    assert!(err.to_string().contains("127.0.0.1"), "{err}");
    // ...and so is a redirect from an allowed page to a refused one.
    let redirect = serve_redirect(addr).await;
    let Some(backend) = chromium_guarded(Duration::from_secs(10), &["localhost".to_string()])
    else {
        return;
    };
    let start = url::Url::parse(&format!("http://localhost:{}/", redirect.port())).unwrap();
    let err = backend.fetch(&start).await.unwrap_err();
    assert!(matches!(err, agentry_web::FetchError::Blocked(_)), "{err}");
    backend.shutdown().await;
}

/// Answers every request with a redirect to `target`.
async fn serve_redirect(target: SocketAddr) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = vec![0u8; 4096];
            let _ = socket.read(&mut buf).await;
            let response = format!(
                "HTTP/1.1 302 Found\r\nlocation: http://{target}/\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            );
            let _ = socket.write_all(response.as_bytes()).await;
        }
    });
    addr
}
