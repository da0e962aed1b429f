//! The context window as the model server states it.
//!
//! A window configured by hand and the one the server really gives the
//! model drift apart easily (llama.cpp's `--ctx-size`, vLLM's
//! `--max-model-len`, Ollama's `OLLAMA_CONTEXT_LENGTH`), and a server
//! given a longer prompt than its window drops the oldest part silently,
//! the system prompt first. So the server is asked where it can say:
//!
//! | server | asked | number |
//! |---|---|---|
//! | llama.cpp | `GET {root}/props` | `default_generation_settings.n_ctx` (per slot) |
//! | vLLM | `GET {base}/models` | the model's `max_model_len` |
//! | Ollama, OpenAI endpoint | `GET {root}/api/ps`, `POST {root}/api/show` | the loaded model's `context_length`, else the model's `num_ctx` parameter |
//! | LM Studio | `GET {root}/api/v0/models/{model}` | `loaded_context_length` |
//! | Ollama, native API | `POST {root}/api/show` | the model's trained `context_length` (the client then sets `options.num_ctx` itself) |
//!
//! `root` is the base URL without a trailing `/v1`. Answers that are not
//! the expected JSON (404 from other servers) mean "not this server"; only
//! a server that cannot be reached at all is an error.

use std::time::Duration;

use reqwest::header::{ACCEPT, AUTHORIZATION};
use serde_json::{Value, json};

use crate::{ChatClient, LlmError, Provider};

/// What a number from the server means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// The window the server gives every request now.
    Serving,
    /// The most the model can be given; the client asks for its window with
    /// each request (Ollama's `options.num_ctx`).
    Trained,
}

/// A context window stated by the model server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerWindow {
    /// The window in tokens, `None` when the server was recognised but
    /// does not say (a model Ollama has not loaded yet, with no `num_ctx`).
    pub tokens: Option<u32>,
    /// What the number means.
    pub kind: WindowKind,
    /// Where it was read, for messages, e.g. `llama.cpp /props (n_ctx)`.
    pub source: String,
}

impl ServerWindow {
    fn serving(tokens: u64, source: &str) -> Option<ServerWindow> {
        let tokens = u32::try_from(tokens).ok().filter(|&t| t > 0)?;
        Some(ServerWindow {
            tokens: Some(tokens),
            kind: WindowKind::Serving,
            source: source.to_string(),
        })
    }
}

impl ChatClient {
    /// Asks the model server what context window it gives the model (see
    /// the module's table). Each request waits at most `timeout`.
    ///
    /// Returns `Ok(None)` when the server does not say (OpenAI, or a server
    /// none of the known endpoints describes).
    ///
    /// # Errors
    ///
    /// [`LlmError::Connect`] or [`LlmError::Timeout`] when the server
    /// cannot be reached at all.
    pub async fn server_context_window(
        &self,
        timeout: Duration,
    ) -> Result<Option<ServerWindow>, LlmError> {
        match self.provider {
            // The Messages API does not say; the known window of the
            // model's name applies.
            Provider::Anthropic => Ok(None),
            Provider::Ollama => {
                let root = self.url.trim_end_matches("/api/chat");
                let show = self.ollama_show(root, timeout).await?;
                Ok(show
                    .as_ref()
                    .and_then(trained_context_length)
                    .map(|tokens| ServerWindow {
                        tokens: Some(tokens),
                        kind: WindowKind::Trained,
                        source: "Ollama /api/show (the model's context_length)".to_string(),
                    }))
            }
            Provider::OpenAi => {
                let base = self.url.trim_end_matches("/chat/completions");
                let root = base.strip_suffix("/v1").unwrap_or(base);
                // llama.cpp; its answer or refusal also shows the server is up.
                let props = self
                    .get_json(&format!("{root}/props"), timeout)
                    .await?
                    .and_then(|p| p["default_generation_settings"]["n_ctx"].as_u64());
                if let Some(window) = props.and_then(|n| {
                    ServerWindow::serving(n, "llama.cpp /props (default_generation_settings.n_ctx)")
                }) {
                    return Ok(Some(window));
                }
                // vLLM.
                let models = self.get_json(&format!("{base}/models"), timeout).await?;
                if let Some(window) = models
                    .as_ref()
                    .and_then(|m| self.listed(m))
                    .and_then(|m| m["max_model_len"].as_u64())
                    .and_then(|n| ServerWindow::serving(n, "vLLM /v1/models (max_model_len)"))
                {
                    return Ok(Some(window));
                }
                if let Some(window) = self.ollama_serving(root, timeout).await? {
                    return Ok(Some(window));
                }
                // LM Studio.
                let studio = self
                    .get_json(&format!("{root}/api/v0/models/{}", self.model), timeout)
                    .await?;
                Ok(studio.and_then(|m| {
                    m["loaded_context_length"].as_u64().and_then(|n| {
                        ServerWindow::serving(n, "LM Studio /api/v0/models (loaded_context_length)")
                    })
                }))
            }
        }
    }

    /// The models the server lists: `GET {base}/models` (`data[].id`) on
    /// the OpenAI-compatible wire, `GET {root}/api/tags` (`models[].name`)
    /// on Ollama's. `Ok(None)` when it answers without such a list (and for
    /// Anthropic, which is not asked).
    ///
    /// # Errors
    ///
    /// [`LlmError::Connect`] or [`LlmError::Timeout`] when the server
    /// cannot be reached at all.
    pub async fn listed_models(&self, timeout: Duration) -> Result<Option<Vec<String>>, LlmError> {
        let names = |list: &Value, array: &str, key: &str| -> Option<Vec<String>> {
            Some(
                list[array]
                    .as_array()?
                    .iter()
                    .filter_map(|m| m[key].as_str().map(str::to_string))
                    .collect(),
            )
        };
        match self.provider {
            Provider::Anthropic => Ok(None),
            Provider::Ollama => {
                let root = self.url.trim_end_matches("/api/chat");
                let tags = self.get_json(&format!("{root}/api/tags"), timeout).await?;
                Ok(tags.and_then(|t| names(&t, "models", "name")))
            }
            Provider::OpenAi => {
                let base = self.url.trim_end_matches("/chat/completions");
                let models = self.get_json(&format!("{base}/models"), timeout).await?;
                Ok(models.and_then(|m| names(&m, "data", "id")))
            }
        }
    }

    /// The window of Ollama's OpenAI-compatible endpoint: that of the
    /// loaded model, else the model's `num_ctx` parameter, else unknown (the
    /// server's own default applies). `None` when the server is not Ollama.
    async fn ollama_serving(
        &self,
        root: &str,
        timeout: Duration,
    ) -> Result<Option<ServerWindow>, LlmError> {
        let Some(running) = self.get_json(&format!("{root}/api/ps"), timeout).await? else {
            return Ok(None);
        };
        let Some(models) = running["models"].as_array() else {
            return Ok(None);
        };
        let loaded = models
            .iter()
            .find(|m| {
                [&m["name"], &m["model"]].iter().any(|n| {
                    n.as_str()
                        .is_some_and(|n| same_ollama_model(n, &self.model))
                })
            })
            .and_then(|m| m["context_length"].as_u64());
        if let Some(window) =
            loaded.and_then(|n| ServerWindow::serving(n, "Ollama /api/ps (context_length)"))
        {
            return Ok(Some(window));
        }
        let parameter = self
            .ollama_show(root, timeout)
            .await?
            .and_then(|show| num_ctx_parameter(&show));
        if let Some(window) =
            parameter.and_then(|n| ServerWindow::serving(n, "Ollama /api/show (num_ctx)"))
        {
            return Ok(Some(window));
        }
        Ok(Some(ServerWindow {
            tokens: None,
            kind: WindowKind::Serving,
            source: "Ollama's OpenAI-compatible endpoint (the server's context length, \
                     OLLAMA_CONTEXT_LENGTH)"
                .to_string(),
        }))
    }

    /// The model's entry in an OpenAI-style model list: the one with the
    /// configured id, or the only one.
    fn listed<'a>(&self, list: &'a Value) -> Option<&'a Value> {
        let data = list["data"].as_array()?;
        data.iter()
            .find(|m| m["id"].as_str() == Some(&*self.model))
            .or_else(|| (data.len() == 1).then(|| &data[0]))
    }

    async fn ollama_show(&self, root: &str, timeout: Duration) -> Result<Option<Value>, LlmError> {
        let request = self
            .http
            .post(format!("{root}/api/show"))
            .json(&json!({ "model": &*self.model }));
        self.send_json(request, timeout).await
    }

    async fn get_json(&self, url: &str, timeout: Duration) -> Result<Option<Value>, LlmError> {
        self.send_json(self.http.get(url), timeout).await
    }

    /// Sends a probe: the JSON of a 2xx answer, `None` for any other answer
    /// (not this kind of server), an error when the server cannot be reached.
    async fn send_json(
        &self,
        mut request: reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Option<Value>, LlmError> {
        request = request.header(ACCEPT, "application/json").timeout(timeout);
        if let Some(auth) = &self.auth {
            request = request.header(AUTHORIZATION, auth.clone());
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(e) if e.is_timeout() => return Err(LlmError::Timeout { after: timeout }),
            Err(e) => {
                return Err(LlmError::Connect {
                    url: self.url.to_string(),
                    reason: crate::client::connect_reason(&e),
                });
            }
        };
        // Still loading its model (llama.cpp answers 503 meanwhile).
        if response.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE {
            return Err(LlmError::Http {
                status: 503,
                message: "the server is not ready yet".into(),
            });
        }
        if !response.status().is_success() {
            return Ok(None);
        }
        Ok(response.json::<Value>().await.ok())
    }
}

/// Whether Ollama's name `listed` is the configured `model` (`llama3`
/// stands for `llama3:latest`).
fn same_ollama_model(listed: &str, model: &str) -> bool {
    listed == model || listed.strip_suffix(":latest") == Some(model)
}

/// The trained context length in `/api/show`'s `model_info`
/// (`<architecture>.context_length`).
fn trained_context_length(show: &Value) -> Option<u32> {
    let info = show["model_info"].as_object()?;
    let arch = info.get("general.architecture").and_then(Value::as_str);
    let key = arch.map(|a| format!("{a}.context_length"));
    key.and_then(|k| info.get(&k))
        .or_else(|| {
            info.iter()
                .find(|(k, _)| k.ends_with(".context_length"))
                .map(|(_, v)| v)
        })
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|&n| n > 0)
}

/// The `num_ctx` line of `/api/show`'s `parameters` text.
fn num_ctx_parameter(show: &Value) -> Option<u64> {
    show["parameters"].as_str()?.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("num_ctx"))
            .then(|| words.next()?.parse().ok())
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ollama_show_answers_are_read() {
        let show = json!({
            "parameters": "stop \"<|im_end|>\"\nnum_ctx                        8192\ntemperature 0.2",
            "model_info": {"general.architecture": "qwen2", "qwen2.context_length": 32768,
                           "llama.context_length": 4096},
        });
        assert_eq!(trained_context_length(&show), Some(32768));
        assert_eq!(num_ctx_parameter(&show), Some(8192));
        let bare = json!({"model_info": {"phi3.context_length": 131072}, "parameters": "stop x"});
        assert_eq!(trained_context_length(&bare), Some(131072));
        assert_eq!(num_ctx_parameter(&bare), None);
        assert_eq!(trained_context_length(&json!({})), None);
    }

    #[test]
    fn ollama_names_match_with_their_default_tag() {
        assert!(same_ollama_model("llama3:latest", "llama3"));
        assert!(same_ollama_model("qwen2.5:7b", "qwen2.5:7b"));
        assert!(!same_ollama_model("qwen2.5:7b", "qwen2.5"));
    }
}
