//! `warden migrate`: brings the database's schema to this binary's (what
//! the service does at start-up with `WARDEN_MIGRATE=auto`), lists what it
//! would do with `--dry-run`, or takes the schema back with `--down-to N`
//! (docs/operations/upgrades.md says when).

use std::process::ExitCode;

use clap::Args;
use warden::store::Store;
use warden::store::schema::{self, MigrationName};

use super::store::{Schema, on_cli_store};

/// The flags of `warden migrate`.
#[derive(Debug, Args)]
#[command(
    after_long_help = "Reads DATABASE_URL, or the embedded database in WARDEN_DATA_DIR when it is \
unset and Warden is stopped. Replicas of the previous release keep running on the new schema \
(see docs/operations/upgrades.md)."
)]
pub struct MigrateArgs {
    /// List what would be applied (or reversed) and change nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Reverse the applied migrations above N, newest first; refused, with
    /// nothing changed, when one of them cannot be reversed
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(0..))]
    pub down_to: Option<i64>,
}

/// Runs `warden migrate ...`.
pub(super) async fn run(args: MigrateArgs) -> ExitCode {
    on_cli_store("migrate", Schema::AsIs, async |store| {
        let done = match (args.down_to, args.dry_run) {
            (None, true) => store
                .pending_migrations()
                .await
                .map(|p| report("would apply", &p)),
            (None, false) => apply(store).await,
            (Some(target), true) => down_plan(store, target).await,
            (Some(target), false) => store
                .migrate_down_to(target)
                .await
                .map(|r| report("reversed", &r)),
        };
        match done {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("warden migrate: {err}");
                ExitCode::FAILURE
            }
        }
    })
    .await
}

/// Applies what is pending and says what it applied.
async fn apply(store: &Store) -> Result<(), warden::store::StoreError> {
    let pending = store.pending_migrations().await?;
    store.migrate().await?;
    report("applied", &pending);
    Ok(())
}

/// What `--down-to target` would reverse, or why it cannot.
async fn down_plan(store: &Store, target: i64) -> Result<(), warden::store::StoreError> {
    let applied = store.applied_migrations().await?;
    match schema::down_plan(&applied, target, schema::DOWNS) {
        Ok(plan) => {
            let names: Vec<MigrationName> = plan
                .iter()
                .map(|(v, _)| schema::migration_name(*v))
                .collect();
            report("would reverse", &names);
            Ok(())
        }
        Err(version) => Err(warden::store::StoreError::Irreversible {
            migration: schema::migration_name(version).to_string(),
        }),
    }
}

/// One line per migration on stdout, then where the schema stands on stderr.
fn report(verb: &str, migrations: &[MigrationName]) {
    for m in migrations {
        println!("{verb} {m}");
    }
    if migrations.is_empty() {
        eprintln!(
            "warden migrate: nothing to do (this binary's schema is migration {})",
            schema::binary_version()
        );
    }
}
