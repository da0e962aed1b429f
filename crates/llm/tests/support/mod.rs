//! Helpers shared by the integration tests that talk to the fake model server.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use agentry_fakes::fake_model::FakeModel;
use agentry_llm::{
    ChatClient, ChatRequest, ChatStream, Completion, LlmError, Message, Provider, ProviderConfig,
    StreamEvent,
};
use futures::StreamExt;

/// A configuration for `fake` speaking `provider`, without retries.
pub fn config(fake: &FakeModel, provider: Provider) -> ProviderConfig {
    let base_url = match provider {
        Provider::OpenAi => fake.base_url(),
        Provider::Ollama | Provider::Anthropic => fake.root_url(),
    };
    let mut cfg = ProviderConfig::new(provider, base_url, "test-model");
    cfg.request_timeout = Duration::from_secs(10);
    cfg.connect_timeout = Duration::from_secs(2);
    cfg.max_retries = 0;
    cfg
}

/// A configuration with `max_retries` retries and a 10 ms base delay.
pub fn retrying(fake: &FakeModel, provider: Provider, max_retries: u32) -> ProviderConfig {
    let mut cfg = config(fake, provider);
    cfg.max_retries = max_retries;
    cfg.retry_base_delay = Duration::from_millis(10);
    cfg
}

pub fn client(cfg: ProviderConfig) -> ChatClient {
    ChatClient::new(cfg).unwrap()
}

pub fn hello() -> ChatRequest {
    ChatRequest::new(vec![Message::user("hello")])
}

/// Every item of the stream, checking that nothing follows an error.
pub async fn collect(mut stream: ChatStream) -> Vec<Result<StreamEvent, LlmError>> {
    let mut items = Vec::new();
    while let Some(item) = stream.next().await {
        let is_err = item.is_err();
        items.push(item);
        if is_err {
            assert!(
                stream.next().await.is_none(),
                "the stream must end after an error"
            );
            break;
        }
    }
    items
}

/// Runs one request that must succeed; returns the text deltas and the completion.
pub async fn run_ok(client: &ChatClient, req: ChatRequest) -> (Vec<String>, Completion) {
    let items = collect(client.stream(req).await.unwrap()).await;
    let mut deltas = Vec::new();
    let mut completion = None;
    for item in items {
        match item.unwrap() {
            StreamEvent::TextDelta(d) => {
                assert!(completion.is_none(), "text delta after Completed");
                deltas.push(d);
            }
            StreamEvent::Completed(c) => {
                assert!(completion.is_none(), "two Completed events");
                completion = Some(c);
            }
        }
    }
    (deltas, completion.expect("no Completed event"))
}

/// Runs one request whose stream must fail; returns the deltas seen before and the error.
pub async fn run_err(client: &ChatClient, req: ChatRequest) -> (Vec<String>, LlmError) {
    let items = collect(client.stream(req).await.unwrap()).await;
    let mut deltas = Vec::new();
    for item in items {
        match item {
            Ok(StreamEvent::TextDelta(d)) => deltas.push(d),
            Ok(StreamEvent::Completed(c)) => panic!("unexpected completion {c:?}"),
            Err(e) => return (deltas, e),
        }
    }
    panic!("the stream ended without an error");
}

/// The value of header `name` (lower case) in a captured header list.
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}
