//! What the fake says about its context window, in the shape of one kind of
//! real server: llama.cpp's `/props`, vLLM's `/v1/models`, Ollama's
//! `/api/ps` and `/api/show`. Other servers' endpoints answer 404, as the
//! real ones do.

use super::*;

/// The model server the fake poses as when asked about its context window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ServerKind {
    /// Says nothing about its window (OpenAI's API).
    #[default]
    Silent,
    /// llama.cpp still loading its model: 503 on every endpoint but chat.
    Loading,
    /// llama.cpp: `GET /props` → `default_generation_settings.n_ctx`.
    LlamaCpp {
        /// The context of each slot.
        n_ctx: u32,
    },
    /// vLLM: `max_model_len` in each `/v1/models` entry.
    Vllm {
        /// The longest sequence the server accepts.
        max_model_len: u32,
    },
    /// Ollama: `/api/show` (trained `context_length`, optional `num_ctx`
    /// parameter) and `/api/ps` (the loaded model's `context_length`).
    Ollama {
        /// The model's trained context length.
        trained: u32,
        /// The context the loaded model runs with; `None`: not loaded.
        loaded: Option<u32>,
        /// A `num_ctx` line in the model's parameters.
        num_ctx: Option<u32>,
    },
}

pub(super) async fn props(State(shared): State<Arc<Shared>>) -> Response {
    match shared.lock().server {
        ServerKind::LlamaCpp { n_ctx } => json_response(
            StatusCode::OK,
            &json!({"default_generation_settings": {"n_ctx": n_ctx, "params": {}},
                    "total_slots": 1, "model_path": "fake.gguf"}),
        ),
        ServerKind::Loading => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}),
        ),
        _ => error_response(404, "File Not Found"),
    }
}

pub(super) async fn ollama_ps(State(shared): State<Arc<Shared>>) -> Response {
    match shared.lock().server {
        ServerKind::Ollama { loaded, .. } => {
            let models: Vec<Value> = loaded
                .map(|n| {
                    json!({"name": "fake-model:latest", "model": "fake-model:latest",
                                "size": 0, "context_length": n})
                })
                .into_iter()
                .collect();
            json_response(StatusCode::OK, &json!({ "models": models }))
        }
        _ => error_response(404, "404 page not found"),
    }
}

pub(super) async fn ollama_show(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let server = shared.lock().server.clone();
    let ServerKind::Ollama {
        trained, num_ctx, ..
    } = server
    else {
        return error_response(404, "404 page not found");
    };
    let asked = serde_json::from_slice::<Value>(&body).unwrap_or_default();
    let Some(model) = asked["model"].as_str().or(asked["name"].as_str()) else {
        return protocol_error(Protocol::Ollama, 400, "model is required");
    };
    if !model.starts_with("fake-model") {
        return protocol_error(Protocol::Ollama, 404, &format!("model '{model}' not found"));
    }
    let mut parameters = "stop \"<|im_end|>\"".to_string();
    if let Some(n) = num_ctx {
        parameters.push_str(&format!("\nnum_ctx                        {n}"));
    }
    json_response(
        StatusCode::OK,
        &json!({
            "parameters": parameters,
            "template": "{{ .Prompt }}",
            "details": {"format": "gguf", "family": "fake"},
            "model_info": {"general.architecture": "fake", "fake.context_length": trained},
        }),
    )
}
