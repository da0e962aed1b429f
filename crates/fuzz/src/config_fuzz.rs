//! Fuzzing the configuration loader: a config directory with a random
//! `default.toml` and `local.toml` built from the real keys of
//! `config/default.toml` (and the table arrays it documents) with random
//! values, sometimes damaged as text, and random `AGENTRY_*` variables
//! (the names `config/default.toml` gives beside its keys).
//!
//! Oracles: loading never panics or hangs, and an error names where the
//! bad value came from (the file, or the variable) and which key (or the
//! line of a syntax error).

use crate::dict;
use crate::rng::Rng;
use agentry_runtime::{Config, ConfigError, ConfigSource};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use toml::{Table, Value};

/// Table arrays and tables `config/default.toml` documents only in
/// comments (or not at all), with one valid entry each.
const EXTRA_KEYS: &str = r#"
[llm.extra_body]
max_tokens = 1024
parallel_tool_calls = false

[[model_prices]]
pattern = "gpt-4o-mini*"
input = 0.15
output = 0.60
cached_input = 0.075
cache_write = 0.15
currency = "USD"

[[mcp_servers]]
name = "time"
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
env = { TZ = "UTC" }
read_only = ["get_time"]
network = false
enabled = true
timeout_secs = 0

[[hooks]]
event = "before_tool"
command = "true"
timeout_secs = 10
matcher = "*"

[[notify]]
name = "phone"
url = "https://127.0.0.1:1/topic"
events = ["approval_requested", "schedule_failed"]
format = "text"
headers = { Priority = "high" }
secret_env = "AGENTRY_NOTIFY_KEY"

[[secrets]]
name = "GH_TOKEN"
value_env = "GH_TOKEN"
allow = [{ tool = "bash", command = "gh *" }, { host = "api.github.com", header = "Authorization: Bearer {value}" }]

[[agents]]
name = "reviewer"
description = "Reviews a change"
system_prompt = "You review."
tools = ["read_file"]
max_steps = 5
context_window = 4096
"#;

/// Strings that mean something to some config key.
const CONFIG_WORDS: &[&str] = &[
    "auto", "require", "off", "token", "text", "json", "openai", "ollama", "anthropic", "once",
    "all", "skip", "stop", "park", "none", "required", "o200k_base", "cl100k_base", "estimate",
    "session", "root", "127.0.0.1:0", "0.0.0.0:1", "[::1]:7741", ":80", "host:99999",
    "http://a/v1", "https://127.0.0.1:1", "http://127.0.0.1:1,http://127.0.0.1:2", "~", "~/p",
    "*", "[", "**", "gpt-4o*", "before_tool", "after_tool", "turn_finished",
    "approval_requested", "GH_TOKEN", "lower_case", "api.github.com:0", "Bearer {value}",
];

/// One input of the loader: the two files (absent, or their bytes) and
/// the environment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigCase {
    pub default_toml: Option<Vec<u8>>,
    pub local_toml: Option<Vec<u8>>,
    pub env: BTreeMap<String, String>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

impl ConfigCase {
    /// As a saved TOML file (file contents in hex: they may not be text).
    pub fn to_text(&self) -> String {
        let mut table = Table::new();
        for (key, file) in [("default_toml", &self.default_toml), ("local_toml", &self.local_toml)] {
            if let Some(bytes) = file {
                table.insert(key.into(), Value::String(hex(bytes)));
            }
        }
        let env: Table = self
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        table.insert("env".into(), Value::Table(env));
        toml::to_string(&table).unwrap_or_default()
    }

    /// Reads a saved case.
    pub fn from_text(text: &str) -> Option<ConfigCase> {
        let table: Table = text.parse().ok()?;
        let file = |key: &str| match table.get(key) {
            Some(Value::String(h)) => unhex(h).map(Some),
            Some(_) => None,
            None => Some(None),
        };
        let env = match table.get("env") {
            Some(Value::Table(env)) => env
                .iter()
                .map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect::<Option<BTreeMap<_, _>>>()?,
            _ => BTreeMap::new(),
        };
        Some(ConfigCase {
            default_toml: file("default_toml")?,
            local_toml: file("local_toml")?,
            env,
        })
    }
}

/// The keys to choose from.
pub struct Keys {
    template: Table,
    leaves: Vec<Vec<String>>,
    env: Vec<String>,
    /// Every key name, for checking that an error names one.
    names: BTreeSet<String>,
}

impl Keys {
    /// From the built-in defaults and [`EXTRA_KEYS`].
    pub fn new() -> anyhow::Result<Keys> {
        let mut template: Table = agentry_runtime::config::DEFAULT_TOML.parse()?;
        let extra: Table = EXTRA_KEYS.parse()?;
        merge(&mut template, extra);
        let mut leaves = Vec::new();
        let mut names = BTreeSet::new();
        walk(&template, &mut Vec::new(), &mut leaves, &mut names);
        let mut env: BTreeSet<String> = agentry_runtime::config::DEFAULT_TOML
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| w.starts_with("AGENTRY_") && w.len() > "AGENTRY_".len())
            .map(str::to_string)
            .collect();
        env.extend(["AGENTRY_NOT_A_SETTING".to_string(), "AGENTRY_".to_string()]);
        Ok(Keys {
            template,
            leaves,
            env: env.into_iter().collect(),
            names,
        })
    }

    /// How many keys and variables there are.
    pub fn counts(&self) -> (usize, usize) {
        (self.leaves.len(), self.env.len())
    }
}

fn merge(base: &mut Table, layer: Table) {
    for (key, value) in layer {
        match (base.get_mut(&key), value) {
            (Some(Value::Table(b)), Value::Table(l)) => merge(b, l),
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Collects the path of every leaf (an array of tables by its first
/// element, as `key`, `#0`, ...).
fn walk(
    table: &Table,
    path: &mut Vec<String>,
    leaves: &mut Vec<Vec<String>>,
    names: &mut BTreeSet<String>,
) {
    for (key, value) in table {
        names.insert(key.clone());
        path.push(key.clone());
        match value {
            Value::Table(inner) => walk(inner, path, leaves, names),
            Value::Array(items) if items.first().is_some_and(Value::is_table) => {
                path.push("#0".into());
                if let Some(Value::Table(first)) = items.first() {
                    walk(first, path, leaves, names);
                }
                path.pop();
            }
            _ => leaves.push(path.clone()),
        }
        path.pop();
    }
}

/// Sets `path` in `table` to `value`, creating tables on the way; an
/// array of tables on the way is copied whole from `template` first, so
/// that the entry stays complete but for the one key.
fn set(table: &mut Table, template: &Table, path: &[String], value: Value) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    if rest.is_empty() {
        table.insert(first.clone(), value);
        return;
    }
    if rest.first().is_some_and(|s| s == "#0") {
        let entry = table.entry(first.clone()).or_insert_with(|| {
            template
                .get(first)
                .cloned()
                .unwrap_or_else(|| Value::Array(vec![Value::Table(Table::new())]))
        });
        if let Value::Array(items) = entry
            && let Some(Value::Table(inner)) = items.first_mut()
        {
            let empty = Table::new();
            let inner_template = match template.get(first) {
                Some(Value::Array(t)) => match t.first() {
                    Some(Value::Table(t)) => t,
                    _ => &empty,
                },
                _ => &empty,
            };
            set(inner, inner_template, &rest[1..], value);
        }
        return;
    }
    let entry = table
        .entry(first.clone())
        .or_insert_with(|| Value::Table(Table::new()));
    if !entry.is_table() {
        *entry = Value::Table(Table::new());
    }
    let empty = Table::new();
    let inner_template = match template.get(first) {
        Some(Value::Table(t)) => t,
        _ => &empty,
    };
    if let Value::Table(inner) = entry {
        set(inner, inner_template, rest, value);
    }
}

fn get<'a>(table: &'a Table, path: &[String]) -> Option<&'a Value> {
    let (first, rest) = path.split_first()?;
    let value = table.get(first)?;
    if rest.is_empty() {
        return Some(value);
    }
    match (value, rest.first().map(String::as_str)) {
        (Value::Array(items), Some("#0")) => match items.first()? {
            Value::Table(t) => get(t, &rest[1..]),
            _ => None,
        },
        (Value::Table(t), _) => get(t, rest),
        _ => None,
    }
}

fn word(rng: &mut Rng) -> String {
    match rng.below(6) {
        0 | 1 => rng.pick(CONFIG_WORDS).to_string(),
        2 => rng.pick(dict::GENERAL).to_string(),
        3 => rng.pick(dict::PATHS).to_string(),
        4 => rng.pick(dict::URLS).to_string(),
        _ => dict::random_chars(rng),
    }
}

fn any_value(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(if depth > 2 { 5 } else { 7 }) {
        0 => Value::Integer(*rng.pick(&[0, 1, -1, 2, 255, 1024, i64::MAX, i64::MIN, 4_294_967_295, 4_294_967_296])),
        1 => Value::Float(*rng.pick(&[0.0, -0.0, 0.1, 0.09, 1.0, 1.01, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 1e308])),
        2 => Value::Boolean(rng.chance(1, 2)),
        3 => Value::String(word(rng)),
        4 => "1979-05-27T07:32:00Z"
            .parse()
            .map(Value::Datetime)
            .unwrap_or(Value::Boolean(false)),
        5 => Value::Array((0..rng.range(0, 3)).map(|_| any_value(rng, depth + 1)).collect()),
        _ => {
            let mut t = Table::new();
            for _ in 0..rng.range(0, 2) {
                t.insert(word(rng), any_value(rng, depth + 1));
            }
            Value::Table(t)
        }
    }
}

/// A value for a key whose default is `existing`: usually of its type
/// (with edge values), sometimes of another.
fn value_for(rng: &mut Rng, existing: Option<&Value>) -> Value {
    if rng.chance(1, 4) {
        return any_value(rng, 0);
    }
    match existing {
        Some(Value::Integer(n)) => Value::Integer(*rng.pick(&[
            0,
            1,
            -1,
            2,
            *n,
            n.saturating_add(1),
            n.saturating_sub(1),
            255,
            256,
            999,
            1000,
            1023,
            1024,
            65_535,
            65_536,
            4_294_967_294,
            4_294_967_295,
            4_294_967_296,
            i64::MAX,
            i64::MIN,
        ])),
        Some(Value::Float(_)) => Value::Float(*rng.pick(&[
            0.0,
            -0.0,
            0.09,
            0.1,
            0.5,
            1.0,
            1.01,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            1e308,
        ])),
        Some(Value::Boolean(_)) => Value::Boolean(rng.chance(1, 2)),
        Some(Value::Array(_)) => {
            Value::Array((0..rng.range(0, 3)).map(|_| Value::String(word(rng))).collect())
        }
        Some(Value::Table(_)) => any_value(rng, 2),
        Some(Value::String(_) | Value::Datetime(_)) | None => Value::String(word(rng)),
    }
}

/// Syntax that is not TOML, or TOML that repeats itself.
const BROKEN: &[&str] = &[
    "[[[",
    "a = ",
    "key = \"unterminated",
    "= 1",
    "[llm]\n[llm]\n",
    "llm = 5\n[llm]\n",
    "[llm]\nmodel = 1\nmodel = 2\n",
    "a.b.c = 1\n[a]\nb = 2\n",
    "x = [1, \"a\"]\n",
    "\u{feff}[llm]\n",
    "[agent]\nmax_steps = 99999999999999999999\n",
    "[llm]\nbase_url = '''\nhttp://x\n'''\n",
];

fn file(rng: &mut Rng, keys: &Keys) -> Option<Vec<u8>> {
    if rng.chance(1, 4) {
        return None;
    }
    let mut layer = Table::new();
    if rng.chance(1, 10) {
        layer = keys.template.clone();
    }
    for _ in 0..rng.range(1, 6) {
        let path = rng.pick(&keys.leaves).clone();
        let value = value_for(rng, get(&keys.template, &path));
        set(&mut layer, &keys.template, &path, value);
    }
    if rng.chance(1, 8) {
        // A key that does not exist, beside real ones.
        let mut path = rng.pick(&keys.leaves).clone();
        if let Some(last) = path.last_mut() {
            *last = format!("{last}{}", rng.pick(&["x", "_", "s", ""]));
        }
        set(&mut layer, &keys.template, &path, any_value(rng, 0));
    }
    let mut text = toml::to_string(&layer).unwrap_or_default().into_bytes();
    match rng.below(25) {
        0 | 1 => crate::generate::mutate(rng, &mut text),
        2 => text.extend_from_slice(rng.pick(BROKEN).as_bytes()),
        3 => text = rng.pick(BROKEN).as_bytes().to_vec(),
        _ => {}
    }
    Some(text)
}

fn env_value(rng: &mut Rng) -> String {
    match rng.below(6) {
        0 => rng
            .pick(&["0", "1", "-1", "18446744073709551616", "1e3", " 5 ", "0x10", ""])
            .to_string(),
        1 => rng.pick(&["true", "false", "yes", "no", "TRUE", "on"]).to_string(),
        2 => rng.pick(&["a,b,,c", ",", " , ", "~,/tmp", "*"]).to_string(),
        _ => word(rng),
    }
}

/// A random input of the loader.
pub fn generate(rng: &mut Rng, keys: &Keys) -> ConfigCase {
    let env = (0..rng.range(0, 4))
        .map(|_| (rng.pick(&keys.env).clone(), env_value(rng)))
        .collect();
    ConfigCase {
        default_toml: file(rng, keys),
        local_toml: file(rng, keys),
        env,
    }
}

/// Loads `case` from `dir` (which it overwrites); what is wrong with the
/// result, if anything. A panic is recorded by the panic hook and said
/// here too.
pub fn run(case: &ConfigCase, dir: &Path, keys: &Keys) -> Option<String> {
    for (name, content) in [("default.toml", &case.default_toml), ("local.toml", &case.local_toml)] {
        let path = dir.join(name);
        let written = match content {
            Some(bytes) => std::fs::write(&path, bytes),
            None => std::fs::remove_file(&path).or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            }),
        };
        if let Err(e) = written {
            return Some(format!("the fuzzer could not write {}: {e}", path.display()));
        }
    }
    let source = ConfigSource {
        dir: Some(dir.to_path_buf()),
        env: case.env.clone(),
    };
    let loaded = std::panic::catch_unwind(|| {
        let loaded = Config::load(&source);
        if let Ok(config) = &loaded {
            // What the services derive from it at start.
            let _ = config.system_prompt();
            let _ = config.model_profile();
            let _ = config.model_price();
            let _ = config.data_dir();
            let _ = config.workspace_root();
            let _ = config.project_roots();
            let _ = config.snapshots_dir();
            let _ = config.people_file();
        }
        loaded
    });
    match loaded {
        Err(_) => Some("loading panicked".into()),
        Ok(Ok(_)) => None,
        Ok(Err(e)) => error_problem(&e, case, dir, keys),
    }
}

/// An error must say where (the file or variable) and what (a key, or a
/// line).
fn error_problem(e: &ConfigError, case: &ConfigCase, dir: &Path, keys: &Keys) -> Option<String> {
    let text = e.to_string();
    if text.contains("Error {") || text.contains("kind: ") {
        return Some(format!("the error holds a debug dump: {text}"));
    }
    match e {
        ConfigError::Read { path, .. } => {
            (!path.starts_with(dir) && !mentioned(case, &path.display().to_string()))
                .then(|| format!("the error names a file that is no input: {text}"))
        }
        ConfigError::Env { var, .. } => (!case.env.contains_key(var))
            .then(|| format!("the error names a variable that was not set: {text}")),
        ConfigError::Invalid {
            source_name,
            reason,
        } => {
            if source_name == "built-in defaults" {
                return Some(format!("the built-in defaults were found invalid: {text}"));
            }
            let known_source = Path::new(source_name).starts_with(dir)
                || case.env.contains_key(source_name)
                || source_name == "merged configuration"
                || mentioned(case, source_name);
            if !known_source {
                return Some(format!("the error names no file or variable: {text}"));
            }
            let names_key = reason.contains("line ")
                || keys
                    .names
                    .iter()
                    .any(|k| k.len() > 2 && reason.contains(k.as_str()))
                || layer_keys(case).iter().any(|k| reason.contains(k.as_str()));
            (!names_key).then(|| format!("the error names no key: {text}"))
        }
    }
}

/// Whether `text` appears in the case's files or variables (a path a
/// value names).
fn mentioned(case: &ConfigCase, text: &str) -> bool {
    let in_file = |f: &Option<Vec<u8>>| {
        f.as_ref()
            .is_some_and(|b| String::from_utf8_lossy(b).contains(text))
    };
    !text.is_empty()
        && (in_file(&case.default_toml)
            || in_file(&case.local_toml)
            || case.env.values().any(|v| v.contains(text)))
}

/// The keys the case's files set (names it made up included).
fn layer_keys(case: &ConfigCase) -> Vec<String> {
    let mut names = BTreeSet::new();
    for bytes in [&case.default_toml, &case.local_toml].into_iter().flatten() {
        if let Ok(table) = String::from_utf8_lossy(bytes).parse::<Table>() {
            walk(&table, &mut Vec::new(), &mut Vec::new(), &mut names);
        }
    }
    names.into_iter().filter(|n| !n.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_keys_come_from_the_defaults_and_a_case_round_trips() {
        let keys = Keys::new().unwrap();
        let (leaves, env) = keys.counts();
        assert!(leaves > 100, "{leaves}");
        assert!(env.saturating_sub(2) > 30, "{env}");
        assert!(keys.leaves.contains(&vec!["hooks".into(), "#0".into(), "command".into()]));
        let mut rng = Rng::new(3);
        for _ in 0..50 {
            let case = generate(&mut rng, &keys);
            assert_eq!(ConfigCase::from_text(&case.to_text()), Some(case));
        }
    }

    #[test]
    fn a_bad_value_is_named_by_file_and_key() {
        let keys = Keys::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let case = ConfigCase {
            local_toml: Some(b"[agent]\nmax_steps = 0\n".to_vec()),
            ..Default::default()
        };
        assert_eq!(run(&case, dir.path(), &keys), None);
        let fine = ConfigCase::default();
        assert_eq!(run(&fine, dir.path(), &keys), None);
    }
}
