//! Asking the model server for its context window, against the fake posing
//! as each kind of server over real HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use agentry_fakes::fake_model::{FakeModel, Reply, ServerKind};
use agentry_llm::{ChatClient, LlmError, Provider, ServerWindow, WindowKind};
use futures::StreamExt;
use pretty_assertions::assert_eq;
use support::{client, config, hello};

const WAIT: Duration = Duration::from_secs(2);

fn named(fake: &FakeModel, provider: Provider) -> ChatClient {
    let mut cfg = config(fake, provider);
    cfg.model = "fake-model".to_string();
    client(cfg)
}

fn serving(tokens: u32, source: &str) -> Option<ServerWindow> {
    Some(ServerWindow {
        tokens: Some(tokens),
        kind: WindowKind::Serving,
        source: source.to_string(),
    })
}

#[tokio::test]
async fn each_kind_of_server_states_its_window_where_it_can() {
    let fake = FakeModel::start().await.unwrap();
    let openai = named(&fake, Provider::OpenAi);
    let native = named(&fake, Provider::Ollama);

    // OpenAI's API says nothing.
    assert_eq!(openai.server_context_window(WAIT).await.unwrap(), None);

    fake.set_server(ServerKind::LlamaCpp { n_ctx: 2048 });
    assert_eq!(
        openai.server_context_window(WAIT).await.unwrap(),
        serving(2048, "llama.cpp /props (default_generation_settings.n_ctx)")
    );

    fake.set_server(ServerKind::Vllm {
        max_model_len: 16384,
    });
    assert_eq!(
        openai.server_context_window(WAIT).await.unwrap(),
        serving(16384, "vLLM /v1/models (max_model_len)")
    );

    // Ollama behind its OpenAI endpoint: the loaded model's context, else
    // the num_ctx parameter, else unknown.
    fake.set_server(ServerKind::Ollama {
        trained: 32768,
        loaded: Some(4096),
        num_ctx: Some(8192),
    });
    assert_eq!(
        openai.server_context_window(WAIT).await.unwrap(),
        serving(4096, "Ollama /api/ps (context_length)")
    );
    fake.set_server(ServerKind::Ollama {
        trained: 32768,
        loaded: None,
        num_ctx: Some(8192),
    });
    assert_eq!(
        openai.server_context_window(WAIT).await.unwrap(),
        serving(8192, "Ollama /api/show (num_ctx)")
    );
    fake.set_server(ServerKind::Ollama {
        trained: 32768,
        loaded: None,
        num_ctx: None,
    });
    let unknown = openai.server_context_window(WAIT).await.unwrap().unwrap();
    assert_eq!(unknown.tokens, None);
    assert!(
        unknown.source.contains("OLLAMA_CONTEXT_LENGTH"),
        "{unknown:?}"
    );

    // Ollama's native API: the most the model can take (the client asks
    // for its window with each request).
    assert_eq!(
        native.server_context_window(WAIT).await.unwrap(),
        Some(ServerWindow {
            tokens: Some(32768),
            kind: WindowKind::Trained,
            source: "Ollama /api/show (the model's context_length)".to_string(),
        })
    );
}

#[tokio::test]
async fn a_server_still_loading_says_so() {
    let fake = FakeModel::start().await.unwrap();
    fake.set_server(ServerKind::Loading);
    let err = named(&fake, Provider::OpenAi)
        .server_context_window(WAIT)
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::Http { status: 503, .. }), "{err:?}");
}

#[tokio::test]
async fn a_server_that_cannot_be_reached_is_an_error() {
    let fake = FakeModel::start().await.unwrap();
    let client = named(&fake, Provider::OpenAi);
    drop(fake);
    let err = client.server_context_window(WAIT).await.unwrap_err();
    assert!(matches!(err, LlmError::Connect { .. }), "{err:?}");
}

#[tokio::test]
async fn the_native_ollama_client_asks_for_its_window_with_every_request() {
    let fake = FakeModel::start().await.unwrap();
    let client = named(&fake, Provider::Ollama).with_context_window(4096);
    fake.push(Reply::text("hi"));
    let mut stream = client.stream(hello()).await.unwrap();
    while stream.next().await.is_some() {}
    let sent = fake.requests();
    assert_eq!(sent[0]["options"]["num_ctx"], 4096);
    // Without a window, no options are sent.
    let plain = named(&fake, Provider::Ollama);
    fake.push(Reply::text("hi"));
    let mut stream = plain.stream(hello()).await.unwrap();
    while stream.next().await.is_some() {}
    assert_eq!(fake.requests()[1].get("options"), None);
}
