#![allow(clippy::unwrap_used, clippy::expect_used)]
use super::*;

fn source(dir: Option<&Path>, env: &[(&str, &str)]) -> ConfigSource {
    ConfigSource {
        dir: dir.map(Path::to_path_buf),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn defaults_load() {
    let config = Config::load(&source(None, &[])).unwrap();
    assert_eq!(config.llm.base_url, "http://localhost:11434/v1");
    assert_eq!(config.agent.max_steps, 15);
    assert_eq!(config.orchestrator.url, "http://127.0.0.1:7741");
    assert_eq!(config.log.format, LogFormat::Text);
}

#[test]
fn layers_apply_in_order() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("default.toml"),
        "[llm]\nmodel = \"from-default\"\nbase_url = \"http://a/v1\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("local.toml"),
        "[llm]\nmodel = \"from-local\"\n[agent]\nmax_steps = 3\n",
    )
    .unwrap();
    let config = Config::load(&source(
        Some(dir.path()),
        &[("AGENTRY_MAX_STEPS", "7"), ("AGENTRY_LLM_API_KEY", "sk-1")],
    ))
    .unwrap();
    assert_eq!(config.llm.model, "from-local");
    assert_eq!(config.llm.base_url, "http://a/v1");
    assert_eq!(config.agent.max_steps, 7);
    assert_eq!(config.llm.api_key, "sk-1");
    assert!(!format!("{config:?}").contains("sk-1"));
}

#[test]
fn the_first_matching_model_profile_applies() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("local.toml"),
        "[[model_profiles]]\npattern = \"tiny-*\"\nnative_tools = false\ncontext_window = 4096\n\
         [[model_profiles]]\npattern = \"*\"\n",
    )
    .unwrap();
    let mut config = Config::load(&source(Some(dir.path()), &[])).unwrap();
    config.llm.model = "Tiny-Chat:1b".into();
    let p = config.model_profile();
    assert!(!p.native_tools);
    assert_eq!(p.context_window, 4096);
    config.llm.model = "qwen2.5:7b".into();
    assert!(config.model_profile().native_tools);
    assert!(ModelProfile::fallback().matches("anything"));
    let q = ModelProfile {
        pattern: "a?c".into(),
        ..ModelProfile::fallback()
    };
    assert!(q.matches("abc") && !q.matches("abbc"));
}

fn usage(
    prompt: u64,
    cached: u64,
    written: u64,
    completion: u64,
) -> agentry_proto::sessions::v1::TokenUsage {
    agentry_proto::sessions::v1::TokenUsage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        cached_prompt_tokens: cached,
        cache_write_prompt_tokens: written,
    }
}

#[test]
fn cache_writes_cost_their_own_price() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("local.toml"),
        "[[model_prices]]\npattern = \"claude-*\"\ninput = 3\noutput = 15\n\
         cached_input = 0.3\ncache_write = 3.75\n",
    )
    .unwrap();
    let mut config = Config::load(&source(Some(dir.path()), &[])).unwrap();
    config.llm.model = "claude-sonnet".into();
    let price = config.model_price().unwrap();
    // 1M fresh (3), 1M read (0.3), 1M written (3.75), 1M out (15).
    let cost = price.cost(&usage(3_000_000, 1_000_000, 1_000_000, 1_000_000));
    assert!((cost - 22.05).abs() < 1e-9, "{cost}");
}

#[test]
fn the_first_matching_model_price_applies_and_bad_prices_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("local.toml"),
        "[[model_prices]]\npattern = \"gpt-4o-mini*\"\ninput = 0.15\noutput = 0.6\n\
         cached_input = 0.075\n\
         [[model_prices]]\npattern = \"claude-*\"\ninput = 3\noutput = 15\ncurrency = \"EUR\"\n",
    )
    .unwrap();
    let mut config = Config::load(&source(Some(dir.path()), &[])).unwrap();
    config.llm.model = "gpt-4o-mini-2024".into();
    let price = config.model_price().unwrap();
    assert_eq!(price.currency(), "USD");
    // 1M uncached in, 1M cached in, 1M out.
    assert!((price.cost(&usage(2_000_000, 1_000_000, 0, 1_000_000)) - 0.825).abs() < 1e-9);
    config.llm.model = "claude-x".into();
    let price = config.model_price().unwrap();
    assert_eq!(price.currency(), "EUR");
    // Unset cached price: the input price.
    assert!((price.cost(&usage(1_000_000, 500_000, 0, 0)) - 3.0).abs() < 1e-9);
    // Unset cache-write price: the input price too.
    assert!((price.cost(&usage(1_000_000, 0, 400_000, 0)) - 3.0).abs() < 1e-9);
    config.llm.model = "llama3".into();
    assert_eq!(config.model_price(), None);

    std::fs::write(
        dir.path().join("local.toml"),
        "[[model_prices]]\npattern = \"*\"\ninput = -1\noutput = 1\n",
    )
    .unwrap();
    let error = Config::load(&source(Some(dir.path()), &[]))
        .unwrap_err()
        .to_string();
    assert!(error.contains("model_prices"), "{error}");
    assert!(error.contains("0 or more"), "{error}");
}

#[test]
fn container_settings_from_the_environment() {
    let config = Config::load(&source(
        None,
        &[
            ("AGENTRY_CHROMIUM_SANDBOX", "false"),
            (
                "AGENTRY_TOOL_RUNNER_URL",
                "http://tool-runner:7743, http://10.0.0.9:7743",
            ),
        ],
    ))
    .unwrap();
    assert!(!config.tool_runner.web.chromium_sandbox);
    assert!(
        Config::load(&source(None, &[]))
            .unwrap()
            .tool_runner
            .web
            .chromium_sandbox
    );
    let err = Config::load(&source(
        None,
        &[("AGENTRY_TOOL_RUNNER_URL", "http://a:1,tool-runner:7743")],
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("tool_runner.url"), "{err}");
    assert!(
        err.contains("\"tool-runner:7743\" is not an http(s) URL"),
        "{err}"
    );
}

#[test]
fn bad_file_names_file_key_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("local.toml"),
        "[agent]\nmax_steps = \"many\"\n",
    )
    .unwrap();
    let err = Config::load(&source(Some(dir.path()), &[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("local.toml"), "{err}");
    assert!(err.contains("max_steps"), "{err}");
    assert!(err.contains("invalid type"), "{err}");
}

#[test]
fn unknown_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("default.toml"), "[llm]\nmodle = \"x\"\n").unwrap();
    let err = Config::load(&source(Some(dir.path()), &[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("default.toml"), "{err}");
    assert!(err.contains("modle"), "{err}");
}

#[test]
fn syntax_error_is_reported_with_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("local.toml"), "[llm\n").unwrap();
    let err = Config::load(&source(Some(dir.path()), &[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("local.toml"), "{err}");
}

#[test]
fn bad_env_value_names_variable() {
    let err = Config::load(&source(None, &[("AGENTRY_MAX_STEPS", "lots")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("AGENTRY_MAX_STEPS"), "{err}");
    assert!(err.contains("lots"), "{err}");
    let err = Config::load(&source(None, &[("AGENTRY_LLM_BASE_URL", "localhost:1")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("llm.base_url"), "{err}");
    let err = Config::load(&source(None, &[("AGENTRY_ORCHESTRATOR_LISTEN", "nowhere")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("AGENTRY_ORCHESTRATOR_LISTEN"), "{err}");
}

#[test]
fn system_prompt_prefers_non_empty_system_md() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::load(&source(Some(dir.path()), &[])).unwrap();
    assert_eq!(config.system_prompt().unwrap(), DEFAULT_SYSTEM_PROMPT);
    std::fs::write(dir.path().join("default_system.md"), "default one").unwrap();
    std::fs::write(dir.path().join("system.md"), "  \n").unwrap();
    assert_eq!(config.system_prompt().unwrap(), "default one");
    std::fs::write(dir.path().join("system.md"), "mine").unwrap();
    assert_eq!(config.system_prompt().unwrap(), "mine");
    config.config_dir = None;
    assert_eq!(config.system_prompt().unwrap(), DEFAULT_SYSTEM_PROMPT);
}

#[test]
fn tool_choice_and_extra_body_are_read_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("local.toml"),
        "[llm]\ntool_choice = \"required\"\n[llm.extra_body]\nmax_tokens = 64\n\
         logit_bias = { \"{\" = 8 }\n",
    )
    .unwrap();
    let config = Config::load(&source(Some(dir.path()), &[])).unwrap();
    assert_eq!(config.llm.tool_choice, crate::config::ToolChoice::Required);
    let extra = config.llm.extra_body_json();
    assert_eq!(extra["max_tokens"], 64);
    assert_eq!(extra["logit_bias"]["{"], 8);
    // The default, and the environment.
    let config = Config::load(&source(None, &[])).unwrap();
    assert_eq!(config.llm.tool_choice, crate::config::ToolChoice::Auto);
    assert!(config.llm.extra_body_json().is_empty());
    let config = Config::load(&source(None, &[("AGENTRY_LLM_TOOL_CHOICE", "required")])).unwrap();
    assert_eq!(config.llm.tool_choice, crate::config::ToolChoice::Required);
    let err = Config::load(&source(None, &[("AGENTRY_LLM_TOOL_CHOICE", "always")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("AGENTRY_LLM_TOOL_CHOICE"), "{err}");
    // Keys Agentry sets itself cannot be overridden.
    std::fs::write(
        dir.path().join("local.toml"),
        "[llm.extra_body]\nmessages = []\n",
    )
    .unwrap();
    let err = Config::load(&source(Some(dir.path()), &[]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("llm.extra_body") && err.contains("\"messages\""),
        "{err}"
    );
}

#[test]
fn llm_context_window_overrides_the_profile() {
    let config = Config::load(&source(
        None,
        &[
            ("AGENTRY_LLM_MODEL", "phi3"),
            ("AGENTRY_LLM_CONTEXT_WINDOW", "8192"),
        ],
    ))
    .unwrap();
    assert_eq!(config.model_profile().context_window, 8192);
    assert!(
        !config.model_profile().native_tools,
        "the rest of the profile stays"
    );
    let config = Config::load(&source(None, &[("AGENTRY_LLM_MODEL", "phi3")])).unwrap();
    assert_eq!(config.model_profile().context_window, 4096);
    let err = Config::load(&source(None, &[("AGENTRY_LLM_CONTEXT_WINDOW", "100")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("llm.context_window"), "{err}");
}

#[test]
fn loop_repeats_of_one_is_refused() {
    let err = Config::load(&source(None, &[("AGENTRY_LOOP_REPEATS", "1")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("agent.loop_repeats"), "{err}");
    let config = Config::load(&source(None, &[("AGENTRY_LOOP_REPEATS", "0")])).unwrap();
    assert_eq!(config.agent.loop_repeats, 0);
    assert_eq!(
        Config::load(&source(None, &[])).unwrap().agent.loop_repeats,
        3
    );
}

#[test]
fn database_urls_and_snapshots_come_from_the_environment_and_passwords_stay_hidden() {
    let url = "postgres://agentry:s3cret@db.internal:5432/agentry";
    let config = Config::load(&source(
        None,
        &[
            ("AGENTRY_SESSION_STORE_DATABASE_URL", url),
            ("AGENTRY_SCHEDULER_DATABASE_URL", url),
            ("AGENTRY_SNAPSHOTS", "false"),
            ("AGENTRY_SNAPSHOTS_DIR", "/srv/snapshots"),
        ],
    ))
    .unwrap();
    assert_eq!(config.session_store.database_url, url);
    assert_eq!(config.scheduler.database_url, url);
    assert!(!config.tool_runner.snapshots.enabled);
    assert_eq!(
        config.snapshots_dir(),
        std::path::Path::new("/srv/snapshots")
    );
    let shown = format!("{:?}", config.session_store);
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(
        shown.contains("postgres://agentry:***@db.internal:5432/agentry"),
        "{shown}"
    );
    assert_eq!(
        crate::config::redact_url("postgres://u@h/db"),
        "postgres://u@h/db"
    );
    let defaults = Config::load(&source(None, &[])).unwrap();
    assert!(defaults.session_store.database_url.is_empty());
    assert!(defaults.tool_runner.snapshots.enabled);
    assert!(defaults.snapshots_dir().ends_with("workspaces/.snapshots"));
}

#[test]
fn default_ports_lie_below_the_ephemeral_range() {
    // Linux hands out 32768-60999 for outgoing connections: a default port
    // there can be held by any client of the machine when the services
    // start.
    let config = Config::load(&source(None, &[])).unwrap();
    for addr in [
        config.orchestrator.listen,
        config.session_store.listen,
        config.tool_runner.listen,
        config.scheduler.listen,
    ] {
        assert!(addr.port() < 32768, "{addr}");
    }
}

#[test]
fn response_limits_are_checked() {
    let config = Config::load(&source(None, &[])).unwrap();
    assert_eq!(config.llm.max_response_bytes, 1024 * 1024);
    assert_eq!(config.llm.max_tool_arguments_bytes, 256 * 1024);
    for (env, key) in [
        (
            [("AGENTRY_LLM_MAX_RESPONSE_BYTES", "999999999")],
            "llm.max_response_bytes",
        ),
        (
            [("AGENTRY_LLM_MAX_TOOL_ARGUMENTS_BYTES", "2000000")],
            "llm.max_tool_arguments_bytes",
        ),
    ] {
        let err = Config::load(&source(None, &env)).unwrap_err().to_string();
        assert!(err.contains(key), "{err}");
    }
}

/// What a person pastes from `agentry policy suggest` into local.toml.
const ONE_ALLOW_RULE: &str =
    "[[policy.rules]]\ntool = \"bash\"\ncommand = \"make test*\"\ndecision = \"allow\"\n";

fn bash_decision(config: &Config, command: &str) -> agentry_policy::Decision {
    let policy = agentry_policy::Policy::from_config(&config.policy).unwrap();
    let args = serde_json::json!({ "command": command }).to_string();
    policy.check("bash", &args, false, &[]).decision
}

#[test]
fn a_layer_s_policy_rules_are_added_to_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    // The shipped file again in the config directory (as in a checkout)
    // adds nothing twice.
    std::fs::write(dir.path().join("default.toml"), DEFAULT_TOML).unwrap();
    std::fs::write(dir.path().join("local.toml"), ONE_ALLOW_RULE).unwrap();
    let config = Config::load(&source(Some(dir.path()), &[])).unwrap();
    let defaults = Config::builtin().policy.rules.len();
    assert_eq!(config.policy.rules.len(), defaults + 1);
    assert_eq!(
        config.policy.rules.last().unwrap().command.as_deref(),
        Some("make test*")
    );
    assert_eq!(
        bash_decision(&config, "make test"),
        agentry_policy::Decision::Allow
    );
    assert_eq!(
        bash_decision(&config, "sudo id"),
        agentry_policy::Decision::Deny
    );
    assert_eq!(
        bash_decision(&config, "rm -rf /"),
        agentry_policy::Decision::Deny
    );
    assert!(config.notices.is_empty(), "{:?}", config.notices);
}

#[test]
fn replacing_the_default_rules_is_explicit_and_named() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("local.toml"),
        format!("[policy]\nreplace_default_rules = true\n\n{ONE_ALLOW_RULE}"),
    )
    .unwrap();
    let config = Config::load(&source(Some(dir.path()), &[])).unwrap();
    assert_eq!(config.policy.rules.len(), 1);
    assert_eq!(
        bash_decision(&config, "sudo id"),
        agentry_policy::Decision::Confirm
    );
    let notices = config.notices.join("\n");
    assert!(notices.contains("local.toml"), "{notices}");
    assert!(notices.contains("bash \"sudo *\""), "{notices}");
    assert!(notices.contains("bash \"rm -rf /*\""), "{notices}");
}

#[test]
fn a_syntax_error_names_its_line_and_a_bad_rule_its_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("local.toml"),
        "[agent]\nmax_steps = 3\n[llm\n",
    )
    .unwrap();
    let err = Config::load(&source(Some(dir.path()), &[]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("local.toml") && err.contains("line 3"),
        "{err}"
    );
    std::fs::write(
        dir.path().join("local.toml"),
        "[[policy.rules]]\ntool = \"bash\"\ncommand = \"[abc\"\ndecision = \"allow\"\n",
    )
    .unwrap();
    let err = Config::load(&source(Some(dir.path()), &[]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("local.toml") && err.contains("invalid command glob \"[abc\""),
        "{err}"
    );
}

#[test]
fn secret_rules_are_a_command_or_a_host_header() {
    let load = |allow: &str| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("local.toml"),
            format!("[[secrets]]\nname = \"GH_TOKEN\"\nvalue_env = \"GH\"\nallow = [{allow}]\n"),
        )
        .unwrap();
        Config::load(&source(Some(dir.path()), &[]))
    };
    let config = load(
        "{ tool = \"bash\", command = \"gh *\" }, \
         { host = \"api.github.com\", header = \"Authorization: Bearer {value}\" }",
    )
    .unwrap();
    let rules = &config.secrets[0].allow;
    assert_eq!(rules[0], SecretRule::command("gh *"));
    assert_eq!(
        rules[1].header_parts(),
        Some(("Authorization", "Bearer {value}"))
    );
    assert!(load("{ host = \"internal:8443\", header = \"X-Key: {value}\" }").is_ok());
    for bad in [
        // No {value}, a bad header name, a header without a host.
        "{ host = \"api.github.com\", header = \"Authorization: Bearer\" }",
        "{ host = \"api.github.com\", header = \"Bad Name: {value}\" }",
        "{ header = \"X-Key: {value}\" }",
        // A URL, a wildcard or a bad port is not a host.
        "{ host = \"https://api.github.com\", header = \"X-Key: {value}\" }",
        "{ host = \"*.github.com\", header = \"X-Key: {value}\" }",
        "{ host = \"api.github.com:0\", header = \"X-Key: {value}\" }",
        // Both kinds in one rule.
        "{ tool = \"bash\", command = \"gh *\", host = \"api.github.com\", header = \"X: {value}\" }",
    ] {
        let err = load(bad).unwrap_err().to_string();
        assert!(
            err.contains("secrets[0]") && err.contains("host = "),
            "{bad}: {err}"
        );
    }
}
