//! `warden archive import FILE`: one archived session back, read-only.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use warden::store::Store;

use super::store::{Schema, on_cli_store};

/// The subcommands of `warden archive`.
#[derive(Debug, Subcommand)]
pub enum ArchiveCommand {
    /// Bring one archived session back, read-only, under the tenant it had
    ///
    /// Reads DATABASE_URL, or the embedded database in WARDEN_DATA_DIR when
    /// it is unset and Warden is stopped.
    Import {
        /// The session's archive file, <id>.jsonl.zst under WARDEN_ARCHIVE_DIR
        file: PathBuf,
    },
}

/// Runs `warden archive ...`.
pub(super) async fn run(command: ArchiveCommand) -> ExitCode {
    match command {
        ArchiveCommand::Import { file } => {
            on_cli_store("archive", Schema::Write, async |store| {
                import(store, &file).await
            })
            .await
        }
    }
}

/// Imports `file` and says what came back.
async fn import(store: &Store, file: &std::path::Path) -> ExitCode {
    match warden::session::archive::import(store, file).await {
        Ok(session) => {
            let rows: Vec<String> = session
                .counts
                .iter()
                .map(|(kind, n)| format!("{n} {kind}"))
                .collect();
            println!(
                "imported session {} of tenant {} (read-only): {}",
                session.id,
                session.tenant,
                if rows.is_empty() {
                    "no history".to_string()
                } else {
                    rows.join(", ")
                }
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("warden archive: {err}");
            ExitCode::FAILURE
        }
    }
}
