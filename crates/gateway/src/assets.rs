//! The console's files, built into the binary: plain HTML, CSS and one
//! JavaScript module (no build step, no Node).

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page.
pub const INDEX: &str = include_str!("../console/index.html");
/// Its style.
pub const CSS: &str = include_str!("../console/console.css");
/// Its script.
pub const JS: &str = include_str!("../console/console.js");

fn file(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// `GET /`.
pub async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

/// `GET /console.css`.
pub async fn css() -> Response {
    file("text/css; charset=utf-8", CSS)
}

/// `GET /console.js`.
pub async fn js() -> Response {
    file("text/javascript; charset=utf-8", JS)
}
