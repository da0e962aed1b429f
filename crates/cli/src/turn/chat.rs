//! The line chat (`agentry chat` on a pipe, or with `--plain`): a message
//! per line, the answers and activity on standard output, questions asked
//! between messages (or while a turn waits), slash commands.

use super::{
    Driver, Follower, Limits, Mode, Notice, Place, RESEND_EVERY, exit_code, unknown_command,
    user_input,
};
use crate::Approve;
use crate::approval;
use crate::render::Renderer;
use crate::terminal::Visible;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1 as spb;
use agentry_runtime::Config;
use std::io::IsTerminal;
use std::process::ExitCode;
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

/// The question the chat is asking, if any.
enum Asking {
    Nothing,
    Approval(spb::ApprovalRequested),
    /// The person edited the call: asked again before it runs as edited.
    Edited(spb::ApprovalRequested),
    DenyReason(spb::ApprovalRequested),
}

/// `agentry chat`: interactive, or one message per line from a pipe.
pub async fn chat(
    config: &Config,
    session: Option<String>,
    place: &Place,
    network: bool,
) -> anyhow::Result<ExitCode> {
    let (mut driver, note) = Driver::open(config, session, place).await?;
    let session = driver.session.clone();
    if let Some(note) = note {
        eprintln!("agentry: {}", crate::terminal::visible(&note));
    }
    if let Ok(tools) = driver
        .client
        .list_tools(pb::ListToolsRequest::default())
        .await
        && !tools.get_ref().model_problem.is_empty()
    {
        eprintln!(
            "agentry: {}; `agentry doctor` says how to fix it",
            crate::terminal::visible(&tools.get_ref().model_problem)
        );
    }
    let interactive = std::io::stdin().is_terminal();
    // Read the log from the start, silently, to number the turns as
    // `/rewind N` takes them and to find what still waits (an approval left
    // pending).
    let history_end = session.event_count;
    let mut start = session.clone();
    start.event_count = 0;
    let mut events = Follower::new(&driver.client, &start).await?;
    if interactive {
        let resumed = if session.user_message_count > 0 {
            format!(" ({} earlier messages)", session.user_message_count)
        } else {
            String::new()
        };
        let place = if session.project_dir.is_empty() {
            String::new()
        } else {
            format!(" in {}", crate::terminal::visible(&session.project_dir))
        };
        eprintln!(
            "session {}{place}{resumed}. Type a message; /help for commands, Ctrl+D to leave.",
            session.id
        );
        if network {
            eprintln!(
                "network on: the agent's commands reach public hosts through the tool runner's proxy (/network to switch)"
            );
        }
    }
    let (notices_tx, mut notices) = mpsc::unbounded_channel::<Notice>();
    let mut open_turn: Option<String> = None;
    let printer_session = session.id.clone();
    let printer = tokio::spawn(async move {
        let own_id = printer_session;
        let mut renderer = Renderer::new(
            Visible::new(std::io::stdout()),
            Visible::new(std::io::stdout()),
        )
        .of_session(&own_id);
        renderer.show_approvals = false;
        let mut turns = crate::render::TurnCounter::default();
        loop {
            let event = match events.next().await {
                Ok(event) => event,
                Err(e) => return Err::<(), _>(e),
            };
            if event.kind.is_none() {
                continue;
            }
            let turn_number = turns.follow(&event);
            if !event.live && event.seq <= history_end {
                // History: only what still waits for a decision is kept.
                renderer.fold(&event);
                if event.seq == history_end {
                    for question in renderer.questions() {
                        let _ = notices_tx.send(Notice::Approval(question));
                    }
                }
                continue;
            }
            // Numbers for a person to `/rewind` to; a script reading the
            // answers gets none.
            if let Some(number) = turn_number.filter(|_| interactive) {
                renderer.turn_header(number);
            }
            let applied = renderer.event(&event);
            for notice in super::notices(&own_id, &event, applied) {
                let _ = notices_tx.send(notice);
            }
        }
    });
    if session.turn_open {
        open_turn = Some(String::new());
    }
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut last_outcome = spb::TurnOutcome::Completed as i32;
    let mut asking = Asking::Nothing;
    let mut queued: Vec<spb::ApprovalRequested> = Vec::new();
    // Plan mode for every message, switched by /plan; network likewise, by
    // /network.
    let mut plan_mode = false;
    let mut network = network;
    let mut limits = Limits::default();
    let mut cancelled = false;
    let mut prompt_shown = false;
    // A message the orchestrator did not answer for: sent again every few
    // seconds until it is back.
    let mut unsent: Option<pb::Input> = None;
    let mut resend = tokio::time::interval(RESEND_EVERY);
    resend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        // Move to the next queued question when free.
        if matches!(asking, Asking::Nothing) && !queued.is_empty() {
            let next = queued.remove(0);
            eprint!("{}{}", approval::describe(&next), approval::question(&next));
            asking = Asking::Approval(next);
        }
        let idle = open_turn.is_none();
        let read_input = idle || !matches!(asking, Asking::Nothing);
        if interactive && idle && matches!(asking, Asking::Nothing) && !prompt_shown {
            eprint!("you> ");
            prompt_shown = true;
        }
        tokio::select! {
            line = lines.next_line(), if read_input => {
                prompt_shown = false;
                let Some(line) = line? else {
                    if let Some(kept) = unsent.as_ref().and_then(|i| match &i.kind {
                        Some(pb::input::Kind::UserMessage(m)) => Some(m.text.clone()),
                        _ => None,
                    }) {
                        eprintln!("\nthe orchestrator never answered; this message was not sent: {}", crate::terminal::visible(&kept));
                    }
                    let waiting = usize::from(matches!(asking, Asking::Approval(_) | Asking::Edited(_) | Asking::DenyReason(_))) + queued.len();
                    if interactive && open_turn.is_some() && waiting > 0 {
                        // The person left (Ctrl+D) with a question open: it
                        // is not decided here; it waits in the inbox.
                        eprintln!(
                            "\n{waiting} question{} of this session wait{} for an answer in `agentry approvals`; the turn goes on once answered (there, or here again).",
                            if waiting == 1 { "" } else { "s" },
                            if waiting == 1 { "s" } else { "" }
                        );
                        break;
                    }
                    if open_turn.is_some() {
                        // Input ended while a question was open: nobody is
                        // left to answer, so stop the turn and wait for it.
                        let _ = driver.cancel().await;
                        while let Some(n) = notices.recv().await {
                            if let Notice::Finished { outcome, .. } = n { last_outcome = outcome; break; }
                        }
                    }
                    break;
                };
                let edited = matches!(asking, Asking::Edited(_));
                match std::mem::replace(&mut asking, Asking::Nothing) {
                    Asking::Approval(mut request) | Asking::Edited(mut request) => {
                        match approval::answer(&request, &line, edited).await {
                            approval::Answer::Decide(input) => {
                                if let Err(status) = driver.decide(input).await {
                                    eprintln!("agentry: {}", crate::terminal::visible(status.message()));
                                }
                            }
                            approval::Answer::Edited(arguments) => {
                                eprint!("{}", approval::ask_edited(&mut request, arguments));
                                asking = Asking::Edited(request);
                            }
                            approval::Answer::DenyAskReason => {
                                eprint!("  Reason for the agent (optional, Enter to skip): ");
                                asking = Asking::DenyReason(request);
                            }
                            approval::Answer::Again(why) => {
                                eprint!("  {why}\n{}", approval::question(&request));
                                asking = if edited { Asking::Edited(request) } else { Asking::Approval(request) };
                            }
                        }
                    }
                    Asking::DenyReason(request) => {
                        let input = approval::deny(&request.call_id, &line);
                        if let Err(status) = driver.decide(input).await {
                            eprintln!("agentry: {}", crate::terminal::visible(status.message()));
                        }
                    }
                    Asking::Nothing => {
                        let text = line.trim();
                        match text {
                            "" => continue,
                            "/exit" | "/quit" | "exit" | "quit" => break,
                            "/help" => {
                                eprintln!("/plan <message>  run this message in plan mode (plan, then execute step by step)\n/plan            plan mode on or off for every message\n/network         outbound network for the agent's commands on or off (now {})\n/session         show this session's id\n/model NAME      switch this session's model from the next message\n/compact         summarise the conversation now (all but the last few messages) to free context\n/rewind N        back to the end of turn N, files included (see `agentry sessions show`)\n/exit            leave (also Ctrl+D, or Ctrl+C at the prompt)\nCtrl+C during a turn cancels it.", if network { "on" } else { "off" });
                                continue;
                            }
                            "/plan" => {
                                plan_mode = !plan_mode;
                                eprintln!("plan mode {}", if plan_mode { "on: every message is planned, then executed step by step" } else { "off" });
                                continue;
                            }
                            "/network" => {
                                network = !network;
                                eprintln!("network {}", if network { "on: the agent's commands reach public hosts through the tool runner's proxy" } else { "off" });
                                continue;
                            }
                            "/session" => {
                                eprintln!("{}", session.id);
                                continue;
                            }
                            _ => {}
                        }
                        if let Some(name) = text.strip_prefix("/model ") {
                            let input = pb::Input {
                                kind: Some(pb::input::Kind::Model(pb::ModelInput {
                                    name: name.trim().to_string(),
                                })),
                            };
                            if let Err(status) = driver.submit(input).await {
                                eprintln!("agentry: {}", crate::terminal::visible(status.message()));
                            }
                            continue;
                        }
                        if let Some(rest) = text.strip_prefix("/rewind") {
                            match rest.trim().parse::<u32>() {
                                Ok(to_turn) => {
                                    let rewound = driver
                                        .client
                                        .rewind_session(pb::RewindSessionRequest {
                                            session_id: session.id.clone(),
                                            to_turn,
                                            conversation_only: false,
                                        })
                                        .await;
                                    if let Err(status) = rewound {
                                        eprintln!("agentry: {}", crate::terminal::visible(status.message()));
                                    }
                                }
                                Err(_) => eprintln!("/rewind N: the turn to go back to (0: the start), as `agentry sessions show` numbers them"),
                            }
                            continue;
                        }
                        if text == "/compact" {
                            let mut input = user_input(text.to_string(), Mode { approve: Approve::Policy, plan: false, network, limits: Limits::default(), verbose: false });
                            if let Some(pb::input::Kind::UserMessage(m)) = &mut input.kind {
                                m.compact = true;
                            }
                            match driver.submit(input).await {
                                Ok(r) => {
                                    open_turn = Some(r.turn_id);
                                    cancelled = false;
                                }
                                Err(status) => eprintln!("agentry: {}", crate::terminal::visible(status.message())),
                            }
                            continue;
                        }
                        if let Some(rest) = text.strip_prefix("/budget") {
                            match limits.set(rest) {
                                Ok(()) => eprintln!("(limits raised with your next message)"),
                                Err(e) => eprintln!("{e}"),
                            }
                            continue;
                        }
                        let (text, plan) = match text.strip_prefix("/plan ") {
                            Some(rest) if !rest.trim().is_empty() => (rest.trim(), true),
                            _ => (text, plan_mode),
                        };
                        // A command this chat does not have is not sent to
                        // the model as a message (a path such as /etc/hosts is).
                        if let Some(unknown) = unknown_command(text) {
                            eprintln!("{unknown}");
                            continue;
                        }
                        let request = user_input(text.to_string(), Mode { approve: Approve::Policy, plan, network, limits: std::mem::take(&mut limits), verbose: false });
                        match driver.submit(request.clone()).await {
                            Ok(r) => {
                                open_turn = Some(r.turn_id);
                                cancelled = false;
                                unsent = None;
                            }
                            Err(status) if status.code() == tonic::Code::Unavailable => {
                                eprintln!(
                                    "agentry: disconnected: the orchestrator does not answer ({}); the message is kept and sent once it is back (Ctrl+D leaves)",
                                    crate::terminal::visible(status.message())
                                );
                                unsent = Some(request);
                                resend.reset();
                            }
                            Err(status) => eprintln!("agentry: {}", crate::terminal::visible(status.message())),
                        }
                    }
                }
            }
            notice = notices.recv() => match notice {
                Some(Notice::Finished { turn_id, outcome }) => {
                    if open_turn.as_deref().is_some_and(|t| t.is_empty() || t == turn_id) {
                        open_turn = None;
                        last_outcome = outcome;
                        asking = Asking::Nothing;
                        queued.clear();
                    }
                }
                Some(Notice::Approval(request)) => {
                    if open_turn.is_none() {
                        open_turn = Some(String::new());
                    }
                    let already = matches!(&asking, Asking::Approval(a) | Asking::Edited(a) | Asking::DenyReason(a) if a.call_id == request.call_id)
                        || queued.iter().any(|q| q.call_id == request.call_id);
                    if !already {
                        queued.push(request);
                    }
                }
                Some(Notice::Resolved(call_id)) => {
                    queued.retain(|q| q.call_id != call_id);
                    if matches!(&asking, Asking::Approval(a) | Asking::Edited(a) | Asking::DenyReason(a) if a.call_id == call_id) {
                        eprintln!("\n  (answered)");
                        asking = Asking::Nothing;
                    }
                }
                None => {
                    return match printer.await {
                        Ok(Err(e)) => Err(e),
                        _ => Err(anyhow::anyhow!("the event stream ended")),
                    };
                }
            },
            _ = resend.tick(), if unsent.is_some() && open_turn.is_none() => {
                let Some(request) = unsent.take() else { continue };
                match driver.submit(request.clone()).await {
                    Ok(r) => {
                        eprintln!("(the orchestrator answers again: the message was sent)");
                        open_turn = Some(r.turn_id);
                        cancelled = false;
                        prompt_shown = false;
                    }
                    Err(status) if status.code() == tonic::Code::Unavailable => unsent = Some(request),
                    Err(status) => eprintln!(
                        "agentry: the message kept while disconnected was not sent: {}",
                        crate::terminal::visible(status.message())
                    ),
                }
            }
            _ = tokio::signal::ctrl_c() => {
                if open_turn.is_some() && !cancelled {
                    cancelled = true;
                    asking = Asking::Nothing;
                    queued.clear();
                    eprintln!("\ncancelling the turn…");
                    if let Err(status) = driver.cancel().await {
                        eprintln!("agentry: {}", crate::terminal::visible(status.message()));
                    }
                } else if open_turn.is_none() {
                    eprintln!();
                    break;
                }
            }
        }
    }
    printer.abort();
    if interactive {
        eprintln!("bye. Resume with: agentry chat --session {}", session.id);
    }
    Ok(exit_code(last_outcome))
}
