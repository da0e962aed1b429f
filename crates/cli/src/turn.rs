//! `agentry run` and `agentry chat`: submitting messages and following the
//! session's events until the turn ends.

use crate::Approve;
use crate::client::{connect, print_line, status_error};
use crate::render::{Renderer, event_json};
use agentry_proto::orchestrator::v1::{self as pb, orchestrator_client::OrchestratorClient};
use agentry_proto::sessions::v1::{self as spb, event::Kind};
use agentry_runtime::Config;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::transport::Channel;

/// Exit code of a failed turn.
const EXIT_FAILED: u8 = 1;
/// Exit code of a turn that hit the step limit.
const EXIT_STEP_LIMIT: u8 = 3;
/// Exit code of a cancelled turn.
const EXIT_CANCELLED: u8 = 130;

fn exit_code(outcome: i32) -> ExitCode {
    match spb::TurnOutcome::try_from(outcome) {
        Ok(spb::TurnOutcome::Completed) => ExitCode::SUCCESS,
        Ok(spb::TurnOutcome::StepLimit) => ExitCode::from(EXIT_STEP_LIMIT),
        Ok(spb::TurnOutcome::Cancelled) => ExitCode::from(EXIT_CANCELLED),
        Ok(spb::TurnOutcome::Failed | spb::TurnOutcome::Unspecified) | Err(_) => {
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// Opens the named session, or creates a new one.
async fn open_session(
    client: &mut OrchestratorClient<Channel>,
    session: Option<String>,
) -> anyhow::Result<spb::Session> {
    match session {
        Some(id) => client
            .get_session(pb::GetSessionRequest {
                session_id: id.clone(),
            })
            .await
            .map(|r| r.into_inner())
            .map_err(|s| status_error(&format!("cannot open session {id}"), s)),
        None => client
            .create_session(pb::CreateSessionRequest::default())
            .await
            .map(|r| r.into_inner())
            .map_err(|s| status_error("cannot create a session", s)),
    }
}

/// A session's event stream that survives a restart of the orchestrator or
/// the session store: on a broken stream it resubscribes from the next seq.
struct Follower {
    client: OrchestratorClient<Channel>,
    session_id: String,
    next_seq: u64,
    stream: Option<Streaming<spb::Event>>,
}

/// How long a broken event stream is retried before giving up.
const RECONNECT_FOR: Duration = Duration::from_secs(30);

impl Follower {
    async fn new(
        client: &OrchestratorClient<Channel>,
        session: &spb::Session,
    ) -> anyhow::Result<Follower> {
        let mut follower = Follower {
            client: client.clone(),
            session_id: session.id.clone(),
            next_seq: session.event_count + 1,
            stream: None,
        };
        follower.stream = Some(
            follower
                .subscribe()
                .await
                .map_err(|s| status_error("cannot follow the session", s))?,
        );
        Ok(follower)
    }

    async fn subscribe(&mut self) -> Result<Streaming<spb::Event>, tonic::Status> {
        self.client
            .subscribe(pb::SubscribeRequest {
                session_id: self.session_id.clone(),
                from_seq: self.next_seq,
            })
            .await
            .map(|r| r.into_inner())
    }

    /// The next event, reconnecting when the stream breaks.
    async fn next(&mut self) -> anyhow::Result<spb::Event> {
        let mut broken_since: Option<Instant> = None;
        loop {
            let failure = match &mut self.stream {
                Some(stream) => match stream.message().await {
                    Ok(Some(event)) => {
                        self.next_seq = event.seq + 1;
                        return Ok(event);
                    }
                    Ok(None) => "the event stream ended".to_string(),
                    Err(status) => status.message().to_string(),
                },
                None => "not subscribed".to_string(),
            };
            self.stream = None;
            let since = *broken_since.get_or_insert_with(|| {
                eprintln!("({failure}; reconnecting…)");
                Instant::now()
            });
            if since.elapsed() > RECONNECT_FOR {
                anyhow::bail!("lost the session's event stream: {failure}");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            if let Ok(stream) = self.subscribe().await {
                self.stream = Some(stream);
            }
        }
    }
}

fn user_input(text: String, approve: Approve) -> pb::Input {
    let approval_mode = match approve {
        Approve::Always => pb::ApprovalMode::Always,
        Approve::Never => pb::ApprovalMode::Never,
        Approve::Policy => pb::ApprovalMode::Policy,
    };
    pb::Input {
        kind: Some(pb::input::Kind::UserMessage(pb::UserInput {
            text,
            approval_mode: approval_mode as i32,
        })),
    }
}

fn cancel_input() -> pb::Input {
    pb::Input {
        kind: Some(pb::input::Kind::Cancel(pb::CancelInput {
            reason: "interrupted by the user".into(),
        })),
    }
}

/// `agentry run`: one turn, headless.
pub async fn run(
    config: &Config,
    session: Option<String>,
    approve: Approve,
    json: bool,
    prompt: String,
) -> anyhow::Result<ExitCode> {
    let mut client = connect(config).await?;
    let session = open_session(&mut client, session).await?;
    let mut events = Follower::new(&client, &session).await?;
    let submitted = client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(user_input(prompt, approve)),
        })
        .await
        .map_err(|s| status_error("the message was not accepted", s))?
        .into_inner();
    let mut renderer = Renderer::new(std::io::stdout(), std::io::stderr());
    let mut cancelled = false;
    loop {
        let next = tokio::select! {
            next = events.next() => next?,
            _ = tokio::signal::ctrl_c(), if !cancelled => {
                cancelled = true;
                eprintln!("\ncancelling the turn…");
                client
                    .submit(pb::SubmitRequest { session_id: session.id.clone(), input: Some(cancel_input()) })
                    .await
                    .map_err(|s| status_error("cannot cancel", s))?;
                continue;
            }
        };
        let event = next;
        if event.seq < submitted.seq {
            continue;
        }
        if json {
            print_line(event_json(&event))?;
        } else {
            renderer.event(&event);
        }
        if let Some(Kind::TurnFinished(finished)) = &event.kind
            && event.turn_id == submitted.turn_id
        {
            if !json {
                eprintln!("session: {}", session.id);
            }
            return Ok(exit_code(finished.outcome));
        }
    }
}

/// `agentry chat`: interactive, or one message per line from a pipe.
pub async fn chat(config: &Config, session: Option<String>) -> anyhow::Result<ExitCode> {
    let mut client = connect(config).await?;
    let session = open_session(&mut client, session).await?;
    let interactive = std::io::stdin().is_terminal();
    let mut events = Follower::new(&client, &session).await?;
    if interactive {
        let resumed = if session.user_message_count > 0 {
            format!(" ({} earlier messages)", session.user_message_count)
        } else {
            String::new()
        };
        eprintln!(
            "session {}{resumed}. Type a message; /help for commands, Ctrl+D to leave.",
            session.id
        );
    }
    // Print events as they come and report finished turns.
    let (finished_tx, mut finished) = mpsc::unbounded_channel::<(String, i32)>();
    let printer = tokio::spawn(async move {
        let mut renderer = Renderer::new(std::io::stdout(), std::io::stdout());
        loop {
            let event = match events.next().await {
                Ok(event) => event,
                Err(e) => return Err::<(), _>(e),
            };
            renderer.event(&event);
            if let Some(Kind::TurnFinished(f)) = &event.kind {
                let _ = finished_tx.send((event.turn_id.clone(), f.outcome));
            }
        }
    });
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut last_outcome = spb::TurnOutcome::Completed as i32;
    loop {
        if interactive {
            eprint!("you> ");
        }
        let line = tokio::select! {
            line = lines.next_line() => line?,
            _ = tokio::signal::ctrl_c() => None,
        };
        let Some(line) = line else { break };
        let text = line.trim();
        match text {
            "" => continue,
            "/exit" | "/quit" => break,
            "/help" => {
                eprintln!(
                    "/session  show this session's id\n/exit     leave (also Ctrl+D)\nCtrl+C during a turn cancels it."
                );
                continue;
            }
            "/session" => {
                eprintln!("{}", session.id);
                continue;
            }
            _ => {}
        }
        let submitted = client
            .submit(pb::SubmitRequest {
                session_id: session.id.clone(),
                input: Some(user_input(text.to_string(), Approve::Policy)),
            })
            .await;
        let turn_id = match submitted {
            Ok(r) => r.into_inner().turn_id,
            Err(status) => {
                eprintln!("agentry: {}", status.message());
                continue;
            }
        };
        let mut cancelled = false;
        loop {
            tokio::select! {
                done = finished.recv() => match done {
                    Some((id, outcome)) if id == turn_id => { last_outcome = outcome; break; }
                    Some(_) => continue,
                    None => {
                        return match printer.await {
                            Ok(Err(e)) => Err(e),
                            _ => Err(anyhow::anyhow!("the event stream ended")),
                        };
                    }
                },
                _ = tokio::signal::ctrl_c(), if !cancelled => {
                    cancelled = true;
                    if let Err(status) = client
                        .submit(pb::SubmitRequest { session_id: session.id.clone(), input: Some(cancel_input()) })
                        .await
                    {
                        eprintln!("agentry: {}", status.message());
                    }
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
