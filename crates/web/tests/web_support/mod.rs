//! Shared helpers of the web tests: a tiny scriptable page server over raw
//! TCP on 127.0.0.1, and configuration builders.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use agentry_runtime::config::WebConfig;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A scripted response.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub delay: Duration,
}

impl Reply {
    pub fn new(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), content_type.into())],
            body: body.into(),
            delay: Duration::ZERO,
        }
    }

    pub fn html(body: &str) -> Reply {
        Reply::new(200, "text/html; charset=utf-8", body)
    }

    pub fn redirect(status: u16, location: &str) -> Reply {
        Reply {
            status,
            headers: vec![("location".into(), location.into())],
            body: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    /// A response without a Content-Type header.
    pub fn untyped(body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status: 200,
            headers: Vec::new(),
            body: body.into(),
            delay: Duration::ZERO,
        }
    }

    pub fn delayed(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
}

#[derive(Default)]
struct Routes {
    replies: HashMap<String, Reply>,
    hits: HashMap<String, usize>,
}

/// A page server: answers `GET <path>` with the reply scripted for the path
/// (404 otherwise), one request per connection.
#[derive(Clone)]
pub struct PageServer {
    pub addr: SocketAddr,
    routes: Arc<Mutex<Routes>>,
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Whatever",
    }
}

impl PageServer {
    pub async fn start() -> PageServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let routes = Arc::new(Mutex::new(Routes::default()));
        let shared = routes.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let routes = shared.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&request).to_string();
                    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                    let reply = {
                        let mut routes = routes.lock().unwrap();
                        *routes.hits.entry(path.clone()).or_default() += 1;
                        routes.replies.get(&path).cloned()
                    };
                    let reply =
                        reply.unwrap_or_else(|| Reply::new(404, "text/plain", "no such page"));
                    if !reply.delay.is_zero() {
                        tokio::time::sleep(reply.delay).await;
                    }
                    let mut response =
                        format!("HTTP/1.1 {} {}\r\n", reply.status, reason(reply.status));
                    for (name, value) in &reply.headers {
                        response.push_str(&format!("{name}: {value}\r\n"));
                    }
                    response.push_str(&format!(
                        "content-length: {}\r\nconnection: close\r\n\r\n",
                        reply.body.len()
                    ));
                    let mut bytes = response.into_bytes();
                    bytes.extend_from_slice(&reply.body);
                    let _ = socket.write_all(&bytes).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        PageServer { addr, routes }
    }

    /// Scripts the reply for `path`.
    pub fn route(&self, path: &str, reply: Reply) {
        self.routes
            .lock()
            .unwrap()
            .replies
            .insert(path.to_string(), reply);
    }

    /// `http://127.0.0.1:PORT<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Requests received for `path`.
    pub fn hits(&self, path: &str) -> usize {
        self.routes
            .lock()
            .unwrap()
            .hits
            .get(path)
            .copied()
            .unwrap_or(0)
    }
}

/// The default web settings with `allow_hosts`, no Crawl4AI, no Chromium.
pub fn config(allow_hosts: &[&str]) -> WebConfig {
    WebConfig {
        crawl4ai_url: String::new(),
        crawl4ai_token: String::new(),
        chromium: false,
        chromium_path: String::new(),
        chromium_max_pages: 1,
        chromium_sandbox: true,
        page_timeout_secs: 5,
        http_timeout_secs: 5,
        max_body_bytes: 5 * 1024 * 1024,
        max_redirects: 5,
        max_chars: 5000,
        allow_hosts: allow_hosts.iter().map(|h| h.to_string()).collect(),
    }
}
