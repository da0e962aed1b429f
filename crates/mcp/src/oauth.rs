//! OAuth for remote MCP servers: `agentry mcp login NAME` signs in once
//! (the server's protected-resource metadata leads to its authorization
//! server; the client registers itself when it has no configured id; PKCE;
//! the person approves in a browser, which comes back to a loopback
//! address), and the tool runners then reach the server with the tokens,
//! refreshing them when they expire.
//!
//! Tokens are kept in the runners' private state directory, one file per
//! server (`mcp-oauth/NAME.json`), readable by the runners' user alone
//! (0600 in a 0700 directory); a refresh rewrites the file the same way.

use crate::McpError;
use agentry_runtime::config::McpServerConfig;
use rmcp::transport::auth::{
    AuthError, AuthorizationManager, AuthorizationRequest, CredentialRefreshGuard, CredentialStore,
    OAuthState, StoredCredentials,
};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The directory of the tokens, in the runners' state directory.
pub const DIR: &str = "mcp-oauth";

/// Where the tokens of `server` are kept.
pub fn credentials_path(state_dir: &Path, server: &str) -> PathBuf {
    state_dir.join(DIR).join(format!("{server}.json"))
}

/// The tokens of one server in a file only the runners' user can read.
#[derive(Debug, Clone)]
pub struct FileStore {
    path: PathBuf,
}

impl FileStore {
    /// The store of `server` in `state_dir`.
    pub fn new(state_dir: &Path, server: &str) -> FileStore {
        FileStore {
            path: credentials_path(state_dir, server),
        }
    }

    /// Whether tokens were stored.
    pub fn exists(&self) -> bool {
        self.path.is_file()
    }

    fn write(&self, credentials: &StoredCredentials) -> std::io::Result<()> {
        let dir = self
            .path
            .parent()
            .ok_or_else(|| std::io::Error::other("no directory"))?;
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let text = serde_json::to_vec_pretty(credentials).map_err(std::io::Error::other)?;
        let tmp = self
            .path
            .with_extension(format!("tmp{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&text)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, &self.path)
    }
}

#[async_trait::async_trait]
impl CredentialStore for FileStore {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let text = match std::fs::read(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(AuthError::CredentialStoreError(format!(
                    "cannot read {}: {e}",
                    self.path.display()
                )));
            }
        };
        serde_json::from_slice(&text).map(Some).map_err(|e| {
            AuthError::CredentialStoreError(format!(
                "{} cannot be read ({e}); sign in again with agentry mcp login",
                self.path.display()
            ))
        })
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        self.write(&credentials).map_err(|e| {
            AuthError::CredentialStoreError(format!("cannot write {}: {e}", self.path.display()))
        })
    }

    /// One refresh at a time per file in this process: connections of
    /// several sessions share a server's tokens, and a refresh token the
    /// server rotates may be used once. The SDK takes this guard before it
    /// loads the tokens, so the second connection finds the first one's
    /// fresh tokens instead of refreshing with a spent one.
    async fn acquire_refresh_guard(&self) -> Result<Option<CredentialRefreshGuard>, AuthError> {
        static LOCKS: std::sync::LazyLock<
            std::sync::Mutex<std::collections::HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
        > = std::sync::LazyLock::new(Default::default);
        let lock = LOCKS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(self.path.clone())
            .or_default()
            .clone();
        Ok(Some(CredentialRefreshGuard::new(lock.lock_owned().await)))
    }

    async fn clear(&self) -> Result<(), AuthError> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(AuthError::CredentialStoreError(format!(
                "cannot remove {}: {e}",
                self.path.display()
            ))),
        }
    }
}

/// The OAuth client of `url`: discovered metadata may name private
/// addresses only when the server's own URL does (a server on a private
/// network, reached as configured).
async fn manager(url: &str) -> Result<AuthorizationManager, McpError> {
    let private = url::Url::parse(url)
        .ok()
        .and_then(|u| match u.host() {
            Some(url::Host::Ipv4(ip)) => Some(ip.is_private() || ip.is_loopback()),
            Some(url::Host::Ipv6(ip)) => Some(ip.is_loopback()),
            Some(url::Host::Domain(d)) => Some(d == "localhost"),
            None => None,
        })
        .unwrap_or(false);
    let made = if private {
        AuthorizationManager::new_allowing_private_addresses(url).await
    } else {
        AuthorizationManager::new(url).await
    };
    made.map_err(|e| McpError(format!("cannot set up OAuth for {url}: {e}")))
}

/// The signed-in OAuth client of a server, when `agentry mcp login` stored
/// tokens for it; `None` otherwise.
pub async fn signed_in(
    config: &McpServerConfig,
    state_dir: &Path,
) -> Result<Option<AuthorizationManager>, McpError> {
    let store = FileStore::new(state_dir, &config.name);
    if !store.exists() {
        return Ok(None);
    }
    let mut manager = manager(config.url.trim()).await?;
    manager.set_credential_store(store);
    match manager.initialize_from_store().await {
        Ok(true) => Ok(Some(manager)),
        Ok(false) => Err(McpError(format!(
            "the sign-in for {} is no longer valid (its authorization server changed); run \
             agentry mcp login {}",
            config.name, config.name
        ))),
        Err(e) => Err(McpError(format!(
            "cannot use the sign-in for {}: {e}; run agentry mcp login {}",
            config.name, config.name
        ))),
    }
}

/// What a login came to.
#[derive(Debug)]
pub struct LoggedIn {
    /// Where the tokens are.
    pub path: PathBuf,
    /// The client id used (registered, or configured).
    pub client_id: String,
    /// The scopes granted.
    pub scopes: Vec<String>,
}

/// Signs in to `config`'s server: the authorization URL is given to
/// `show` (for the person to open), the browser's return is awaited on a
/// loopback port for at most `wait`, and the tokens are stored.
pub async fn login(
    config: &McpServerConfig,
    state_dir: &Path,
    wait: Duration,
    show: impl FnOnce(&str),
) -> Result<LoggedIn, McpError> {
    let url = config.url.trim();
    if url.is_empty() {
        return Err(McpError(format!(
            "{} is a stdio server; OAuth applies to url servers",
            config.name
        )));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| McpError(format!("cannot listen for the browser's return: {e}")))?;
    let port = listener
        .local_addr()
        .map_err(|e| McpError(e.to_string()))?
        .port();
    let redirect_uri = format!("http://127.0.0.1:{port}/callback");
    let store = FileStore::new(state_dir, &config.name);
    let mut manager = manager(url).await?;
    manager.set_credential_store(store.clone());
    let mut request = AuthorizationRequest::new(redirect_uri.clone()).with_client_name("Agentry");
    if !config.oauth_client_id.is_empty() {
        request = request.with_preregistered_client(config.oauth_client_id.clone());
    }
    if !config.oauth_scopes.is_empty() {
        request = request.with_scopes(config.oauth_scopes.iter().cloned());
    }
    if let Some(challenge) = challenge(url).await {
        request = request.with_challenge(challenge);
    }
    let mut state = OAuthState::Unauthorized(manager);
    state
        .start_authorization(request)
        .await
        .map_err(|e| McpError(format!("cannot start signing in to {url}: {e}")))?;
    let auth_url = state
        .get_authorization_url()
        .await
        .map_err(|e| McpError(e.to_string()))?;
    show(&auth_url);
    let callback = tokio::time::timeout(wait, callback(&listener))
        .await
        .map_err(|_| {
            McpError(format!(
                "nobody came back from the authorization page within {}s; run the login again",
                wait.as_secs()
            ))
        })??;
    state
        .handle_callback_url(&format!("http://127.0.0.1:{port}{callback}"))
        .await
        .map_err(|e| McpError(format!("the authorization server refused the sign-in: {e}")))?;
    // The exchange stored the tokens; make sure they are there.
    let stored = store
        .load()
        .await
        .map_err(|e| McpError(e.to_string()))?
        .ok_or_else(|| McpError("the tokens were not stored".into()))?;
    Ok(LoggedIn {
        path: credentials_path(state_dir, &config.name),
        client_id: stored.client_id,
        scopes: stored.granted_scopes,
    })
}

/// The `WWW-Authenticate` challenge the server answers a request without
/// a token with (it names its protected-resource metadata), if any.
async fn challenge(url: &str) -> Option<String> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(15))
        .build()
        .ok()?;
    let response = client
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":0,"method":"server/discover","params":{}}"#)
        .send()
        .await
        .ok()?;
    if response.status() != reqwest::StatusCode::UNAUTHORIZED {
        return None;
    }
    response
        .headers()
        .get("www-authenticate")?
        .to_str()
        .ok()
        .map(str::to_string)
}

/// Waits for the browser's return to `/callback`; answers it with a page
/// that says what happened; returns its path and query.
async fn callback(listener: &tokio::net::TcpListener) -> Result<String, McpError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let (mut socket, _) = listener
            .accept()
            .await
            .map_err(|e| McpError(format!("the loopback listener failed: {e}")))?;
        let mut buf = vec![0u8; 8192];
        let mut len = 0;
        while len < buf.len() {
            let Ok(n) = socket.read(&mut buf[len..]).await else {
                break;
            };
            len += n;
            if n == 0 || buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let head = String::from_utf8_lossy(&buf[..len]).into_owned();
        let target = head
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("GET "))
            .and_then(|rest| rest.split(' ').next())
            .unwrap_or_default()
            .to_string();
        if !target.starts_with("/callback?") {
            let _ = socket
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                )
                .await;
            continue;
        }
        let failed = target.contains("error=");
        let body = if failed {
            "Signing in failed; see the terminal."
        } else {
            "Agentry is signed in. You may close this page."
        };
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = socket.write_all(response.as_bytes()).await;
        if failed {
            let why = url::Url::parse(&format!("http://127.0.0.1{target}"))
                .ok()
                .and_then(|u| {
                    u.query_pairs()
                        .find(|(k, _)| k == "error_description" || k == "error")
                        .map(|(_, v)| v.into_owned())
                })
                .unwrap_or_default();
            return Err(McpError(format!(
                "the authorization server refused the sign-in: {why}"
            )));
        }
        return Ok(target);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[tokio::test]
    async fn tokens_are_kept_for_the_runners_user_alone() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(dir.path(), "remote");
        assert!(store.load().await.unwrap().is_none());
        store
            .save(StoredCredentials::new(
                "client-1".into(),
                None,
                vec!["mcp".into()],
                Some(7),
            ))
            .await
            .unwrap();
        let path = credentials_path(dir.path(), "remote");
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(path.parent().unwrap()).unwrap().mode() & 0o777,
            0o700
        );
        let loaded = store.load().await.unwrap().unwrap();
        assert_eq!(loaded.client_id, "client-1");
        assert_eq!(loaded.granted_scopes, vec!["mcp".to_string()]);
        std::fs::write(&path, "{").unwrap();
        let broken = store.load().await.unwrap_err().to_string();
        assert!(broken.contains("agentry mcp login"), "{broken}");
        store.clear().await.unwrap();
        assert!(!store.exists());
    }
}
