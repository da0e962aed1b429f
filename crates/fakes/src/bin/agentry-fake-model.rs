//! `agentry-fake-model [--listen 127.0.0.1:PORT] [--script FILE.json]`
//!
//! Runs the testkit's fake model server until killed: OpenAI-compatible at
//! `http://ADDR/v1/chat/completions`, Ollama's native API at `http://ADDR/api/chat`. Without
//! `--script` it echoes the last user message; with it, it cycles through the replies of the
//! JSON file, an array whose items are one of:
//!
//! ```json
//! {"text": "Hello!"}
//! {"tool_call": {"name": "read_file", "arguments": {"path": "a.txt"}, "id": "call_1"}}
//! {"error": {"status": 503, "message": "overloaded"}}
//! {"error": {"status": 429, "message": "slow down", "retry_after": 2}}
//! ```
//!
//! (`id` and `retry_after`, in seconds, are optional.) Prints `listening on http://ADDR/v1`
//! once ready (for Ollama clients, use `http://ADDR`).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use agentry_fakes::fake_model::{FakeModel, Fallback, Reply, parse_script};
use anyhow::{Context, bail};
use serde_json::Value;

const USAGE: &str = "usage: agentry-fake-model [--listen 127.0.0.1:PORT] [--script FILE.json]";

struct Args {
    listen: SocketAddr,
    script: Option<PathBuf>,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> anyhow::Result<Option<Args>> {
    let mut parsed = Args {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        script: None,
    };
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_string(), Some(value.to_string()))
            }
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> anyhow::Result<String> {
            match inline.clone().or_else(|| args.next()) {
                Some(v) => Ok(v),
                None => bail!("{name} needs a value\n{USAGE}"),
            }
        };
        match flag.as_str() {
            "--listen" => {
                let v = value("--listen")?;
                parsed.listen = v.parse().with_context(|| {
                    format!("--listen: '{v}' is not an address like 127.0.0.1:8080")
                })?;
            }
            "--script" => parsed.script = Some(PathBuf::from(value("--script")?)),
            "-h" | "--help" => return Ok(None),
            other => bail!("unknown argument '{other}'\n{USAGE}"),
        }
    }
    Ok(Some(parsed))
}

fn load_script(path: &PathBuf) -> anyhow::Result<Vec<Reply>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read script {}", path.display()))?;
    let value: Value = serde_json::from_str(&text)
        .with_context(|| format!("script {} is not valid JSON", path.display()))?;
    parse_script(&value).with_context(|| format!("script {}", path.display()))
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentry-fake-model: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let Some(args) = parse_args(std::env::args().skip(1))? else {
        println!("{USAGE}");
        return Ok(());
    };
    let fallback = match &args.script {
        Some(path) => Fallback::Script(load_script(path)?),
        None => Fallback::Echo,
    };
    let fake = FakeModel::start_on(args.listen).await?;
    // Nothing reads the requests of a standalone server but their count.
    fake.forget_requests();
    fake.set_fallback(fallback);
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on {}", fake.base_url())?;
    stdout.flush()?;
    tokio::signal::ctrl_c()
        .await
        .context("cannot wait for ctrl-c")?;
    drop(fake);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn args(list: &[&str]) -> anyhow::Result<Option<Args>> {
        parse_args(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn parses_arguments() {
        let a = args(&[]).unwrap().unwrap();
        assert_eq!(a.listen, SocketAddr::from(([127, 0, 0, 1], 0)));
        assert!(a.script.is_none());
        let a = args(&["--listen", "127.0.0.1:9999", "--script=s.json"])
            .unwrap()
            .unwrap();
        assert_eq!(a.listen.port(), 9999);
        assert_eq!(a.script, Some(PathBuf::from("s.json")));
        assert!(args(&["--help"]).unwrap().is_none());
        assert!(args(&["--listen"]).is_err());
        assert!(args(&["--listen", "nope"]).is_err());
        assert!(args(&["--frobnicate"]).is_err());
    }

    #[test]
    fn loads_a_script_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("script.json");
        std::fs::write(
            &path,
            r#"[{"text": "a"}, {"error": {"status": 500, "message": "m"}}]"#,
        )
        .unwrap();
        assert_eq!(load_script(&path).unwrap().len(), 2);
        std::fs::write(&path, "[]").unwrap();
        assert!(load_script(&path).is_err());
        std::fs::write(&path, "{").unwrap();
        assert!(load_script(&path).is_err());
    }
}
