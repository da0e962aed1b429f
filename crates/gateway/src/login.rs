//! Who is at the browser: a person logs in with their token and gets a
//! signed, expiring cookie; every request after that is checked against it
//! and against the people file (a person removed is logged out within a
//! second); every request that changes something also carries the page's
//! anti-forgery token and, from a browser, this site's origin.

use crate::Gateway;
use crate::error::ApiError;
use agentry_runtime::auth::Role;
use axum::Json;
use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::{HeaderMap, HeaderValue, Method, header, request::Parts};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The cookie that holds the login.
pub const COOKIE: &str = "agentry_console";

/// Its name under TLS.
pub const SECURE_COOKIE: &str = "__Host-agentry_console";

/// The header a page sends its anti-forgery token in.
pub const CSRF_HEADER: &str = "x-agentry-csrf";

/// Failed logins allowed per client address in [`LOGIN_WINDOW`].
pub const LOGIN_ATTEMPTS: u32 = 10;

/// The window failed logins are counted in.
pub const LOGIN_WINDOW: Duration = Duration::from_secs(60);

/// The secret the gateway signs cookies with (kept in a private file, so
/// a restarted gateway keeps everyone logged in).
pub struct Keys {
    secret: Vec<u8>,
}

impl Keys {
    /// Keys from `secret` (at least 32 bytes of randomness).
    pub fn new(secret: &[u8]) -> Keys {
        Keys {
            secret: secret.to_vec(),
        }
    }

    fn mac(&self, text: &str) -> Vec<u8> {
        // HMAC takes a key of any length.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&self.secret) else {
            return Vec::new();
        };
        mac.update(text.as_bytes());
        mac.finalize().into_bytes().to_vec()
    }

    /// The cookie value for `claims`.
    pub fn seal(&self, claims: &Claims) -> String {
        let body = format!(
            "v1:{}:{}:{}:{}",
            claims.name, claims.expires, claims.fingerprint, claims.nonce
        );
        let mac = B64.encode(self.mac(&body));
        format!("{body}:{mac}")
    }

    /// The claims of a cookie value this gateway sealed, unless it has
    /// expired at `now` (seconds since the epoch).
    pub fn open(&self, value: &str, now: u64) -> Option<Claims> {
        let (body, mac) = value.rsplit_once(':')?;
        let given = B64.decode(mac).ok()?;
        let expected = self.mac(body);
        if expected.is_empty() || !agentry_runtime::people::constant_time_eq(&given, &expected) {
            return None;
        }
        let mut parts = body.split(':');
        if parts.next()? != "v1" {
            return None;
        }
        let claims = Claims {
            name: parts.next()?.to_string(),
            expires: parts.next()?.parse().ok()?,
            fingerprint: parts.next()?.to_string(),
            nonce: parts.next()?.to_string(),
        };
        (parts.next().is_none() && claims.expires > now).then_some(claims)
    }

    /// The anti-forgery token of the login with `nonce`.
    pub fn csrf(&self, nonce: &str) -> String {
        B64.encode(&self.mac(&format!("csrf:{nonce}"))[..16])
    }
}

/// What a login cookie says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// The person.
    pub name: String,
    /// When it stops being valid (seconds since the epoch).
    pub expires: u64,
    /// The start of the SHA-256 of the token they logged in with: a token
    /// replaced or removed ends the login.
    pub fingerprint: String,
    /// Random: this login's anti-forgery token derives from it.
    pub nonce: String,
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// Counts failed logins per client address.
#[derive(Default)]
pub struct Limiter {
    failures: Mutex<HashMap<IpAddr, (u32, Instant)>>,
}

impl Limiter {
    /// How long `ip` must wait before trying again, if it must.
    pub fn wait(&self, ip: IpAddr) -> Option<Duration> {
        let failures = self.failures.lock().ok()?;
        let shared = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
        [key(ip), shared].iter().find_map(|k| {
            let (count, since) = failures.get(k)?;
            let left = LOGIN_WINDOW.checked_sub(since.elapsed())?;
            (*count >= LOGIN_ATTEMPTS).then_some(left)
        })
    }

    /// Records a failed login from `ip`.
    pub fn failed(&self, ip: IpAddr) {
        let Ok(mut failures) = self.failures.lock() else {
            return;
        };
        let mut ip = key(ip);
        if failures.len() >= MAX_ADDRESSES && !failures.contains_key(&ip) {
            failures.retain(|_, (_, since)| since.elapsed() < LOGIN_WINDOW);
            if failures.len() >= MAX_ADDRESSES {
                // Too many addresses failing at once: they share one count.
                ip = IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED);
            }
        }
        let entry = failures.entry(ip).or_insert((0, Instant::now()));
        if entry.1.elapsed() >= LOGIN_WINDOW {
            *entry = (0, Instant::now());
        }
        entry.0 += 1;
    }
}

/// Addresses whose failures are counted apart, at most.
const MAX_ADDRESSES: usize = 10_000;

/// What failures are counted under: the address, or for IPv6 its /64
/// (one client's range).
fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The person a request is made by.
#[derive(Debug, Clone)]
pub struct Person {
    /// Their name.
    pub name: String,
    /// Their role.
    pub role: Role,
    /// The anti-forgery token their page must send with every change.
    pub csrf: String,
    /// Their login: its token's fingerprint and when it ends (`None` with
    /// credentials off).
    pub login: Option<(String, u64)>,
}

impl Person {
    /// Whether their login still holds: not expired, and the person still
    /// has the token they logged in with.
    pub fn still_logged_in(&self, gw: &Gateway) -> bool {
        match &self.login {
            None => true,
            Some((fingerprint, expires)) => {
                now() < *expires && gw.auth.holder(&self.name, fingerprint).is_some()
            }
        }
    }
}

impl FromRequestParts<Gateway> for Person {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gw: &Gateway) -> Result<Person, ApiError> {
        gw.check_host(&parts.headers)?;
        if gw.auth_off {
            return Ok(Person {
                name: agentry_runtime::people::LOCAL.to_string(),
                role: Role::Admin,
                csrf: gw.keys.csrf(agentry_runtime::people::LOCAL),
                login: None,
            });
        }
        let value = cookie(&parts.headers, gw.cookie_name()).ok_or_else(ApiError::login)?;
        let claims = gw.keys.open(&value, now()).ok_or_else(ApiError::login)?;
        let principal = gw
            .auth
            .holder(&claims.name, &claims.fingerprint)
            .ok_or_else(|| {
                ApiError::new(
                    axum::http::StatusCode::UNAUTHORIZED,
                    "login",
                    "your token was replaced or removed: log in again",
                )
            })?;
        Ok(Person {
            name: principal.name,
            role: principal.role,
            csrf: gw.keys.csrf(&claims.nonce),
            login: Some((claims.fingerprint, claims.expires)),
        })
    }
}

/// A person making a change: besides their login, the request carries
/// their page's anti-forgery token, comes from this site when a browser
/// says where it comes from, and is JSON (which a cross-site form cannot
/// send).
pub struct Acting(pub Person);

impl FromRequestParts<Gateway> for Acting {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gw: &Gateway) -> Result<Acting, ApiError> {
        let person = Person::from_request_parts(parts, gw).await?;
        check_same_origin(&parts.headers)?;
        if parts.method != Method::GET {
            let json = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/json"));
            if !json {
                return Err(ApiError::forbidden(
                    "a change is sent as JSON (content-type: application/json)",
                ));
            }
        }
        let sent = parts
            .headers
            .get(CSRF_HEADER)
            .map(HeaderValue::as_bytes)
            .unwrap_or_default();
        if !agentry_runtime::people::constant_time_eq(sent, person.csrf.as_bytes()) {
            return Err(ApiError::forbidden(
                "the request lacks this page's anti-forgery token (x-agentry-csrf): reload the page",
            ));
        }
        Ok(Acting(person))
    }
}

/// Refuses a request a browser says comes from another site: its `Origin`
/// (when sent) must name the host it was sent to.
pub fn check_same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let same = origin.to_str().ok().is_some_and(|o| {
        o.strip_prefix("http://")
            .or_else(|| o.strip_prefix("https://"))
            .is_some_and(|rest| !host.is_empty() && rest == host)
    });
    if same {
        Ok(())
    } else {
        Err(ApiError::forbidden(
            "the request comes from another site (its Origin is not this gateway)",
        ))
    }
}

/// The value of cookie `name`.
pub fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// The person a protocol call (A2A, AG-UI, MCP) is made by, from their
/// bearer token, once the request names a host this gateway answers to: no
/// cookie, so no anti-forgery token; failed tokens count against the
/// address like failed logins.
pub fn bearer(
    gw: &Gateway,
    headers: &HeaderMap,
    peer: std::net::IpAddr,
) -> Result<Person, Box<Response>> {
    let ip = gw.client_ip(headers, peer);
    gw.check_host(headers)
        .map_err(|e| Box::new(e.into_response()))?;
    // A page of another site cannot make these calls: no cross-site
    // Origin, and JSON only (a cross-site form or a simple fetch cannot
    // send it without asking first). This matters most with credentials
    // off, where no token stands in the way.
    check_same_origin(headers).map_err(|e| Box::new(e.into_response()))?;
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/json")
        });
    if !json {
        return Err(Box::new(
            crate::error::ApiError::new(
                axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "content_type",
                "send JSON (content-type: application/json)",
            )
            .into_response(),
        ));
    }
    if gw.auth_off {
        return Ok(Person {
            name: agentry_runtime::people::LOCAL.to_string(),
            role: agentry_runtime::auth::Role::Admin,
            csrf: String::new(),
            login: None,
        });
    }
    if let Some(wait) = gw.limiter.wait(ip) {
        return Err(Box::new(
            crate::error::ApiError::too_many(wait).into_response(),
        ));
    }
    let unauthorized = |message: &str| {
        let mut response =
            crate::error::ApiError::new(axum::http::StatusCode::UNAUTHORIZED, "token", message)
                .into_response();
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        Box::new(response)
    };
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        })
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        return Err(unauthorized(
            "send a person's token as `Authorization: Bearer TOKEN` (`agentry users add` prints one)",
        ));
    };
    match gw.auth.identify(token.as_bytes()) {
        Ok(principal) => Ok(Person {
            name: principal.name,
            role: principal.role,
            csrf: String::new(),
            // Checked again while a stream lasts: a removed person or a
            // replaced token ends it.
            login: Some((
                agentry_runtime::people::sha256_hex(token.as_bytes())[..16].to_string(),
                u64::MAX,
            )),
        }),
        Err(status) => {
            gw.limiter.failed(ip);
            tracing::info!(%ip, "an A2A call with an unknown token was refused");
            Err(unauthorized(status.message()))
        }
    }
}

/// The body of a login.
#[derive(serde::Deserialize)]
pub struct LoginRequest {
    /// The person's token (`agentry users add` printed it).
    #[serde(default)]
    pub token: String,
}

/// `POST /api/login`.
pub async fn login(
    State(gw): State<Gateway>,
    ConnectInfo(crate::tls::ClientAddr(peer)): ConnectInfo<crate::tls::ClientAddr>,
    headers: HeaderMap,
    body: Result<Json<LoginRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, ApiError> {
    gw.check_host(&headers)?;
    check_same_origin(&headers)?;
    let Json(body) = body
        .map_err(|e| ApiError::bad_request(format!("a login is JSON {{\"token\": \"…\"}}: {e}")))?;
    let ip = gw.client_ip(&headers, peer.ip());
    if let Some(wait) = gw.limiter.wait(ip) {
        return Err(ApiError::too_many(wait));
    }
    if gw.auth_off {
        return Err(ApiError::bad_request(
            "credentials are off here (auth.mode = \"off\"): there is nothing to log in to",
        ));
    }
    let token = body.token.trim();
    if token.is_empty() {
        gw.limiter.failed(ip);
        return Err(ApiError::new(
            axum::http::StatusCode::UNAUTHORIZED,
            "login",
            "give your token: `agentry users add NAME --role ROLE` printed it (the client token, \
             `agentry token`, logs in as admin)",
        ));
    }
    let principal = match gw.auth.identify(token.as_bytes()) {
        Ok(p) => p,
        Err(status) => {
            gw.limiter.failed(ip);
            tracing::info!(%ip, "a console login was refused");
            return Err(ApiError::new(
                axum::http::StatusCode::UNAUTHORIZED,
                "login",
                status.message(),
            ));
        }
    };
    let nonce = random_nonce()?;
    let claims = Claims {
        name: principal.name.clone(),
        expires: now() + gw.login_ttl.as_secs(),
        fingerprint: agentry_runtime::people::sha256_hex(token.as_bytes())[..16].to_string(),
        nonce,
    };
    let csrf = gw.keys.csrf(&claims.nonce);
    let cookie = format!(
        "{}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        gw.cookie_name(),
        gw.keys.seal(&claims),
        gw.login_ttl.as_secs(),
        if gw.secure_cookie { "; Secure" } else { "" }
    );
    tracing::info!(person = %principal.name, "logged in to the console");
    let mut response = Json(serde_json::json!({
        "name": principal.name,
        "role": principal.role.name(),
        "csrf": csrf,
    }))
    .into_response();
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    Ok(response)
}

/// `POST /api/logout`: the cookie is cleared.
pub async fn logout(State(gw): State<Gateway>, Acting(person): Acting) -> Response {
    tracing::info!(person = %person.name, "logged out of the console");
    let mut response = Json(serde_json::json!({"logged_out": person.name})).into_response();
    let cookie = format!(
        "{}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{}",
        gw.cookie_name(),
        if gw.secure_cookie { "; Secure" } else { "" }
    );
    if let Ok(value) = HeaderValue::from_str(&cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

/// `GET /api/me`: who is logged in, their role and their page's
/// anti-forgery token.
pub async fn me(person: Person) -> Json<serde_json::Value> {
    Json(serde_json::json!({
        "name": person.name,
        "role": person.role.name(),
        "csrf": person.csrf,
    }))
}

fn random_nonce() -> Result<String, ApiError> {
    let token = agentry_runtime::auth::Token::generate(agentry_runtime::auth::TokenKind::Signing)
        .map_err(|e| ApiError::internal(format!("no randomness for a login: {e}")))?;
    let digest = agentry_runtime::people::sha256_hex(token.secret().as_bytes());
    Ok(digest[..32].to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn claims(expires: u64) -> Claims {
        Claims {
            name: "alice".into(),
            expires,
            fingerprint: "0123456789abcdef".into(),
            nonce: "n1".into(),
        }
    }

    #[test]
    fn a_sealed_cookie_opens_until_it_expires_and_not_when_touched() {
        let keys = Keys::new(b"0123456789abcdef0123456789abcdef");
        let sealed = keys.seal(&claims(100));
        assert_eq!(keys.open(&sealed, 99), Some(claims(100)));
        assert_eq!(keys.open(&sealed, 100), None, "expired");
        let forged = sealed.replace("alice", "admin");
        assert_eq!(keys.open(&forged, 1), None, "another name");
        let later = sealed.replace(":100:", ":999999:");
        assert_eq!(keys.open(&later, 1), None, "a later expiry");
        let other = Keys::new(b"another key, another key, another");
        assert_eq!(other.open(&sealed, 1), None, "another gateway's key");
        assert_eq!(keys.open("garbage", 1), None);
        assert_ne!(keys.csrf("n1"), keys.csrf("n2"));
    }

    #[test]
    fn failed_logins_wait_after_the_limit() {
        let limiter = Limiter::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        for _ in 0..LOGIN_ATTEMPTS - 1 {
            limiter.failed(ip);
        }
        assert_eq!(limiter.wait(ip), None);
        limiter.failed(ip);
        assert!(limiter.wait(ip).is_some());
        assert_eq!(limiter.wait("10.0.0.2".parse().unwrap()), None);
        // One IPv6 client's range counts as one.
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        for _ in 0..LOGIN_ATTEMPTS {
            limiter.failed(v6);
        }
        assert!(limiter.wait("2001:db8::ffff".parse().unwrap()).is_some());
        assert_eq!(limiter.wait("2001:db8:1::1".parse().unwrap()), None);
    }

    #[test]
    fn the_origin_must_be_this_host_when_sent() {
        let mut headers = HeaderMap::new();
        headers.insert(header::HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert!(check_same_origin(&headers).is_ok());
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:8080"),
        );
        assert!(check_same_origin(&headers).is_ok());
        headers.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(check_same_origin(&headers).is_err());
        headers.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(check_same_origin(&headers).is_err());
    }
}
