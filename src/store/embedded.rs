//! The embedded PostgreSQL: PostgreSQL 17.5 compiled to WASM, run
//! in this process by `pglite-oxide`, used when `DATABASE_URL` is unset.
//!
//! It serves one backend, so Warden talks to it over a single connection
//! (see [`EMBEDDED_CONNECTIONS`]), on a Unix socket inside the data
//! directory: nothing listens on a TCP port another local user could reach.
//! One process at a time owns a data directory, through an exclusive lock
//! on `warden.lock` held for the life of the [`Embedded`] handle.
//!
//! Durability: a commit reaches the kernel before it is acknowledged, so a
//! killed process (kill -9) loses nothing committed. The WASM runtime does
//! not pass fsync through to the host, so the store flushes the data
//! directory's filesystem itself before a commit counts (see
//! `store::flush`).

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use pglite_oxide::{PgDumpOptions, PgliteServer};
use sqlx::postgres::PgConnectOptions;

/// The embedded server has one backend: every pool on it has one connection.
pub const EMBEDDED_CONNECTIONS: u32 = 1;

/// The database, user and socket port the embedded server answers as.
const DATABASE: &str = "template1";
const USER: &str = "postgres";
const SOCKET_PORT: u16 = 5432;
/// The longest Unix socket path the kernel accepts (`sun_path`, with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Why the embedded PostgreSQL could not start or answer.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// Another process uses the data directory.
    #[error(
        "the data directory {0} is in use by another Warden process (only one may use it); \
stop that process, or set WARDEN_DATA_DIR to another directory, or DATABASE_URL to share a Postgres server"
    )]
    Locked(PathBuf),
    /// The data directory could not be created or locked.
    #[error("cannot use the data directory {path}: {source}")]
    DataDir {
        /// The directory.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The socket path would be longer than the kernel allows.
    #[error(
        "the data directory path {0} is too long for the embedded server's socket; set WARDEN_DATA_DIR to a shorter path"
    )]
    PathTooLong(PathBuf),
    /// The embedded server failed.
    #[error("embedded PostgreSQL: {0}")]
    Engine(String),
}

/// A running embedded PostgreSQL and the lock on its data directory.
/// Dropping it stops the server; close every pool on it first (the server
/// waits for its one client to leave).
#[derive(Debug)]
pub struct Embedded {
    server: Option<PgliteServer>,
    socket_dir: PathBuf,
    data_dir: Option<PathBuf>,
    _socket_tmp: Option<TempSocketDir>,
    _lock: Option<File>,
}

impl Embedded {
    /// Starts the embedded server on `data_dir` (created if missing), after
    /// taking its lock. Blocking: call it off the async runtime.
    pub fn open(data_dir: &Path) -> Result<Embedded, EmbeddedError> {
        let dir_error = |source| EmbeddedError::DataDir {
            path: data_dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(data_dir).map_err(dir_error)?;
        let data_dir = std::fs::canonicalize(data_dir).map_err(dir_error)?;
        restrict_to_owner(&data_dir).map_err(dir_error)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(data_dir.join("warden.lock"))
            .map_err(dir_error)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(EmbeddedError::Locked(data_dir)),
            Err(TryLockError::Error(e)) => return Err(dir_error(e)),
        }
        let socket_dir = data_dir.join("run");
        std::fs::create_dir_all(&socket_dir).map_err(dir_error)?;
        let socket = socket_path(&socket_dir)?;
        let server = PgliteServer::builder()
            .path(data_dir.join("pg"))
            .unix(socket)
            .username(USER)
            .database(DATABASE)
            .start()
            .map_err(|e| EmbeddedError::Engine(format!("{e:#}")))?;
        Ok(Embedded {
            server: Some(server),
            socket_dir,
            data_dir: Some(data_dir),
            _socket_tmp: None,
            _lock: Some(lock),
        })
    }

    /// Starts a throwaway server (a copy of a cached fresh cluster, removed
    /// on drop): one per test. Blocking: call it off the async runtime.
    pub fn temporary() -> Result<Embedded, EmbeddedError> {
        let tmp = TempSocketDir::new().map_err(|source| EmbeddedError::DataDir {
            path: std::env::temp_dir(),
            source,
        })?;
        let socket = socket_path(&tmp.0)?;
        let server = PgliteServer::builder()
            .temporary()
            .unix(socket)
            .username(USER)
            .database(DATABASE)
            .start()
            .map_err(|e| EmbeddedError::Engine(format!("{e:#}")))?;
        Ok(Embedded {
            server: Some(server),
            socket_dir: tmp.0.clone(),
            data_dir: None,
            _socket_tmp: Some(tmp),
            _lock: None,
        })
    }

    /// The data directory (none for a temporary server).
    pub fn data_dir(&self) -> Option<&Path> {
        self.data_dir.as_deref()
    }

    /// How to connect to it: over its Unix socket, whatever `PGHOST`,
    /// `PGPORT` or a `.pgpass` say (never a fall-back to another server).
    pub fn connect_options(&self) -> PgConnectOptions {
        PgConnectOptions::new_without_pgpass()
            .socket(&self.socket_dir)
            .ssl_mode(sqlx::postgres::PgSslMode::Disable)
            .port(SOCKET_PORT)
            .username(USER)
            .database(DATABASE)
    }

    /// Writes the whole database as SQL with the bundled `pg_dump`, which
    /// needs the server's one backend: no pool may be open on it. Blocking
    /// (the dump runs its own runtime): call it off the async runtime.
    pub fn dump_sql(data_dir: &Path) -> Result<String, EmbeddedError> {
        // pg_dump reaches the server over TCP only: a short-lived loopback
        // listener, started after taking the directory's lock.
        if !data_dir.join("pg").is_dir() {
            return Err(EmbeddedError::DataDir {
                path: data_dir.to_path_buf(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no embedded database here (it is created when Warden first starts without DATABASE_URL)",
                ),
            });
        }
        let data_dir =
            std::fs::canonicalize(data_dir).map_err(|source| EmbeddedError::DataDir {
                path: data_dir.to_path_buf(),
                source,
            })?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(data_dir.join("warden.lock"))
            .map_err(|source| EmbeddedError::DataDir {
                path: data_dir.clone(),
                source,
            })?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(EmbeddedError::Locked(data_dir)),
            Err(TryLockError::Error(source)) => {
                return Err(EmbeddedError::DataDir {
                    path: data_dir,
                    source,
                });
            }
        }
        let server = PgliteServer::builder()
            .path(data_dir.join("pg"))
            .username(USER)
            .database(DATABASE)
            .start()
            .map_err(|e| EmbeddedError::Engine(format!("{e:#}")))?;
        let sql = server
            .dump_sql(PgDumpOptions::new().database(DATABASE).username(USER))
            .map_err(|e| EmbeddedError::Engine(format!("pg_dump: {e:#}")));
        let stopped = server
            .shutdown()
            .map_err(|e| EmbeddedError::Engine(format!("{e:#}")));
        drop(lock);
        let sql = sql?;
        stopped?;
        Ok(for_older_servers(&sql))
    }
}

impl Drop for Embedded {
    /// Stops the server on a thread of its own: it waits for its client to
    /// leave, which a pool still open elsewhere would make a hang here. The
    /// directory's lock goes with it, released once the server has stopped.
    fn drop(&mut self) {
        let Some(server) = self.server.take() else {
            return;
        };
        let lock = self._lock.take();
        let socket_tmp = self._socket_tmp.take();
        let stopper = std::thread::Builder::new()
            .name("warden-pg-stop".into())
            .spawn(move || {
                if let Err(err) = server.shutdown() {
                    tracing::warn!(error = %format!("{err:#}"), "embedded PostgreSQL did not stop cleanly");
                }
                drop(socket_tmp);
                drop(lock);
            });
        if let Err(err) = stopper {
            tracing::warn!(error = %err, "cannot stop embedded PostgreSQL");
        }
    }
}

impl Embedded {
    /// Stops the server and waits for it (close every pool on it first).
    pub fn stop(mut self) {
        if let Some(server) = self.server.take()
            && let Err(err) = server.shutdown()
        {
            tracing::warn!(error = %format!("{err:#}"), "embedded PostgreSQL did not stop cleanly");
        }
    }
}

/// The bundled pg_dump is version 17, whose header sets
/// `transaction_timeout`, a setting older servers refuse (and `psql -v
/// ON_ERROR_STOP=1` stops there). It only ever sets it to 0, the default, so
/// the dump loads into every supported server (14+) without it. Only the
/// header's line goes: the same text inside a stored value stays.
fn for_older_servers(sql: &str) -> String {
    let mut header = true;
    let mut out = String::with_capacity(sql.len());
    for line in sql.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        header = header
            && (bare.is_empty()
                || bare.starts_with("--")
                || bare.starts_with("SET ")
                || bare.starts_with("SELECT pg_catalog.set_config("));
        if header && bare == "SET transaction_timeout = 0;" {
            continue;
        }
        out.push_str(line);
    }
    out
}

fn socket_path(dir: &Path) -> Result<PathBuf, EmbeddedError> {
    let socket = dir.join(format!(".s.PGSQL.{SOCKET_PORT}"));
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(EmbeddedError::PathTooLong(dir.to_path_buf()));
    }
    Ok(socket)
}

/// Only the owner may enter the data directory (its socket takes no password).
#[cfg(unix)]
fn restrict_to_owner(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

#[cfg(not(unix))]
fn restrict_to_owner(_dir: &Path) -> std::io::Result<()> {
    Ok(())
}

/// A private directory for a temporary server's socket, removed on drop.
#[derive(Debug)]
struct TempSocketDir(PathBuf);

impl TempSocketDir {
    fn new() -> std::io::Result<TempSocketDir> {
        let dir = std::env::temp_dir().join(format!("warden-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir)?;
        restrict_to_owner(&dir)?;
        Ok(TempSocketDir(dir))
    }
}

impl Drop for TempSocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_opener_of_a_data_directory_is_refused() {
        let dir =
            std::env::temp_dir().join(format!("warden-lock-{}", uuid::Uuid::new_v4().simple()));
        let first = Embedded::open(&dir).expect("first opener starts");
        let err = Embedded::open(&dir).expect_err("second opener is refused");
        assert!(matches!(err, EmbeddedError::Locked(_)), "{err}");
        assert!(err.to_string().contains("in use by another Warden process"));
        first.stop();
        let again = Embedded::open(&dir).expect("free again after the first stopped");
        again.stop();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_dump_loads_into_servers_before_17() {
        let dump = "--\n-- PostgreSQL database dump\n\nSET lock_timeout = 0;\nSET transaction_timeout = 0;\n\
CREATE TABLE t (x text);\nCOPY t (x) FROM stdin;\nSET transaction_timeout = 0;\n\\.\n";
        assert_eq!(
            for_older_servers(dump),
            "--\n-- PostgreSQL database dump\n\nSET lock_timeout = 0;\n\
CREATE TABLE t (x text);\nCOPY t (x) FROM stdin;\nSET transaction_timeout = 0;\n\\.\n",
            "the header's line goes, the stored value's stays"
        );
    }

    #[test]
    fn an_overlong_socket_path_is_named() {
        let dir = PathBuf::from(format!("/tmp/{}", "d".repeat(120)));
        assert!(matches!(
            socket_path(&dir),
            Err(EmbeddedError::PathTooLong(_))
        ));
    }
}
