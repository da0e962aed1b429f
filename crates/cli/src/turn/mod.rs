//! `agentry run` and the line chat: one driver of a session ([`Driver`]:
//! open it, submit, cancel, answer questions wherever they were asked;
//! [`Follower`]: its events, across reconnections; [`notices`]: what each
//! event asks of the person, from the shared view) with three front ends,
//! `run.rs` (one turn, headless), `chat.rs` (a message per line) and the
//! full-screen chat (`crate::tui`).

mod chat;
mod run;

pub use chat::chat;
pub use run::run;

use crate::Approve;
use crate::client::{connect, status_error};
use agentry_client::relay::{answer_to, is_relayed};
use agentry_client::view::Applied;
use agentry_proto::orchestrator::v1::{self as pb, orchestrator_client::OrchestratorClient};
use agentry_proto::sessions::v1::{self as spb, event::Kind};
use agentry_runtime::Config;
use agentry_runtime::telemetry::TracedChannel;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tonic::Streaming;

/// Exit code of a failed turn.
const EXIT_FAILED: u8 = 1;
/// Exit code of a turn that hit the step limit.
const EXIT_STEP_LIMIT: u8 = 3;
/// Exit code of a turn stopped because a call needed a person and none could answer.
const EXIT_NEEDS_APPROVAL: u8 = 4;
/// Exit code of a turn stopped at a spending limit.
const EXIT_BUDGET: u8 = 5;
/// Exit code of a cancelled turn.
const EXIT_CANCELLED: u8 = 130;

fn exit_code(outcome: i32) -> ExitCode {
    match spb::TurnOutcome::try_from(outcome) {
        Ok(spb::TurnOutcome::Completed) => ExitCode::SUCCESS,
        Ok(spb::TurnOutcome::StepLimit) => ExitCode::from(EXIT_STEP_LIMIT),
        Ok(spb::TurnOutcome::Budget) => ExitCode::from(EXIT_BUDGET),
        Ok(spb::TurnOutcome::Cancelled) => ExitCode::from(EXIT_CANCELLED),
        Ok(spb::TurnOutcome::Failed | spb::TurnOutcome::Unspecified) | Err(_) => {
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// Where a new session works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// The directory the command started in: the session works there when
    /// the services allow it, else in a scratch workspace, said once.
    Here(std::path::PathBuf),
    /// `--dir`: that directory, or an error saying why not.
    Dir(std::path::PathBuf),
    /// `--scratch`: an empty workspace of its own.
    Scratch,
}

impl Place {
    /// The place `--dir` and `--scratch` name (they exclude each other),
    /// else the current directory.
    pub fn from_args(dir: Option<std::path::PathBuf>, scratch: bool) -> anyhow::Result<Place> {
        if scratch {
            return Ok(Place::Scratch);
        }
        if let Some(dir) = dir {
            let full = std::fs::canonicalize(&dir).map_err(|e| {
                anyhow::anyhow!(
                    "--dir {}: {e}",
                    crate::terminal::visible(&dir.display().to_string())
                )
            })?;
            if !full.is_dir() {
                anyhow::bail!("--dir {}: not a directory", full.display());
            }
            return Ok(Place::Dir(full));
        }
        // The root directory is never anyone's project (a container's
        // default working directory): a scratch workspace, silently.
        match std::env::current_dir() {
            Ok(dir) if dir.parent().is_some() => Ok(Place::Here(dir)),
            _ => Ok(Place::Scratch),
        }
    }
}

/// Opens the named session, or creates a new one working in `place`.
/// Returns it with a note to show when the place could not be used.
pub(crate) async fn open_session(
    client: &mut OrchestratorClient<TracedChannel>,
    session: Option<String>,
    place: &Place,
) -> anyhow::Result<(spb::Session, Option<String>)> {
    if let Some(id) = session {
        return client
            .get_session(pb::GetSessionRequest {
                session_id: id.clone(),
            })
            .await
            .map(|r| (r.into_inner(), None))
            .map_err(|s| status_error(&format!("cannot open session {id}"), s));
    }
    let create = |project_dir: String| pb::CreateSessionRequest {
        project_dir,
        ..Default::default()
    };
    let dir = match place {
        Place::Scratch => None,
        Place::Here(dir) | Place::Dir(dir) => Some(dir.display().to_string()),
    };
    let Some(dir) = dir else {
        return client
            .create_session(create(String::new()))
            .await
            .map(|r| (r.into_inner(), None))
            .map_err(|s| status_error("cannot create a session", s));
    };
    match client.create_session(create(dir.clone())).await {
        Ok(r) => Ok((r.into_inner(), None)),
        Err(s)
            if matches!(place, Place::Here(_))
                && matches!(
                    s.code(),
                    tonic::Code::PermissionDenied
                        | tonic::Code::InvalidArgument
                        | tonic::Code::Unimplemented
                ) =>
        {
            let note = format!(
                "this session works in a scratch workspace, not in {dir}: {}",
                s.message()
            );
            client
                .create_session(create(String::new()))
                .await
                .map(|r| (r.into_inner(), Some(note)))
                .map_err(|s| status_error("cannot create a session", s))
        }
        Err(s) => Err(status_error(
            &format!("cannot create a session working in {dir}"),
            s,
        )),
    }
}

/// A session's event stream that survives a restart of the orchestrator or
/// the session store: on a broken stream it resubscribes from the next seq.
pub(crate) struct Follower {
    /// Says nothing on stderr while it reconnects (a full-screen chat
    /// owns the terminal).
    pub quiet: bool,
    client: OrchestratorClient<TracedChannel>,
    session_id: String,
    next_seq: u64,
    stream: Option<Streaming<spb::Event>>,
}

/// How often a message kept while the orchestrator did not answer is sent
/// again.
const RESEND_EVERY: Duration = Duration::from_secs(2);

/// How long a broken event stream is retried before giving up.
const RECONNECT_FOR: Duration = Duration::from_secs(30);

impl Follower {
    pub(crate) async fn new(
        client: &OrchestratorClient<TracedChannel>,
        session: &spb::Session,
    ) -> anyhow::Result<Follower> {
        let mut follower = Follower {
            quiet: false,
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

    /// Follows session `session_id` from event `next_seq` on; it subscribes
    /// at its first [`Follower::next`].
    pub(crate) fn from_seq(
        client: &OrchestratorClient<TracedChannel>,
        session_id: &str,
        next_seq: u64,
    ) -> Follower {
        Follower {
            quiet: false,
            client: client.clone(),
            session_id: session_id.to_string(),
            next_seq,
            stream: None,
        }
    }

    async fn subscribe(&mut self) -> Result<Streaming<spb::Event>, tonic::Status> {
        self.client
            .subscribe(pb::SubscribeRequest {
                session_id: self.session_id.clone(),
                from_seq: self.next_seq,
                live_only: false,
            })
            .await
            .map(|r| r.into_inner())
    }

    /// The next event, reconnecting when the stream breaks.
    pub(crate) async fn next(&mut self) -> anyhow::Result<spb::Event> {
        let mut broken_since: Option<Instant> = None;
        if self.stream.is_none()
            && let Ok(stream) = self.subscribe().await
        {
            self.stream = Some(stream);
        }
        loop {
            let failure = match &mut self.stream {
                Some(stream) => match stream.message().await {
                    Ok(Some(event)) => {
                        // A live event is not in the log: the position
                        // in it stays.
                        if !event.live {
                            self.next_seq = event.seq + 1;
                        }
                        return Ok(event);
                    }
                    Ok(None) => "the event stream ended".to_string(),
                    Err(status) => status.message().to_string(),
                },
                None => "not subscribed".to_string(),
            };
            self.stream = None;
            let quiet = self.quiet;
            let since = *broken_since.get_or_insert_with(|| {
                if !quiet {
                    eprintln!("({failure}; reconnecting…)");
                }
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

/// A session driven from the command line: the connection, the session,
/// and the inputs both front ends send.
#[derive(Clone)]
pub(crate) struct Driver {
    /// The orchestrator.
    pub client: OrchestratorClient<TracedChannel>,
    /// The session, as it was when opened.
    pub session: spb::Session,
}

impl Driver {
    /// Connects and opens the named session, or makes one working in
    /// `place`; the note says why the place could not be used, if so.
    pub(crate) async fn open(
        config: &Config,
        session: Option<String>,
        place: &Place,
    ) -> anyhow::Result<(Driver, Option<String>)> {
        let mut client = connect(config).await?;
        let (session, note) = open_session(&mut client, session, place).await?;
        Ok((Driver { client, session }, note))
    }

    /// The session's id.
    pub(crate) fn id(&self) -> &str {
        &self.session.id
    }

    /// Sends one input to the session.
    pub(crate) async fn submit(
        &mut self,
        input: pb::Input,
    ) -> Result<pb::SubmitResponse, tonic::Status> {
        let request = pb::SubmitRequest {
            session_id: self.session.id.clone(),
            input: Some(input),
        };
        self.client.submit(request).await.map(|r| r.into_inner())
    }

    /// Cancels the turn running.
    pub(crate) async fn cancel(&mut self) -> Result<(), tonic::Status> {
        self.cancel_because("interrupted by the user").await
    }

    /// Cancels the turn running, saying why.
    pub(crate) async fn cancel_because(&mut self, reason: &str) -> Result<(), tonic::Status> {
        let input = pb::Input {
            kind: Some(pb::input::Kind::Cancel(pb::CancelInput {
                reason: reason.to_string(),
            })),
        };
        self.submit(input).await.map(|_| ())
    }

    /// Switches the session's model from its next model call on (empty:
    /// the configured one again).
    pub(crate) async fn set_model(&mut self, name: String) -> Result<(), tonic::Status> {
        let input = pb::Input {
            kind: Some(pb::input::Kind::Model(pb::ModelInput { name })),
        };
        self.submit(input).await.map(|_| ())
    }

    /// Takes the session back to before turn `to_turn` (0: the start),
    /// with its files.
    pub(crate) async fn rewind(&mut self, to_turn: u32) -> Result<(), tonic::Status> {
        let request = pb::RewindSessionRequest {
            session_id: self.session.id.clone(),
            to_turn,
            conversation_only: false,
        };
        self.client.rewind_session(request).await.map(|_| ())
    }

    /// What the call waiting as `call_id` would change (a sub-agent's,
    /// relayed, is previewed in its session).
    pub(crate) async fn preview(
        &mut self,
        call_id: &str,
    ) -> Result<agentry_proto::tools::v1::PreviewResponse, tonic::Status> {
        let (session_id, call_id) = answer_to(&self.session.id, call_id);
        let request = pb::PreviewCallRequest {
            session_id,
            call_id,
        };
        self.client
            .preview_call(request)
            .await
            .map(tonic::Response::into_inner)
    }

    /// Whether the session's log holds a message of the person with this
    /// text after event `after_seq`: for a message whose sending was cut
    /// off (it may have arrived), asked before it is sent again. Reads what
    /// the log has now (until it is quiet for a moment).
    pub(crate) async fn arrived(
        &mut self,
        text: &str,
        after_seq: u64,
    ) -> Result<bool, tonic::Status> {
        let mut events = self
            .client
            .subscribe(pb::SubscribeRequest {
                session_id: self.session.id.clone(),
                from_seq: after_seq + 1,
                live_only: false,
            })
            .await?
            .into_inner();
        let quiet = Duration::from_millis(300);
        while let Ok(next) = tokio::time::timeout(quiet, events.message()).await {
            match next? {
                Some(spb::Event {
                    kind: Some(Kind::UserMessage(m)),
                    live: false,
                    ..
                }) if m.text == text => return Ok(true),
                Some(spb::Event {
                    kind: Some(Kind::SteeringQueued(q)),
                    live: false,
                    ..
                }) if q.text == text => return Ok(true),
                Some(_) => {}
                None => break,
            }
        }
        Ok(false)
    }

    /// Answers the question kept as `input.call_id`: this session's, or a
    /// sub-agent's, relayed (the answer goes to the sub-agent's session).
    pub(crate) async fn decide(&mut self, input: pb::ApprovalInput) -> Result<(), tonic::Status> {
        decide(&mut self.client, &self.session.id, input).await
    }
}

/// Answers the question session `own`'s client keeps as `input.call_id`:
/// the session's own, or a sub-agent's, relayed (the answer goes to the
/// sub-agent's session). Both chats answer through it.
pub(crate) async fn decide(
    client: &mut OrchestratorClient<TracedChannel>,
    own: &str,
    mut input: pb::ApprovalInput,
) -> Result<(), tonic::Status> {
    let (session_id, call_id) = answer_to(own, &input.call_id);
    input.call_id = call_id;
    client
        .submit(pb::SubmitRequest {
            session_id,
            input: Some(pb::Input {
                kind: Some(pb::input::Kind::Approval(input)),
            }),
        })
        .await
        .map(|_| ())
}

/// What an event of the session asks of a front end.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Notice {
    /// A turn of the session ended.
    Finished {
        /// Its id.
        turn_id: String,
        /// How.
        outcome: i32,
    },
    /// A call waits for a decision (a sub-agent's, relayed, under an id
    /// naming its session: see [`agentry_client::relay::question_id`]).
    Approval(spb::ApprovalRequested),
    /// A call no longer waits (someone answered, here or elsewhere).
    Resolved(String),
}

/// The notices of `event` of session `own`, from what it changed in the
/// shared view.
pub(crate) fn notices(own: &str, event: &spb::Event, applied: Applied) -> Vec<Notice> {
    let mut out: Vec<Notice> = applied.asked.into_iter().map(Notice::Approval).collect();
    out.extend(applied.resolved.into_iter().map(Notice::Resolved));
    if let Some(Kind::TurnFinished(f)) = &event.kind
        && !is_relayed(own, event)
    {
        out.push(Notice::Finished {
            turn_id: event.turn_id.clone(),
            outcome: f.outcome,
        });
    }
    out
}

/// How a message's turn runs.
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    /// How tool calls needing confirmation are handled.
    pub approve: Approve,
    /// Plan mode.
    pub plan: bool,
    /// Outbound network for the turn's bash calls.
    pub network: bool,
    /// Spending limits to raise with the message (0: unchanged).
    pub limits: Limits,
    /// Print details a person rarely needs.
    pub verbose: bool,
}

/// Spending limits to raise (0: unchanged).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// Tokens per turn.
    pub turn_tokens: u64,
    /// Tokens per session.
    pub session_tokens: u64,
    /// Cost per turn.
    pub turn_cost: f64,
    /// Cost per session.
    pub session_cost: f64,
}

impl Limits {
    fn to_proto(self) -> Option<spb::Budget> {
        (self != Limits::default()).then_some(spb::Budget {
            turn_tokens: self.turn_tokens,
            session_tokens: self.session_tokens,
            turn_cost: self.turn_cost,
            session_cost: self.session_cost,
        })
    }

    /// Takes `/budget KEY VALUE` (keys: tokens, session-tokens, cost,
    /// session-cost); the error says what is expected.
    pub(crate) fn set(&mut self, command: &str) -> Result<(), String> {
        let usage = "usage: /budget tokens|session-tokens|cost|session-cost VALUE";
        let mut words = command.split_whitespace();
        let (Some(key), Some(value), None) = (words.next(), words.next(), words.next()) else {
            return Err(usage.to_string());
        };
        let number = |v: &str| v.parse::<f64>().ok().filter(|n| n.is_finite() && *n > 0.0);
        let Some(n) = number(value) else {
            return Err(format!("{value:?} is not a positive number; {usage}"));
        };
        match key {
            "tokens" => self.turn_tokens = n as u64,
            "session-tokens" => self.session_tokens = n as u64,
            "cost" => self.turn_cost = n,
            "session-cost" => self.session_cost = n,
            _ => return Err(usage.to_string()),
        }
        Ok(())
    }
}

pub(crate) fn user_input(text: String, mode: Mode) -> pb::Input {
    let approval_mode = match mode.approve {
        Approve::Always => spb::ApprovalMode::Always,
        Approve::Never => spb::ApprovalMode::Never,
        Approve::Policy => spb::ApprovalMode::Policy,
    };
    pb::Input {
        kind: Some(pb::input::Kind::UserMessage(pb::UserInput {
            images: Vec::new(),
            text,
            approval_mode: approval_mode as i32,
            plan: mode.plan,
            network: mode.network,
            budget: mode.limits.to_proto(),
            compact: false,
            interrupt: false,
        })),
    }
}

/// What to say instead of sending `text` when it is a slash command the
/// line chat does not have (`/new`, `/sessions`, a typo); `None` for a
/// message (which may start with a path, like `/etc/hosts is empty`).
fn unknown_command(text: &str) -> Option<String> {
    let word = text.split_whitespace().next()?;
    let name = word.strip_prefix('/')?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_lowercase() || c == '-') {
        return None;
    }
    Some(match word {
        "/new" | "/sessions" | "/model" => format!(
            "{word} is in the full-screen chat (a terminal, without --plain); here: `agentry \
             chat` again, `agentry sessions list`, `/model NAME`"
        ),
        _ => format!(
            "unknown command {word}; /help lists them (to send it as a message, put a word before it)"
        ),
    })
}

/// A call the orchestrator gave no answer to: it could not be reached
/// (`UNAVAILABLE`: nothing arrived), or the connection broke while the call
/// was under way (`CANCELLED`, `UNKNOWN` from the transport: it may have
/// arrived).
pub(crate) fn unanswered(status: &tonic::Status) -> bool {
    match status.code() {
        tonic::Code::Unavailable => true,
        // Made by the transport (it carries the connection's error), not
        // an answer of the orchestrator's.
        tonic::Code::Cancelled | tonic::Code::Unknown => {
            std::error::Error::source(status).is_some()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {

    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn slash_words_the_line_chat_lacks_are_not_sent() {
        assert!(
            unknown_command("/new")
                .unwrap()
                .contains("full-screen chat")
        );
        assert!(
            unknown_command("/sesions")
                .unwrap()
                .contains("unknown command /sesions")
        );
        assert_eq!(unknown_command("/etc/hosts is empty, why?"), None);
        assert_eq!(unknown_command("why is /etc/hosts empty"), None);
        assert_eq!(unknown_command("/"), None);
    }

    #[test]
    fn budget_commands_raise_one_limit_each() {
        let mut limits = Limits::default();
        assert_eq!(limits.to_proto(), None, "nothing to raise");
        limits.set(" tokens 20000").unwrap();
        limits.set("session-cost 2.5").unwrap();
        assert_eq!(
            limits.to_proto(),
            Some(spb::Budget {
                turn_tokens: 20_000,
                session_tokens: 0,
                turn_cost: 0.0,
                session_cost: 2.5,
            })
        );
        for bad in [
            "",
            " tokens",
            " tokens -1",
            " tokens lots",
            " coins 3",
            " tokens 1 2",
        ] {
            let err = limits.set(bad).unwrap_err();
            assert!(err.contains("/budget"), "{bad:?}: {err}");
        }
    }
}
