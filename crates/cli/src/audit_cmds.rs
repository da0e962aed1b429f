//! `agentry audit`: who did what, and what let each tool call run, read
//! from the session logs in the session store (`agentry_client::audit`).

use crate::client::{credentials, dial, print_line, resolve_session, status_error};
use agentry_client::audit::{Record, records};
use agentry_proto::sessions::v1 as spb;
use agentry_proto::sessions::v1::session_store_client::SessionStoreClient;
use agentry_runtime::Config;
use agentry_runtime::telemetry::TracedChannel;

type Store = SessionStoreClient<TracedChannel>;

/// Prints the audit of one session, or of every session; only what
/// happened since `since` (RFC 3339, or a time ago: `30m`, `24h`, `7d`).
pub async fn run(
    config: &Config,
    session: Option<String>,
    since: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    let since_ms = since.as_deref().map(parse_since).transpose()?;
    let auth = credentials(config)?;
    let channel = dial(
        &auth,
        &config.session_store.url,
        "session store",
        "AGENTRY_SESSION_STORE_URL",
    )
    .await?;
    let mut store = SessionStoreClient::new(channel)
        .max_decoding_message_size(agentry_runtime::MAX_MESSAGE_BYTES);
    let ids = match session {
        Some(given) => vec![resolve_session(config, &given).await?],
        None => all_sessions(&mut store).await?,
    };
    let mut all: Vec<Record> = Vec::new();
    for id in &ids {
        let log = read_log(&mut store, id).await?;
        all.extend(
            records(&log)
                .into_iter()
                .filter(|r| since_ms.is_none_or(|since| r.time_ms.is_some_and(|t| t >= since))),
        );
    }
    all.sort_by(|a, b| (a.time_ms, &a.session_id, a.seq).cmp(&(b.time_ms, &b.session_id, b.seq)));
    if json {
        for record in &all {
            print_line(record.to_json())?;
        }
        return Ok(());
    }
    if all.is_empty() {
        return print_line("nothing was done in these sessions (in that time)");
    }
    for record in &all {
        let when = record
            .time_ms
            .and_then(chrono::DateTime::from_timestamp_millis)
            .map(|d| {
                d.with_timezone(&chrono::Local)
                    .format("%Y-%m-%d %H:%M:%S")
                    .to_string()
            })
            .unwrap_or_else(|| "-".repeat(19));
        let who = if record.by.is_empty() {
            "agent"
        } else {
            record.by.as_str()
        };
        let allowed = record
            .allowed
            .as_ref()
            .map(|a| format!(" — {}", a.describe()))
            .unwrap_or_default();
        print_line(format!(
            "{when}  {:<8}  {who:<12} {:<19} {}{allowed}",
            record.session_id.chars().take(8).collect::<String>(),
            record.action,
            record.subject
        ))?;
    }
    Ok(())
}

/// Milliseconds since the epoch of `text`: an RFC 3339 time, or a time
/// ago (`90s`, `30m`, `24h`, `7d`).
fn parse_since(text: &str) -> anyhow::Result<i64> {
    let text = text.trim();
    if let Ok(at) = chrono::DateTime::parse_from_rfc3339(text) {
        return Ok(at.timestamp_millis());
    }
    let unit_at = text.len().saturating_sub(1);
    let (number, unit) = text.split_at(unit_at);
    let seconds = match (number.parse::<i64>(), unit) {
        (Ok(n), "s") => n,
        (Ok(n), "m") => n * 60,
        (Ok(n), "h") => n * 3600,
        (Ok(n), "d") => n * 86_400,
        _ => anyhow::bail!(
            "--since {text:?}: give a time (2026-11-28T09:00:00+01:00) or a time ago (30m, 24h, 7d)"
        ),
    };
    Ok(chrono::Utc::now().timestamp_millis() - seconds * 1000)
}

async fn all_sessions(store: &mut Store) -> anyhow::Result<Vec<String>> {
    let mut ids = Vec::new();
    loop {
        let page = store
            .list_sessions(spb::ListSessionsRequest {
                limit: 1000,
                offset: ids.len() as u32,
                only_open_turns: false,
            })
            .await
            .map_err(|s| status_error("cannot list sessions", s))?
            .into_inner();
        let done =
            page.sessions.is_empty() || ids.len() as u64 + page.sessions.len() as u64 >= page.total;
        ids.extend(page.sessions.into_iter().map(|s| s.id));
        if done {
            return Ok(ids);
        }
    }
}

async fn read_log(store: &mut Store, session_id: &str) -> anyhow::Result<Vec<spb::Event>> {
    let mut events = Vec::new();
    let mut from = 1;
    loop {
        let page = store
            .read(spb::ReadRequest {
                session_id: session_id.to_string(),
                from_seq: from,
                limit: 0,
                ..Default::default()
            })
            .await
            .map_err(|s| status_error(&format!("cannot read session {session_id}"), s))?
            .into_inner();
        from = page.next_seq;
        events.extend(page.events);
        if !page.has_more {
            return Ok(events);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn since_takes_a_time_or_a_time_ago() {
        assert_eq!(
            parse_since("2026-11-28T09:00:00+01:00").unwrap(),
            1_795_852_800_000
        );
        let now = chrono::Utc::now().timestamp_millis();
        let day = parse_since("1d").unwrap();
        assert!((now - day - 86_400_000).abs() < 5_000, "{}", now - day);
        assert!(parse_since("yesterday").is_err());
        assert!(parse_since("5w").is_err());
        assert!(parse_since("").is_err());
    }
}
