//! The `warden` binary: read configuration, start, serve until a signal.

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;
use warden::Application;
use warden::config::Config;

#[tokio::main]
async fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        Some("openapi") => {
            print!("{}", warden::http::openapi::document());
            return ExitCode::SUCCESS;
        }
        Some("healthcheck") => return healthcheck(),
        Some("keys") => return keys(std::env::args().skip(2).collect()).await,
        Some(other) => {
            eprintln!(
                "warden: unknown command {other:?}; commands: openapi, healthcheck, keys (none starts the service)"
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

const KEYS_USAGE: &str =
    "usage: warden keys create --tenant NAME --role admin|operator|viewer [--name LABEL]
       warden keys list
       warden keys revoke ID
(reads DATABASE_URL; a created key is printed once and never stored)";

/// `warden keys ...`: create, list and revoke API keys straight in the
/// database, for first setup without `WARDEN_ADMIN_TOKEN`.
async fn keys(args: Vec<String>) -> ExitCode {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        eprintln!("warden keys: DATABASE_URL must be set");
        return ExitCode::from(2);
    };
    let store = match warden::store::Store::connect(&url, 2).await {
        Ok(store) => store,
        Err(err) => {
            eprintln!("warden keys: {err}");
            return ExitCode::FAILURE;
        }
    };
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
                eprintln!("warden keys: unknown role {role:?}; one of admin, operator, viewer");
                return ExitCode::from(2);
            };
            match warden::auth::issue_key(&store, tenant, role, flag("--name")).await {
                Ok(issued) => {
                    eprintln!(
                        "created key {} ({}) for tenant {} with role {}; it is shown only now:",
                        issued.record.id,
                        issued.record.prefix,
                        issued.record.tenant,
                        issued.record.role
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
                println!("ID\tPREFIX\tTENANT\tROLE\tCREATED\tLAST USED\tREVOKED");
                let time = |t: Option<chrono::DateTime<chrono::Utc>>| {
                    t.map_or_else(|| "-".to_string(), |t| t.to_rfc3339())
                };
                for k in keys {
                    println!(
                        "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                        k.id,
                        k.prefix,
                        k.tenant,
                        k.role,
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
            match store.revoke_key(id).await {
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
