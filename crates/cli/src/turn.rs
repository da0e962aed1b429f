//! `agentry run` and `agentry chat`: submitting messages and following the
//! session's events until the turn ends.

use crate::Approve;
use crate::approval;
use crate::client::{connect, print_line, status_error};
use crate::render::{Renderer, event_json};
use crate::terminal::Visible;
use agentry_proto::orchestrator::v1::{self as pb, orchestrator_client::OrchestratorClient};
use agentry_proto::sessions::v1::{self as spb, event::Kind};
use agentry_runtime::Config;
use agentry_runtime::telemetry::TracedChannel;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;
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

/// `agentry run`: one turn, headless.
pub async fn run(
    config: &Config,
    session: Option<String>,
    place: &Place,
    mode: Mode,
    json: bool,
    prompt: String,
) -> anyhow::Result<ExitCode> {
    let mut client = connect(config).await?;
    let (session, note) = open_session(&mut client, session, place).await?;
    if let Some(note) = note
        && !json
    {
        eprintln!("agentry: {}", crate::terminal::visible(&note));
    }
    let mut events = Follower::new(&client, &session).await?;
    let submitted = client
        .submit(pb::SubmitRequest {
            session_id: session.id.clone(),
            input: Some(user_input(prompt, mode)),
        })
        .await
        .map_err(|s| status_error("the message was not accepted", s))?
        .into_inner();
    let mut renderer = Renderer::new(
        Visible::new(std::io::stdout()),
        Visible::new(std::io::stderr()),
    );
    renderer.show_approvals = !std::io::stdin().is_terminal();
    renderer.verbose = mode.verbose;
    let mut cancelled = false;
    let mut needs_person = false;
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
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
        // A sub-agent's question, relayed (its own session and seq).
        let relayed = approval::is_relayed(&session.id, &event);
        if !relayed && event.seq < submitted.seq {
            continue;
        }
        if json {
            print_line(event_json(&event))?;
        } else {
            renderer.event(&event);
        }
        match &event.kind {
            Some(Kind::ApprovalRequested(request))
                if relayed || event.turn_id == submitted.turn_id =>
            {
                if std::io::stdin().is_terminal() && !json {
                    let input = ask_on_terminal(request, &mut lines).await?;
                    let to = if relayed {
                        &event.session_id
                    } else {
                        &session.id
                    };
                    if let Err(status) = client.submit(approval_submit(to, input)).await {
                        eprintln!("agentry: {}", crate::terminal::visible(status.message()));
                    }
                } else if !needs_person {
                    needs_person = true;
                    eprintln!(
                        "agentry: {} needs a person's approval ({}), and nobody can answer here; \
                         stopping the turn. Re-run with --approve always, or use `agentry chat`.",
                        request.tool, request.matched_rule
                    );
                    client
                        .submit(pb::SubmitRequest {
                            session_id: session.id.clone(),
                            input: Some(cancel_input()),
                        })
                        .await
                        .map_err(|s| status_error("cannot cancel", s))?;
                }
            }
            Some(Kind::TurnFinished(finished)) if event.turn_id == submitted.turn_id => {
                if !json {
                    eprintln!("session: {}", session.id);
                }
                if needs_person {
                    return Ok(ExitCode::from(EXIT_NEEDS_APPROVAL));
                }
                return Ok(exit_code(finished.outcome));
            }
            _ => {}
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

/// What the event printer tells the chat loop.
enum Notice {
    /// A turn ended.
    Finished { turn_id: String, outcome: i32 },
    /// A call waits for a decision (a sub-agent's, relayed, under an id
    /// naming its session: see [`agentry_client::relay::question_id`]).
    Approval(spb::ApprovalRequested),
    /// A call is no longer waiting (someone answered, or the turn ended).
    Resolved(String),
}

/// The question the chat is asking, if any.
enum Asking {
    Nothing,
    Approval(spb::ApprovalRequested),
    /// The person edited the call: asked again before it runs as edited.
    Edited(spb::ApprovalRequested),
    DenyReason(spb::ApprovalRequested),
}

fn is_resolution(kind: &Kind) -> Option<String> {
    match kind {
        Kind::ToolCallState(s) if s.phase != spb::ToolCallPhase::AwaitingApproval as i32 => {
            Some(s.call_id.clone())
        }
        _ => None,
    }
}

/// The decision on the question kept as `input.call_id`, to its session.
fn answer(own: &str, mut input: pb::ApprovalInput) -> pb::SubmitRequest {
    let (session, call) = approval::answer_to(own, &input.call_id);
    input.call_id = call;
    approval_submit(&session, input)
}

fn approval_submit(session_id: &str, input: pb::ApprovalInput) -> pb::SubmitRequest {
    pb::SubmitRequest {
        session_id: session_id.to_string(),
        input: Some(pb::Input {
            kind: Some(pb::input::Kind::Approval(input)),
        }),
    }
}

/// `agentry chat`: interactive, or one message per line from a pipe.
pub async fn chat(
    config: &Config,
    session: Option<String>,
    place: &Place,
    network: bool,
) -> anyhow::Result<ExitCode> {
    let mut client = connect(config).await?;
    let (session, note) = open_session(&mut client, session, place).await?;
    if let Some(note) = note {
        eprintln!("agentry: {}", crate::terminal::visible(&note));
    }
    if let Ok(tools) = client.list_tools(pb::ListToolsRequest::default()).await
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
    let mut events = Follower::new(&client, &start).await?;
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
        let mut renderer = Renderer::new(
            Visible::new(std::io::stdout()),
            Visible::new(std::io::stdout()),
        );
        renderer.show_approvals = false;
        let own_id = printer_session;
        let mut pending: Vec<spb::ApprovalRequested> = Vec::new();
        let mut turns = crate::render::TurnCounter::default();
        loop {
            let event = match events.next().await {
                Ok(event) => event,
                Err(e) => return Err::<(), _>(e),
            };
            let Some(kind) = &event.kind else { continue };
            let turn_number = turns.follow(&event);
            if !event.live && event.seq <= history_end {
                // History: only track what still waits for a decision.
                match kind {
                    Kind::ApprovalRequested(a) => {
                        pending.retain(|p| p.call_id != a.call_id);
                        pending.push(a.clone());
                    }
                    Kind::TurnFinished(_) => pending.clear(),
                    other => {
                        if let Some(id) = is_resolution(other) {
                            pending.retain(|p| p.call_id != id);
                        }
                    }
                }
                if event.seq == history_end {
                    for a in pending.drain(..) {
                        let _ = notices_tx.send(Notice::Approval(a));
                    }
                }
                continue;
            }
            // A sub-agent's question, relayed: asked here, answered there
            // (kept under an id naming its session).
            if let Some(relayed) = approval::relayed(&own_id, &event) {
                let notice = match relayed {
                    approval::Relayed::Asked(question) => Some(Notice::Approval(question)),
                    approval::Relayed::Answered(id) => Some(Notice::Resolved(id)),
                    approval::Relayed::Nothing => None,
                };
                if let Some(notice) = notice {
                    let _ = notices_tx.send(notice);
                }
                continue;
            }
            // Numbers for a person to `/rewind` to; a script reading the
            // answers gets none.
            if let Some(number) = turn_number.filter(|_| interactive) {
                renderer.turn_header(number);
            }
            renderer.event(&event);
            let notice = match kind {
                Kind::TurnFinished(f) => Some(Notice::Finished {
                    turn_id: event.turn_id.clone(),
                    outcome: f.outcome,
                }),
                Kind::ApprovalRequested(a) => Some(Notice::Approval(a.clone())),
                other => is_resolution(other).map(Notice::Resolved),
            };
            if let Some(notice) = notice {
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
    let mut unsent: Option<pb::SubmitRequest> = None;
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
                    if let Some(kept) = unsent.as_ref().and_then(|r| r.input.as_ref()).and_then(|i| match &i.kind {
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
                        let _ = client.submit(pb::SubmitRequest { session_id: session.id.clone(), input: Some(cancel_input()) }).await;
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
                                if let Err(status) = client.submit(answer(&session.id, input)).await {
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
                        if let Err(status) = client.submit(answer(&session.id, input)).await {
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
                            if let Err(status) = client.submit(pb::SubmitRequest { session_id: session.id.clone(), input: Some(input) }).await {
                                eprintln!("agentry: {}", crate::terminal::visible(status.message()));
                            }
                            continue;
                        }
                        if let Some(rest) = text.strip_prefix("/rewind") {
                            match rest.trim().parse::<u32>() {
                                Ok(to_turn) => {
                                    let rewound = client
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
                            match client.submit(pb::SubmitRequest { session_id: session.id.clone(), input: Some(input) }).await {
                                Ok(r) => {
                                    open_turn = Some(r.into_inner().turn_id);
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
                        let request = pb::SubmitRequest {
                            session_id: session.id.clone(),
                            input: Some(user_input(text.to_string(), Mode { approve: Approve::Policy, plan, network, limits: std::mem::take(&mut limits), verbose: false })),
                        };
                        match client.submit(request.clone()).await {
                            Ok(r) => {
                                open_turn = Some(r.into_inner().turn_id);
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
                match client.submit(request.clone()).await {
                    Ok(r) => {
                        eprintln!("(the orchestrator answers again: the message was sent)");
                        open_turn = Some(r.into_inner().turn_id);
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
                    if let Err(status) = client
                        .submit(pb::SubmitRequest { session_id: session.id.clone(), input: Some(cancel_input()) })
                        .await
                    {
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
