//! The line chat (`agentry chat` on a pipe, or with `--plain`): a message
//! per line, the answers and activity on standard output, questions asked
//! between messages (or while a turn waits), slash commands.
//!
//! A printer task folds the session's events (its whole log first,
//! silently, to number the turns and find questions still waiting) and
//! sends [`Notice`]s; the chat's loop takes lines, notices, resends and
//! Ctrl+C, each handled by one method of [`LineChat`].

use super::{
    Driver, Follower, Limits, Mode, Notice, Place, RESEND_EVERY, exit_code, unanswered,
    unknown_command, user_input,
};
use crate::Approve;
use crate::approval;
use crate::render::Renderer;
use crate::terminal::{Visible, visible};
use agentry_proto::orchestrator::v1 as pb;
use agentry_proto::sessions::v1 as spb;
use agentry_runtime::Config;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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

impl Asking {
    /// The question asked now.
    fn question(&self) -> Option<&spb::ApprovalRequested> {
        match self {
            Asking::Nothing => None,
            Asking::Approval(q) | Asking::Edited(q) | Asking::DenyReason(q) => Some(q),
        }
    }
}

/// Whether the chat goes on after an input.
enum Flow {
    Go,
    Leave,
}

const HELP: &str =
    "/plan <message>  run this message in plan mode (plan, then execute step by step)\n\
/plan            plan mode on or off for every message\n\
/network         outbound network for the agent's commands on or off (now {network})\n\
/session         show this session's id\n\
/model NAME      switch this session's model from the next message\n\
/compact         summarise the conversation now (all but the last few messages) to free context\n\
/rewind N        back to the end of turn N, files included (see `agentry sessions show`)\n\
/exit            leave (also Ctrl+D, or Ctrl+C at the prompt)\n\
A message typed during a turn steers it: the model gets it at its next step.
Ctrl+C during a turn cancels it.";

/// The line chat's state between inputs.
struct LineChat {
    driver: Driver,
    interactive: bool,
    /// The turn running (its id; empty when it is known to run but not
    /// which, as for a session opened mid-turn).
    open_turn: Option<String>,
    last_outcome: i32,
    asking: Asking,
    /// Questions waiting for their turn to be asked.
    queued: Vec<spb::ApprovalRequested>,
    /// Plan mode for every message, switched by /plan; network likewise,
    /// by /network.
    plan_mode: bool,
    network: bool,
    limits: Limits,
    cancelled: bool,
    prompt_shown: bool,
    /// A message the orchestrator did not answer for: sent again every few
    /// seconds until it is back.
    unsent: Option<pb::Input>,
    /// The connection broke while `unsent` was being sent: it may have
    /// arrived after this event, and is looked for before it is sent again.
    maybe_arrived_after: Option<u64>,
    /// The last logged event shown.
    seen: Arc<AtomicU64>,
}

/// `agentry chat`: interactive, or one message per line from a pipe.
pub async fn chat(
    config: &Config,
    session: Option<String>,
    place: &Place,
    network: bool,
) -> anyhow::Result<ExitCode> {
    let (mut driver, note) = Driver::open(config, session, place).await?;
    if let Some(note) = note {
        eprintln!("agentry: {}", visible(&note));
    }
    if let Ok(tools) = driver
        .client
        .list_tools(pb::ListToolsRequest::default())
        .await
        && !tools.get_ref().model_problem.is_empty()
    {
        eprintln!(
            "agentry: {}; `agentry doctor` says how to fix it",
            visible(&tools.get_ref().model_problem)
        );
    }
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        greet(&driver.session, network);
    }
    let (notices_tx, mut notices) = mpsc::unbounded_channel::<Notice>();
    let seen = Arc::new(AtomicU64::new(driver.session.event_count));
    let printer = tokio::spawn(print_events(
        driver.clone(),
        interactive,
        notices_tx,
        seen.clone(),
    ));
    let mut chat = LineChat {
        open_turn: driver.session.turn_open.then(String::new),
        driver,
        interactive,
        last_outcome: spb::TurnOutcome::Completed as i32,
        asking: Asking::Nothing,
        queued: Vec::new(),
        plan_mode: false,
        network,
        limits: Limits::default(),
        cancelled: false,
        prompt_shown: false,
        unsent: None,
        maybe_arrived_after: None,
        seen,
    };
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut resend = tokio::time::interval(RESEND_EVERY);
    resend.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // On a terminal, a line typed while a turn runs steers it; lines from a
    // pipe are messages one after the other.
    let steers = std::io::IsTerminal::is_terminal(&std::io::stdin());
    loop {
        chat.ask_next();
        let idle = chat.open_turn.is_none();
        let read_input = idle || steers || !matches!(chat.asking, Asking::Nothing);
        tokio::select! {
            line = lines.next_line(), if read_input => {
                chat.prompt_shown = false;
                let flow = match line? {
                    Some(line) => chat.on_line(line, &mut resend).await,
                    None => chat.on_end(&mut notices).await,
                };
                if matches!(flow, Flow::Leave) {
                    break;
                }
            }
            notice = notices.recv() => match notice {
                Some(notice) => chat.on_notice(notice),
                None => {
                    return match printer.await {
                        Ok(Err(e)) => Err(e),
                        _ => Err(anyhow::anyhow!("the event stream ended")),
                    };
                }
            },
            _ = resend.tick(), if chat.unsent.is_some() && idle => chat.resend().await,
            _ = tokio::signal::ctrl_c() => {
                if matches!(chat.on_ctrl_c().await, Flow::Leave) {
                    break;
                }
            }
        }
    }
    printer.abort();
    if interactive {
        eprintln!(
            "bye. Resume with: agentry chat --session {}",
            chat.driver.id()
        );
    }
    Ok(exit_code(chat.last_outcome))
}

/// Says which session this is, where it works and how to use the chat.
fn greet(session: &spb::Session, network: bool) {
    let resumed = if session.user_message_count > 0 {
        format!(" ({} earlier messages)", session.user_message_count)
    } else {
        String::new()
    };
    let place = if session.project_dir.is_empty() {
        String::new()
    } else {
        format!(" in {}", visible(&session.project_dir))
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

/// Prints the session's events as they come and tells the chat what they
/// ask of it. The log is read from the start, silently, to number the turns
/// as `/rewind N` takes them and to find what still waits (a question left
/// pending).
async fn print_events(
    driver: Driver,
    interactive: bool,
    notices: mpsc::UnboundedSender<Notice>,
    seen: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let own = driver.id().to_string();
    let history_end = driver.session.event_count;
    let mut start = driver.session.clone();
    start.event_count = 0;
    let mut events = Follower::new(&driver.client, &start).await?;
    let mut renderer = Renderer::new(
        Visible::new(std::io::stdout()),
        Visible::new(std::io::stdout()),
    )
    .of_session(&own);
    renderer.show_approvals = false;
    let mut turns = crate::render::TurnCounter::default();
    loop {
        let event = events.next().await?;
        if !event.live {
            seen.store(event.seq, Ordering::Relaxed);
        }
        if event.kind.is_none() {
            continue;
        }
        let turn_number = turns.follow(&event);
        if !event.live && event.seq <= history_end {
            // History: only what still waits for a decision is kept.
            renderer.fold(&event);
            if event.seq == history_end {
                for question in renderer.questions() {
                    let _ = notices.send(Notice::Approval(question));
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
        for notice in super::notices(&own, &event, applied) {
            let _ = notices.send(notice);
        }
    }
}

impl LineChat {
    /// Asks the next queued question when none is asked; shows the prompt
    /// when the chat waits for a message.
    fn ask_next(&mut self) {
        if matches!(self.asking, Asking::Nothing) && !self.queued.is_empty() {
            let next = self.queued.remove(0);
            eprint!("{}{}", approval::describe(&next), approval::question(&next));
            self.asking = Asking::Approval(next);
        }
        let idle = self.open_turn.is_none();
        if self.interactive && idle && matches!(self.asking, Asking::Nothing) && !self.prompt_shown
        {
            eprint!("you> ");
            self.prompt_shown = true;
        }
    }

    /// Standard input ended (Ctrl+D, or the end of a pipe).
    async fn on_end(&mut self, notices: &mut mpsc::UnboundedReceiver<Notice>) -> Flow {
        if let Some(kept) = self.unsent.as_ref().and_then(|i| match &i.kind {
            Some(pb::input::Kind::UserMessage(m)) => Some(m.text.clone()),
            _ => None,
        }) {
            eprintln!(
                "\nthe orchestrator never answered; this message was not sent: {}",
                visible(&kept)
            );
        }
        let waiting = usize::from(self.asking.question().is_some()) + self.queued.len();
        if self.interactive && self.open_turn.is_some() && waiting > 0 {
            // The person left (Ctrl+D) with a question open: it is not
            // decided here; it waits in the inbox.
            eprintln!(
                "\n{waiting} question{} of this session wait{} for an answer in `agentry approvals`; the turn goes on once answered (there, or here again).",
                if waiting == 1 { "" } else { "s" },
                if waiting == 1 { "s" } else { "" }
            );
            return Flow::Leave;
        }
        if self.open_turn.is_some() {
            // Input ended while a turn runs: nobody is left to answer, so
            // stop the turn and wait for it.
            let _ = self.driver.cancel().await;
            while let Some(notice) = notices.recv().await {
                if let Notice::Finished { outcome, .. } = notice {
                    self.last_outcome = outcome;
                    break;
                }
            }
        }
        Flow::Leave
    }

    /// A line from the person: the answer to the question asked, or a
    /// message or command.
    async fn on_line(&mut self, line: String, resend: &mut tokio::time::Interval) -> Flow {
        let edited = matches!(self.asking, Asking::Edited(_));
        match std::mem::replace(&mut self.asking, Asking::Nothing) {
            Asking::Approval(mut request) | Asking::Edited(mut request) => {
                match approval::answer(&request, &line, edited).await {
                    approval::Answer::Decide(input) => self.decide(input).await,
                    approval::Answer::Edited(arguments) => {
                        eprint!("{}", approval::ask_edited(&mut request, arguments));
                        self.asking = Asking::Edited(request);
                    }
                    approval::Answer::DenyAskReason => {
                        eprint!("  Reason for the agent (optional, Enter to skip): ");
                        self.asking = Asking::DenyReason(request);
                    }
                    approval::Answer::Again(why) => {
                        eprint!("  {why}\n{}", approval::question(&request));
                        self.asking = if edited {
                            Asking::Edited(request)
                        } else {
                            Asking::Approval(request)
                        };
                    }
                }
                Flow::Go
            }
            Asking::DenyReason(request) => {
                self.decide(approval::deny(&request.call_id, &line)).await;
                Flow::Go
            }
            Asking::Nothing => self.on_message(line.trim(), resend).await,
        }
    }

    async fn decide(&mut self, input: pb::ApprovalInput) {
        if let Err(status) = self.driver.decide(input).await {
            eprintln!("agentry: {}", visible(status.message()));
        }
    }

    /// A message, or one of the chat's commands.
    async fn on_message(&mut self, text: &str, resend: &mut tokio::time::Interval) -> Flow {
        match text {
            "" => return Flow::Go,
            "/exit" | "/quit" | "exit" | "quit" => return Flow::Leave,
            "/help" => {
                let network = if self.network { "on" } else { "off" };
                eprintln!("{}", HELP.replace("{network}", network));
                return Flow::Go;
            }
            "/plan" => {
                self.plan_mode = !self.plan_mode;
                eprintln!(
                    "plan mode {}",
                    if self.plan_mode {
                        "on: every message is planned, then executed step by step"
                    } else {
                        "off"
                    }
                );
                return Flow::Go;
            }
            "/network" => {
                self.network = !self.network;
                eprintln!(
                    "network {}",
                    if self.network {
                        "on: the agent's commands reach public hosts through the tool runner's proxy"
                    } else {
                        "off"
                    }
                );
                return Flow::Go;
            }
            "/session" => {
                eprintln!("{}", self.driver.id());
                return Flow::Go;
            }
            _ => {}
        }
        if let Some(name) = text.strip_prefix("/model ") {
            if let Err(status) = self.driver.set_model(name.trim().to_string()).await {
                eprintln!("agentry: {}", visible(status.message()));
            }
            return Flow::Go;
        }
        if let Some(rest) = text.strip_prefix("/rewind") {
            self.rewind(rest).await;
            return Flow::Go;
        }
        if let Some(rest) = text.strip_prefix("/budget") {
            match self.limits.set(rest) {
                Ok(()) => eprintln!("(limits raised with your next message)"),
                Err(e) => eprintln!("{e}"),
            }
            return Flow::Go;
        }
        if text == "/compact" {
            let mut input = user_input(text.to_string(), self.mode(false, Limits::default()));
            if let Some(pb::input::Kind::UserMessage(m)) = &mut input.kind {
                m.compact = true;
            }
            match self.driver.submit(input).await {
                Ok(r) => self.started(r.turn_id),
                Err(status) => eprintln!("agentry: {}", visible(status.message())),
            }
            return Flow::Go;
        }
        let (text, plan) = match text.strip_prefix("/plan ") {
            Some(rest) if !rest.trim().is_empty() => (rest.trim(), true),
            _ => (text, self.plan_mode),
        };
        // A command this chat does not have is not sent to the model as a
        // message (a path such as /etc/hosts is).
        if let Some(unknown) = unknown_command(text) {
            eprintln!("{unknown}");
            return Flow::Go;
        }
        let limits = std::mem::take(&mut self.limits);
        let input = user_input(text.to_string(), self.mode(plan, limits));
        let seen = self.seen.load(Ordering::Relaxed);
        match self.driver.submit(input.clone()).await {
            Ok(r) => {
                self.started(r.turn_id);
                self.unsent = None;
            }
            Err(status) if unanswered(&status) => {
                eprintln!(
                    "agentry: disconnected: the orchestrator does not answer ({}); the message is kept and sent once it is back (Ctrl+D leaves)",
                    visible(status.message())
                );
                self.maybe_arrived_after =
                    (status.code() != tonic::Code::Unavailable).then_some(seen);
                self.unsent = Some(input);
                resend.reset();
            }
            Err(status) => eprintln!("agentry: {}", visible(status.message())),
        }
        Flow::Go
    }

    /// How the chat's messages run.
    fn mode(&self, plan: bool, limits: Limits) -> Mode {
        Mode {
            approve: Approve::Policy,
            plan,
            network: self.network,
            limits,
            verbose: false,
        }
    }

    /// A turn of ours started.
    fn started(&mut self, turn_id: String) {
        self.open_turn = Some(turn_id);
        self.cancelled = false;
    }

    /// `/rewind N`.
    async fn rewind(&mut self, rest: &str) {
        let Ok(to_turn) = rest.trim().parse::<u32>() else {
            eprintln!(
                "/rewind N: the turn to go back to (0: the start), as `agentry sessions show` numbers them"
            );
            return;
        };
        if let Err(status) = self.driver.rewind(to_turn).await {
            eprintln!("agentry: {}", visible(status.message()));
        }
    }

    /// What the session's events ask of the chat.
    fn on_notice(&mut self, notice: Notice) {
        match notice {
            Notice::Finished { turn_id, outcome } => {
                if self
                    .open_turn
                    .as_deref()
                    .is_some_and(|t| t.is_empty() || t == turn_id)
                {
                    self.open_turn = None;
                    self.last_outcome = outcome;
                    self.asking = Asking::Nothing;
                    self.queued.clear();
                }
            }
            Notice::Approval(request) => {
                if self.open_turn.is_none() {
                    self.open_turn = Some(String::new());
                }
                let already = self
                    .asking
                    .question()
                    .is_some_and(|a| a.call_id == request.call_id)
                    || self.queued.iter().any(|q| q.call_id == request.call_id);
                if !already {
                    self.queued.push(request);
                }
            }
            Notice::Resolved(call_id) => {
                self.queued.retain(|q| q.call_id != call_id);
                if self.asking.question().is_some_and(|a| a.call_id == call_id) {
                    eprintln!("\n  (answered)");
                    self.asking = Asking::Nothing;
                }
            }
        }
    }

    /// Sends again the message kept while the orchestrator did not answer
    /// (unless it had arrived after all).
    async fn resend(&mut self) {
        let Some(input) = self.unsent.take() else {
            return;
        };
        if let (Some(after), Some(pb::input::Kind::UserMessage(m))) =
            (self.maybe_arrived_after, &input.kind)
        {
            match self.driver.arrived(&m.text, after).await {
                Ok(true) => {
                    eprintln!("(the orchestrator answers again: the message had arrived)");
                    self.maybe_arrived_after = None;
                    self.open_turn = Some(String::new());
                    self.cancelled = false;
                    self.prompt_shown = false;
                    return;
                }
                Ok(false) => self.maybe_arrived_after = None,
                // Not back yet.
                Err(_) => {
                    self.unsent = Some(input);
                    return;
                }
            }
        }
        match self.driver.submit(input.clone()).await {
            Ok(r) => {
                eprintln!("(the orchestrator answers again: the message was sent)");
                self.started(r.turn_id);
                self.prompt_shown = false;
            }
            Err(status) if unanswered(&status) => {
                if status.code() != tonic::Code::Unavailable {
                    self.maybe_arrived_after = Some(self.seen.load(Ordering::Relaxed));
                }
                self.unsent = Some(input);
            }
            Err(status) => eprintln!(
                "agentry: the message kept while disconnected was not sent: {}",
                visible(status.message())
            ),
        }
    }

    /// Ctrl+C: cancels the turn running, or leaves at the prompt.
    async fn on_ctrl_c(&mut self) -> Flow {
        if self.open_turn.is_some() && !self.cancelled {
            self.cancelled = true;
            self.asking = Asking::Nothing;
            self.queued.clear();
            eprintln!("\ncancelling the turn…");
            if let Err(status) = self.driver.cancel().await {
                eprintln!("agentry: {}", visible(status.message()));
            }
            Flow::Go
        } else if self.open_turn.is_none() {
            eprintln!();
            Flow::Leave
        } else {
            Flow::Go
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_call_without_an_answer_keeps_the_message() {
        let broken = |code| {
            let mut status = tonic::Status::new(code, "operation was canceled");
            status.set_source(Arc::new(std::io::Error::from(
                std::io::ErrorKind::ConnectionReset,
            )));
            status
        };
        // Nothing arrived, or the connection broke under the call.
        assert!(unanswered(&tonic::Status::unavailable(
            "connection refused"
        )));
        assert!(unanswered(&broken(tonic::Code::Cancelled)));
        assert!(unanswered(&broken(tonic::Code::Unknown)));
        // The orchestrator's own answers: said, not kept.
        assert!(!unanswered(&tonic::Status::cancelled(
            "cancelled by the caller"
        )));
        assert!(!unanswered(&tonic::Status::failed_precondition("busy")));
        assert!(!unanswered(&broken(tonic::Code::InvalidArgument)));
    }
}
