//! `agentry run`: one turn, headless. The answer goes to standard output
//! (or every event as a JSON line), the activity to standard error; a
//! question is asked on the terminal, or, with nobody to answer, stops the
//! turn with its own exit code.

use super::{Driver, EXIT_NEEDS_APPROVAL, Follower, Mode, Notice, Place, exit_code, notices};
use crate::approval;
use crate::client::{print_line, status_error};
use crate::render::{Renderer, event_json};
use crate::terminal::Visible;
use agentry_client::relay::is_relayed;
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1 as spb;
use agentry_runtime::Config;
use std::io::IsTerminal;
use std::process::ExitCode;
use tokio::io::AsyncBufReadExt;

/// `agentry run`: one turn, headless.
pub async fn run(
    config: &Config,
    session: Option<String>,
    place: &Place,
    mode: Mode,
    json: bool,
    interrupt: bool,
    prompt: String,
) -> anyhow::Result<ExitCode> {
    let (mut driver, note) = Driver::open(config, session, place).await?;
    if let Some(note) = note
        && !json
    {
        eprintln!("agentry: {}", crate::terminal::visible(&note));
    }
    let own = driver.id().to_string();
    let mut events = Follower::new(&driver.client, &driver.session).await?;
    let mut input = super::user_input(prompt, mode);
    if let Some(pb::input::Kind::UserMessage(m)) = input.kind.as_mut() {
        m.interrupt = interrupt;
    }
    let submitted = driver
        .submit(input)
        .await
        .map_err(|s| status_error("the message was not accepted", s))?;
    let mut renderer = Renderer::new(
        Visible::new(std::io::stdout()),
        Visible::new(std::io::stderr()),
    )
    .of_session(&own);
    renderer.show_approvals = !std::io::stdin().is_terminal();
    renderer.verbose = mode.verbose;
    let mut cancelled = false;
    let mut needs_person = false;
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    loop {
        let event = tokio::select! {
            next = events.next() => next?,
            _ = tokio::signal::ctrl_c(), if !cancelled => {
                cancelled = true;
                eprintln!("\ncancelling the turn…");
                driver.cancel().await.map_err(|s| status_error("cannot cancel", s))?;
                continue;
            }
        };
        // What came before this message is not this turn's (a sub-agent's
        // relayed question has its own session and seq).
        if !is_relayed(&own, &event) && event.seq < submitted.seq {
            continue;
        }
        let applied = if json {
            print_line(event_json(&event))?;
            renderer.fold(&event)
        } else {
            renderer.event(&event)
        };
        for notice in notices(&own, &event, applied) {
            match notice {
                Notice::Approval(request) => {
                    if std::io::stdin().is_terminal() && !json {
                        let input = ask_on_terminal(&request, &mut lines).await?;
                        if let Err(status) = driver.decide(input).await {
                            eprintln!("agentry: {}", crate::terminal::visible(status.message()));
                        }
                    } else if !needs_person {
                        needs_person = true;
                        eprintln!(
                            "agentry: {} needs a person's approval ({}), and nobody can answer \
                             here; stopping the turn. Re-run with --approve always, or use \
                             `agentry chat`.",
                            request.tool, request.matched_rule
                        );
                        driver
                            .cancel()
                            .await
                            .map_err(|s| status_error("cannot cancel", s))?;
                    }
                }
                Notice::Finished { turn_id, outcome } if turn_id == submitted.turn_id => {
                    if !json {
                        eprintln!("session: {own}");
                    }
                    if needs_person {
                        return Ok(ExitCode::from(EXIT_NEEDS_APPROVAL));
                    }
                    return Ok(exit_code(outcome));
                }
                Notice::Finished { .. } | Notice::Resolved(_) => {}
            }
        }
    }
}

/// Asks on the terminal until the person gives a usable answer.
async fn ask_on_terminal(
    request: &spb::ApprovalRequested,
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::io::Stdin>>,
) -> anyhow::Result<pb::ApprovalInput> {
    eprint!(
        "{}{}",
        approval::describe(request),
        approval::question(request)
    );
    let mut request = request.clone();
    let mut edited = false;
    loop {
        let Some(line) = lines.next_line().await? else {
            anyhow::bail!("standard input closed while a tool call waited for approval");
        };
        match approval::answer(&request, &line, edited).await {
            approval::Answer::Decide(input) => return Ok(input),
            approval::Answer::Edited(arguments) => {
                eprint!("{}", approval::ask_edited(&mut request, arguments));
                edited = true;
            }
            approval::Answer::DenyAskReason => {
                eprint!("  Reason for the agent (optional, Enter to skip): ");
                let reason = lines.next_line().await?.unwrap_or_default();
                return Ok(approval::deny(&request.call_id, &reason));
            }
            approval::Answer::Again(why) => {
                eprint!("  {why}\n{}", approval::question(&request))
            }
        }
    }
}
