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

fn main() -> ExitCode {
    purge_freed_pages_promptly();
    // The command line first: a command other than serving keeps its
    // environment (it reads DATABASE_URL and the secret key itself).
    let (command, service_vars) = match cli::parse() {
        Ok(cli::Invocation::Run(command)) => (Some(command), None),
        // The service reads its environment and takes its secrets out of it
        // here, before the runtime starts: `remove_var` is sound only while
        // no other thread reads or writes the environment, and from here on
        // many do. `--listen` wins over WARDEN_LISTEN_ADDR.
        Ok(cli::Invocation::Serve { listen }) => {
            let mut vars = hardening::take_service_env();
            if let Some(addr) = listen {
                vars.insert(settings::WARDEN_LISTEN_ADDR.name.to_string(), addr);
            }
            (None, Some(vars))
        }
        Err(code) => return code,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("warden: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        match command {
            Some(command) => cli::run(command).await,
            None => serve(service_vars).await,
        }
    })
}

/// Start-up hardening of the service against other processes of its user
/// (an MCP stdio server runs as that user): they can read neither its
/// memory nor its environment, and its secrets are no longer in that
/// environment once read.
mod hardening {
    use std::collections::HashMap;

    use warden::config::settings;

    /// The service's environment, read once; then Warden's secrets are
    /// taken out of the process environment and the process is made
    /// non-dumpable. Call only while this is the only thread.
    pub fn take_service_env() -> HashMap<String, String> {
        let vars = settings::process_env();
        deny_inspection();
        // The OpenTelemetry SDK reads its own variables when the exporter
        // starts: those stay (unreadable to others, as the rest).
        let secrets = settings::SETTINGS
            .iter()
            .filter(|s| s.secret && !s.name.starts_with("OTEL_"))
            .flat_map(|s| [Some(s.name), s.old_name])
            .flatten();
        for name in secrets {
            // SAFETY: called from `main` before the runtime or any other
            // thread exists, so nothing reads or writes the environment
            // meanwhile.
            unsafe { forget_var(name) };
        }
        vars
    }

    /// `PR_SET_DUMPABLE` off: `/proc/<pid>/environ`, `maps`, `mem` and
    /// ptrace are then refused to every process of the same user that
    /// lacks `CAP_SYS_PTRACE` (root keeps it), and no core file is written.
    #[cfg(target_os = "linux")]
    fn deny_inspection() {
        // SAFETY: prctl with PR_SET_DUMPABLE takes plain integers.
        if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
            eprintln!(
                "warden: cannot turn PR_SET_DUMPABLE off ({}); processes of this user can read its memory",
                std::io::Error::last_os_error()
            );
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn deny_inspection() {}

    /// Takes `name` out of the environment and, on Linux, zeroes every
    /// `name=value` text it had: `/proc/<pid>/environ` shows the block the
    /// process started with, which `remove_var` alone leaves as it was.
    ///
    /// # Safety
    /// No other thread may read or write the environment meanwhile.
    unsafe fn forget_var(name: &str) {
        #[cfg(target_os = "linux")]
        let texts = unsafe { entries_of(name) };
        // SAFETY: the caller guarantees no other thread touches the environment.
        unsafe { std::env::remove_var(name) };
        #[cfg(target_os = "linux")]
        for (start, len) in texts {
            // SAFETY: `start..start + len` is an entry's text that the
            // environment held (the initial block on the stack, or libc's
            // copy): writable, and no longer referenced by `environ` now
            // that the variable is removed.
            unsafe { std::ptr::write_bytes(start, 0, len) };
        }
    }

    /// Where the texts `name=…` of the environment are: (start, length).
    ///
    /// # Safety
    /// No other thread may change the environment meanwhile.
    #[cfg(target_os = "linux")]
    unsafe fn entries_of(name: &str) -> Vec<(*mut u8, usize)> {
        unsafe extern "C" {
            static environ: *const *mut libc::c_char;
        }
        let prefix = format!("{name}=");
        let mut found = Vec::new();
        // SAFETY: `environ` is a NULL-terminated array of NUL-terminated
        // strings that no other thread changes meanwhile (the caller's word).
        unsafe {
            let mut entry = environ;
            while !entry.is_null() && !(*entry).is_null() {
                let text = std::ffi::CStr::from_ptr(*entry);
                if text.to_bytes().starts_with(prefix.as_bytes()) {
                    found.push(((*entry).cast::<u8>(), text.to_bytes().len()));
                }
                entry = entry.add(1);
            }
        }
        found
    }
}

/// Serves until a signal, configured from `service_vars` (the environment
/// read at start-up) or, without them, from the process environment.
async fn serve(service_vars: Option<std::collections::HashMap<String, String>>) -> ExitCode {
    let vars = service_vars.unwrap_or_else(settings::process_env);
    let config = match Config::from_vars(&vars) {
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
