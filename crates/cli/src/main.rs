//! `agentry`: chat with an agent, run headless turns, browse sessions, and
//! run every service in one process.

mod acp;
mod approval;
mod audit_cmds;
mod autostart;
mod client;
mod doctor;
mod health;
mod inbox_cmds;
mod init;
mod mcp_cmds;
mod mcp_serve;
mod migrate;
mod reminder_cmds;
mod render;
mod schedule_cmds;
mod session_cmds;
mod tui;
mod turn;
mod up;
mod user_cmds;

use agentry_client::terminal;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "agentry",
    version,
    about = "A self-hosted runtime for tool-using LLM agents",
    long_about = "A self-hosted runtime for tool-using LLM agents.\n\n\
        Run `agentry` in your project to chat about it (the services start \
        for the chat when none are running), or start them with `agentry up` \
        and use `agentry chat` or `agentry run \"...\"`. Point it at any \
        OpenAI-compatible model with AGENTRY_LLM_BASE_URL and AGENTRY_LLM_MODEL.",
    after_help = "Examples:\n  \
        cd your-project && agentry                  # chat about it (starts the services if needed)\n  \
        agentry up                                  # every service in this process\n  \
        agentry chat                                # talk to the agent\n  \
        agentry run \"list the files\"                # one turn, the answer on stdout\n  \
        git diff | agentry run - --approve never    # the message from a pipe\n  \
        agentry sessions show 01a21d77-35cf         # any prefix only one session has\n  \
        agentry approvals                           # calls waiting for a person\n  \
        agentry completions bash > ~/.local/share/bash-completion/completions/agentry"
)]
struct Cli {
    /// Directory holding default.toml, local.toml and system.md
    /// [default: $AGENTRY_CONFIG_DIR, else ./config when present, else
    /// ~/.config/agentry when present]
    #[arg(long, global = true, value_name = "DIR")]
    config_dir: Option<PathBuf>,

    /// The orchestrator to talk to [default: $AGENTRY_ORCHESTRATOR_URL, else the configured url]
    #[arg(long, global = true, value_name = "URL")]
    orchestrator: Option<String>,

    /// Log line format of the services [default: $AGENTRY_LOG_FORMAT, else log.format]
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormatArg>,

    /// Without a command: `agentry chat` (starting the services for it
    /// when none answer)
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run all four services in this process (stop with Ctrl+C)
    Up,
    /// Run one service on its own
    Serve {
        /// Which service
        service: Service,
    },
    /// Chat with the agent interactively (or one message per line from a pipe)
    Chat {
        /// Continue this session instead of starting a new one (its id, or
        /// any prefix of it that only it has)
        #[arg(long, short)]
        session: Option<String>,
        /// Give the agent's bash commands outbound network through the tool
        /// runner's proxy (public hosts only); switch it with /network
        #[arg(long)]
        network: bool,
        /// The line-by-line chat even on a terminal (the full-screen chat
        /// opens only when standard input and output are terminals)
        #[arg(long)]
        plain: bool,
        /// Choose the session from a list of recent ones first
        #[arg(long, conflicts_with = "session")]
        pick: bool,
        /// A new session works in this project directory instead of the
        /// current one
        #[arg(long, value_name = "PATH", conflicts_with_all = ["session", "scratch"])]
        dir: Option<std::path::PathBuf>,
        /// A new session works in an empty scratch workspace of its own
        /// instead of the current directory
        #[arg(long, conflicts_with = "session")]
        scratch: bool,
    },
    /// Serve the Agent Client Protocol on stdin/stdout, for editors that
    /// host agents (Zed, JetBrains, Neovim's CodeCompanion); the editor
    /// starts it. Sessions are Agentry's: durable, resumable with
    /// session/load, their calls confirmed in the editor
    #[command(
        after_help = "Examples (the editor runs this; see docs/integrations.md):\n  \
        agentry acp                      # the person's token from AGENTRY_TOKEN or the token file\n  \
        agentry acp --network            # bash commands get outbound network"
    )]
    Acp {
        /// Give the agent's bash commands outbound network through the tool
        /// runner's proxy (public hosts only)
        #[arg(long)]
        network: bool,
    },
    /// Run one turn headless and print the final answer
    Run {
        /// Continue this session instead of starting a new one (its id, or
        /// any prefix of it that only it has)
        #[arg(long, short)]
        session: Option<String>,
        /// How tool calls that need confirmation are handled
        #[arg(long, value_enum, default_value_t = Approve::Policy)]
        approve: Approve,
        /// Print every event as one JSON object per line instead
        #[arg(long)]
        json: bool,
        /// Also say how much of the context window every request's fixed
        /// part (instructions, tool definitions) takes
        #[arg(long, short)]
        verbose: bool,
        /// Plan mode: the agent writes a step-by-step plan, then carries it
        /// out step by step, revising the plan when a step fails
        #[arg(long)]
        plan: bool,
        /// Give the agent's bash commands outbound network through the tool
        /// runner's proxy (public hosts only)
        #[arg(long)]
        network: bool,
        /// Tokens this turn and the ones after may use (raises the limit)
        #[arg(long, value_name = "N")]
        budget_tokens: Option<u64>,
        /// Tokens the session may use in all (raises the limit)
        #[arg(long, value_name = "N")]
        session_budget_tokens: Option<u64>,
        /// What this turn and the ones after may cost, at the model prices
        #[arg(long, value_name = "AMOUNT")]
        budget_cost: Option<f64>,
        /// What the session may cost in all, at the model prices
        #[arg(long, value_name = "AMOUNT")]
        session_budget_cost: Option<f64>,
        /// A new session works in this project directory instead of the
        /// current one
        #[arg(long, value_name = "PATH", conflicts_with_all = ["session", "scratch"])]
        dir: Option<std::path::PathBuf>,
        /// A new session works in an empty scratch workspace of its own
        /// instead of the current directory
        #[arg(long, conflicts_with = "session")]
        scratch: bool,
        /// With --session: cancel the turn running there and start a new
        /// one with this message (without it, a message sent while a turn
        /// runs steers that turn: the model gets it at its next step)
        #[arg(long, requires = "session")]
        interrupt: bool,
        /// The message for the agent; `-` (or none, with a pipe) reads it
        /// from standard input: `git diff | agentry run -`
        prompt: Option<String>,
    },
    /// List and inspect sessions
    Sessions {
        #[command(subcommand)]
        command: SessionsCommand,
    },
    /// List and cancel reminders
    Reminders {
        #[command(subcommand)]
        command: RemindersCommand,
    },
    /// Tasks the agent runs on a schedule, with no client open
    #[command(after_help = "Examples:\n  \
        agentry schedules add --cron \"0 9 * * 1-5\" --tz Europe/Oslo --project ~/src/app \\\n      \
        \"check the open pull requests and summarise what needs me\"\n  \
        agentry schedules add --cron \"*/30 * * * *\" --approve never \"look at the build\"\n  \
        agentry schedules list\n  \
        agentry schedules runs 0192a4f1          # any beginning only one schedule has\n  \
        agentry schedules pause 0192a4f1")]
    Schedules {
        #[command(subcommand)]
        command: SchedulesCommand,
    },
    /// List the tools the agent can use
    Tools,
    /// Tool calls waiting for a person, across sessions (the approval inbox)
    Approvals {
        #[command(subcommand)]
        command: Option<ApprovalsCommand>,
        /// One JSON object per line
        #[arg(long)]
        json: bool,
    },
    /// Help with the tool-call policy
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Copy this data directory's sessions (with their logs) and reminders
    /// from SQLite into PostgreSQL, then check that everything arrived. Stop
    /// Agentry first; running it again copies only what is missing
    Migrate {
        /// The PostgreSQL database (postgres://user:password@host/db);
        /// default: session_store.database_url
        #[arg(long, value_name = "URL")]
        to: Option<String>,
        /// The data directory holding sessions.db and scheduler.db; default:
        /// this configuration's
        #[arg(long, value_name = "DIR")]
        from: Option<std::path::PathBuf>,
    },
    /// The MCP servers the agent's tools come from
    Mcp {
        #[command(subcommand)]
        command: McpCommand,
    },
    /// Print a completion script for a shell, e.g. `agentry completions
    /// bash > ~/.local/share/bash-completion/completions/agentry`, `agentry
    /// completions zsh > ~/.zfunc/_agentry`, `agentry completions fish >
    /// ~/.config/fish/completions/agentry.fish`
    Completions {
        /// The shell
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the client token of this data dir, for gRPC tools and CLIs on
    /// other machines (`authorization: Bearer <token>` metadata, or
    /// AGENTRY_TOKEN)
    Token,
    /// Who did what, and what let each tool call run (a policy rule, a hook,
    /// a person's answer, a standing approval and who granted it, the turn's
    /// approve-always and who asked), from the session logs: `agentry audit
    /// --since 24h`, `agentry audit --session ID --json`
    Audit {
        /// Only this session (its id, or a prefix only it has)
        #[arg(long)]
        session: Option<String>,
        /// Only since then: a time (2026-11-28T09:00:00+01:00) or a time ago
        /// (30m, 24h, 7d)
        #[arg(long, value_name = "WHEN")]
        since: Option<String>,
        /// One JSON object per line
        #[arg(long)]
        json: bool,
    },
    /// The people who may use Agentry, each with a role (viewer, operator,
    /// approver, admin) and a token of their own: `agentry users add alice
    /// --role approver` prints alice's token once
    Users {
        #[command(subcommand)]
        command: user_cmds::UsersCommand,
    },
    /// Write a starter configuration: find model servers on their usual
    /// local ports (Ollama 11434, llama.cpp 8080, LM Studio 1234, vLLM
    /// 8000), list their models and ask which to use; `[llm]` goes to
    /// local.toml in the configuration directory (~/.config/agentry)
    Init {
        /// Also look at this server (an OpenAI-compatible base URL, e.g.
        /// http://gpu-box:8000/v1); repeatable
        #[arg(long, value_name = "URL")]
        url: Vec<String>,
        /// Replace an existing local.toml (kept as local.toml.bak)
        #[arg(long)]
        force: bool,
    },
    /// Check what a working agent needs, each with the fix when it fails:
    /// the model server and the model, a tool call, the context window,
    /// the data directory, the token, and (when they run) the services,
    /// the sandbox's layers and the MCP servers (exit 1 when one fails)
    Doctor,
    /// Check that services answer their gRPC health check (exit 0 when all serve)
    Health {
        /// Service URLs to check [default: the configured orchestrator]
        #[arg(value_name = "URL")]
        urls: Vec<String>,
        /// Give up on a service after this many seconds
        #[arg(long, default_value_t = 3.0)]
        timeout: f64,
        /// Print nothing when healthy
        #[arg(long, short)]
        quiet: bool,
    },
}

#[derive(Subcommand, Debug)]
enum ApprovalsCommand {
    /// Raise the spending limits of a turn parked at one (agent.on_budget =
    /// "park"); it goes on
    #[command(after_help = "Examples:\n  \
        agentry approvals raise 0f3a --turn-tokens 200000\n  \
        agentry approvals raise 0f3a --session-cost 5.00")]
    Raise {
        /// The session (its id, or a prefix only it has)
        session: String,
        /// Tokens one turn may use
        #[arg(long, value_name = "N")]
        turn_tokens: Option<u64>,
        /// Tokens the session may use in all
        #[arg(long, value_name = "N")]
        session_tokens: Option<u64>,
        /// What one turn may cost, at the model prices
        #[arg(long, value_name = "AMOUNT")]
        turn_cost: Option<f64>,
        /// What the session may cost in all
        #[arg(long, value_name = "AMOUNT")]
        session_cost: Option<f64>,
    },
    /// Decide on a waiting call
    Answer {
        /// The session (its id, or a prefix only it has)
        session: String,
        /// The call
        call: String,
        /// What to do
        #[arg(value_enum)]
        decision: inbox_cmds::Answer,
        /// Why (given to the model on a denial)
        #[arg(long)]
        reason: Option<String>,
    },
    /// Answer the questions an MCP server asked during a call (a form to
    /// fill in, or a page to visit)
    #[command(after_help = "Examples:\n  \
        agentry approvals reply 0f3a c7 --set confirm=true --set note='after 6pm'\n  \
        agentry approvals reply 0f3a c7 --json '{\"approval\": {\"confirm\": true}}'\n  \
        agentry approvals reply 0f3a c7 --decline      # refuse to answer\n  \
        agentry approvals reply 0f3a c9                # a page visited: accept")]
    Reply {
        /// The session (its id, or a prefix only it has)
        session: String,
        /// The call
        call: String,
        /// A field of the answer, FIELD=VALUE (the call asks one question);
        /// numbers and true/false are read as the question's schema says
        #[arg(long = "set", value_name = "FIELD=VALUE")]
        set: Vec<String>,
        /// The answers as JSON: the fields of each question under its key,
        /// or the fields of the only question
        #[arg(long, conflicts_with = "set")]
        json: Option<String>,
        /// Refuse to answer (the server is told so)
        #[arg(long, conflicts_with_all = ["set", "json", "cancel"])]
        decline: bool,
        /// Dismiss the questions without an answer
        #[arg(long, conflicts_with_all = ["set", "json"])]
        cancel: bool,
    },
}

#[derive(Subcommand, Debug)]
enum PolicyCommand {
    /// Propose narrower allow rules from the decisions people took: each
    /// would have saved prompts and allows nothing that was denied
    Suggest {
        /// Read this many of the most recently updated sessions
        #[arg(long, default_value_t = 100)]
        sessions: u32,
        /// Only rules that would have saved at least this many prompts
        #[arg(long, default_value_t = 2)]
        min_saves: usize,
    },
}

#[derive(Subcommand, Debug)]
enum McpCommand {
    /// Each MCP server: transport, state, tools, connections, calls
    /// (exit 1 when one is not ready)
    List,
    /// Serve Agentry itself as an MCP server on stdin/stdout, for MCP
    /// hosts that hand it work: tools start_task, get_task,
    /// answer_approval, cancel_task, list_sessions
    #[command(
        after_help = "Example (the MCP host runs this; see docs/integrations.md):\n  \
        agentry mcp serve          # the person's token from AGENTRY_TOKEN or the token file"
    )]
    Serve,
    /// The tools of every MCP server, or of one
    Tools {
        /// Only this server's
        server: Option<String>,
    },
    /// Sign in to a remote MCP server that asks for OAuth: open the printed
    /// address in a browser and approve; the tokens are kept for the tool
    /// runners (0600) and refreshed as they expire
    #[command(after_help = "Example:\n  \
        agentry mcp login github     # a [[mcp_servers]] entry with url = \"https://…/mcp\"\n\n\
        Run it on the machine of the tool runners (it writes into their data directory).\n\
        The browser comes back to a loopback address this command listens on; on a\n\
        remote machine, forward that port (ssh -L) or open the address there.")]
    Login {
        /// The server's name, as configured
        server: String,
        /// How long to wait for the browser, in seconds
        #[arg(long, default_value_t = 300)]
        wait: u64,
    },
}

#[derive(Subcommand, Debug)]
enum RemindersCommand {
    /// List reminders, soonest first
    List {
        /// Only this session's
        #[arg(long, short)]
        session: Option<String>,
        /// Which ones
        #[arg(long, value_enum, default_value_t = ReminderStatus::Pending)]
        status: ReminderStatus,
    },
    /// Cancel a pending reminder
    Cancel {
        /// The reminder's id
        id: String,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ReminderStatus {
    Pending,
    Paused,
    Completed,
    Cancelled,
    All,
}

#[derive(Subcommand, Debug)]
enum SchedulesCommand {
    /// Add a scheduled task: each time the cron expression falls due, the
    /// agent gets the prompt in a new session (or in --session)
    Add {
        /// When it runs: a 5-field cron expression (minute hour
        /// day-of-month month day-of-week), e.g. "0 9 * * 1-5"
        #[arg(long)]
        cron: String,
        /// The IANA time zone the expression is read in [default: this
        /// machine's]
        #[arg(long, value_name = "ZONE")]
        tz: Option<String>,
        /// Run in this session each time instead of a new one per run
        #[arg(long, short, conflicts_with = "project")]
        session: Option<String>,
        /// Each run's new session works in this project directory
        /// [default: a scratch workspace per run]
        #[arg(long, value_name = "DIR")]
        project: Option<PathBuf>,
        /// How calls that need a person are handled: `policy` (they wait
        /// in `agentry approvals`) or `never` (they are refused)
        #[arg(long, value_enum, default_value_t = ScheduleApproval::Policy)]
        approve: ScheduleApproval,
        /// Each run's session works as this configured agent ([[agents]]):
        /// its prompt, tools and model
        #[arg(long, value_name = "NAME", conflicts_with = "session")]
        agent: Option<String>,
        /// What the agent is asked each time
        prompt: String,
    },
    /// List scheduled tasks (active and paused)
    List {
        /// Also removed and finished ones
        #[arg(long)]
        all: bool,
    },
    /// Pause a scheduled task: it runs no more until resumed
    Pause {
        /// The schedule's id (or a unique beginning of it)
        id: String,
    },
    /// Resume a paused scheduled task from its next due time
    Resume {
        /// The schedule's id (or a unique beginning of it)
        id: String,
    },
    /// Remove a scheduled task (its runs' sessions stay)
    Remove {
        /// The schedule's id (or a unique beginning of it)
        id: String,
    },
    /// A scheduled task's runs, newest first, with their outcomes
    Runs {
        /// The schedule's id (or a unique beginning of it)
        id: String,
        /// How many
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum ScheduleApproval {
    Policy,
    Never,
}

#[derive(Subcommand, Debug)]
enum SessionsCommand {
    /// List sessions, most recent first
    List {
        /// How many to show
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// Show a session's conversation, its turns numbered
    Show {
        /// The session's id, a prefix only it has, or its name
        id: String,
        /// Print every event as one JSON object per line
        #[arg(long)]
        json: bool,
    },
    /// Copy a session up to a point into a new session, with its files as
    /// they were there
    Fork {
        /// The session's id, a prefix only it has, or its name
        id: String,
        /// The last event the fork keeps (see `sessions show --json`);
        /// default: the whole log, with the files as they are now
        #[arg(long, value_name = "SEQ", default_value_t = 0)]
        at: u64,
        /// The new session's id (default: generated)
        #[arg(long = "id", value_name = "NEW_ID")]
        new_id: Option<String>,
        /// Copy the conversation only; the new workspace starts empty
        #[arg(long)]
        conversation_only: bool,
        /// Work in this directory instead of a scratch workspace with the
        /// files (left as they are), e.g. a git worktree:
        /// `git worktree add ../try-b && agentry sessions fork ID --dir ../try-b`
        #[arg(long, value_name = "PATH", conflicts_with = "conversation_only")]
        dir: Option<std::path::PathBuf>,
    },
    /// Put a session back to the end of an earlier turn: the conversation
    /// and the workspace's files (what came after stays in the log as
    /// history)
    Rewind {
        /// The session's id, a prefix only it has, or its name
        id: String,
        /// Keep turns 1..TURN, as `sessions show` numbers them (0: none)
        #[arg(long, value_name = "TURN")]
        to: u32,
        /// Rewind the conversation only; leave the files as they are
        #[arg(long)]
        conversation_only: bool,
    },
    /// Give a session a name to use instead of its id (`-` removes it)
    Rename {
        /// The session's id, a prefix only it has, or its name
        id: String,
        /// The new name: no spaces, not only hex digits and dashes
        name: String,
    },
    /// Delete a session: its log, its sub-agents' tasks and its scratch
    /// workspace (a project directory is never touched)
    Delete {
        /// The session's id, a prefix only it has, or its name
        id: String,
        /// Do not ask first (needed without a terminal)
        #[arg(long, short)]
        yes: bool,
    },
    /// Reclaim the space of workspace snapshots: those of deleted sessions,
    /// those past tool_runner.snapshots.keep_days (each session keeps its
    /// latest), then the oldest while all hold more than max_total_mib
    Prune {
        /// Say what would go, remove nothing
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Service {
    Orchestrator,
    SessionStore,
    ToolRunner,
    Scheduler,
    /// The web console and its API
    Gateway,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormatArg {
    /// Human-readable lines
    Text,
    /// One JSON object per line, with the fields of every enclosing span
    Json,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Approve {
    /// Approve every call the policy does not deny
    Always,
    /// Refuse every call that would need confirmation
    Never,
    /// Follow the configured policy
    Policy,
}

fn load_config(cli: &Cli) -> anyhow::Result<agentry_runtime::Config> {
    if let Some(dir) = &cli.config_dir
        && !dir.is_dir()
    {
        anyhow::bail!(
            "--config-dir {}: no such directory (it holds local.toml, system.md, agents/…; \
             create it, or leave the option out to use $AGENTRY_CONFIG_DIR, ./config or \
             ~/.config/agentry)",
            terminal::visible(&dir.display().to_string())
        );
    }
    let source = agentry_runtime::ConfigSource::from_process(cli.config_dir.clone());
    let mut config = agentry_runtime::Config::load(&source)?;
    if let Some(url) = &cli.orchestrator {
        config.orchestrator.url = url.clone();
    }
    if let Some(format) = cli.log_format {
        config.log.format = match format {
            LogFormatArg::Text => agentry_runtime::config::LogFormat::Text,
            LogFormatArg::Json => agentry_runtime::config::LogFormat::Json,
        };
    }
    Ok(config)
}

fn main() -> ExitCode {
    // Started by a tool runner as its sandbox helper: confine one command.
    // This must happen before any thread exists (the helper unshares
    // namespaces), so before the async runtime starts.
    if std::env::args_os()
        .next()
        .is_some_and(|argv0| agentry_sandbox::started_as_helper(&argv0))
    {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let code = agentry_sandbox::helper::run_main(&args);
        return ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX));
    }
    agentry_sandbox::running_program_embeds_helper();
    let cli = Cli::parse();
    // Needs no configuration and no service.
    if let Some(Command::Completions { shell }) = cli.command {
        use clap::CommandFactory;
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "agentry",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("agentry: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Errors carry services' and models' words.
            eprintln!("agentry: {}", terminal::visible(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// Most bytes of a message read from standard input (what the
/// orchestrator accepts).
const MAX_PIPED_PROMPT: u64 = 1024 * 1024;

/// The message of `agentry run`: as given, or read from standard input for
/// `-` or when none is given and standard input is not a terminal.
fn prompt_text(given: Option<String>) -> anyhow::Result<String> {
    use std::io::{IsTerminal, Read};
    match given.as_deref() {
        Some(text) if text != "-" => return Ok(text.to_string()),
        None if std::io::stdin().is_terminal() => anyhow::bail!(
            "give the message as an argument (agentry run \"…\"), or pipe it in \
             (`… | agentry run -`)"
        ),
        _ => {}
    }
    let mut text = String::new();
    std::io::stdin()
        .take(MAX_PIPED_PROMPT + 1)
        .read_to_string(&mut text)
        .map_err(|e| anyhow::anyhow!("cannot read the message from standard input: {e}"))?;
    if text.len() as u64 > MAX_PIPED_PROMPT {
        anyhow::bail!(
            "the message on standard input is over {MAX_PIPED_PROMPT} bytes, more than the \
             orchestrator accepts"
        );
    }
    if text.trim().is_empty() {
        anyhow::bail!("the message on standard input is empty");
    }
    Ok(text)
}

/// `agentry sessions …`.
async fn sessions(
    config: &agentry_runtime::Config,
    command: SessionsCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        SessionsCommand::List { limit } => session_cmds::list(config, limit).await,
        SessionsCommand::Show { id, json } => {
            let id = client::resolve_session(config, &id).await?;
            session_cmds::show(config, &id, json).await
        }
        SessionsCommand::Fork {
            id,
            at,
            new_id,
            conversation_only,
            dir,
        } => {
            let id = client::resolve_session(config, &id).await?;
            let dir = match dir {
                Some(dir) => match turn::Place::from_args(Some(dir), false)? {
                    turn::Place::Dir(full) => Some(full),
                    _ => None,
                },
                None => None,
            };
            session_cmds::fork(config, &id, at, new_id, conversation_only, dir).await
        }
        SessionsCommand::Rewind {
            id,
            to,
            conversation_only,
        } => {
            let id = client::resolve_session(config, &id).await?;
            session_cmds::rewind(config, &id, to, conversation_only).await
        }
        SessionsCommand::Prune { dry_run } => session_cmds::prune(config, dry_run).await,
        SessionsCommand::Rename { id, name } => {
            let id = client::resolve_session(config, &id).await?;
            session_cmds::rename(config, &id, &name).await
        }
        SessionsCommand::Delete { id, yes } => {
            let id = client::resolve_session(config, &id).await?;
            session_cmds::delete(config, &id, yes).await
        }
    }
    .map(|()| ExitCode::SUCCESS)
}

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let config = load_config(&cli)?;
    // Bare `agentry` is `agentry chat`.
    let command = cli.command.unwrap_or(Command::Chat {
        session: None,
        network: false,
        plain: false,
        pick: false,
        dir: None,
        scratch: false,
    });
    match command {
        Command::Up => up::up(&config).await.map(|()| ExitCode::SUCCESS),
        Command::Acp { network } => acp::acp(&config, network).await.map(|()| ExitCode::SUCCESS),
        Command::Serve { service } => up::serve(&config, service)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Chat {
            session,
            network,
            plain,
            pick,
            dir,
            scratch,
        } => {
            let place = turn::Place::from_args(dir, scratch)?;
            let _services = autostart::ensure(&config).await?;
            let session = client::resolve_optional(&config, session).await?;
            if !plain && tui::available() {
                tui::chat(&config, session, &place, network, pick).await
            } else {
                if pick {
                    eprintln!("(--pick needs the full-screen chat: a terminal, without --plain)");
                }
                turn::chat(&config, session, &place, network).await
            }
        }
        Command::Run {
            session,
            approve,
            json,
            verbose,
            plan,
            network,
            budget_tokens,
            session_budget_tokens,
            budget_cost,
            session_budget_cost,
            dir,
            scratch,
            interrupt,
            prompt,
        } => {
            let place = turn::Place::from_args(dir, scratch)?;
            let prompt = prompt_text(prompt)?;
            let session = client::resolve_optional(&config, session).await?;
            let mode = turn::Mode {
                approve,
                plan,
                network,
                verbose,
                limits: turn::Limits {
                    turn_tokens: budget_tokens.unwrap_or(0),
                    session_tokens: session_budget_tokens.unwrap_or(0),
                    turn_cost: budget_cost.unwrap_or(0.0),
                    session_cost: session_budget_cost.unwrap_or(0.0),
                },
            };
            turn::run(&config, session, &place, mode, json, interrupt, prompt).await
        }
        Command::Sessions { command } => sessions(&config, command).await,
        Command::Doctor => doctor::run(&config).await,
        Command::Init { url, force } => init::run(&config, &url, force).await,
        Command::Health {
            urls,
            timeout,
            quiet,
        } => {
            let urls = if urls.is_empty() {
                vec![config.orchestrator.url.clone()]
            } else {
                urls
            };
            let timeout = std::time::Duration::try_from_secs_f64(timeout)
                .map_err(|_| anyhow::anyhow!("--timeout must be a positive number of seconds"))?;
            // A missing token only costs the sandbox lines of a tool runner.
            let auth = client::credentials(&config)?;
            health::check(&auth, &urls, timeout, quiet).await
        }
        Command::Migrate { to, from } => migrate::migrate(&config, to, from)
            .await
            .map(|()| ExitCode::SUCCESS),
        // Answered in `main`, before any configuration is read.
        Command::Completions { .. } => Ok(ExitCode::SUCCESS),
        Command::Token => {
            let token = if config.auth.token.is_empty() {
                agentry_runtime::auth::read_token(&config.client_token_file())?
            } else {
                agentry_runtime::auth::Token::parse(&config.auth.token)
                    .map_err(|e| anyhow::anyhow!("AGENTRY_TOKEN: {e}"))?
            };
            client::print_line(token.secret()).map(|()| ExitCode::SUCCESS)
        }
        Command::Tools => session_cmds::tools(&config)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Approvals { command, json } => match command {
            None => inbox_cmds::list(&config, json).await,
            Some(ApprovalsCommand::Raise {
                session,
                turn_tokens,
                session_tokens,
                turn_cost,
                session_cost,
            }) => {
                let session = client::resolve_session(&config, &session).await?;
                let budget = agentry_proto::sessions::v1::Budget {
                    turn_tokens: turn_tokens.unwrap_or(0),
                    session_tokens: session_tokens.unwrap_or(0),
                    turn_cost: turn_cost.unwrap_or(0.0),
                    session_cost: session_cost.unwrap_or(0.0),
                };
                inbox_cmds::raise(&config, &session, budget).await
            }
            Some(ApprovalsCommand::Answer {
                session,
                call,
                decision,
                reason,
            }) => {
                let session = client::resolve_session(&config, &session).await?;
                inbox_cmds::answer(&config, &session, &call, decision, reason).await
            }
            Some(ApprovalsCommand::Reply {
                session,
                call,
                set,
                json,
                decline,
                cancel,
            }) => {
                let session = client::resolve_session(&config, &session).await?;
                let reply = inbox_cmds::Reply {
                    set,
                    json,
                    decline,
                    cancel,
                };
                inbox_cmds::reply(&config, &session, &call, reply).await
            }
        }
        .map(|()| ExitCode::SUCCESS),
        Command::Policy {
            command:
                PolicyCommand::Suggest {
                    sessions,
                    min_saves,
                },
        } => inbox_cmds::suggest(&config, sessions, min_saves)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Mcp { command } => match command {
            McpCommand::Serve => mcp_serve::serve(&config).await.map(|()| ExitCode::SUCCESS),
            McpCommand::List => mcp_cmds::list(&config).await.map(|ready| {
                if ready {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }),
            McpCommand::Login { server, wait } => mcp_cmds::login(&config, &server, wait)
                .await
                .map(|()| ExitCode::SUCCESS),
            McpCommand::Tools { server } => mcp_cmds::tools(&config, server.as_deref())
                .await
                .map(|()| ExitCode::SUCCESS),
        },
        Command::Audit {
            session,
            since,
            json,
        } => audit_cmds::run(&config, session, since, json)
            .await
            .map(|()| ExitCode::SUCCESS),
        Command::Users { command } => user_cmds::run(&config, command).map(|()| ExitCode::SUCCESS),
        Command::Reminders { command } => match command {
            RemindersCommand::List { session, status } => {
                let session = client::resolve_optional(&config, session).await?;
                reminder_cmds::list(&config, session, status).await
            }
            RemindersCommand::Cancel { id } => reminder_cmds::cancel(&config, &id).await,
        }
        .map(|()| ExitCode::SUCCESS),
        Command::Schedules { command } => match command {
            SchedulesCommand::Add {
                cron,
                tz,
                session,
                project,
                approve,
                agent,
                prompt,
            } => {
                let session = client::resolve_optional(&config, session).await?;
                schedule_cmds::add(
                    &config,
                    schedule_cmds::NewSchedule {
                        cron,
                        time_zone: tz,
                        session,
                        project,
                        approve_never: approve == ScheduleApproval::Never,
                        agent,
                        prompt,
                    },
                )
                .await
            }
            SchedulesCommand::List { all } => schedule_cmds::list(&config, all).await,
            SchedulesCommand::Pause { id } => schedule_cmds::set_paused(&config, &id, true).await,
            SchedulesCommand::Resume { id } => schedule_cmds::set_paused(&config, &id, false).await,
            SchedulesCommand::Remove { id } => schedule_cmds::remove(&config, &id).await,
            SchedulesCommand::Runs { id, limit } => schedule_cmds::runs(&config, &id, limit).await,
        }
        .map(|()| ExitCode::SUCCESS),
    }
}
