//! `warden keys ...`: create, list and revoke API keys straight in the
//! database, for first setup without `WARDEN_ADMIN_TOKEN`.

use std::process::ExitCode;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Subcommand};
use warden::auth::Role;
use warden::store::{Store, TenantScope};

use super::store::{Schema, on_cli_store};

/// Where every `warden keys` command works, said once in each one's help.
const WHERE: &str = "Reads DATABASE_URL, or the embedded database in WARDEN_DATA_DIR when it is \
unset and Warden is stopped; running replicas see a created or revoked key within a second.";

/// The subcommands of `warden keys`.
#[derive(Debug, Subcommand)]
#[command(after_long_help = WHERE)]
pub enum KeysCommand {
    /// Create a key and print it once (only its hash is stored)
    #[command(after_long_help = WHERE)]
    Create(CreateKey),
    /// List every key, revoked ones too (never a secret)
    #[command(after_long_help = WHERE)]
    List,
    /// Revoke a key
    #[command(after_long_help = WHERE)]
    Revoke {
        /// The key's id (the first column of `warden keys list`)
        id: uuid::Uuid,
    },
}

/// The flags of `warden keys create`.
#[derive(Debug, Args)]
pub struct CreateKey {
    /// The tenant the key acts for
    #[arg(long, value_name = "NAME", value_parser = super::tenant_name)]
    pub tenant: String,
    /// What the key may do
    #[arg(long, value_parser = role())]
    pub role: Role,
    /// An admin key of every tenant (else an admin key manages its tenant only)
    #[arg(long)]
    pub global: bool,
    /// A label for the key
    #[arg(long, value_name = "LABEL")]
    pub name: Option<String>,
    /// The queues a worker key may claim from, comma-separated (required for role worker)
    #[arg(long, value_name = "A,B", value_delimiter = ',')]
    pub queues: Vec<String>,
}

/// `--role`: one of the four roles' names, offered as such in the help
/// and the completions.
fn role() -> impl TypedValueParser<Value = Role> {
    PossibleValuesParser::new(["admin", "operator", "viewer", "worker"])
        .try_map(|name| Role::parse(&name).ok_or("unknown role"))
}

/// Runs `warden keys ...` on the CLI's database.
pub(super) async fn run(command: KeysCommand) -> ExitCode {
    let schema = match command {
        KeysCommand::List => Schema::Read,
        _ => Schema::Write,
    };
    on_cli_store("keys", schema, async |store| match command {
        KeysCommand::Create(key) => create(store, key).await,
        KeysCommand::List => list(store).await,
        KeysCommand::Revoke { id } => revoke(store, id).await,
    })
    .await
}

/// Issues the key: its secret to stdout (once), what it is to stderr.
async fn create(store: &Store, key: CreateKey) -> ExitCode {
    let spec = warden::auth::KeySpec {
        tenant: &key.tenant,
        role: key.role,
        global: key.global,
        name: key.name.as_deref(),
        queues: &key.queues,
    };
    match warden::auth::issue_key(store, &spec).await {
        Ok(issued) => {
            eprintln!(
                "created key {} ({}) for tenant {} with role {}{}; it is shown only now:",
                issued.record.id,
                issued.record.prefix,
                issued.record.tenant,
                issued.record.role,
                if issued.record.global {
                    " (global)"
                } else {
                    ""
                }
            );
            println!("{}", issued.secret.expose());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("warden keys: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Every key as a tab-separated table.
async fn list(store: &Store) -> ExitCode {
    let keys = match store.list_keys(&TenantScope::Global).await {
        Ok(keys) => keys,
        Err(err) => {
            eprintln!("warden keys: {err}");
            return ExitCode::FAILURE;
        }
    };
    println!("ID\tPREFIX\tTENANT\tROLE\tGLOBAL\tCREATED\tLAST USED\tREVOKED");
    let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map_or_else(|| "-".to_string(), |t| t.to_rfc3339())
    };
    for k in keys {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            k.id,
            k.prefix,
            k.tenant,
            k.role,
            if k.global { "yes" } else { "no" },
            k.created_at.to_rfc3339(),
            time(k.last_used_at),
            time(k.revoked_at)
        );
    }
    ExitCode::SUCCESS
}

/// Revokes the key `id`; fails when there is none.
async fn revoke(store: &Store, id: uuid::Uuid) -> ExitCode {
    match store.revoke_key(id, &TenantScope::Global).await {
        Ok(Some(k)) => {
            println!("revoked {} ({})", k.id, k.prefix);
            ExitCode::SUCCESS
        }
        Ok(None) => {
            eprintln!("warden keys: no key {id}");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("warden keys: {err}");
            ExitCode::FAILURE
        }
    }
}
