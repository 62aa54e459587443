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
        Some(other) => {
            eprintln!(
                "warden: unknown command {other:?}; commands: openapi, healthcheck (none starts the service)"
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
