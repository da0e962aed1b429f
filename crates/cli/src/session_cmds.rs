//! `agentry sessions …` and `agentry tools`.

use crate::client::{connect, print_line, status_error};
use crate::render::{Renderer, event_json};
use crate::terminal::Visible;
use agentry_client::text::size;
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

/// Where a session works, in at most `width` characters: its project
/// directory (the home directory as `~`, a long path cut at the front), or
/// `scratch`.
pub fn place_of(project_dir: &str, width: usize) -> String {
    if project_dir.is_empty() {
        return "scratch".to_string();
    }
    let home = std::env::var("HOME").unwrap_or_default();
    let shown = match project_dir.strip_prefix(home.as_str()) {
        Some(rest) if !home.is_empty() && (rest.is_empty() || rest.starts_with('/')) => {
            format!("~{rest}")
        }
        _ => project_dir.to_string(),
    };
    let count = shown.chars().count();
    if count <= width {
        return shown;
    }
    let tail: String = shown.chars().skip(count - (width - 1)).collect();
    format!("…{tail}")
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
        "{:<38} {:>9} {:>7} {:>9}  {:<24}  TITLE",
        "ID", "UPDATED", "MSGS", "EVENTS", "WHERE"
    ))?;
    for s in &response.sessions {
        let title = match (s.name.is_empty(), s.title.is_empty()) {
            (true, true) => "(empty)".to_string(),
            (true, false) => s.title.clone(),
            (false, true) => format!("[{}]", s.name),
            (false, false) => format!("[{}] {}", s.name, s.title),
        };
        // A sub-agent's task says whose it is.
        let child = s
            .parent
            .as_ref()
            .map(|p| {
                if p.session_id.is_empty() {
                    format!("[as {}] ", p.agent)
                } else {
                    format!(
                        "↳ [{} for {}] ",
                        p.agent,
                        p.session_id.chars().take(8).collect::<String>()
                    )
                }
            })
            .unwrap_or_default();
        print_line(format!(
            "{:<38} {:>9} {:>7} {:>9}  {:<24}  {child}{}",
            s.id,
            ago(s.updated_at.as_ref()),
            s.user_message_count,
            s.event_count,
            place_of(&s.project_dir, 24),
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

/// `agentry sessions rename ID NAME` (`-` removes the name).
pub async fn rename(config: &Config, id: &str, name: &str) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let name = if name == "-" { "" } else { name };
    let session = client
        .rename_session(spb::RenameSessionRequest {
            session_id: id.to_string(),
            name: name.to_string(),
        })
        .await
        .map_err(|s| status_error(&format!("cannot rename session {id}"), s))?
        .into_inner();
    if session.name.is_empty() {
        print_line(format!("session {} has no name now", session.id))
    } else {
        print_line(format!(
            "session {} is named {}: `agentry chat --session {}`",
            session.id, session.name, session.name
        ))
    }
}

/// `agentry sessions delete ID`: asks first on a terminal.
pub async fn delete(config: &Config, id: &str, yes: bool) -> anyhow::Result<()> {
    use std::io::{BufRead, IsTerminal, Write};
    let mut client = connect(config).await?;
    let session = client
        .get_session(pb::GetSessionRequest {
            session_id: id.to_string(),
        })
        .await
        .map_err(|s| status_error(&format!("cannot find session {id}"), s))?
        .into_inner();
    if !yes {
        if !std::io::stdin().is_terminal() {
            anyhow::bail!(
                "deleting session {id} cannot be undone; pass --yes to delete it without a \
                 terminal to ask on"
            );
        }
        let files = if session.project_dir.is_empty() {
            "and its scratch workspace".to_string()
        } else {
            format!("(its project {} stays as it is)", session.project_dir)
        };
        eprint!(
            "delete session {} \"{}\" ({} messages, {} events) {files}? [y/N] ",
            session.id,
            crate::terminal::visible(&session.title),
            session.user_message_count,
            session.event_count
        );
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            eprintln!("nothing was deleted");
            return Ok(());
        }
    }
    let deleted = client
        .delete_session(spb::DeleteSessionRequest {
            session_id: id.to_string(),
        })
        .await
        .map_err(|s| status_error(&format!("cannot delete session {id}"), s))?
        .into_inner();
    print_line(format!(
        "deleted session {id} ({} events); its snapshots go with the next `agentry sessions prune`",
        deleted.deleted_events
    ))
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
            live_only: false,
        })
        .await
        .map_err(|s| status_error("cannot read the session", s))?
        .into_inner();
    if !json {
        print_line(format!(
            "session {} — {} ({} events)",
            session.id, session.title, session.event_count
        ))?;
        if !session.project_dir.is_empty() {
            print_line(format!("  works in {}", session.project_dir))?;
        }
        if let Some(parent) = &session.parent {
            if parent.session_id.is_empty() {
                print_line(format!("  works as the agent {}", parent.agent))?;
            } else {
                print_line(format!(
                    "  a task of the sub-agent {} for session {} (call {})",
                    parent.agent, parent.session_id, parent.call_id
                ))?;
            }
        }
        // The sessions of its sub-agents' tasks.
        let all = client
            .list_sessions(spb::ListSessionsRequest {
                limit: 1000,
                offset: 0,
                only_open_turns: false,
            })
            .await
            .map_err(|s| status_error("cannot list sessions", s))?
            .into_inner();
        for child in all.sessions.iter().filter(|s| {
            s.parent
                .as_ref()
                .is_some_and(|p| p.session_id == session.id)
        }) {
            let parent = child.parent.clone().unwrap_or_default();
            print_line(format!(
                "  ↳ {} [{} for call {}] {} ({} events)",
                child.id, parent.agent, parent.call_id, child.title, child.event_count
            ))?;
        }
    }
    // What is stored now, then stop.
    let mut log = Vec::new();
    while (log.last().map(|e: &spb::Event| e.seq).unwrap_or(0)) < session.event_count {
        let Some(event) = events
            .message()
            .await
            .map_err(|s| status_error("lost the event stream", s))?
        else {
            break;
        };
        // Streamed text of a turn running now is not part of the log.
        if event.live {
            continue;
        }
        log.push(event);
    }
    // Turns are numbered as `sessions rewind --to` takes them; events a
    // rewind left out of the conversation are marked as history.
    let effective = agentry_orchestrator::rewind::effective(&log);
    let kept: std::collections::HashSet<u64> = effective.iter().map(|e| e.seq).collect();
    let numbers: std::collections::HashMap<u64, u32> =
        agentry_orchestrator::rewind::turns(&effective)
            .into_iter()
            .map(|t| (t.first_seq, t.number))
            .collect();
    let mut renderer = Renderer::new(
        Visible::new(std::io::stdout()),
        Visible::new(std::io::stdout()),
    );
    renderer.show_user = true;
    for event in &log {
        let history = !kept.contains(&event.seq);
        if json {
            let mut line = event_json(event);
            if history && let serde_json::Value::Object(fields) = &mut line {
                fields.insert("history".into(), serde_json::Value::Bool(true));
            }
            print_line(line)?;
            continue;
        }
        let starts_turn = !event.turn_id.is_empty()
            && event
                .kind
                .as_ref()
                .is_some_and(agentry_orchestrator::rewind::starts_turn);
        if starts_turn {
            let header = match numbers.get(&event.seq) {
                Some(n) => format!("── turn {n} · seq {} ──", event.seq),
                None if history => format!("── turn (rewound: history) · seq {} ──", event.seq),
                None => format!("── seq {} ──", event.seq),
            };
            print_line(header)?;
        }
        renderer.event(event);
    }
    Ok(())
}

/// `agentry sessions fork`.
pub async fn fork(
    config: &Config,
    id: &str,
    at_seq: u64,
    new_id: Option<String>,
    conversation_only: bool,
    dir: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let forked = client
        .fork_session(pb::ForkSessionRequest {
            session_id: id.to_string(),
            at_seq,
            new_session_id: new_id.unwrap_or_default(),
            conversation_only,
            dir: dir
                .as_ref()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
        })
        .await
        .map_err(|s| status_error(&format!("cannot fork session {id}"), s))?
        .into_inner();
    let session = forked.session.unwrap_or_default();
    let at = if at_seq == 0 {
        "its whole log".to_string()
    } else {
        format!("seq {at_seq}")
    };
    print_line(format!("forked {id} at {at} into {}", session.id))?;
    if !session.project_dir.is_empty() {
        print_line(format!(
            "  works in {}, its files as they are (nothing copied)",
            session.project_dir
        ))?;
    } else if forked.snapshot_id.is_empty() {
        print_line("  files: not copied (--conversation-only); the new workspace is empty")?;
    } else if forked.snapshot_seq > 0 {
        print_line(format!(
            "  files: as recorded at seq {} ({} entries written)",
            forked.snapshot_seq, forked.files_written
        ))?;
    } else {
        print_line(format!(
            "  files: as they are now ({} entries written)",
            forked.files_written
        ))?;
    }
    if forked.closed_open_turn {
        print_line("  the fork ended inside a turn: that turn was closed as cancelled")?;
    }
    print_line(format!(
        "continue with: agentry chat --session {}",
        session.id
    ))?;
    Ok(())
}

/// `agentry sessions rewind`.
pub async fn rewind(
    config: &Config,
    id: &str,
    to_turn: u32,
    conversation_only: bool,
) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let response = client
        .rewind_session(pb::RewindSessionRequest {
            session_id: id.to_string(),
            to_turn,
            conversation_only,
        })
        .await
        .map_err(|s| status_error(&format!("cannot rewind session {id}"), s))?
        .into_inner();
    let rewound = response.rewound.unwrap_or_default();
    print_line(format!(
        "rewound {id} to the end of turn {to_turn} (seq {}): {} events are now history",
        rewound.to_seq, response.events_rewound
    ))?;
    if rewound.snapshot_id.is_empty() {
        print_line("  files: left as they are (--conversation-only)")?;
    } else {
        print_line(format!(
            "  files: put back ({} written, {} removed{})",
            rewound.files_written,
            rewound.files_deleted,
            if rewound.files_left_alone > 0 {
                format!(
                    ", {} too large to record left as they are",
                    rewound.files_left_alone
                )
            } else {
                String::new()
            }
        ))?;
    }
    Ok(())
}

/// `agentry sessions prune`.
pub async fn prune(config: &Config, dry_run: bool) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    let pruned = client
        .prune_snapshots(pb::PruneSnapshotsRequest { dry_run })
        .await
        .map_err(|s| status_error("cannot prune workspace snapshots", s))?
        .into_inner();
    let verb = if dry_run { "would remove" } else { "removed" };
    print_line(format!(
        "{verb} {} snapshot{} ({} of deleted sessions) and {} stored files: {} freed, {} kept in {} snapshots",
        pruned.snapshots_removed,
        if pruned.snapshots_removed == 1 {
            ""
        } else {
            "s"
        },
        pruned.sessions_removed,
        pruned.objects_removed,
        size(pruned.bytes_freed),
        size(pruned.bytes_kept),
        pruned.snapshots_kept,
    ))?;
    Ok(())
}

/// `agentry tools`.
pub async fn tools(config: &Config) -> anyhow::Result<()> {
    let mut client = connect(config).await?;
    // What a session started here would be given.
    let project_dir = std::env::current_dir()
        .ok()
        .filter(|d| d.parent().is_some())
        .map(|d| d.display().to_string())
        .unwrap_or_default();
    let response = client
        .list_tools(pb::ListToolsRequest { project_dir })
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
    if !response.instructions.is_empty() {
        print_line("instructions a session started here is given (in the fixed part):")?;
        for file in &response.instructions {
            print_line(format!(
                "  {} ({}{})",
                file.path,
                size(file.size),
                if file.truncated {
                    "; cut at 32 KiB"
                } else {
                    ""
                }
            ))?;
        }
        print_line("")?;
    }
    if !response.instructions_note.is_empty() {
        print_line(format!(
            "(no project instructions for this directory: {})\n",
            response.instructions_note
        ))?;
    }
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
