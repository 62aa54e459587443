//! The `warden` command line: clap parses it (`--help` at every level,
//! errors that name the flag, shell completions), one file per command
//! group runs it. No command starts the service (`src/main.rs`).

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

mod archive;
mod client;
mod config;
mod db;
mod healthcheck;
mod keys;
mod migrate;
mod replay;
mod report;
mod secrets;
mod sessions;
mod sse;
mod store;
mod table;
mod tenants;
mod watch;

/// Runs and supervises long-running autonomous agent sessions.
///
/// With no command, starts the service: reads its settings from the
/// environment (`warden config` shows them), serves the API on
/// WARDEN_LISTEN_ADDR (or --listen) and runs sessions until SIGINT or
/// SIGTERM.
#[derive(Debug, Parser)]
#[command(name = "warden", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Serve on this address (host:port) instead of WARDEN_LISTEN_ADDR's
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// What to do instead of serving.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What this process was asked to do.
#[derive(Debug)]
pub enum Invocation {
    /// Serve, on `listen` when given.
    Serve {
        /// `--listen`.
        listen: Option<String>,
    },
    /// Run a command.
    Run(Command),
}

/// The commands beside serving.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the OpenAPI document of the HTTP API (JSON)
    Openapi,
    /// Ask this machine's Warden for /readyz: exit 0 when ready
    ///
    /// For container health checks (the runtime image has no curl): asks
    /// WARDEN_LISTEN_ADDR, on 127.0.0.1 when it listens on every address.
    Healthcheck,
    /// Create, list and revoke API keys straight in the database
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Rotate the secret key, see what each key seals, drop keys that seal nothing
    #[command(subcommand)]
    Secrets(secrets::SecretsCommand),
    /// The tenants' share of the queue, running caps and tree limits
    #[command(subcommand)]
    Tenants(tenants::TenantsCommand),
    /// The embedded PostgreSQL
    #[command(subcommand)]
    Db(db::DbCommand),
    /// Apply this binary's migrations (--dry-run lists them), or reverse some (--down-to N)
    ///
    /// The service applies them itself at start-up unless WARDEN_MIGRATE=off;
    /// a database whose schema is newer than this binary is refused, never
    /// changed. Other commands never migrate when they only read.
    Migrate(migrate::MigrateArgs),
    /// Print every setting with the value in effect and where it came from
    Config(config::ConfigArgs),
    /// Sessions archived past their retention
    #[command(subcommand)]
    Archive(archive::ArchiveCommand),
    /// A running server's sessions, over its HTTP API: list, show, watch, stop, …
    ///
    /// The server is --url, else WARDEN_URL, else the `url` of
    /// ~/.config/warden/cli.toml, else http://127.0.0.1:8080; the key is
    /// --key, else WARDEN_API_KEY, else that file's `key`.
    Sessions(sessions::SessionsArgs),
    /// A running server's workers and their queues, over its HTTP API
    Workers(sessions::WorkersArgs),
    /// Replay a policy over a running server's ended sessions (what-if), over its HTTP API
    ///
    /// Reruns the policy over each session's recorded steps with no model
    /// call and no write, and says where each would have ended. The server
    /// and key are found as for `warden sessions`.
    Replay(replay::ReplayArgs),
    /// Reports over a running server's stored sessions, over its HTTP API
    ///
    /// `warden report thresholds`: how sessions ended against their
    /// thresholds, which policy pauses a person overruled, a suggested
    /// iteration limit with its replay, and the reflector's calibration.
    #[command(subcommand)]
    Report(report::ReportCommand),
    /// Print a shell completion script
    ///
    /// e.g. `warden completions bash > /etc/bash_completion.d/warden`,
    /// `warden completions zsh > "${fpath[1]}/_warden"`,
    /// `warden completions fish > ~/.config/fish/completions/warden.fish`.
    Completions {
        /// The shell to complete in
        shell: clap_complete::Shell,
    },
}

/// The command line of this process; `Err` is the exit code once clap has
/// printed the help, the version, or an error naming the flag.
pub fn parse() -> Result<Invocation, ExitCode> {
    parse_from(std::env::args_os())
}

/// [`parse`] of the given words (the first is the program's name).
fn parse_from<I, T>(args: I) -> Result<Invocation, ExitCode>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(Cli {
            command: Some(command),
            ..
        }) => Ok(Invocation::Run(command)),
        Ok(Cli {
            command: None,
            listen,
        }) => Ok(Invocation::Serve { listen }),
        Err(err) => {
            // Help and the version go to stdout with 0, errors to stderr with 2.
            let _ = err.print();
            Err(ExitCode::from(u8::try_from(err.exit_code()).unwrap_or(2)))
        }
    }
}

/// Runs one command to its exit code.
pub async fn run(command: Command) -> ExitCode {
    match command {
        Command::Openapi => write_out("openapi", warden::http::openapi::document().as_bytes()),
        Command::Healthcheck => healthcheck::run(),
        Command::Keys(command) => keys::run(command).await,
        Command::Secrets(command) => secrets::run(command).await,
        Command::Tenants(command) => tenants::run(command).await,
        Command::Db(command) => db::run(command).await,
        Command::Migrate(args) => migrate::run(args).await,
        Command::Config(args) => config::run(args),
        Command::Archive(command) => archive::run(command).await,
        Command::Sessions(args) => sessions::run(args).await,
        Command::Workers(args) => sessions::run_workers(args).await,
        Command::Replay(args) => replay::run(args).await,
        Command::Report(command) => report::run(command).await,
        Command::Completions { shell } => completions(shell),
    }
}

/// `warden completions SHELL`: the completion script clap_complete writes
/// from the same definitions the parser uses.
fn completions(shell: clap_complete::Shell) -> ExitCode {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "warden", &mut script);
    write_out("completions", &script)
}

/// Writes a command's whole output to stdout; a closed pipe (`| head`) is
/// an error message and exit 1, not a panic.
fn write_out(command: &str, bytes: &[u8]) -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("warden {command}: {err}");
            ExitCode::FAILURE
        }
    }
}

/// A tenant's name as the API accepts it (checked before any database is opened).
fn tenant_name(raw: &str) -> Result<String, String> {
    if warden::auth::valid_tenant(raw) {
        Ok(raw.to_string())
    } else {
        Err("a tenant is 1 to 64 letters, digits, `-`, `_` or `.`".into())
    }
}

#[cfg(test)]
mod client_tests;
#[cfg(test)]
mod tests;
