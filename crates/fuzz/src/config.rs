//! The config loader, fuzzed: layers written from the built-in defaults'
//! own keys with values of the wrong type, out of range or hostile, keys
//! the loader does not know, broken TOML, and environment variables. The
//! loader must answer each with a configuration or an error that says
//! something, without panicking or hanging.

use crate::rng::{Edges, Rng};
use agentry_runtime::{Config, ConfigSource};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use toml::Value;

/// What the config fuzzer saw.
#[derive(Default, Debug)]
pub struct Report {
    pub inputs: u64,
    pub loaded: u64,
    pub refused: u64,
    pub findings: Vec<String>,
    pub slowest: Duration,
}

/// One input: a `local.toml` and an environment.
pub struct Input {
    pub text: String,
    pub env: BTreeMap<String, String>,
}

/// Every key path of the defaults, with its value.
fn paths(value: &Value, prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, Value)>) {
    if let Value::Table(table) = value {
        for (key, inner) in table {
            prefix.push(key.clone());
            out.push((prefix.clone(), inner.clone()));
            paths(inner, prefix, out);
            prefix.pop();
        }
    }
}

/// The generator of inputs.
pub struct Generator {
    keys: Vec<(Vec<String>, Value)>,
    env: Vec<&'static str>,
}

impl Generator {
    pub fn new() -> anyhow::Result<Generator> {
        let defaults: Value = toml::from_str(agentry_runtime::config::DEFAULT_TOML)?;
        let mut keys = Vec::new();
        paths(&defaults, &mut Vec::new(), &mut keys);
        // Array-of-table sections the defaults leave empty.
        for section in [
            "secrets",
            "agents",
            "hooks",
            "policy.rules",
            "mcp.servers",
            "people",
        ] {
            keys.push((
                section.split('.').map(str::to_string).collect(),
                Value::Array(Vec::new()),
            ));
        }
        Ok(Generator {
            keys,
            env: agentry_runtime::config::env_vars().collect(),
        })
    }

    pub fn input(&self, rng: &mut Rng) -> Input {
        let mut env = BTreeMap::new();
        if rng.chance(0.3) {
            for _ in 0..1 + rng.below(3) {
                let var = self.env[rng.below(self.env.len() as u64) as usize];
                env.insert(var.to_string(), scalar_text(rng));
            }
        }
        if rng.chance(0.05) {
            // Not TOML at all, or TOML cut short.
            let text = match rng.below(3) {
                0 => String::from_utf8_lossy(&rng.junk(200)).into_owned(),
                1 => "[llm\nmodel = ".to_string(),
                _ => "a = 1\na = 2\n[[x]]\n[x]\n".to_string(),
            };
            return Input { text, env };
        }
        let mut layer = toml::Table::new();
        for _ in 0..1 + rng.below(6) {
            let (path, like) = &self.keys[rng.below(self.keys.len() as u64) as usize];
            let value = if rng.chance(0.4) {
                near(like, rng)
            } else {
                random_value(rng, 0)
            };
            let mut path = path.clone();
            if rng.chance(0.1) {
                path.push(format!("unknown_{}", rng.below(100)));
            }
            set(&mut layer, &path, value);
        }
        let text = toml::to_string(&Value::Table(layer)).unwrap_or_default();
        Input { text, env }
    }
}

/// A value of the same kind as `like`, at an edge.
fn near(like: &Value, rng: &mut Rng) -> Value {
    match like {
        Value::Integer(_) => Value::Integer(rng.int() as i64),
        Value::Float(_) => Value::Float(rng.float()),
        Value::Boolean(b) => Value::Boolean(!b),
        Value::String(_) => Value::String(scalar_text(rng)),
        Value::Array(items) => Value::Array(
            (0..rng.below(4))
                .map(|_| match items.first() {
                    Some(first) => near(first, rng),
                    None => random_table(rng, 1),
                })
                .collect(),
        ),
        Value::Table(table) => {
            let mut out = toml::Table::new();
            for (key, value) in table {
                if rng.chance(0.5) {
                    out.insert(key.clone(), near(value, rng));
                }
            }
            Value::Table(out)
        }
        Value::Datetime(_) => Value::String(scalar_text(rng)),
    }
}

fn random_value(rng: &mut Rng, depth: u32) -> Value {
    match rng.below(if depth > 2 { 4 } else { 6 }) {
        0 => Value::Integer(rng.int() as i64),
        1 => Value::Float(rng.float()),
        2 => Value::Boolean(rng.chance(0.5)),
        3 => Value::String(scalar_text(rng)),
        4 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => random_table(rng, depth + 1),
    }
}

fn random_table(rng: &mut Rng, depth: u32) -> Value {
    const KEYS: &[&str] = &[
        "name",
        "tool",
        "command",
        "host",
        "header",
        "allow",
        "value_env",
        "value_file",
        "url",
        "transport",
        "args",
        "env",
        "decision",
        "event",
        "matcher",
        "timeout_secs",
        "role",
        "token",
        "model",
        "tools",
        "description",
        "path",
    ];
    let mut table = toml::Table::new();
    for _ in 0..rng.below(5) {
        table.insert(
            KEYS[rng.below(KEYS.len() as u64) as usize].to_string(),
            random_value(rng, depth + 1),
        );
    }
    Value::Table(table)
}

fn scalar_text(rng: &mut Rng) -> String {
    let pools = crate::schema::Pools::default();
    String::from_utf8_lossy(&pools.string_for("", rng)).into_owned()
}

fn set(table: &mut toml::Table, path: &[String], value: Value) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = table;
    for key in parents {
        let entry = at
            .entry(key.clone())
            .or_insert_with(|| Value::Table(toml::Table::new()));
        if !entry.is_table() {
            *entry = Value::Table(toml::Table::new());
        }
        let Value::Table(inner) = entry else {
            return;
        };
        at = inner;
    }
    at.insert(last.clone(), value);
}

/// Loads `input` from `dir`; a finding when the loader panics, says
/// nothing, or takes longer than a second.
pub fn check(dir: &Path, input: &Input, report: &mut Report) -> anyhow::Result<()> {
    std::fs::write(dir.join("local.toml"), &input.text)?;
    let source = ConfigSource {
        dir: Some(dir.to_path_buf()),
        env: input.env.clone(),
    };
    let started = Instant::now();
    let loaded = std::panic::catch_unwind(|| Config::load(&source));
    let took = started.elapsed();
    report.inputs += 1;
    report.slowest = report.slowest.max(took);
    let describe = || format!("local.toml:\n{}\nenvironment: {:?}", input.text, input.env);
    match loaded {
        Err(_) => report
            .findings
            .push(format!("the loader panicked on\n{}", describe())),
        Ok(Ok(_)) => report.loaded += 1,
        Ok(Err(e)) if e.to_string().trim().is_empty() => report
            .findings
            .push(format!("an error without words for\n{}", describe())),
        Ok(Err(_)) => report.refused += 1,
    }
    if took > Duration::from_secs(1) {
        report
            .findings
            .push(format!("the loader took {took:?} on\n{}", describe()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn generated_layers_are_mostly_toml_and_both_load_and_are_refused() {
        let generator = Generator::new().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut report = Report::default();
        let mut toml_ok = 0;
        for i in 0..300 {
            let input = generator.input(&mut Rng::new(i));
            if toml::from_str::<toml::Table>(&input.text).is_ok() {
                toml_ok += 1;
            }
            check(dir.path(), &input, &mut report).unwrap();
        }
        assert!(toml_ok > 250, "{toml_ok} of 300 are TOML");
        assert_eq!(report.inputs, 300);
        assert!(report.loaded > 0 && report.refused > 0, "{report:?}");
        assert!(report.findings.is_empty(), "{:?}", report.findings);
    }
}
