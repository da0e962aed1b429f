//! `agentry doctor`: checks what a working agent needs, each with the fix
//! when it fails: the model server and the model, a tool call, the context
//! window, the data directory, the client token, and (when they run) the
//! services, the sandbox's layers and the MCP servers.

use crate::client::print_line;
use agentry_llm::{ChatRequest, Message, StreamEvent, ToolDefinition};
use agentry_runtime::Config;
use futures::StreamExt;
use std::process::ExitCode;
use std::time::Duration;

/// How long one probe of the model server may take.
const PROBE: Duration = Duration::from_secs(10);
/// How long the tool-call probe may take (a model answers).
const TOOL_PROBE: Duration = Duration::from_secs(120);

/// The checks' outcomes, printed as they come.
#[derive(Default)]
struct Report {
    failed: usize,
}

impl Report {
    fn ok(&mut self, what: impl AsRef<str>) -> anyhow::Result<()> {
        print_line(format!("  ok    {}", what.as_ref()))
    }

    fn warn(&mut self, what: impl AsRef<str>, fix: impl AsRef<str>) -> anyhow::Result<()> {
        print_line(format!(
            "  warn  {}\n        {}",
            what.as_ref(),
            fix.as_ref()
        ))
    }

    fn fail(&mut self, what: impl AsRef<str>, fix: impl AsRef<str>) -> anyhow::Result<()> {
        self.failed += 1;
        print_line(format!(
            "  FAIL  {}\n        fix: {}",
            what.as_ref(),
            fix.as_ref()
        ))
    }
}

/// Runs every check; exit 0 when none failed, 1 otherwise.
pub async fn run(config: &Config) -> anyhow::Result<ExitCode> {
    let mut report = Report::default();
    print_line("model")?;
    model(config, &mut report).await?;
    print_line("this machine")?;
    local(config, &mut report)?;
    print_line("services")?;
    services(config, &mut report).await?;
    if report.failed == 0 {
        print_line("all checks passed")?;
        Ok(ExitCode::SUCCESS)
    } else {
        print_line(format!(
            "{} check{} failed",
            report.failed,
            if report.failed == 1 { "" } else { "s" }
        ))?;
        Ok(ExitCode::FAILURE)
    }
}

/// Where the model settings come from, for fixes.
const MODEL_SETTINGS: &str = "AGENTRY_LLM_BASE_URL / AGENTRY_LLM_MODEL (or [llm] base_url and \
                              model in config/local.toml)";

async fn model(config: &Config, report: &mut Report) -> anyhow::Result<()> {
    let url = &config.llm.base_url;
    let name = &config.llm.model;
    let client = match agentry_orchestrator::llm_client(config) {
        Ok(client) => client.with_context_window(0),
        Err(e) => {
            return report.fail(
                format!("the model settings are not usable: {e}"),
                format!("correct {MODEL_SETTINGS}"),
            );
        }
    };
    match client.listed_models(PROBE).await {
        Err(e) => {
            return report.fail(
                format!("model server {url} does not answer: {e}"),
                format!(
                    "start it (`ollama serve`, `llama-server -m model.gguf --jinja`, …), or \
                     point {MODEL_SETTINGS} at one that runs"
                ),
            );
        }
        Ok(Some(models))
            if models
                .iter()
                .any(|m| m == name || m == &format!("{name}:latest")) =>
        {
            report.ok(format!("model server {url} answers and lists {name}"))?;
        }
        Ok(Some(models)) if models.is_empty() => {
            report.fail(
                format!("model server {url} answers but lists no model"),
                format!("load or pull one (`ollama pull {name}`), or set {MODEL_SETTINGS}"),
            )?;
        }
        Ok(Some(models)) => {
            let shown: Vec<&str> = models.iter().take(8).map(String::as_str).collect();
            report.fail(
                format!(
                    "model {name} is not listed by the server at {url} (it lists: {}{})",
                    shown.join(", "),
                    if models.len() > shown.len() {
                        ", …"
                    } else {
                        ""
                    }
                ),
                format!("use one of them (AGENTRY_LLM_MODEL), or `ollama pull {name}`"),
            )?;
        }
        Ok(None) => {
            report.ok(format!(
                "model server {url} answers (it does not list its models)"
            ))?;
        }
    }
    match client.server_context_window(PROBE).await {
        Ok(Some(window)) => match window.tokens {
            Some(tokens) if config.llm.context_window > 0 && tokens < config.llm.context_window => {
                report.warn(
                    format!(
                        "the server gives the model {tokens} tokens ({}), less than \
                         llm.context_window = {}",
                        window.source, config.llm.context_window
                    ),
                    "the orchestrator plans for the smaller number; raise the server's window \
                     (llama-server -c, OLLAMA_CONTEXT_LENGTH) for longer conversations",
                )?;
            }
            Some(tokens) => {
                report.ok(format!(
                    "context window {tokens} tokens ({})",
                    window.source
                ))?;
            }
            None => report.ok(format!(
                "context window: {} does not say yet (the model is not loaded)",
                window.source
            ))?,
        },
        Ok(None) => report.ok(format!(
            "context window: the server does not say; {} tokens are planned for",
            if config.llm.context_window > 0 {
                config.llm.context_window.to_string()
            } else {
                "the model's known".to_string()
            }
        ))?,
        Err(e) => report.warn(
            format!("cannot ask for the context window: {e}"),
            "set llm.context_window to the server's window",
        )?,
    }
    tool_probe(&client, report).await
}

/// One request offering one tool and asking for it: the model must call it.
async fn tool_probe(client: &agentry_llm::ChatClient, report: &mut Report) -> anyhow::Result<()> {
    let request = ChatRequest {
        messages: vec![
            Message::system("You check that tool calling works. Call the tool you are given."),
            Message::user("Call the `ping` tool now, with no arguments."),
        ],
        tools: vec![ToolDefinition {
            name: "ping".into(),
            description: "Answers pong. Call it when asked to.".into(),
            parameters: serde_json::json!({"type": "object", "properties": {}}),
        }],
        temperature: Some(0.0),
        require_tool: false,
    };
    let attempt = async {
        let mut stream = client.stream(&request).await?;
        while let Some(item) = stream.next().await {
            if let StreamEvent::Completed(done) = item? {
                return Ok(Some(done));
            }
        }
        Ok::<_, agentry_llm::LlmError>(None)
    };
    match tokio::time::timeout(TOOL_PROBE, attempt).await {
        Ok(Ok(Some(done))) if done.tool_calls.iter().any(|c| c.name == "ping") => {
            report.ok("the model calls tools (a one-call probe)")
        }
        Ok(Ok(Some(done))) => report.warn(
            format!(
                "the model answered the tool probe in text instead of calling the tool: {:?}",
                done.text.chars().take(80).collect::<String>()
            ),
            "small models may need llm.tool_choice = \"required\", or a profile with text \
             calls (README, \"Point it at a model\")",
        ),
        Ok(Ok(None)) => report.fail(
            "the model's answer to the tool probe ended early",
            "see the model server's log",
        ),
        Ok(Err(e)) => report.fail(
            format!("the tool probe failed: {e}"),
            format!("check the model server's log and {MODEL_SETTINGS}"),
        ),
        Err(_) => report.warn(
            format!(
                "the model did not answer the tool probe within {} s",
                TOOL_PROBE.as_secs()
            ),
            "a slow or still-loading model; try again, or raise llm.request_timeout_secs",
        ),
    }
}

fn local(config: &Config, report: &mut Report) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let data = config.data_dir();
    match std::fs::metadata(&data) {
        Err(_) => report.ok(format!(
            "data directory {} (made at the first start)",
            data.display()
        ))?,
        Ok(meta) => {
            let me = nix::unistd::geteuid().as_raw();
            if meta.mode() & 0o022 != 0 {
                report.fail(
                    format!(
                        "data directory {} can be written by others (mode {:o})",
                        data.display(),
                        meta.mode() & 0o777
                    ),
                    format!("chmod 700 {}", data.display()),
                )?;
            } else if meta.uid() != me {
                report.warn(
                    format!(
                        "data directory {} belongs to uid {}, not to you (uid {me})",
                        data.display(),
                        meta.uid()
                    ),
                    "run the services and the CLI as the same user, or set AGENTRY_DATA_DIR",
                )?;
            } else {
                report.ok(format!("data directory {}", data.display()))?;
            }
        }
    }
    match crate::client::credentials(config) {
        Ok(auth) => match auth.missing_token() {
            None => report.ok("client token found")?,
            Some(why) => report.warn(
                format!("no client token yet: {why}"),
                "it is made at the services' first start; elsewhere set AGENTRY_TOKEN to the \
                 output of `agentry token`",
            )?,
        },
        Err(e) => report.fail(
            format!("the client credentials cannot be read: {e}"),
            "check AGENTRY_TOKEN / auth.client_token_file",
        )?,
    }
    Ok(())
}

async fn services(config: &Config, report: &mut Report) -> anyhow::Result<()> {
    let url = &config.orchestrator.url;
    let mut client = match tokio::time::timeout(PROBE, crate::client::connect(config)).await {
        Ok(Ok(client)) => client,
        _ => {
            return report.warn(
                format!("no services answer at {url}"),
                "start them with `agentry up` (or just run `agentry`, which starts them for \
                 its chat)",
            );
        }
    };
    let tools = match client
        .list_tools(agentry_proto::orchestrator::v1::ListToolsRequest::default())
        .await
    {
        Ok(tools) => tools.into_inner(),
        Err(status) => {
            return report.fail(
                format!(
                    "the orchestrator at {url} answers, but: {}",
                    status.message()
                ),
                "see the services' log (`agentry up` prints it)",
            );
        }
    };
    report.ok(format!(
        "services answer at {url}; {} tools offered",
        tools.tools.len()
    ))?;
    for server in &tools.mcp_servers {
        if server.state == "ready" {
            report.ok(format!(
                "MCP server {}: {} tools",
                server.name, server.tool_count
            ))?;
        } else {
            report.fail(
                format!(
                    "MCP server {} is {}{}",
                    server.name,
                    server.state,
                    if server.error.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", server.error.lines().next().unwrap_or_default())
                    }
                ),
                "`agentry mcp list` shows it; correct its entry in the configuration",
            )?;
        }
    }
    // The sandbox's layers, as the tool runner reports them.
    let auth = crate::client::credentials(config)?;
    let runner_url = config
        .tool_runner
        .url
        .split(',')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    if let Ok(channel) = auth.endpoint(&runner_url).map(|e| e.connect_lazy()) {
        let mut runner =
            agentry_proto::tools::v1::tool_runner_client::ToolRunnerClient::new(auth.wrap(channel));
        let listed = tokio::time::timeout(
            PROBE,
            runner.list_tools(agentry_proto::tools::v1::ListToolsRequest::default()),
        )
        .await;
        if let Ok(Ok(listed)) = listed {
            for line in listed.into_inner().sandbox {
                if line.contains("OFF") {
                    report.warn(
                        format!("sandbox {line}"),
                        "docs/security.md, \"Where layers are missing\", says what this \
                         leaves open and how to get the layer",
                    )?;
                } else {
                    report.ok(format!("sandbox {line}"))?;
                }
            }
        }
    }
    Ok(())
}
