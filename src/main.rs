//! The `warden` binary: with no command, read configuration, start, serve
//! until a signal; the other commands are in `cli`.

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;
use warden::Application;
use warden::config::Config;
use warden::config::settings;
use warden::telemetry::{self, Telemetry};

mod cli;

/// mimalloc, not the system allocator: with it warden-bench measured 1.6x
/// the iterations/s at 1,000 sessions and 1.2x at one (the loop allocates
/// and frees small JSON values from several threads); see BENCHMARKS.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay` (its position in `mi_option_t`, the
/// same in mimalloc v2 and v3; libmimalloc-sys names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Gives freed pages back to the system at once instead of after mimalloc's
/// delay (1 s in v3): a delayed purge runs only when the heap is next used,
/// so pages a big session freed stayed resident once the service went idle
/// (138 MB after four 3.5 MB-per-step sessions against 53 MB at start).
/// The measured cost is in BENCHMARKS.md. `MIMALLOC_PURGE_DELAY` set by the
/// operator wins.
fn purge_freed_pages_promptly() {
    if settings::MIMALLOC_PURGE_DELAY
        .lookup(&settings::process_env())
        .is_none()
    {
        // SAFETY: writes one integer option; mimalloc documents options as
        // settable at run time and reads this one on each purge.
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    purge_freed_pages_promptly();
    match cli::parse() {
        Ok(None) => {}
        Ok(Some(command)) => return cli::run(command).await,
        Err(code) => return code,
    }
    let config = match Config::from_env() {
        Ok(config) => config,
        Err(err) => {
            eprintln!("warden: configuration error: {err}");
            return ExitCode::from(2);
        }
    };
    let telemetry = match config.telemetry.as_ref().map(Telemetry::start).transpose() {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("warden: {err}");
            return ExitCode::from(2);
        }
    };
    init_tracing(&config, telemetry.as_ref());
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
    let ran = app.run_until(warden::shutdown_signal()).await;
    if let Some(telemetry) = telemetry {
        // Sends the spans still buffered; blocking, so off the runtime's threads.
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    }
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("warden: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The log (`RUST_LOG`, `WARDEN_LOG_FORMAT`) and, when exported, the
/// traces: each layer with its own filter, so the log level does not decide
/// what is traced and the traced spans stay out of the log.
fn init_tracing(config: &Config, telemetry: Option<&Telemetry>) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = EnvFilter::try_new(&config.log_filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let filter = match format!("{}=off", telemetry::TARGET).parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    let log = if config.log_json {
        tracing_subscriber::fmt::layer().json().boxed()
    } else {
        tracing_subscriber::fmt::layer().boxed()
    };
    tracing_subscriber::registry()
        .with(log.with_filter(filter))
        .with(telemetry.map(Telemetry::layer))
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_the_one_set() {
        // mimalloc v3's default purge delay is 1000 ms: reading it at
        // our index before any set shows the index names that option (run
        // without MIMALLOC_PURGE_DELAY in the environment).
        // SAFETY: reads and sets one integer option.
        let default = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(default, 1000);
        purge_freed_pages_promptly();
        let now = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(now, 0);
    }
}
