//! The headless Chromium backend: one warm browser per runner (started on
//! first use, restarted if it dies), a new page per call, bounded
//! concurrency and a page timeout. JavaScript runs, so pages that write
//! their content with scripts come through.

use super::{Backend, BackendName, FetchError, Page};
use chromiumoxide::browser::{Browser, BrowserConfig};
use futures::StreamExt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Mutex, Semaphore};
use tokio::task::JoinHandle;

/// Chromium settings.
#[derive(Debug, Clone)]
pub struct ChromiumSettings {
    /// The executable; `None` looks for `chromium` on PATH.
    pub executable: Option<PathBuf>,
    /// Pages open at once.
    pub max_pages: usize,
    /// Longest a page may take to load and render.
    pub page_timeout: Duration,
    /// When set, every request the page makes (the document, each redirect
    /// hop, every subresource) is checked by this guard and blocked when it
    /// leads somewhere refused.
    pub guard: Option<std::sync::Arc<super::ssrf::Guard>>,
    /// Chromium's own sandbox. It needs user namespaces, which containers
    /// usually deny; it is always off when running as root.
    pub sandbox: bool,
}

struct Live {
    browser: Browser,
    handler: JoinHandle<()>,
    profile: PathBuf,
}

/// The Chromium backend.
pub struct Chromium {
    settings: ChromiumSettings,
    live: Mutex<Option<Live>>,
    pages: Semaphore,
    launches: AtomicU64,
}

/// Flags for a quiet headless browser on a closed network.
const FLAGS: &[&str] = &[
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-extensions",
    "--mute-audio",
    // Containers give /dev/shm 64 MiB; shared memory goes to /tmp instead.
    "--disable-dev-shm-usage",
];

/// Finds `name` on PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

impl Chromium {
    /// A backend that starts Chromium when first used.
    pub fn new(settings: ChromiumSettings) -> Chromium {
        let pages = Semaphore::new(settings.max_pages.max(1));
        Chromium {
            settings,
            live: Mutex::new(None),
            pages,
            launches: AtomicU64::new(0),
        }
    }

    /// The executable that will be started, if one can be found.
    pub fn executable(&self) -> Option<PathBuf> {
        self.settings
            .executable
            .clone()
            .filter(|p| p.is_file())
            .or_else(|| on_path("chromium"))
            .or_else(|| on_path("chromium-browser"))
            .or_else(|| on_path("google-chrome"))
    }

    /// How many times a browser was started (restarts included).
    pub fn launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    async fn launch(&self) -> Result<Live, FetchError> {
        let executable = self.executable().ok_or_else(|| {
            FetchError::Unavailable("no Chromium found (install the `chromium` package)".into())
        })?;
        self.launches.fetch_add(1, Ordering::Relaxed);
        // Unique per browser in this process: Chromium locks its profile.
        static PROFILES: AtomicU64 = AtomicU64::new(0);
        let n = PROFILES.fetch_add(1, Ordering::Relaxed);
        let profile =
            std::env::temp_dir().join(format!("agentry-chromium-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&profile);
        let mut builder = BrowserConfig::builder()
            .chrome_executable(&executable)
            .user_data_dir(&profile)
            .launch_timeout(Duration::from_secs(20))
            .request_timeout(self.settings.page_timeout)
            .args(FLAGS.iter().copied());
        if !self.settings.sandbox || nix::unistd::geteuid().is_root() {
            // Chromium's own sandbox cannot run as root, nor where user
            // namespaces are denied (most containers).
            builder = builder.no_sandbox();
        }
        let config = builder
            .build()
            .map_err(|e| FetchError::Unavailable(format!("bad Chromium settings: {e}")))?;
        let (browser, mut handler) = Browser::launch(config).await.map_err(|e| {
            FetchError::Unavailable(format!(
                "cannot start Chromium ({}): {e}",
                executable.display()
            ))
        })?;
        let handler = tokio::spawn(async move {
            while let Some(event) = handler.next().await {
                if event.is_err() {
                    // Connection-level errors end the browser session.
                    break;
                }
            }
        });
        tracing::info!(executable = %executable.display(), "started headless Chromium");
        Ok(Live {
            browser,
            handler,
            profile,
        })
    }

    /// A running browser: the warm one, or a new one when there is none or
    /// it died.
    async fn browser(&self) -> Result<tokio::sync::MutexGuard<'_, Option<Live>>, FetchError> {
        let mut live = self.live.lock().await;
        let dead = live.as_ref().is_none_or(|l| l.handler.is_finished());
        if dead {
            if let Some(mut old) = live.take() {
                tracing::warn!("Chromium stopped; starting a new one");
                let _ = old.browser.kill().await;
                let _ = std::fs::remove_dir_all(&old.profile);
            }
            *live = Some(self.launch().await?);
        }
        Ok(live)
    }

    async fn load(&self, url: &url::Url) -> Result<Page, FetchError> {
        let _permit = self
            .pages
            .acquire()
            .await
            .map_err(|_| FetchError::Unavailable("Chromium is shutting down".into()))?;
        let page = {
            let guard = self.browser().await?;
            let Some(live) = guard.as_ref() else {
                return Err(FetchError::Unavailable("Chromium is not running".into()));
            };
            live.browser
                .new_page("about:blank")
                .await
                .map_err(|e| FetchError::Failed(format!("cannot open a page: {e}")))?
        };
        let blocked = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
        let interceptor = match &self.settings.guard {
            Some(guard) => Some(intercept(&page, guard.clone(), blocked.clone()).await?),
            None => None,
        };
        let loaded = tokio::time::timeout(self.settings.page_timeout, async {
            let navigated = page.goto(url.as_str()).await;
            let refused = blocked.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(reason) = refused {
                return Err(FetchError::Blocked(reason));
            }
            navigated.map_err(|e| FetchError::Failed(format!("navigation failed: {e}")))?;
            page.wait_for_navigation()
                .await
                .map_err(|e| FetchError::Failed(format!("the page did not load: {e}")))?;
            let html = page
                .content()
                .await
                .map_err(|e| FetchError::Failed(format!("cannot read the page: {e}")))?;
            let title = page.get_title().await.ok().flatten();
            let final_url = page
                .url()
                .await
                .ok()
                .flatten()
                .unwrap_or_else(|| url.to_string());
            Ok::<_, FetchError>((html, title, final_url))
        })
        .await;
        // Close the page whatever happened.
        if let Some(task) = interceptor {
            task.abort();
        }
        let _ = page.close().await;
        let (html, title, final_url) = match loaded {
            Ok(result) => result?,
            Err(_) => {
                return Err(FetchError::Failed(format!(
                    "timed out after {}s",
                    self.settings.page_timeout.as_secs()
                )));
            }
        };
        let markdown = htmd::convert(&html)
            .map_err(|e| FetchError::Failed(format!("cannot convert the page: {e}")))?;
        Ok(Page {
            url: url.to_string(),
            final_url,
            title: title.filter(|t| !t.trim().is_empty()),
            markdown,
            status: None,
        })
    }

    /// Stops the browser, if one runs.
    pub async fn shutdown(&self) {
        if let Some(mut live) = self.live.lock().await.take() {
            let _ = live.browser.close().await;
            let _ = live.browser.wait().await;
            live.handler.abort();
            let _ = std::fs::remove_dir_all(&live.profile);
        }
    }

    /// Kills the browser process without closing it (tests use this to
    /// check that a dead browser is replaced).
    pub async fn kill_browser(&self) {
        if let Some(live) = self.live.lock().await.as_mut() {
            let _ = live.browser.kill().await;
        }
    }
}

/// Pauses every request of `page` and lets it continue only when `guard`
/// accepts its URL; a refused document request is remembered in `blocked`.
async fn intercept(
    page: &chromiumoxide::Page,
    guard: std::sync::Arc<super::ssrf::Guard>,
    blocked: std::sync::Arc<std::sync::Mutex<Option<String>>>,
) -> Result<JoinHandle<()>, FetchError> {
    use chromiumoxide::cdp::browser_protocol::fetch::{
        ContinueRequestParams, EnableParams, EventRequestPaused, FailRequestParams,
    };
    use chromiumoxide::cdp::browser_protocol::network::{ErrorReason, ResourceType};
    let mut paused = page
        .event_listener::<EventRequestPaused>()
        .await
        .map_err(|e| FetchError::Failed(format!("cannot watch the page's requests: {e}")))?;
    page.execute(EnableParams::default())
        .await
        .map_err(|e| FetchError::Failed(format!("cannot intercept the page's requests: {e}")))?;
    let page = page.clone();
    Ok(tokio::spawn(async move {
        while let Some(event) = paused.next().await {
            let verdict = match url::Url::parse(&event.request.url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => guard.check(&u).await,
                // data:, blob:, about: and the like never reach the network.
                Ok(_) => Ok(()),
                Err(e) => Err(FetchError::Blocked(format!("unparsable request URL: {e}"))),
            };
            let id = event.request_id.clone();
            match verdict {
                Ok(()) => {
                    let _ = page.execute(ContinueRequestParams::new(id)).await;
                }
                Err(refusal) => {
                    tracing::warn!(url = %event.request.url, reason = %refusal, "Chromium request blocked");
                    if event.resource_type == ResourceType::Document {
                        let mut slot = blocked.lock().unwrap_or_else(|e| e.into_inner());
                        slot.get_or_insert_with(|| refusal.to_string());
                    }
                    let _ = page
                        .execute(FailRequestParams::new(id, ErrorReason::BlockedByClient))
                        .await;
                }
            }
        }
    }))
}

impl Backend for Chromium {
    fn name(&self) -> BackendName {
        BackendName::Chromium
    }

    fn fetch<'a>(
        &'a self,
        url: &'a url::Url,
    ) -> Pin<Box<dyn Future<Output = Result<Page, FetchError>> + Send + 'a>> {
        Box::pin(self.load(url))
    }
}
