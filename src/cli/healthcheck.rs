//! `warden healthcheck`: asks this machine's Warden for `/readyz` (for
//! container health checks; the runtime image has no curl).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use warden::config::settings;

/// Exits 0 when `/readyz` on `WARDEN_LISTEN_ADDR` answers 200.
pub(super) fn run() -> ExitCode {
    let listen = settings::WARDEN_LISTEN_ADDR
        .value(&settings::process_env())
        .unwrap_or_default();
    let Ok(mut addr) = listen.parse::<SocketAddr>() else {
        eprintln!("healthcheck: invalid WARDEN_LISTEN_ADDR {listen:?}");
        return ExitCode::FAILURE;
    };
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    match readyz(addr) {
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

/// The whole answer to `GET /readyz` at `addr`, within 2 s per step.
fn readyz(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}
