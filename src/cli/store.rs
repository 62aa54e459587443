//! The database the commands work on: `DATABASE_URL`, else the embedded
//! PostgreSQL in `WARDEN_DATA_DIR` (one process at a time: stop Warden).

use std::process::ExitCode;

use warden::config::settings;
use warden::store::Store;

/// What a command needs of the schema before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Schema {
    /// A command that writes: the schema brought to this binary's as the
    /// service would at start-up (`WARDEN_MIGRATE`: `auto` applies what is
    /// missing, `off` requires it current).
    Write,
    /// A command that only reads: never migrates, requires it current.
    Read,
    /// `warden migrate` itself: opened as it is.
    AsIs,
}

/// Runs `warden {name} ...` on the database the service would use
/// (`DATABASE_URL`, else the embedded one): opens it, checks or migrates
/// its schema as `schema` says, runs `command` on it, and closes it.
pub(super) async fn on_cli_store(
    name: &str,
    schema: Schema,
    command: impl AsyncFnOnce(&Store) -> ExitCode,
) -> ExitCode {
    let (store, db) = match cli_store().await {
        Ok(opened) => opened,
        Err(err) => {
            eprintln!("warden {name}: {err}");
            return ExitCode::FAILURE;
        }
    };
    let ready = match schema {
        Schema::Write if migrate_at_start() => store.migrate().await,
        Schema::Write | Schema::Read => store.require_current_schema().await,
        Schema::AsIs => Ok(()),
    };
    let code = match ready {
        Ok(()) => command(&store).await,
        Err(err) => {
            eprintln!("warden {name}: {err}");
            ExitCode::FAILURE
        }
    };
    drop(store);
    db.close().await;
    code
}

/// Whether `WARDEN_MIGRATE` lets a command apply migrations (anything but
/// `off`: the service refuses a value it does not know at its start).
fn migrate_at_start() -> bool {
    settings::WARDEN_MIGRATE
        .value(&settings::process_env())
        .is_none_or(|v| v.trim() != "off")
}

/// `WARDEN_DATA_DIR` as the service reads it.
#[cfg(feature = "embedded")]
pub(super) fn data_dir() -> std::path::PathBuf {
    settings::WARDEN_DATA_DIR
        .value(&settings::process_env())
        .unwrap_or_default()
        .into()
}

/// The store the CLI commands use: `DATABASE_URL`, or the embedded
/// database (kept running until the returned guard drops).
async fn cli_store() -> Result<(Store, CliDb), String> {
    if let Some(url) = settings::DATABASE_URL.value(&settings::process_env()) {
        let store = Store::connect(&url, 2).await.map_err(|e| e.to_string())?;
        return Ok((store, CliDb::default()));
    }
    embedded_cli_store().await
}

/// What keeps the CLI's embedded database open.
#[derive(Default)]
struct CliDb {
    #[cfg(feature = "embedded")]
    embedded: Option<(sqlx::PgPool, warden::store::embedded::Embedded)>,
}

impl CliDb {
    async fn close(self) {
        #[cfg(feature = "embedded")]
        if let Some((pool, embedded)) = self.embedded {
            pool.close().await;
            let _ = tokio::task::spawn_blocking(move || embedded.stop()).await;
        }
    }
}

#[cfg(feature = "embedded")]
async fn embedded_cli_store() -> Result<(Store, CliDb), String> {
    use warden::store::embedded::{EMBEDDED_CONNECTIONS, Embedded};
    let dir = data_dir();
    let embedded = tokio::task::spawn_blocking(move || Embedded::open(&dir))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let pool = Store::pool_options(EMBEDDED_CONNECTIONS)
        .connect_with(embedded.connect_options())
        .await
        .map_err(|e| e.to_string())?;
    let store = Store::embedded(pool.clone(), embedded.data_dir().unwrap_or(&data_dir()))
        .map_err(|e| e.to_string())?;
    Ok((
        store,
        CliDb {
            embedded: Some((pool, embedded)),
        },
    ))
}

#[cfg(not(feature = "embedded"))]
async fn embedded_cli_store() -> Result<(Store, CliDb), String> {
    Err("DATABASE_URL must be set (this build has no embedded PostgreSQL)".into())
}
