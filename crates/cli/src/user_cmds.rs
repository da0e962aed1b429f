//! `agentry users …`: the people who may use Agentry, each with a role and
//! a token of their own, in the people file the services read (run it
//! where the services keep their tokens, or point `--file` at the file).

use crate::client::print_line;
use agentry_runtime::Config;
use agentry_runtime::auth::Role;
use agentry_runtime::people::{ADMIN, People};
use std::path::PathBuf;

/// What to do with the people.
#[derive(clap::Subcommand, Debug)]
pub enum UsersCommand {
    /// Add a person with a role and print their token, once (only its hash
    /// is kept): `agentry users add alice --role approver`
    Add {
        /// Their name: lower-case letters, digits, '.', '_' and '-'
        name: String,
        /// viewer (reads), operator (also chats, cancels, rewinds, forks),
        /// approver (also answers approvals), admin (also deletes)
        #[arg(long, value_parser = parse_role)]
        role: Role,
        /// The people file [default: auth.people_file, beside the service
        /// token]
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
    },
    /// List the people and their roles
    List {
        /// One JSON object per line
        #[arg(long)]
        json: bool,
        /// The people file [default: auth.people_file]
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
    },
    /// Remove a person: their token stops working within a second
    Remove {
        /// Their name
        name: String,
        /// The people file [default: auth.people_file]
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
    },
}

fn parse_role(text: &str) -> Result<Role, String> {
    Role::parse(text)
}

/// Runs a `users` command.
pub fn run(config: &Config, command: UsersCommand) -> anyhow::Result<()> {
    let file_of = |file: Option<PathBuf>| file.unwrap_or_else(|| config.people_file());
    if config.auth.mode == agentry_runtime::config::AuthMode::Off {
        eprintln!(
            "note: auth.mode is \"off\" here, so the services check no token; people's roles \
             apply once it is \"token\" (the default)"
        );
    }
    match command {
        UsersCommand::Add { name, role, file } => {
            let path = file_of(file);
            let by = std::env::var("USER")
                .ok()
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| "local".into());
            let token = People::add(&path, &name, role, &by)?;
            eprintln!(
                "Added {name} ({role}) to {}. Their token, shown only this once:",
                path.display()
            );
            print_line(token.secret())?;
            eprintln!(
                "They use it as AGENTRY_TOKEN for the CLI, or as `authorization: Bearer \
                 <token>` for gRPC."
            );
        }
        UsersCommand::List { json, file } => {
            let path = file_of(file);
            let people = People::load(&path)?;
            if json {
                print_line(serde_json::json!({
                    "name": ADMIN, "role": Role::Admin.name(), "added_at": null,
                    "added_by": null, "token": "client"
                }))?;
                for p in &people.people {
                    print_line(serde_json::json!({
                        "name": p.name, "role": p.role.name(), "added_at": p.added_at,
                        "added_by": p.added_by, "token": "own"
                    }))?;
                }
                return Ok(());
            }
            print_line(format!(
                "{:<24} {:<9} {:<20} ADDED BY",
                "NAME", "ROLE", "ADDED"
            ))?;
            print_line(format!(
                "{:<24} {:<9} {:<20} (the client token, `agentry token`)",
                ADMIN,
                Role::Admin.name(),
                "-"
            ))?;
            for p in &people.people {
                let added = chrono::DateTime::from_timestamp(p.added_at as i64, 0)
                    .map(|d| {
                        d.with_timezone(&chrono::Local)
                            .format("%Y-%m-%d %H:%M")
                            .to_string()
                    })
                    .unwrap_or_else(|| "-".into());
                print_line(format!(
                    "{:<24} {:<9} {:<20} {}",
                    p.name,
                    p.role.name(),
                    added,
                    p.added_by
                ))?;
            }
        }
        UsersCommand::Remove { name, file } => {
            let path = file_of(file);
            let removed = People::remove(&path, &name)?;
            eprintln!(
                "Removed {} ({}): their token stops working within a second.",
                removed.name, removed.role
            );
        }
    }
    Ok(())
}
