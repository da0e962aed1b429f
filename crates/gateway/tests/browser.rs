//! The console in a real headless Chromium against a real cluster: people
//! log in, chat, approve from a diff, deny with a reason, rewind; two
//! browsers see the same session; hostile content stays inert; another
//! site's form is refused; a restarted gateway loses and repeats nothing;
//! the inbox is usable 360 pixels wide.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_fakes::fake_model::{Reply, pause, text};
use agentry_runtime::auth::Role;
use agentry_runtime::people::People;
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Service;
use chromiumoxide::browser::{Browser, BrowserConfig};
use chromiumoxide::cdp::browser_protocol::emulation::SetDeviceMetricsOverrideParams;
use chromiumoxide::cdp::browser_protocol::network::EventRequestWillBeSent;
use chromiumoxide::cdp::browser_protocol::page::EventJavascriptDialogOpening;
use chromiumoxide::cdp::browser_protocol::target::{
    CreateBrowserContextParams, CreateTargetParams,
};
use chromiumoxide::cdp::js_protocol::runtime::EvaluateParams;
use chromiumoxide::page::{Page, ScreenshotParams};
use futures::StreamExt;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const NOTICED: Duration = Duration::from_millis(1300);

fn chromium_path() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join(name))
                    .find(|p| p.is_file())
            })
        })
}

/// A headless Chromium, or `None` (with a visible message) where there is
/// none and CI does not require it.
async fn chromium() -> Option<Browser> {
    let Some(path) = chromium_path() else {
        assert!(
            std::env::var("CI").ok().as_deref() != Some("true"),
            "Chromium is required in CI (apt-get install chromium)"
        );
        eprintln!("skipped: no chromium on PATH (apt-get install chromium)");
        return None;
    };
    static PROFILES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PROFILES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let profile =
        std::env::temp_dir().join(format!("agentry-console-test-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let mut config = BrowserConfig::builder()
        .chrome_executable(path)
        .user_data_dir(profile)
        .launch_timeout(Duration::from_secs(30))
        .request_timeout(Duration::from_secs(30))
        .window_size(1000, 900)
        .args(["--disable-gpu", "--no-first-run", "--disable-dev-shm-usage"]);
    if nix::unistd::geteuid().is_root() {
        config = config.no_sandbox();
    }
    let (browser, mut handler) = Browser::launch(config.build().unwrap()).await.unwrap();
    tokio::spawn(async move { while handler.next().await.is_some() {} });
    Some(browser)
}

/// A page in a fresh cookie jar of `browser` (one person's browser).
async fn new_person_page(browser: &Browser, url: &str) -> Page {
    let context = browser
        .create_browser_context(CreateBrowserContextParams::default())
        .await
        .unwrap();
    let target = CreateTargetParams::builder()
        .url(url)
        .browser_context_id(context)
        .build()
        .unwrap();
    let page = browser.new_page(target).await.unwrap();
    page.wait_for_navigation().await.unwrap();
    page
}

async fn eval(page: &Page, js: &str) -> Value {
    let params = EvaluateParams::builder()
        .expression(js)
        .await_promise(true)
        .return_by_value(true)
        .build()
        .unwrap();
    page.evaluate(params)
        .await
        .unwrap_or_else(|e| panic!("{js}: {e}"))
        .value()
        .cloned()
        .unwrap_or(Value::Null)
}

/// Waits until `js` is true on the page (an expression that throws, e.g.
/// on an element not there yet, is not true yet).
async fn until(page: &Page, js: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(25);
    let guarded = format!(
        "(async () => {{ try {{ return ({js}) === true; }} catch (_) {{ return false; }} }})()"
    );
    loop {
        if eval(page, &guarded).await == Value::Bool(true) {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let body = eval(page, "document.body.innerText").await;
            panic!("never true: {js}\nthe page says:\n{body}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Clicks the first element matching `selector` whose text is `text`.
async fn click(page: &Page, selector: &str, text: &str) {
    let js = format!(
        "(() => {{ const e = [...document.querySelectorAll({s})].find(e => e.textContent.trim() === {t}); \
         if (!e) return false; e.click(); return true; }})()",
        s = json!(selector),
        t = json!(text)
    );
    until(page, &js).await;
}

/// Types `value` into the field `selector` as a person would.
async fn fill(page: &Page, selector: &str, value: &str) {
    until(
        page,
        &format!("!!document.querySelector({})", json!(selector)),
    )
    .await;
    let field = page.find_element(selector).await.unwrap();
    field.click().await.unwrap();
    field.type_str(value).await.unwrap();
}

async fn login(page: &Page, token: &str) {
    fill(page, "#token", token).await;
    click(page, "#login button", "Log in").await;
    until(
        page,
        "document.getElementById('who').textContent.length > 0",
    )
    .await;
}

async fn cluster_with(people: &[(&str, Role)]) -> (Cluster, Vec<String>) {
    let mut cluster = Cluster::start().await.unwrap();
    cluster.start_service(Service::Gateway).await.unwrap();
    let file = cluster.config.people_file();
    let tokens = people
        .iter()
        .map(|(name, role)| {
            People::add(&file, name, *role, "test")
                .unwrap()
                .secret()
                .to_string()
        })
        .collect();
    tokio::time::sleep(NOTICED).await;
    (cluster, tokens)
}

fn base(cluster: &Cluster) -> String {
    format!("http://{}/", cluster.config.gateway.listen)
}

fn artefacts() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/browser-artefacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The number of entries of each kind in the transcript.
async fn kinds(page: &Page) -> Value {
    eval(
        page,
        "(() => { const n = {}; for (const e of document.querySelectorAll('#transcript .entry')) \
         { const k = [...e.classList].find(c => c !== 'entry' && c !== 'rewound'); n[k] = (n[k]||0)+1; } \
         return n; })()",
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approver_chats_approves_from_the_diff_denies_with_a_reason_and_rewinds() {
    let Some(browser) = chromium().await else {
        return;
    };
    let (cluster, tokens) = cluster_with(&[("abe", Role::Approver)]).await;
    cluster
        .model
        .push(Reply::tool_call("l1", "list_dir", json!({"path": "."})));
    cluster.model.push(Reply::tool_call(
        "w1",
        "write_file",
        json!({"path": "notes.txt", "content": "first line\nsecond line\n"}),
    ));
    cluster.model.push(Reply::tool_call(
        "b1",
        "bash",
        json!({"command": "rm -rf build"}),
    ));
    cluster.model.push(Reply::stream(vec![
        text("I kept "),
        pause(Duration::from_millis(1500)),
        text("the build."),
    ]));

    let page = new_person_page(&browser, &base(&cluster)).await;
    login(&page, &tokens[0]).await;
    click(&page, "#new-session", "New session").await;
    until(&page, "!!document.getElementById('message')").await;
    fill(&page, "#message", "write notes, then clean").await;
    click(&page, "#send", "Send").await;

    // The write waits, shown as the diff it would make.
    until(
        &page,
        "!!document.querySelector('#questions .question[data-call=\"w1\"] .diff .add')",
    )
    .await;
    let diff = eval(
        &page,
        "document.querySelector('#questions .diff').innerText",
    )
    .await;
    assert!(diff.as_str().unwrap().contains("+first line"), "{diff}");
    click(
        &page,
        "#questions .question[data-call=\"w1\"] button",
        "Approve",
    )
    .await;

    // The bash call: denied with a reason.
    until(
        &page,
        "!!document.querySelector('#questions .question[data-call=\"b1\"]')",
    )
    .await;
    let command = eval(
        &page,
        "document.querySelector('#questions .command').textContent",
    )
    .await;
    assert_eq!(command, "$ rm -rf build");
    fill(
        &page,
        "#questions .question[data-call=\"b1\"] input",
        "keep the build",
    )
    .await;
    click(
        &page,
        "#questions .question[data-call=\"b1\"] button",
        "Deny",
    )
    .await;

    // The answer streams in, then settles.
    until(
        &page,
        "[...document.querySelectorAll('#transcript .answer')].some(a => a.textContent.trim() === 'I kept')",
    )
    .await;
    until(
        &page,
        "[...document.querySelectorAll('#transcript .answer')].some(a => a.textContent.includes('I kept the build.'))",
    )
    .await;
    // The model was told the reason.
    let told = cluster.model.requests().last().unwrap().to_string();
    assert!(told.contains("keep the build"), "{told}");
    // The file was written; the blocks say who approved and who denied.
    let session = eval(&page, "location.hash.slice(4)").await;
    let workspace = cluster.workspace_root().join(session.as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(workspace.join("notes.txt")).unwrap(),
        "first line\nsecond line\n"
    );
    let blocks = eval(
        &page,
        "[...document.querySelectorAll('#transcript .tool summary')].map(s => s.textContent)",
    )
    .await;
    let blocks = blocks.to_string();
    assert!(
        blocks.contains("approved by abe") && blocks.contains("denied by abe"),
        "{blocks}"
    );

    // Rewind to before the turn: its entries become history.
    until(
        &page,
        "document.getElementById('status').textContent.includes('idle')",
    )
    .await;
    click(&page, "#transcript .turn button", "Rewind to before this").await;
    click(&page, "#transcript .turn button", "Sure? Rewind").await;
    until(
        &page,
        "document.querySelectorAll('#transcript .entry.rewound .answer').length > 0",
    )
    .await;
    assert!(
        !workspace.join("notes.txt").exists(),
        "the files went back too"
    );

    // The audit names the approver of the write and the rule that let the
    // listing run; the denied command never ran.
    let mut store = cluster.store().await.unwrap();
    let log = store
        .read(agentry_proto::sessions::v1::ReadRequest {
            session_id: session.as_str().unwrap().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    let ran: Vec<(String, Option<agentry_client::audit::Allowed>)> =
        agentry_client::audit::records(&log)
            .into_iter()
            .filter(|r| r.action == "tool_call")
            .map(|r| (r.subject, r.allowed))
            .collect();
    assert_eq!(ran.len(), 2, "{ran:?}");
    assert!(ran[0].0.starts_with("list_dir"), "{ran:?}");
    assert!(
        matches!(&ran[0].1, Some(agentry_client::audit::Allowed::Rule(rule)) if rule.contains("list_dir")),
        "{ran:?}"
    );
    assert!(ran[1].0.starts_with("write_file"), "{ran:?}");
    assert_eq!(
        ran[1].1,
        Some(agentry_client::audit::Allowed::Person("abe".into()))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_approver_and_a_viewer_see_the_same_and_the_viewer_cannot_approve() {
    let Some(browser) = chromium().await else {
        return;
    };
    let (cluster, tokens) = cluster_with(&[("abe", Role::Approver), ("vera", Role::Viewer)]).await;
    cluster.model.push(Reply::tool_call(
        "b1",
        "bash",
        json!({"command": "touch shared.txt"}),
    ));
    cluster.model.push(Reply::text("done"));
    let abe = new_person_page(&browser, &base(&cluster)).await;
    login(&abe, &tokens[0]).await;
    click(&abe, "#new-session", "New session").await;
    until(&abe, "!!document.getElementById('message')").await;
    let session = eval(&abe, "location.hash.slice(4)").await;
    let session = session.as_str().unwrap().to_string();

    let vera = new_person_page(&browser, &format!("{}#/s/{session}", base(&cluster))).await;
    login(&vera, &tokens[1]).await;
    until(&vera, "!!document.getElementById('transcript')").await;
    assert_eq!(
        eval(&vera, "!!document.getElementById('message')").await,
        false
    );

    fill(&abe, "#message", "make a shared file").await;
    click(&abe, "#send", "Send").await;
    let asked = "!!document.querySelector('#questions .question')";
    until(&abe, asked).await;
    until(&vera, asked).await;
    // The viewer is shown no answer buttons...
    let buttons = eval(
        &vera,
        "document.querySelectorAll('#questions button').length",
    )
    .await;
    assert_eq!(buttons, 0);
    // ...and a hand-made approval from her page is refused by the server.
    let forced = eval(
        &vera,
        &format!(
            "(async () => {{ const me = await (await fetch('/api/me')).json(); \
             const r = await fetch('/api/sessions/{session}/approvals/b1', {{method: 'POST', \
             headers: {{'content-type': 'application/json', 'x-agentry-csrf': me.csrf}}, \
             body: JSON.stringify({{decision: 'approve'}})}}); return r.status; }})()"
        ),
    )
    .await;
    assert_eq!(forced, 403);

    click(&abe, "#questions button", "Approve").await;
    let finished = "[...document.querySelectorAll('#transcript .answer')].some(a => a.textContent.includes('done')) \
                    && document.getElementById('status').textContent.includes('idle')";
    until(&abe, finished).await;
    until(&vera, finished).await;
    // The same transcript, but for the buttons a viewer is not given.
    let text = "(() => { const t = document.getElementById('transcript').cloneNode(true); \
                t.querySelectorAll('button').forEach(b => b.remove()); return t.textContent; })()";
    assert_eq!(eval(&abe, text).await, eval(&vera, text).await);
    assert_eq!(kinds(&abe).await, kinds(&vera).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hostile_answer_stays_text() {
    let Some(browser) = chromium().await else {
        return;
    };
    let (cluster, tokens) = cluster_with(&[("abe", Role::Operator)]).await;
    let hostile = "<script>window.__pwned = 1</script>\n\
        <img src=x onerror=\"window.__pwned = 2\">\n\n\
        [click me](javascript:window.__pwned=3) and [safe](https://example.org/)\n\n\
        <a href=\"javascript:alert(1)\">link</a> <iframe src=\"https://example.org\"></iframe>\n\n\
        ![pixel](http://127.0.0.1:9/tracker.png)\n\n\
        ```html\n<script>alert('in code')</script>\n```\n\n\
        <svg onload=alert(1)></svg> **bold <b>tag</b>**";
    cluster.model.push(Reply::text(hostile));
    let page = new_person_page(&browser, &base(&cluster)).await;
    let dialogs = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut dialog_events = page
        .event_listener::<EventJavascriptDialogOpening>()
        .await
        .unwrap();
    let seen = dialogs.clone();
    tokio::spawn(async move {
        while let Some(d) = dialog_events.next().await {
            seen.lock().unwrap().push(d.message.clone());
        }
    });
    let requests = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut request_events = page
        .event_listener::<EventRequestWillBeSent>()
        .await
        .unwrap();
    let sent = requests.clone();
    tokio::spawn(async move {
        while let Some(r) = request_events.next().await {
            sent.lock().unwrap().push(r.request.url.clone());
        }
    });
    login(&page, &tokens[0]).await;
    click(&page, "#new-session", "New session").await;
    fill(
        &page,
        "#message",
        "<img src=y onerror=\"window.__pwned=4\"> say something",
    )
    .await;
    click(&page, "#send", "Send").await;
    until(
        &page,
        "[...document.querySelectorAll('#transcript .answer')].some(a => a.textContent.includes('window.__pwned = 1'))",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    assert_eq!(eval(&page, "typeof window.__pwned").await, "undefined");
    assert!(
        dialogs.lock().unwrap().is_empty(),
        "{:?}",
        dialogs.lock().unwrap()
    );
    let made = eval(
        &page,
        "document.querySelectorAll('#transcript script, #transcript img, #transcript iframe, #transcript svg').length",
    )
    .await;
    assert_eq!(made, 0, "no element from the answer");
    let links = eval(
        &page,
        "[...document.querySelectorAll('#transcript a')].map(a => a.getAttribute('href'))",
    )
    .await;
    assert_eq!(
        links,
        json!(["https://example.org/", "http://127.0.0.1:9/tracker.png"]),
        "only http(s) addresses are links; an image is a link to it, never loaded"
    );
    let image = eval(
        &page,
        "[...document.querySelectorAll('#transcript a')].map(a => a.textContent)",
    )
    .await;
    assert_eq!(image[1], "image: pixel");
    let shown = eval(&page, "document.getElementById('transcript').textContent").await;
    let shown = shown.as_str().unwrap();
    assert!(
        shown.contains("<script>window.__pwned = 1</script>"),
        "{shown}"
    );
    assert!(
        shown.contains("onerror=\"window.__pwned=4\""),
        "the person's text too: {shown}"
    );
    // Nothing left for another address (the tracker, the iframe, the image).
    let base = base(&cluster);
    let outside: Vec<String> = requests
        .lock()
        .unwrap()
        .iter()
        .filter(|u| !u.starts_with(&base) && !u.starts_with("data:"))
        .cloned()
        .collect();
    assert!(outside.is_empty(), "requests left the page: {outside:?}");
}

/// Serves one page of another site at a new address.
async fn serve_once(html: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let html = html.clone();
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{html}",
                    html.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}/")
}

#[tokio::test(flavor = "multi_thread")]
async fn another_sites_form_and_a_login_without_a_token_are_refused() {
    let Some(browser) = chromium().await else {
        return;
    };
    let (cluster, tokens) = cluster_with(&[("abe", Role::Admin)]).await;
    let page = new_person_page(&browser, &base(&cluster)).await;

    // No token: refused, and the page says so.
    until(&page, "!!document.getElementById('token')").await;
    click(&page, "#login button", "Log in").await;
    until(
        &page,
        "document.getElementById('login-error').textContent.length > 0",
    )
    .await;
    let said = eval(&page, "document.getElementById('login-error').textContent").await;
    assert!(said.as_str().unwrap().contains("token"), "{said}");
    assert_eq!(
        eval(&page, "document.getElementById('who').textContent").await,
        ""
    );

    login(&page, &tokens[0]).await;
    let mut orchestrator = cluster.orchestrator().await.unwrap();
    let count = |orchestrator: &mut agentry_proto::orchestrator::v1::orchestrator_client::OrchestratorClient<_>| {
        let mut orchestrator = orchestrator.clone();
        async move {
            orchestrator
                .list_sessions(agentry_proto::sessions::v1::ListSessionsRequest::default())
                .await
                .unwrap()
                .into_inner()
                .sessions
                .len()
        }
    };
    let before = count(&mut orchestrator).await;

    // Another site (another port: the same site to a browser, so the cookie
    // goes along) posts a form to the gateway as the logged-in person.
    let gateway = base(&cluster);
    let evil = serve_once(format!(
        "<html><body><form id=f method=post enctype=text/plain action=\"{gateway}api/sessions\">\
         <input name='{{\"title\":\"evil\",\"x\":\"' value='\"}}'></form>\
         <script>document.getElementById('f').submit()</script></body></html>"
    ))
    .await;
    page.goto(evil.as_str()).await.unwrap();
    until(&page, "location.href.includes('/api/sessions')").await;
    let answer = eval(&page, "document.body.innerText").await;
    assert!(
        answer.as_str().unwrap().contains("JSON")
            || answer.as_str().unwrap().contains("another site"),
        "{answer}"
    );
    assert_eq!(
        count(&mut orchestrator).await,
        before,
        "no session was made"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_restarted_mid_stream_loses_and_repeats_nothing() {
    let Some(browser) = chromium().await else {
        return;
    };
    let (mut cluster, tokens) = cluster_with(&[("abe", Role::Operator)]).await;
    cluster.model.push(Reply::stream(vec![
        text("part one, "),
        pause(Duration::from_secs(4)),
        text("part two."),
    ]));
    let page = new_person_page(&browser, &base(&cluster)).await;
    login(&page, &tokens[0]).await;
    click(&page, "#new-session", "New session").await;
    fill(&page, "#message", "tell me in two parts").await;
    click(&page, "#send", "Send").await;
    until(
        &page,
        "[...document.querySelectorAll('#transcript .answer')].some(a => a.textContent.includes('part one'))",
    )
    .await;
    cluster.restart_service(Service::Gateway).await.unwrap();
    until(
        &page,
        "[...document.querySelectorAll('#transcript .answer')].some(a => a.textContent.includes('part one, part two.')) \
         && document.getElementById('status').textContent.includes('idle')",
    )
    .await;
    let after_restart = kinds(&page).await;
    assert_eq!(after_restart["user"], 1, "{after_restart}");
    assert_eq!(after_restart["answer"], 1, "{after_restart}");
    // A fresh page shows exactly the same.
    let text = eval(&page, "document.getElementById('transcript').innerText").await;
    let url = eval(&page, "location.href").await;
    let fresh = new_person_page(&browser, url.as_str().unwrap()).await;
    login(&fresh, &tokens[0]).await;
    until(
        &fresh,
        "document.getElementById('status').textContent.includes('idle')",
    )
    .await;
    assert_eq!(kinds(&fresh).await, after_restart);
    assert_eq!(
        eval(&fresh, "document.getElementById('transcript').innerText").await,
        text
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_inbox_is_usable_on_a_phone() {
    let Some(browser) = chromium().await else {
        return;
    };
    let (cluster, tokens) = cluster_with(&[("abe", Role::Approver)]).await;
    cluster.model.push(Reply::tool_call(
        "b1",
        "bash",
        json!({"command": "git push origin main --force-with-lease"}),
    ));
    cluster.model.push(Reply::text("pushed"));
    let page = new_person_page(&browser, &base(&cluster)).await;
    page.execute(SetDeviceMetricsOverrideParams::new(360, 780, 2.0, true))
        .await
        .unwrap();
    login(&page, &tokens[0]).await;
    click(&page, "#new-session", "New session").await;
    fill(&page, "#message", "push it").await;
    click(&page, "#send", "Send").await;
    until(&page, "!!document.querySelector('#questions .question')").await;
    eval(&page, "location.hash = '#/inbox'").await;
    until(&page, "!!document.querySelector('#inbox .question button')").await;
    let fits = eval(
        &page,
        "document.documentElement.scrollWidth <= 360 && [...document.querySelectorAll('#inbox button')]\
         .every(b => { const r = b.getBoundingClientRect(); return r.left >= 0 && r.right <= 360 && r.height >= 32; })",
    )
    .await;
    assert_eq!(
        fits, true,
        "nothing wider than the screen, every button in reach"
    );
    let body = eval(&page, "document.body.innerText").await;
    assert!(!body.as_str().unwrap().contains("null"), "{body}");
    let shot = page
        .screenshot(ScreenshotParams::builder().full_page(true).build())
        .await
        .unwrap();
    std::fs::write(artefacts().join("inbox-360.png"), &shot).unwrap();
    assert!(shot.len() > 1000);
    click(&page, "#inbox button", "Approve").await;
    until(&page, "!document.querySelector('#inbox .question')").await;
}
