//! `warden db dump`: the embedded database as SQL (the bundled `pg_dump`),
//! to load into a Postgres server before setting `DATABASE_URL`.

use std::process::ExitCode;

use clap::Subcommand;

/// The subcommands of `warden db`.
#[derive(Debug, Subcommand)]
pub enum DbCommand {
    /// Write the embedded PostgreSQL as SQL to stdout: warden db dump > warden.sql
    ///
    /// Reads the embedded PostgreSQL in WARDEN_DATA_DIR (default ./.warden);
    /// stop Warden first: the embedded server has one connection. Load the
    /// dump into a server with psql, then start Warden with DATABASE_URL.
    Dump,
}

/// Runs `warden db ...`.
pub(super) async fn run(command: DbCommand) -> ExitCode {
    match command {
        DbCommand::Dump => dump().await,
    }
}

#[cfg(feature = "embedded")]
async fn dump() -> ExitCode {
    use std::io::Write;
    use warden::config::settings;
    if settings::DATABASE_URL
        .lookup(&settings::process_env())
        .is_some()
    {
        eprintln!(
            "warden db dump: DATABASE_URL is set, so Warden does not use the embedded database; \
dump a server with its own pg_dump (unset DATABASE_URL to dump WARDEN_DATA_DIR)"
        );
        return ExitCode::from(2);
    }
    let dir = super::store::data_dir();
    let dumped =
        tokio::task::spawn_blocking(move || warden::store::embedded::Embedded::dump_sql(&dir))
            .await;
    let sql = match dumped {
        Ok(Ok(sql)) => sql,
        Ok(Err(err)) => {
            eprintln!("warden db dump: {err}");
            return ExitCode::FAILURE;
        }
        Err(err) => {
            eprintln!("warden db dump: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(sql.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("warden db dump: cannot write the dump: {err}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "embedded"))]
async fn dump() -> ExitCode {
    eprintln!(
        "warden db dump: this build has no embedded PostgreSQL (the `embedded` feature is off)"
    );
    ExitCode::from(2)
}
