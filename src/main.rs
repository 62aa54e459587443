//! The `warden` binary: read configuration, start, serve until a signal.

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;
use warden::Application;
use warden::config::Config;

/// mimalloc, not the system allocator: with it warden-bench measured 1.6x
/// the iterations/s at 1,000 sessions and 1.2x at one (the loop allocates
/// and frees small JSON values from several threads); see BENCHMARKS.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        Some("openapi") => {
            print!("{}", warden::http::openapi::document());
            return ExitCode::SUCCESS;
        }
        Some("healthcheck") => return healthcheck(),
        Some("keys") => return keys(std::env::args().skip(2).collect()).await,
        Some("db") => return db(std::env::args().skip(2).collect()).await,
        Some(other) => {
            eprintln!(
                "warden: unknown command {other:?}; commands: openapi, healthcheck, keys, db (none starts the service)"
            );
            return ExitCode::from(2);
        }
        None => {}
    }
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(err) => {
            eprintln!("warden: configuration error: {err}");
            return ExitCode::from(2);
        }
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if config.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    match warden::http::serve::raise_open_files_limit() {
        Ok(limit) if limit < config.connections.max_connections as u64 + 1_024 => {
            tracing::warn!(
                open_files = limit,
                max_connections = config.connections.max_connections,
                "the open-files limit (ulimit -n) leaves little room beyond WARDEN_MAX_CONNECTIONS; \
raise it or lower WARDEN_MAX_CONNECTIONS so excess connections are refused rather than failing to be accepted"
            );
        }
        Ok(limit) => tracing::debug!(open_files = limit, "open-files limit"),
        Err(e) => tracing::debug!(error = %e, "open-files limit left as it is"),
    }
    let app = match Application::build(config).await {
        Ok(app) => app,
        Err(err) => {
            tracing::error!(error = %err, "warden could not start");
            eprintln!("warden: {err}");
            return ExitCode::FAILURE;
        }
    };
    match app.run_until(warden::shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("warden: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `warden healthcheck`: asks this machine's Warden for `/readyz` (for
/// container health checks; the runtime image has no curl).
fn healthcheck() -> ExitCode {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

    let listen = std::env::var("WARDEN_LISTEN_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let Ok(mut addr) = listen.parse::<SocketAddr>() else {
        eprintln!("healthcheck: invalid WARDEN_LISTEN_ADDR {listen:?}");
        return ExitCode::FAILURE;
    };
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let answer = (|| -> std::io::Result<String> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    })();
    match answer {
        Ok(response)
            if response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200") =>
        {
            ExitCode::SUCCESS
        }
        Ok(response) => {
            eprintln!(
                "healthcheck: not ready: {}",
                response.lines().next().unwrap_or("")
            );
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("healthcheck: cannot reach {addr}: {err}");
            ExitCode::FAILURE
        }
    }
}

const DB_USAGE: &str = "usage: warden db dump > warden.sql
(writes the embedded PostgreSQL in WARDEN_DATA_DIR, default ./.warden, as SQL;
stop Warden first: the embedded server has one connection)";

/// `warden db dump`: the embedded database as SQL (the bundled `pg_dump`),
/// to load into a Postgres server before setting `DATABASE_URL`.
async fn db(args: Vec<String>) -> ExitCode {
    if args.first().map(String::as_str) != Some("dump") || args.len() > 1 {
        eprintln!("{DB_USAGE}");
        return ExitCode::from(2);
    }
    dump().await
}

#[cfg(feature = "embedded")]
async fn dump() -> ExitCode {
    use std::io::Write;
    if std::env::var_os("DATABASE_URL").is_some_and(|v| !v.is_empty()) {
        eprintln!(
            "warden db dump: DATABASE_URL is set, so Warden does not use the embedded database; \
dump a server with its own pg_dump (unset DATABASE_URL to dump WARDEN_DATA_DIR)"
        );
        return ExitCode::from(2);
    }
    let dir = data_dir();
    let dumped =
        tokio::task::spawn_blocking(move || warden::store::embedded::Embedded::dump_sql(&dir))
            .await;
    match dumped {
        Ok(Ok(sql)) => {
            let mut out = std::io::stdout().lock();
            match out.write_all(sql.as_bytes()).and_then(|()| out.flush()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("warden db dump: cannot write the dump: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Ok(Err(err)) => {
            eprintln!("warden db dump: {err}");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("warden db dump: {err}");
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

/// `WARDEN_DATA_DIR` as the service reads it.
#[cfg(feature = "embedded")]
fn data_dir() -> std::path::PathBuf {
    std::env::var("WARDEN_DATA_DIR")
        .ok()
        .filter(|d| !d.trim().is_empty())
        .map_or_else(|| "./.warden".into(), |d| d.trim().into())
}

const KEYS_USAGE: &str =
    "usage: warden keys create --tenant NAME --role admin|operator|viewer|worker [--global] [--name LABEL] [--queues A,B]
       warden keys list
       warden keys revoke ID
(--global: an admin key of every tenant, else an admin key manages its tenant only;
--queues: the queues a worker key may claim from, required for role worker;
reads DATABASE_URL, or the embedded database in WARDEN_DATA_DIR when it is unset
and Warden is stopped; a created key is printed once and never stored; running
replicas see a created or revoked key within a second)";

/// The store the CLI commands use: `DATABASE_URL`, or the embedded
/// database (kept running until the returned guard drops).
async fn cli_store() -> Result<(warden::store::Store, CliDb), String> {
    if let Ok(url) = std::env::var("DATABASE_URL")
        && !url.trim().is_empty()
    {
        let store = warden::store::Store::connect(&url, 2)
            .await
            .map_err(|e| e.to_string())?;
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
async fn embedded_cli_store() -> Result<(warden::store::Store, CliDb), String> {
    use warden::store::embedded::{EMBEDDED_CONNECTIONS, Embedded};
    let dir = data_dir();
    let embedded = tokio::task::spawn_blocking(move || Embedded::open(&dir))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let pool = warden::store::Store::pool_options(EMBEDDED_CONNECTIONS)
        .connect_with(embedded.connect_options())
        .await
        .map_err(|e| e.to_string())?;
    let store =
        warden::store::Store::embedded(pool.clone(), embedded.data_dir().unwrap_or(&data_dir()))
            .map_err(|e| e.to_string())?;
    Ok((
        store,
        CliDb {
            embedded: Some((pool, embedded)),
        },
    ))
}

#[cfg(not(feature = "embedded"))]
async fn embedded_cli_store() -> Result<(warden::store::Store, CliDb), String> {
    Err("DATABASE_URL must be set (this build has no embedded PostgreSQL)".into())
}

/// `warden keys ...`: create, list and revoke API keys straight in the
/// database, for first setup without `WARDEN_ADMIN_TOKEN`.
async fn keys(args: Vec<String>) -> ExitCode {
    let (store, db) = match cli_store().await {
        Ok(opened) => opened,
        Err(err) => {
            eprintln!("warden keys: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = keys_on(&store, args).await;
    drop(store);
    db.close().await;
    code
}

async fn keys_on(store: &warden::store::Store, args: Vec<String>) -> ExitCode {
    if let Err(err) = store.migrate().await {
        eprintln!("warden keys: {err}");
        return ExitCode::FAILURE;
    }
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    match args.first().map(String::as_str) {
        Some("create") => {
            let (Some(tenant), Some(role)) = (flag("--tenant"), flag("--role")) else {
                eprintln!("{KEYS_USAGE}");
                return ExitCode::from(2);
            };
            let Some(role) = warden::auth::Role::parse(role) else {
                eprintln!(
                    "warden keys: unknown role {role:?}; one of admin, operator, viewer, worker"
                );
                return ExitCode::from(2);
            };
            let queues: Vec<String> = flag("--queues")
                .map(|q| q.split(',').map(str::to_string).collect())
                .unwrap_or_default();
            let spec = warden::auth::KeySpec {
                tenant,
                role,
                global: args.iter().any(|a| a == "--global"),
                name: flag("--name"),
                queues: &queues,
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
        Some("list") => match store.list_keys(None).await {
            Ok(keys) => {
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
            Err(err) => {
                eprintln!("warden keys: {err}");
                ExitCode::FAILURE
            }
        },
        Some("revoke") => {
            let Some(Ok(id)) = args.get(1).map(|a| a.parse::<uuid::Uuid>()) else {
                eprintln!("{KEYS_USAGE}");
                return ExitCode::from(2);
            };
            match store.revoke_key(id, None).await {
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
        _ => {
            eprintln!("{KEYS_USAGE}");
            ExitCode::from(2)
        }
    }
}
