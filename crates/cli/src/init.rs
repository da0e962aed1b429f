//! `agentry init`: a starter configuration. Looks for model servers on
//! their usual local ports (and any URL given), lists their models, asks
//! which to use, and writes `[llm]` to `local.toml` in the configuration
//! directory.

use crate::client::print_line;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// A model server looked for: its name, wire protocol and base URL.
struct Candidate {
    name: &'static str,
    provider: agentry_llm::Provider,
    base_url: String,
}

/// The usual local ports.
fn usual() -> Vec<Candidate> {
    use agentry_llm::Provider;
    [
        ("Ollama", Provider::Ollama, "http://127.0.0.1:11434"),
        ("llama.cpp", Provider::OpenAi, "http://127.0.0.1:8080/v1"),
        ("LM Studio", Provider::OpenAi, "http://127.0.0.1:1234/v1"),
        ("vLLM", Provider::OpenAi, "http://127.0.0.1:8000/v1"),
    ]
    .into_iter()
    .map(|(name, provider, base_url)| Candidate {
        name,
        provider,
        base_url: base_url.to_string(),
    })
    .collect()
}

/// One model a server offers.
struct Choice {
    server: &'static str,
    provider: agentry_llm::Provider,
    base_url: String,
    model: String,
}

/// The models of each server that answers.
async fn discover(extra: &[String]) -> Vec<Choice> {
    let mut candidates: Vec<Candidate> = extra
        .iter()
        .map(|url| Candidate {
            name: "the server given",
            provider: agentry_llm::Provider::OpenAi,
            base_url: url.trim_end_matches('/').to_string(),
        })
        .collect();
    candidates.extend(usual());
    let mut choices = Vec::new();
    for candidate in candidates {
        let mut config = agentry_llm::ProviderConfig::new(
            candidate.provider,
            candidate.base_url.clone(),
            "probe",
        );
        config.connect_timeout = Duration::from_secs(1);
        let Ok(client) = agentry_llm::ChatClient::new(config) else {
            continue;
        };
        if let Ok(Some(models)) = client.listed_models(Duration::from_secs(2)).await {
            for model in models {
                choices.push(Choice {
                    server: candidate.name,
                    provider: candidate.provider,
                    base_url: candidate.base_url.clone(),
                    model,
                });
            }
        }
    }
    choices
}

/// The directory `local.toml` goes to: the one configured, else the
/// person's `~/.config/agentry`.
fn target_dir(config: &agentry_runtime::Config) -> anyhow::Result<PathBuf> {
    if let Some(dir) = &config.config_dir {
        return Ok(dir.clone());
    }
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".config"))
        })
        .ok_or_else(|| {
            anyhow::anyhow!("no HOME to put the configuration in; set AGENTRY_CONFIG_DIR")
        })?;
    Ok(base.join("agentry"))
}

/// The `[llm]` table for `choice`.
fn llm_table(choice: &Choice) -> String {
    let provider = match choice.provider {
        agentry_llm::Provider::Ollama => "ollama",
        agentry_llm::Provider::Anthropic => "anthropic",
        agentry_llm::Provider::OpenAi => "openai",
    };
    format!(
        "# Written by `agentry init`: the model {} serves. `agentry doctor` checks it.\n\
         [llm]\nprovider = {provider:?}\nbase_url = {:?}\nmodel = {:?}\n",
        choice.server, choice.base_url, choice.model
    )
}

/// `agentry init [--url URL…] [--force]`.
pub async fn run(
    config: &agentry_runtime::Config,
    urls: &[String],
    force: bool,
) -> anyhow::Result<ExitCode> {
    let dir = target_dir(config)?;
    let file = dir.join("local.toml");
    if file.exists() && !force {
        anyhow::bail!(
            "{} exists; nothing was changed. Edit it, or run `agentry init --force` to replace \
             it (the old one is kept as local.toml.bak)",
            file.display()
        );
    }
    print_line(
        "looking for model servers (Ollama 11434, llama.cpp 8080, LM Studio 1234, vLLM 8000)…",
    )?;
    let choices = discover(urls).await;
    if choices.is_empty() {
        print_line(
            "no model server answers on this machine. Start one (`ollama serve` and `ollama pull \
             qwen2.5:7b`, or `llama-server -m model.gguf --jinja -c 16384`), or name one with \
             `agentry init --url http://host:port/v1`; README, \"Point it at a model\", lists \
             the settings for remote ones.",
        )?;
        return Ok(ExitCode::FAILURE);
    }
    for (n, choice) in choices.iter().enumerate() {
        print_line(format!(
            "  {:>2}. {} ({}, {})",
            n + 1,
            choice.model,
            choice.server,
            choice.base_url
        ))?;
    }
    print_line(format!("which model? [1-{}, Enter: 1]", choices.len()))?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    let answer = answer.trim();
    let index = if answer.is_empty() {
        0
    } else {
        match answer.parse::<usize>() {
            Ok(n) if (1..=choices.len()).contains(&n) => n - 1,
            _ => anyhow::bail!(
                "{answer:?} is not one of 1-{}; nothing was written",
                choices.len()
            ),
        }
    };
    write(&dir, &file, &llm_table(&choices[index]))?;
    print_line(format!(
        "wrote {} ({} from {}). Next: `agentry doctor`, then `agentry` in your project.",
        file.display(),
        choices[index].model,
        choices[index].base_url
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// Writes `text` to `file` (its directory made, an old file kept as
/// `.bak`).
fn write(dir: &Path, file: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    if file.exists() {
        let backup = file.with_extension("toml.bak");
        std::fs::copy(file, &backup)
            .map_err(|e| anyhow::anyhow!("cannot keep {}: {e}", backup.display()))?;
    }
    std::fs::write(file, text).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", file.display()))
}
