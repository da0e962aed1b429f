//! The gateway over real HTTP against a real cluster: logins and cookies,
//! the anti-forgery checks, roles enforced by the orchestrator, the live
//! stream and its resumption.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentry_fakes::fake_model::Reply;
use agentry_runtime::auth::Role;
use agentry_runtime::people::People;
use agentry_testkit::Cluster;
use agentry_testkit::cluster::Service;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};
use std::time::Duration;

/// Long enough for every service to read the people file again.
const NOTICED: Duration = Duration::from_millis(1300);

/// A browser's worth of state: its cookie and its page's anti-forgery token.
struct Browser {
    http: reqwest::Client,
    base: String,
    cookie: String,
    csrf: String,
}

async fn started() -> Cluster {
    let mut cluster = Cluster::start().await.unwrap();
    cluster.start_service(Service::Gateway).await.unwrap();
    cluster
}

fn base(cluster: &Cluster) -> String {
    format!("http://{}", cluster.config.gateway.listen)
}

async fn login_response(cluster: &Cluster, token: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/api/login", base(cluster)))
        .json(&json!({"token": token}))
        .send()
        .await
        .unwrap()
}

async fn login(cluster: &Cluster, token: &str) -> Browser {
    let response = login_response(cluster, token).await;
    assert_eq!(response.status(), 200, "{:?}", response.text().await);
    let cookie = response
        .headers()
        .get("set-cookie")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let body: Value = response.json().await.unwrap();
    Browser {
        http: reqwest::Client::new(),
        base: base(cluster),
        cookie: cookie.split(';').next().unwrap().to_string(),
        csrf: body["csrf"].as_str().unwrap().to_string(),
    }
}

impl Browser {
    async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .header("x-agentry-csrf", &self.csrf)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    /// The live stream of `session`, resumed from `last_id`.
    async fn live(
        &self,
        session: &str,
        last_id: Option<&str>,
    ) -> impl futures::Stream<Item = eventsource_stream::Event> + Unpin + use<> {
        let mut request = self
            .http
            .get(format!("{}/api/sessions/{session}/live", self.base))
            .header("cookie", &self.cookie);
        if let Some(id) = last_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Box::pin(
            response
                .bytes_stream()
                .eventsource()
                .filter_map(|e| async move { e.ok() }),
        )
    }
}

/// Reads the stream until `done` says the view (entries folded by index,
/// figures, questions) is what the test waits for; returns the view and the
/// last id.
async fn until(
    stream: &mut (impl futures::Stream<Item = eventsource_stream::Event> + Unpin),
    view: &mut Value,
    done: impl Fn(&Value) -> bool,
) -> String {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .unwrap_or_else(|_| panic!("the view never got there: {view:#}"))
            .expect("the stream ended");
        if event.event != "snapshot" && event.event != "patch" {
            continue;
        }
        let data: Value = serde_json::from_str(&event.data).unwrap();
        apply(view, &event.event, &data);
        if done(view) {
            return settle(stream, view, event.id).await;
        }
    }
}

/// Reads what else comes until the stream is quiet for half a second;
/// the last id.
async fn settle(
    stream: &mut (impl futures::Stream<Item = eventsource_stream::Event> + Unpin),
    view: &mut Value,
    mut last: String,
) -> String {
    while let Ok(Some(event)) =
        tokio::time::timeout(Duration::from_millis(500), stream.next()).await
    {
        if event.event == "snapshot" || event.event == "patch" {
            apply(
                view,
                &event.event,
                &serde_json::from_str(&event.data).unwrap(),
            );
            last = event.id;
        }
    }
    last
}

/// What the console does with a message: a snapshot replaces the view, a
/// patch replaces the entries it carries.
fn apply(view: &mut Value, kind: &str, data: &Value) {
    if kind == "snapshot" || view.is_null() {
        *view = json!({"entries": [], "status": {}, "questions": []});
    }
    let entries = view["entries"].as_array_mut().unwrap();
    for entry in data["entries"].as_array().unwrap() {
        let i = entry["i"].as_u64().unwrap() as usize;
        if let Some(more) = entry["append"].as_str() {
            // More of an answer still streaming.
            let text = format!("{}{more}", entries[i]["text"].as_str().unwrap());
            entries[i]["text"] = json!(text);
            entries[i]["streaming"] = entry["streaming"].clone();
            continue;
        }
        if i < entries.len() {
            entries[i] = entry.clone();
        } else {
            assert_eq!(i, entries.len(), "an entry skipped: {data:#}");
            entries.push(entry.clone());
        }
    }
    view["status"] = data["status"].clone();
    view["questions"] = data["questions"].clone();
}

fn answers(view: &Value) -> Vec<String> {
    view["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "answer")
        .map(|e| e["text"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn logins_give_signed_cookies_and_refuse_everything_else() {
    let cluster = started().await;
    let file = cluster.config.people_file();
    let vera = People::add(&file, "vera", Role::Viewer, "test").unwrap();
    tokio::time::sleep(NOTICED).await;

    // Not logged in: refused.
    let anonymous = reqwest::get(format!("{}/api/sessions", base(&cluster)))
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    let body: Value = anonymous.json().await.unwrap();
    assert_eq!(body["reason"], "login");

    // No token, a wrong token, the service token: refused.
    assert_eq!(login_response(&cluster, "").await.status(), 401);
    assert_eq!(
        login_response(&cluster, "agentry_user_0000000000000000")
            .await
            .status(),
        401
    );
    let service = cluster.auth.service_token().unwrap().secret().to_string();
    let refused = login_response(&cluster, &service).await;
    assert_eq!(refused.status(), 401);
    assert!(refused.text().await.unwrap().contains("not a person"));

    // A person's token: a cookie only this site's scripts cannot read.
    let response = login_response(&cluster, vera.secret()).await;
    assert_eq!(response.status(), 200);
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_string();
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(cookie.contains(flag), "{cookie}");
    }
    assert!(!cookie.contains("Secure"), "no TLS here: {cookie}");
    let csp = response.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"));
    let me: Value = response.json().await.unwrap();
    assert_eq!(
        (me["name"].as_str(), me["role"].as_str()),
        (Some("vera"), Some("viewer"))
    );
    let browser = login(&cluster, vera.secret()).await;
    let (status, me) = browser.get("/api/me").await;
    assert_eq!((status, me["name"].as_str()), (200, Some("vera")));

    // A cookie changed by hand is nobody's.
    let forged = Browser {
        cookie: browser.cookie.replace("vera", "admin"),
        ..login(&cluster, vera.secret()).await
    };
    assert_eq!(forged.get("/api/me").await.0, 401);

    // Another host name (DNS rebinding) is refused.
    let rebound = reqwest::Client::new()
        .get(format!("{}/api/me", base(&cluster)))
        .header("cookie", &browser.cookie)
        .header("host", "evil.example:8080")
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), 403);

    // A person removed is logged out within a second, and the live stream
    // she had open ends.
    let mut admin = cluster.orchestrator().await.unwrap();
    let session = admin
        .create_session(agentry_proto::orchestrator::v1::CreateSessionRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut watching = browser.live(&session.id, None).await;
    let first = watching.next().await.unwrap();
    assert_eq!(first.event, "snapshot");
    People::remove(&file, "vera").unwrap();
    tokio::time::sleep(NOTICED).await;
    assert_eq!(browser.get("/api/me").await.0, 401);
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while watching.next().await.is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "the stream outlived the person");

    // Failed logins from one address are limited.
    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(
            login_response(&cluster, "agentry_user_wrong_wrong_wrong")
                .await
                .status(),
        );
    }
    assert!(
        statuses.contains(&reqwest::StatusCode::TOO_MANY_REQUESTS),
        "{statuses:?}"
    );
    let limited = login_response(&cluster, "agentry_user_wrong_wrong_wrong").await;
    assert!(limited.headers().contains_key("retry-after"));
}

#[tokio::test(flavor = "multi_thread")]
async fn changes_need_the_page_token_this_origin_and_the_role() {
    let cluster = started().await;
    let file = cluster.config.people_file();
    let vera = People::add(&file, "vera", Role::Viewer, "test").unwrap();
    let abe = People::add(&file, "abe", Role::Approver, "test").unwrap();
    tokio::time::sleep(NOTICED).await;
    let abe = login(&cluster, abe.secret()).await;
    let vera = login(&cluster, vera.secret()).await;

    // Without the page's token, from another site, as a form, or with
    // another person's page token: refused.
    let url = format!("{}/api/sessions", abe.base);
    for (csrf, extra, form) in [
        (None, None, false),
        (
            Some(&abe.csrf),
            Some(("origin", "https://evil.example")),
            false,
        ),
        (Some(&abe.csrf), None, true),
        (Some(&vera.csrf), None, false),
    ] {
        let mut request = abe.http.post(&url).header("cookie", &abe.cookie);
        if let Some(csrf) = csrf {
            request = request.header("x-agentry-csrf", csrf);
        }
        if let Some((name, value)) = extra {
            request = request.header(name, value);
        }
        request = if form {
            request
                .header("content-type", "application/x-www-form-urlencoded")
                .body("title=x")
        } else {
            request.json(&json!({}))
        };
        let status = request.send().await.unwrap().status();
        assert_eq!(status, 403, "{csrf:?} {extra:?} form: {form}");
    }

    // With them all: made, named by who made it in the log.
    let (status, session) = abe
        .post("/api/sessions", json!({"title": "from the console"}))
        .await;
    assert_eq!(status, 200, "{session}");
    let id = session["id"].as_str().unwrap().to_string();

    // A fork records who made it.
    let (status, forked) = abe
        .post(&format!("/api/sessions/{id}/fork"), json!({}))
        .await;
    assert_eq!(status, 200, "{forked}");
    let fork_id = forked["session"]["id"].as_str().unwrap().to_string();
    let mut store = cluster.store().await.unwrap();
    let log = store
        .read(agentry_proto::sessions::v1::ReadRequest {
            session_id: fork_id,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .events;
    let made = log
        .iter()
        .find(|e| {
            matches!(
                e.kind,
                Some(agentry_proto::sessions::v1::event::Kind::SessionForked(_))
            )
        })
        .expect("the fork says where it comes from");
    assert_eq!(made.by, "abe");

    // A viewer's hand-made change is refused by the orchestrator.
    let (status, refused) = vera
        .post(
            &format!("/api/sessions/{id}/messages"),
            json!({"text": "hi"}),
        )
        .await;
    assert_eq!(status, 403, "{refused}");
    assert_eq!(refused["reason"], "role_too_low");
    assert!(refused["error"].as_str().unwrap().starts_with("vera"));
    // A bad body says what is wrong.
    let (status, bad) = abe
        .post(
            &format!("/api/sessions/{id}/approvals/c1"),
            json!({"decision": "maybe"}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(bad["error"].as_str().unwrap().contains("approve"), "{bad}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_turn_streams_to_two_people_who_see_the_same_and_only_the_approver_answers() {
    let mut cluster = started().await;
    let file = cluster.config.people_file();
    let vera = People::add(&file, "vera", Role::Viewer, "test").unwrap();
    let abe = People::add(&file, "abe", Role::Approver, "test").unwrap();
    tokio::time::sleep(NOTICED).await;
    let abe = login(&cluster, abe.secret()).await;
    let vera = login(&cluster, vera.secret()).await;
    cluster.model.push(Reply::tool_call(
        "t1",
        "bash",
        json!({"command": "touch from-the-console.txt"}),
    ));
    cluster.model.push(Reply::text("made <b>it</b>"));

    let (_, session) = abe.post("/api/sessions", json!({})).await;
    let id = session["id"].as_str().unwrap().to_string();
    let mut abe_live = abe.live(&id, None).await;
    let mut vera_live = vera.live(&id, None).await;
    let (mut abe_view, mut vera_view) = (Value::Null, Value::Null);
    let (status, sent) = abe
        .post(
            &format!("/api/sessions/{id}/messages"),
            json!({"text": "make a file"}),
        )
        .await;
    assert_eq!(status, 200, "{sent}");

    let asked = |v: &Value| !v["questions"].as_array().unwrap().is_empty();
    until(&mut abe_live, &mut abe_view, asked).await;
    until(&mut vera_live, &mut vera_view, asked).await;
    let question = abe_view["questions"][0].clone();
    assert_eq!(question["tool"], "bash");
    let call = question["call_id"].as_str().unwrap().to_string();
    // The inbox lists it across sessions.
    let (_, inbox) = vera.get("/api/approvals").await;
    assert_eq!(inbox["approvals"][0]["call_id"], call.as_str());
    // The session list shows the badge.
    let (_, listed) = vera.get("/api/sessions").await;
    let listed = listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id.as_str())
        .unwrap()
        .clone();
    assert_eq!(listed["waiting"], 1);

    // The viewer cannot answer, however sent.
    let path = format!("/api/sessions/{id}/approvals/{call}");
    let (status, _) = vera.post(&path, json!({"decision": "approve"})).await;
    assert_eq!(status, 403);
    // The approver does; both see the turn end the same way.
    let (status, answered) = abe.post(&path, json!({"decision": "approve"})).await;
    assert_eq!(status, 200, "{answered}");
    let finished = |v: &Value| {
        v["status"]["turn_open"] == false && answers(v).iter().any(|a| a.contains("made"))
    };
    let abe_id = until(&mut abe_live, &mut abe_view, finished).await;
    let vera_id = until(&mut vera_live, &mut vera_view, finished).await;
    assert_eq!(abe_view, vera_view);
    assert_eq!(abe_id, vera_id);
    // The model's HTML is text in the view.
    assert_eq!(answers(&abe_view), ["made <b>it</b>"]);
    let tool = abe_view["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["kind"] == "tool")
        .unwrap();
    assert_eq!(tool["state"], "done");
    assert!(
        tool["decision"]
            .as_str()
            .unwrap()
            .contains("approved by abe"),
        "{tool}"
    );

    // Reconnecting with the last id sends nothing again...
    let mut again = abe.live(&id, Some(&abe_id)).await;
    let quiet = tokio::time::timeout(Duration::from_millis(500), again.next()).await;
    assert!(quiet.is_err(), "nothing new, nothing sent: {quiet:?}");
    // ...a stale one gets the view as of now, and after a gateway restart
    // too: the same view, nothing missing, nothing twice.
    cluster.restart_service(Service::Gateway).await.unwrap();
    let mut resumed = abe.live(&id, Some("1.1")).await;
    let mut view = Value::Null;
    until(&mut resumed, &mut view, finished).await;
    assert_eq!(view, abe_view);
    // The login survives the restart (the signing key is kept).
    assert_eq!(abe.get("/api/me").await.0, 200);
}

/// A CA and a certificate it signed for 127.0.0.1, as PEM files.
fn write_pki(dir: &std::path::Path) -> (String, String, Vec<u8>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (
        cert_path.display().to_string(),
        key_path.display().to_string(),
        ca.pem().into_bytes(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn beyond_loopback_it_serves_tls_or_refuses_to_start() {
    // Beyond loopback in clear text: refused, saying what to do.
    let cluster = Cluster::start().await.unwrap();
    let mut open = cluster.config.clone();
    open.gateway.listen = "0.0.0.0:0".parse().unwrap();
    let refused = agentry_gateway::Gateway::new(&open, &cluster.auth)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        refused.contains("beyond loopback") && refused.contains("gateway.tls_cert"),
        "{refused}"
    );
    // Credentials off: loopback only, whatever else is said.
    let mut private = open.clone();
    private.gateway.private_network = true;
    assert!(agentry_gateway::Gateway::new(&private, &cluster.auth).is_ok());
    let refused = agentry_gateway::Gateway::new(&private, &agentry_runtime::Auth::off())
        .err()
        .expect("refused")
        .to_string();
    assert!(refused.contains("credentials are off"), "{refused}");
    let mut half = cluster.config.clone();
    half.gateway.tls_cert = "/nowhere/cert.pem".into();
    let refused = agentry_gateway::Gateway::new(&half, &cluster.auth)
        .err()
        .expect("refused")
        .to_string();
    assert!(refused.contains("both"), "{refused}");
    drop(cluster);

    // With a certificate: HTTPS, and Secure cookies.
    let pki = tempfile::tempdir().unwrap();
    let (cert, key, ca) = write_pki(pki.path());
    let mut cluster = Cluster::start_with(|c| {
        c.gateway.tls_cert = cert.clone();
        c.gateway.tls_key = key.clone();
    })
    .await
    .unwrap();
    cluster.start_service(Service::Gateway).await.unwrap();
    let https = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    let base = format!("https://{}", cluster.config.gateway.listen);
    let health = https.get(format!("{base}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let token = cluster.auth.client_token().unwrap().secret().to_string();
    let login = https
        .post(format!("{base}/api/login"))
        .json(&json!({"token": token}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status(), 200);
    let cookie = login.headers()["set-cookie"].to_str().unwrap();
    assert!(cookie.contains("; Secure"), "{cookie}");
    // Clear text to the same port gets nowhere.
    let plain = reqwest::get(format!("http://{}/healthz", cluster.config.gateway.listen)).await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
}
