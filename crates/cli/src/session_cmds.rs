//! `agentry sessions …` and `agentry tools`.

use crate::client::{connect, print_line, status_error};
use crate::render::{Renderer, event_json};
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1 as spb;
use agentry_runtime::Config;

/// How long ago `ts` was, for listings.
pub(crate) fn ago(ts: Option<&prost_types::Timestamp>) -> String {
    let Some(ts) = ts else { return "-".into() };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let secs = (now - ts.seconds).max(0);
    match secs {
        0..60 => format!("{secs}s ago"),
        60..3600 => format!("{}m ago", secs / 60),
        3600..86400 => format!("{}h ago", secs / 3600),
        _ => format!("{}d ago", secs / 86400),
    }
}

/// `agentry sessions list`.
pub async fn list(config: &Config, limit: u32) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let response = client
        .list_sessions(spb::ListSessionsRequest {
            limit,
            offset: 0,
            only_open_turns: false,
        })
        .await
        .map_err(|s| status_error("cannot list sessions", s))?
        .into_inner();
    if response.sessions.is_empty() {
        print_line("no sessions yet; start one with `agentry chat`")?;
        return Ok(());
    }
    print_line(format!(
        "{:<38} {:>9} {:>7} {:>9}  TITLE",
        "ID", "UPDATED", "MSGS", "EVENTS"
    ))?;
    for s in &response.sessions {
        let title = if s.title.is_empty() {
            "(empty)"
        } else {
            &s.title
        };
        print_line(format!(
            "{:<38} {:>9} {:>7} {:>9}  {}",
            s.id,
            ago(s.updated_at.as_ref()),
            s.user_message_count,
            s.event_count,
            title
        ))?;
    }
    if response.total > response.sessions.len() as u64 {
        print_line(format!(
            "({} of {} sessions; use --limit to see more)",
            response.sessions.len(),
            response.total
        ))?;
    }
    Ok(())
}

/// `agentry sessions show ID`.
pub async fn show(config: &Config, id: &str, json: bool) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let session = client
        .get_session(pb::GetSessionRequest {
            session_id: id.to_string(),
        })
        .await
        .map_err(|s| status_error(&format!("cannot show session {id}"), s))?
        .into_inner();
    let mut events = client
        .subscribe(pb::SubscribeRequest {
            session_id: id.to_string(),
            from_seq: 1,
        })
        .await
        .map_err(|s| status_error("cannot read the session", s))?
        .into_inner();
    if !json {
        print_line(format!(
            "session {} — {} ({} events)",
            session.id, session.title, session.event_count
        ))?;
    }
    let mut renderer = Renderer::new(std::io::stdout(), std::io::stdout());
    renderer.show_user = true;
    // Replay what is stored now, then stop.
    if session.event_count == 0 {
        return Ok(());
    }
    loop {
        let Some(event) = events
            .message()
            .await
            .map_err(|s| status_error("lost the event stream", s))?
        else {
            break;
        };
        if json {
            print_line(event_json(&event))?;
        } else {
            renderer.event(&event);
        }
        if event.seq >= session.event_count {
            break;
        }
    }
    Ok(())
}

/// `agentry tools`.
pub async fn tools(config: &Config) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let response = client
        .list_tools(pb::ListToolsRequest {})
        .await
        .map_err(|s| status_error("cannot list tools", s))?
        .into_inner();
    print_line(format!(
        "model {}: context window {} tokens ({}){}\n{}\n",
        config.llm.model,
        response.context_window,
        response.window_source,
        if response.lean {
            "; lean requests (short tool definitions, the tools each turn's skillset needs)"
        } else {
            ""
        },
        crate::render::fixed_part(response.fixed_tokens, response.context_window),
    ))?;
    for t in response.tools {
        let mut flags = Vec::new();
        if t.read_only {
            flags.push("read-only");
        }
        if t.sensitive {
            flags.push("sensitive");
        }
        print_line(format!(
            "{:<12} [{}]\n    {}",
            t.name,
            flags.join(", "),
            t.description
        ))?;
    }
    Ok(())
}
