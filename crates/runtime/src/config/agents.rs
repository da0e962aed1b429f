//! Sub-agents: `[[agents]]` in the TOML layers, plus one Markdown file per
//! agent in the config directory's `agents/` (front matter of `key: value`
//! lines between `---` lines, then the agent's system prompt). An agent is
//! run by the built-in `delegate` tool as a child session with its own
//! prompt, only its tools, and its limits.

use super::{Config, ConfigError};
use serde::Deserialize;
use std::path::Path;

/// Longest agent name.
const MAX_NAME: usize = 40;

/// One agent a task can be delegated to.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AgentDefinition {
    /// Its name (what `delegate` is called with): letters, digits, `-`, `_`.
    pub name: String,
    /// What it is for, as the delegating model reads it.
    pub description: String,
    /// Its system prompt (none for a remote agent).
    #[serde(default)]
    pub system_prompt: String,
    /// The tools it is offered (nothing else; no `delegate`; none for a
    /// remote agent).
    #[serde(default)]
    pub tools: Vec<String>,
    /// Its model, when not the orchestrator's.
    #[serde(default)]
    pub model: Option<String>,
    /// Model calls allowed in one of its tasks (default: `agent.max_steps`).
    #[serde(default)]
    pub max_steps: Option<u32>,
    /// The context window its requests are fitted to (default: the
    /// orchestrator's).
    #[serde(default)]
    pub context_window: Option<u32>,
    /// A remote agent: the address of an A2A 1.0 agent (its base URL, or
    /// its agent card's): tasks go to it over A2A instead of to a child
    /// session here.
    #[serde(default)]
    pub url: Option<String>,
    /// For a remote agent: the environment variable (of the orchestrator)
    /// holding the bearer token it wants.
    #[serde(default)]
    pub token_env: Option<String>,
    /// The file it was read from, for messages.
    #[serde(skip)]
    pub file: Option<std::path::PathBuf>,
}

impl Config {
    /// Every configured agent: `[[agents]]`, then the files of the config
    /// directory's `agents/`, in name order. Checked: names, tools,
    /// limits, duplicates; a file's error names the file.
    pub fn agents(&self) -> Result<Vec<AgentDefinition>, ConfigError> {
        let mut agents = self.agents.clone();
        if let Some(dir) = &self.config_dir {
            agents.extend(read_agent_files(&dir.join("agents"))?);
        }
        let mut seen = std::collections::BTreeSet::new();
        for agent in &agents {
            let source = agent
                .file
                .as_ref()
                .map_or("configuration".to_string(), |f| f.display().to_string());
            let invalid = |reason: String| ConfigError::Invalid {
                source_name: source.clone(),
                reason: format!("agents {:?}: {reason}", agent.name),
            };
            check_agent(agent).map_err(invalid)?;
            if !seen.insert(agent.name.clone()) {
                return Err(invalid(
                    "is defined twice (names must be unique across [[agents]] and agents/*.md)"
                        .into(),
                ));
            }
        }
        Ok(agents)
    }
}

fn check_agent(agent: &AgentDefinition) -> Result<(), String> {
    let name_ok = !agent.name.is_empty()
        && agent.name.len() <= MAX_NAME
        && agent
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !name_ok {
        return Err(format!(
            "the name must be 1-{MAX_NAME} letters, digits, '-' or '_'"
        ));
    }
    if agent.description.trim().is_empty() {
        return Err("description must not be empty (the delegating model chooses by it)".into());
    }
    if let Some(url) = &agent.url {
        return check_remote(agent, url);
    }
    if agent.token_env.is_some() {
        return Err("token_env is for a remote agent (with url)".into());
    }
    if agent.system_prompt.trim().is_empty() {
        return Err("system_prompt must not be empty".into());
    }
    if agent.tools.is_empty() {
        return Err("tools must name at least one tool".into());
    }
    if let Some(tool) = agent.tools.iter().find(|t| t.as_str() == "delegate") {
        return Err(format!("{tool:?}: sub-agents do not delegate further"));
    }
    // A task ends with its call: nothing may wake it later.
    if let Some(tool) = agent.tools.iter().find(|t| {
        matches!(
            t.as_str(),
            "schedule_reminder" | "list_reminders" | "cancel_reminder" | "mcp_subscribe"
        )
    }) {
        return Err(format!(
            "{tool:?}: a sub-agent's task ends with its call, so it has no reminders or \
             subscriptions"
        ));
    }
    if agent.max_steps == Some(0) {
        return Err("max_steps must be at least 1".into());
    }
    if agent.context_window.is_some_and(|w| w < 1024) {
        return Err("context_window must be at least 1024 tokens".into());
    }
    Ok(())
}

/// A remote agent: an http(s) address, and none of what only a local
/// agent has.
fn check_remote(agent: &AgentDefinition, url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .filter(|rest| !rest.is_empty() && !rest.starts_with('/'));
    if rest.is_none() || url.chars().any(char::is_whitespace) {
        return Err(format!(
            "url {url:?} is not an http(s) address of an A2A agent (its base URL or its agent \
             card's)"
        ));
    }
    let local_only = [
        (!agent.system_prompt.trim().is_empty(), "system_prompt"),
        (!agent.tools.is_empty(), "tools"),
        (agent.model.is_some(), "model"),
        (agent.max_steps.is_some(), "max_steps"),
        (agent.context_window.is_some(), "context_window"),
    ];
    if let Some((_, key)) = local_only.iter().find(|(set, _)| *set) {
        return Err(format!(
            "{key} is for an agent run here; a remote agent (url) has its own"
        ));
    }
    if let Some(var) = &agent.token_env
        && (var.is_empty()
            || !var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            || var.starts_with(|c: char| c.is_ascii_digit()))
    {
        return Err(format!(
            "token_env {var:?} is not an environment variable's name"
        ));
    }
    Ok(())
}

/// The agents of `dir/*.md` (none when the directory does not exist).
fn read_agent_files(dir: &Path) -> Result<Vec<AgentDefinition>, ConfigError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(ConfigError::Read {
                path: dir.to_path_buf(),
                reason: e.to_string(),
            });
        }
    };
    let mut paths: Vec<std::path::PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::Read {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let mut agent = parse_agent_file(&text).map_err(|reason| ConfigError::Invalid {
                source_name: path.display().to_string(),
                reason,
            })?;
            agent.file = Some(path);
            Ok(agent)
        })
        .collect()
}

/// An agent file: `---`, `key: value` lines (name, description, tools as a
/// comma-separated list or `[a, b]`, model, max_steps, context_window),
/// `---`, then the system prompt.
pub fn parse_agent_file(text: &str) -> Result<AgentDefinition, String> {
    let mut lines = text.lines();
    if lines.next().map(str::trim) != Some("---") {
        return Err("an agent file starts with a front matter between two '---' lines".into());
    }
    let mut agent = AgentDefinition {
        name: String::new(),
        description: String::new(),
        system_prompt: String::new(),
        tools: Vec::new(),
        model: None,
        max_steps: None,
        context_window: None,
        url: None,
        token_env: None,
        file: None,
    };
    let mut closed = false;
    for (i, line) in lines.by_ref().enumerate() {
        let n = i + 2;
        if line.trim() == "---" {
            closed = true;
            break;
        }
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            return Err(format!("line {n}: expected `key: value`, got {line:?}"));
        };
        let value = value.trim().trim_matches('"').to_string();
        let number = |what: &str| {
            value
                .parse::<u32>()
                .map_err(|_| format!("line {n}: {what} must be a whole number, not {value:?}"))
        };
        match key.trim() {
            "name" => agent.name = value,
            "description" => agent.description = value,
            "tools" => {
                agent.tools = value
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .split(',')
                    .map(|t| t.trim().trim_matches('"').to_string())
                    .filter(|t| !t.is_empty())
                    .collect();
            }
            "model" => agent.model = Some(value).filter(|m| !m.is_empty()),
            "max_steps" => agent.max_steps = Some(number("max_steps")?),
            "context_window" => agent.context_window = Some(number("context_window")?),
            other => {
                return Err(format!(
                    "line {n}: unknown key {other:?} (name, description, tools, model, \
                     max_steps, context_window)"
                ));
            }
        }
    }
    if !closed {
        return Err("the front matter has no closing '---' line".into());
    }
    agent.system_prompt = lines.collect::<Vec<_>>().join("\n").trim().to_string();
    Ok(agent)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_agent_file_gives_its_front_matter_and_prompt() {
        let agent = parse_agent_file(
            "---\nname: researcher\ndescription: Reads files\ntools: [read_file, \"grep\"]\nmax_steps: 4\n---\n\nYou read.\nNever write.\n",
        )
        .unwrap();
        assert_eq!(agent.name, "researcher");
        assert_eq!(agent.tools, vec!["read_file", "grep"]);
        assert_eq!(agent.max_steps, Some(4));
        assert_eq!(agent.system_prompt, "You read.\nNever write.");
        for (bad, why) in [
            ("name: x\n", "starts with a front matter"),
            ("---\nname: x\n", "no closing"),
            ("---\ncolour: red\n---\n", "unknown key \"colour\""),
            ("---\nmax_steps: many\n---\n", "whole number"),
        ] {
            let err = parse_agent_file(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }

    #[test]
    fn bad_agents_are_refused_saying_why() {
        let good =
            parse_agent_file("---\nname: a\ndescription: d\ntools: read_file\n---\nprompt\n")
                .unwrap();
        assert_eq!(check_agent(&good), Ok(()));
        let with = |f: &dyn Fn(&mut AgentDefinition)| {
            let mut a = good.clone();
            f(&mut a);
            check_agent(&a).unwrap_err()
        };
        assert!(with(&|a| a.name = "no spaces".into()).contains("name"));
        assert!(with(&|a| a.tools.clear()).contains("at least one tool"));
        assert!(with(&|a| a.tools.push("delegate".into())).contains("do not delegate"));
        assert!(with(&|a| a.max_steps = Some(0)).contains("max_steps"));
        assert!(with(&|a| a.system_prompt = " ".into()).contains("system_prompt"));
        assert!(with(&|a| a.token_env = Some("T".into())).contains("remote"));
    }

    #[test]
    fn remote_agents_name_an_address_and_nothing_local() {
        let remote = AgentDefinition {
            name: "far".into(),
            description: "d".into(),
            system_prompt: String::new(),
            tools: Vec::new(),
            model: None,
            max_steps: None,
            context_window: None,
            url: Some("https://agents.example/far".into()),
            token_env: Some("FAR_TOKEN".into()),
            file: None,
        };
        assert_eq!(check_agent(&remote), Ok(()));
        let with = |f: &dyn Fn(&mut AgentDefinition)| {
            let mut a = remote.clone();
            f(&mut a);
            check_agent(&a).unwrap_err()
        };
        assert!(with(&|a| a.url = Some("ftp://x".into())).contains("http(s)"));
        assert!(with(&|a| a.url = Some("https://".into())).contains("http(s)"));
        assert!(with(&|a| a.tools = vec!["bash".into()]).contains("tools"));
        assert!(with(&|a| a.system_prompt = "be nice".into()).contains("system_prompt"));
        assert!(with(&|a| a.token_env = Some("1BAD-NAME".into())).contains("token_env"));
    }
}
