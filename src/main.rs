//! The `warden` binary: read configuration, start, serve until a signal.

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;
use warden::Application;
use warden::config::Config;
use warden::config::settings;
use warden::telemetry::{self, Telemetry};

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
    // The service reads its environment and takes its secrets out of it
    // here, before the runtime starts: `remove_var` is sound only while no
    // other thread reads or writes the environment, and from here on many do.
    let service_vars = std::env::args()
        .nth(1)
        .is_none()
        .then(hardening::take_service_env);
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
    runtime.block_on(run(service_vars))
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

async fn run(service_vars: Option<std::collections::HashMap<String, String>>) -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        Some("openapi") => {
            print!("{}", warden::http::openapi::document());
            return ExitCode::SUCCESS;
        }
        Some("healthcheck") => return healthcheck(),
        Some("keys") => return keys(std::env::args().skip(2).collect()).await,
        Some("secrets") => return secrets(std::env::args().skip(2).collect()).await,
        Some("tenants") => return tenants(std::env::args().skip(2).collect()).await,
        Some("db") => return db(std::env::args().skip(2).collect()).await,
        Some("config") => return config(std::env::args().skip(2).collect()),
        Some("archive") => return archive(std::env::args().skip(2).collect()).await,
        Some(other) => {
            eprintln!(
                "warden: unknown command {other:?}; commands: openapi, healthcheck, keys, secrets, tenants, db, config, archive (none starts the service)"
            );
            return ExitCode::from(2);
        }
        None => {}
    }
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

/// `warden healthcheck`: asks this machine's Warden for `/readyz` (for
/// container health checks; the runtime image has no curl).
fn healthcheck() -> ExitCode {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream};
    use std::time::Duration;

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

const CONFIG_USAGE: &str = "usage: warden config [--markdown]
(every setting with the value in effect and where it came from, secrets shown
only as (set); --markdown: the README's settings table)";

/// `warden config`: every setting with the value in effect and where it
/// came from; exits 2 when the configuration would not start.
fn config(args: Vec<String>) -> ExitCode {
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => {
            let vars = settings::process_env();
            print!("{}", settings::render_in_effect(&vars));
            match Config::from_vars(&vars) {
                Ok(_) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("warden config: configuration error: {err}");
                    ExitCode::from(2)
                }
            }
        }
        ["--markdown"] => {
            print!("{}", settings::markdown());
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{CONFIG_USAGE}");
            ExitCode::from(2)
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
    settings::WARDEN_DATA_DIR
        .value(&settings::process_env())
        .unwrap_or_default()
        .into()
}

const ARCHIVE_USAGE: &str = "usage: warden archive import FILE
(brings one archived session back from its file, <id>.jsonl.zst under
WARDEN_ARCHIVE_DIR, read-only, under the tenant it had; reads DATABASE_URL,
or the embedded database in WARDEN_DATA_DIR when it is unset and Warden is
stopped)";

/// `warden archive import FILE`: one archived session back, read-only.
async fn archive(args: Vec<String>) -> ExitCode {
    let [command, file] = args.as_slice() else {
        eprintln!("{ARCHIVE_USAGE}");
        return ExitCode::from(2);
    };
    if command != "import" {
        eprintln!("{ARCHIVE_USAGE}");
        return ExitCode::from(2);
    }
    on_cli_store(
        "archive",
        async |store| match warden::session::archive::import(store, std::path::Path::new(file))
            .await
        {
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
        },
    )
    .await
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
    if let Some(url) = settings::DATABASE_URL.value(&settings::process_env()) {
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

/// Runs `warden {name} ...` on the database the service would use
/// (`DATABASE_URL`, else the embedded one): opens and migrates it, runs
/// `command` on it, and closes it.
async fn on_cli_store(
    name: &str,
    command: impl AsyncFnOnce(&warden::store::Store) -> ExitCode,
) -> ExitCode {
    let (store, db) = match cli_store().await {
        Ok(opened) => opened,
        Err(err) => {
            eprintln!("warden {name}: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = match store.migrate().await {
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

/// The word after `name` among a command's `args` (`--tenant acme`).
fn flag_value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// `warden keys ...`: create, list and revoke API keys straight in the
/// database, for first setup without `WARDEN_ADMIN_TOKEN`.
async fn keys(args: Vec<String>) -> ExitCode {
    on_cli_store("keys", async |store| keys_on(store, args).await).await
}

async fn keys_on(store: &warden::store::Store, args: Vec<String>) -> ExitCode {
    let flag = |name: &str| flag_value(&args, name);
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
        Some("list") => match store.list_keys(&warden::store::TenantScope::Global).await {
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
            match store
                .revoke_key(id, &warden::store::TenantScope::Global)
                .await
            {
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

const SECRETS_USAGE: &str = "usage: warden secrets rotate
       warden secrets status
       warden secrets retire
(rotate: a new key becomes the key file's first (current) line, the old keys stay
after it and still open what they sealed; with WARDEN_SECRET_KEYS or
WARDEN_SECRET_KEY set, prints a new key to put first in WARDEN_SECRET_KEYS.
Restart the replicas one by one: the first with the new key re-seals every
secret under it in the background.
status: how many secrets each key id still seals, and the fleet's current key.
retire: drops from the key file every old key that seals nothing any more.
status and retire read DATABASE_URL, or the embedded database when it is unset)";

/// `warden secrets ...`: rotate the key ring, see what each key seals,
/// drop keys that seal nothing.
async fn secrets(args: Vec<String>) -> ExitCode {
    let vars = settings::process_env();
    let env_keys = settings::WARDEN_SECRET_KEYS.lookup(&vars).is_some()
        || settings::WARDEN_SECRET_KEY.lookup(&vars).is_some();
    let key_file = std::path::PathBuf::from(
        settings::WARDEN_SECRET_KEY_FILE
            .value(&vars)
            .unwrap_or_default(),
    );
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["rotate"] if env_keys => match warden::secrets::SecretKey::generate() {
            Ok(key) => {
                eprintln!(
                    "new secret key {} (shown only now); put it first in WARDEN_SECRET_KEYS, \
the current keys after it, on every replica (WARDEN_SECRET_KEYS=<new>,<current>,...), and restart them one by one",
                    key.id()
                );
                println!("{}", key.expose_hex());
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("warden secrets: {err}");
                ExitCode::FAILURE
            }
        },
        ["rotate"] => match warden::secrets::rotate_key_file(&key_file) {
            Ok((new, kept)) => {
                let kept: Vec<&str> = kept.iter().map(|k| k.id()).collect();
                println!(
                    "{}: new current key {}, kept {}; restart the replicas one by one (each reads the file at start): \
the first re-seals every secret under {} in the background; `warden secrets status` shows the progress",
                    key_file.display(),
                    new.id(),
                    kept.join(", "),
                    new.id()
                );
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("warden secrets: {err}");
                ExitCode::FAILURE
            }
        },
        [cmd @ ("status" | "retire")] => {
            on_cli_store("secrets", async |store| {
                secrets_on(store, cmd, &key_file, env_keys).await
            })
            .await
        }
        _ => {
            eprintln!("{SECRETS_USAGE}");
            ExitCode::from(2)
        }
    }
}

async fn secrets_on(
    store: &warden::store::Store,
    cmd: &str,
    key_file: &std::path::Path,
    env_keys: bool,
) -> ExitCode {
    let (registered, counts) = match (
        store.registered_secret_key().await,
        store.secret_counts().await,
    ) {
        (Ok(registered), Ok(counts)) => (registered, counts),
        (Err(err), _) | (_, Err(err)) => {
            eprintln!("warden secrets: {err}");
            return ExitCode::FAILURE;
        }
    };
    if cmd == "status" {
        println!(
            "current key (registered by the fleet): {}",
            registered.as_deref().unwrap_or("none yet")
        );
        println!("KEY ID\tSECRETS");
        if let Some(id) = registered
            .as_deref()
            .filter(|id| !counts.iter().any(|(k, _)| k == id))
        {
            println!("{id}\t0");
        }
        for (id, n) in &counts {
            println!("{id}\t{n}");
        }
        let old: i64 = counts
            .iter()
            .filter(|(id, _)| Some(id.as_str()) != registered.as_deref())
            .map(|(_, n)| n)
            .sum();
        if old == 0 {
            println!(
                "every secret is sealed under the current key: older keys can be dropped (`warden secrets retire`)"
            );
        } else {
            println!(
                "{old} secrets are still sealed under older keys: keep those keys until the re-seal is done"
            );
        }
        return ExitCode::SUCCESS;
    }
    if env_keys {
        eprintln!(
            "warden secrets retire: the keys come from WARDEN_SECRET_KEYS or WARDEN_SECRET_KEY: \
drop from it every key `warden secrets status` lists with no secret"
        );
        return ExitCode::from(2);
    }
    let still: Vec<String> = counts
        .into_iter()
        .map(|(id, _)| id)
        .chain(registered)
        .collect();
    match warden::secrets::retire_from_key_file(key_file, &still) {
        Ok(dropped) if dropped.is_empty() => {
            println!(
                "{}: every key still seals something; nothing dropped",
                key_file.display()
            );
            ExitCode::SUCCESS
        }
        Ok(dropped) => {
            println!("{}: dropped {}", key_file.display(), dropped.join(", "));
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("warden secrets: {err}");
            ExitCode::FAILURE
        }
    }
}

const TENANTS_USAGE: &str =
    "usage: warden tenants set TENANT [--weight 1..1000] [--max-running N|none]
                              [--max-depth 1..64|default] [--max-children 1..64|default]
       warden tenants list
(weight: the tenant's share of free places when the queue is claimed, against
the other waiting tenants' weights (default 1); max-running: most sessions of
the tenant running at once across the fleet, beyond which its sessions wait
queued (default none); max-depth and max-children: how deep its trees of
child sessions may grow and how many children one session may have (default
3 and 8); reads DATABASE_URL, or the embedded database when it is unset)";

/// `warden tenants ...`: the tenants' weights and running caps in the queue.
async fn tenants(args: Vec<String>) -> ExitCode {
    on_cli_store("tenants", async |store| tenants_on(store, args).await).await
}

async fn tenants_on(store: &warden::store::Store, args: Vec<String>) -> ExitCode {
    let flag = |name: &str| flag_value(&args, name);
    match args.first().map(String::as_str) {
        Some("set") => {
            let Some(tenant) = args.get(1).filter(|t| warden::auth::valid_tenant(t)) else {
                eprintln!(
                    "warden tenants: a tenant is 1 to 64 letters, digits, `-`, `_` or `.`\n{TENANTS_USAGE}"
                );
                return ExitCode::from(2);
            };
            let current = match store.tenant_settings().await {
                Ok(all) => all.into_iter().find(|t| &t.tenant == tenant),
                Err(err) => {
                    eprintln!("warden tenants: {err}");
                    return ExitCode::FAILURE;
                }
            };
            let weight = match flag("--weight").map(str::parse::<i32>) {
                None => current.as_ref().map_or(1, |t| t.weight),
                Some(Ok(w)) if (1..=1000).contains(&w) => w,
                Some(_) => {
                    eprintln!("warden tenants: --weight is a whole number from 1 to 1000");
                    return ExitCode::from(2);
                }
            };
            let max_running = match flag("--max-running") {
                None => current.as_ref().and_then(|t| t.max_running),
                Some("none") => None,
                Some(n) => match n.parse::<i32>() {
                    Ok(n) if n >= 0 => Some(n),
                    _ => {
                        eprintln!(
                            "warden tenants: --max-running is a whole number from 0, or none"
                        );
                        return ExitCode::from(2);
                    }
                },
            };
            let tree_limit = |name: &str, now: Option<i32>| match flag(name) {
                None => Ok(now),
                Some("default") => Ok(None),
                Some(n) => match n.parse::<i32>() {
                    Ok(n) if (1..=64).contains(&n) => Ok(Some(n)),
                    _ => Err(format!(
                        "warden tenants: {name} is a whole number from 1 to 64, or default"
                    )),
                },
            };
            let limits = tree_limit("--max-depth", current.as_ref().and_then(|t| t.max_depth))
                .and_then(|depth| {
                    tree_limit(
                        "--max-children",
                        current.as_ref().and_then(|t| t.max_children),
                    )
                    .map(|children| (depth, children))
                });
            let (max_depth, max_children) = match limits {
                Ok(limits) => limits,
                Err(why) => {
                    eprintln!("{why}");
                    return ExitCode::from(2);
                }
            };
            let saved = match store.set_tenant_settings(tenant, weight, max_running).await {
                Ok(()) => {
                    store
                        .set_tenant_tree_limits(tenant, max_depth, max_children)
                        .await
                }
                Err(err) => Err(err),
            };
            let default =
                |n: Option<i32>, d: u32| n.map_or(format!("{d} (default)"), |n| n.to_string());
            match saved {
                Ok(()) => {
                    println!(
                        "tenant {tenant}: weight {weight}, max running {}, max depth {}, max children {}",
                        max_running.map_or("none".to_string(), |n| n.to_string()),
                        default(max_depth, warden::policy::delegation::DEFAULT_MAX_DEPTH),
                        default(
                            max_children,
                            warden::policy::delegation::DEFAULT_MAX_CHILDREN
                        ),
                    );
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("warden tenants: {err}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("list") => match store.tenant_settings().await {
            Ok(all) => {
                println!("TENANT\tWEIGHT\tMAX RUNNING\tMAX DEPTH\tMAX CHILDREN\tRUNNING\tACTIVE");
                let shown = |n: Option<i32>| n.map_or("-".to_string(), |n| n.to_string());
                for t in all {
                    println!(
                        "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                        t.tenant,
                        t.weight,
                        shown(t.max_running),
                        shown(t.max_depth),
                        shown(t.max_children),
                        t.running,
                        t.active
                    );
                }
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("warden tenants: {err}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!("{TENANTS_USAGE}");
            ExitCode::from(2)
        }
    }
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
