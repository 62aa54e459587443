//! Warden: runs and supervises long-running autonomous agent sessions.
//!
//! Layers, with dependencies pointing one way (checked by `layers.rs`):
//! `http` → `session` → (`executor`, `store`) → `policy`.

pub mod auth;
pub mod config;
pub mod egress;
pub mod event;
pub mod executor;
pub mod http;
#[cfg(test)]
mod layers;
pub mod llm;
pub mod mcp;
pub mod metrics;
pub mod policy;
pub mod ratelimit;
pub mod secrets;
pub mod session;
pub mod spec;
pub mod store;
pub mod telemetry;
pub mod thread_priority;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use config::Config;
use session::{SessionService, Supervisor};
use store::{Store, StoreError};

/// Why the application could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Storage could not be reached or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for (`WARDEN_LISTEN_ADDR`).
        addr: SocketAddr,
        /// Why the bind failed (in use, not permitted...).
        source: std::io::Error,
    },
    /// The server failed.
    #[error("server error: {0}")]
    Serve(std::io::Error),
    /// Asked to listen beyond loopback with no way to authenticate.
    #[error(
        "refusing to listen on {0} without authentication: set WARDEN_ADMIN_TOKEN (an admin key, e.g. `openssl rand -hex 32`) \
or create a key with `warden keys create --tenant NAME --role admin`; or listen on 127.0.0.1; \
or set WARDEN_AUTH=off to serve everyone who can reach the port"
    )]
    Unprotected(SocketAddr),
    /// Keys could not be read at start.
    #[error("cannot read API keys: {0}")]
    Auth(#[from] auth::AuthError),
    /// The secret key could not be loaded, or sessions' plaintext keys not sealed.
    #[error("secrets at rest: {0}")]
    Secrets(String),
    /// The runtime for the session loops could not be started.
    #[error("cannot start the session runtime: {0}")]
    Runtime(std::io::Error),
    /// The embedded PostgreSQL could not start.
    #[cfg(feature = "embedded")]
    #[error(transparent)]
    Embedded(#[from] store::embedded::EmbeddedError),
    /// No `DATABASE_URL` in a build without the embedded PostgreSQL.
    #[cfg(not(feature = "embedded"))]
    #[error("DATABASE_URL is unset and this build has no embedded PostgreSQL")]
    NoDatabase,
}

/// The runtime that runs the session loops, apart from the one that serves
/// the API: sessions that keep every core busy then only share the CPU with
/// the API's threads, instead of queueing its requests behind their work.
struct LoopRuntime(Option<tokio::runtime::Runtime>);

impl LoopRuntime {
    fn start(threads: usize, nice: i32) -> Result<LoopRuntime, AppError> {
        if threads == 0 {
            return Ok(LoopRuntime(None));
        }
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("warden-loop")
            .on_thread_start(move || thread_priority::lower_priority(nice))
            .enable_all()
            .build()
            .map(|rt| LoopRuntime(Some(rt)))
            .map_err(AppError::Runtime)
    }

    fn handle(&self) -> tokio::runtime::Handle {
        match &self.0 {
            Some(rt) => rt.handle().clone(),
            None => tokio::runtime::Handle::current(),
        }
    }
}

impl Drop for LoopRuntime {
    fn drop(&mut self) {
        // Dropping a runtime may block, which is not allowed inside another
        // one; by now every runner has ended or been aborted.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Brings the schema to this binary's or refuses to start: `auto`
/// applies what it lacks, `off` applies nothing and requires it current;
/// either way a schema newer than the binary is refused in plain words.
async fn prepare_schema(store: &Store, mode: config::MigrateMode) -> Result<(), StoreError> {
    match mode {
        config::MigrateMode::Auto => store.migrate().await,
        config::MigrateMode::Off => store.require_current_schema().await,
    }
}

/// A built Warden: bound listener, supervisor, background tasks.
pub struct Application {
    addr: SocketAddr,
    supervisor: Supervisor,
    server: JoinHandle<Result<(), std::io::Error>>,
    background: Vec<JoinHandle<()>>,
    stop_serving: CancellationToken,
    /// The loops' own pool, when they run on a runtime of their own.
    loop_pool: Option<sqlx::PgPool>,
    /// The embedded PostgreSQL this instance started, and its one pool
    /// (closed before the server stops).
    #[cfg(feature = "embedded")]
    embedded: Option<(sqlx::PgPool, store::embedded::Embedded)>,
    // Last: dropped after everything that runs on it.
    _loops: LoopRuntime,
}

impl Application {
    /// Connects to Postgres (applying migrations), then builds. Without
    /// `DATABASE_URL`, starts the embedded PostgreSQL in the data directory.
    pub async fn build(config: Config) -> Result<Application, AppError> {
        let Some(url) = &config.database_url else {
            return Application::build_embedded(config).await;
        };
        // The API's own pool; the loops get `db_max_connections` of their own,
        // unless they share the API's runtime and so this pool.
        let api_connections = if config.loop_threads == 0 {
            config.db_max_connections
        } else {
            (config.db_max_connections / 4).max(2)
        };
        let store =
            Store::connect_api(url.expose(), api_connections, config.db_acquire_timeout).await?;
        prepare_schema(&store, config.migrate).await?;
        Application::build_with_store(config, store).await
    }

    /// Starts the embedded PostgreSQL on `config.data_dir` and builds on it:
    /// one connection shared by the API and the loops (which then run on
    /// the API's runtime), control notes in this process.
    #[cfg(feature = "embedded")]
    async fn build_embedded(mut config: Config) -> Result<Application, AppError> {
        let dir = config.data_dir.clone();
        let embedded = tokio::task::spawn_blocking(move || store::embedded::Embedded::open(&dir))
            .await
            .map_err(|e| AppError::Runtime(std::io::Error::other(e)))??;
        tracing::info!(
            data_dir = %embedded.data_dir().unwrap_or(&config.data_dir).display(),
            "DATABASE_URL is unset: embedded PostgreSQL, one process, data in WARDEN_DATA_DIR \
        (set DATABASE_URL to share a Postgres server between replicas)"
        );
        let pool = Store::pool_options(store::embedded::EMBEDDED_CONNECTIONS)
            .acquire_timeout(config.db_acquire_timeout.max(Duration::from_secs(10)))
            .connect_with(embedded.connect_options())
            .await
            .map_err(StoreError::from)?;
        let store = Store::embedded(
            pool.clone(),
            embedded.data_dir().unwrap_or(&config.data_dir),
        )?;
        prepare_schema(&store, config.migrate).await?;
        // The data directory's lock proves no other process runs a session:
        // a lease left by a killed predecessor is released now, not waited out.
        let released = store.release_previous_process().await?;
        if released > 0 {
            tracing::info!(
                released,
                "released the leases of the previous process on this data directory"
            );
        }
        config.db_max_connections = store::embedded::EMBEDDED_CONNECTIONS;
        let mut app = Application::build_with_store(config, store).await?;
        app.embedded = Some((pool, embedded));
        Ok(app)
    }

    #[cfg(not(feature = "embedded"))]
    async fn build_embedded(_config: Config) -> Result<Application, AppError> {
        // Config refuses a missing DATABASE_URL in this build.
        Err(AppError::NoDatabase)
    }

    /// Builds on an existing store: binds the listener, rescues orphaned
    /// sessions, and starts serving.
    pub async fn build_with_store(
        mut config: Config,
        store: Store,
    ) -> Result<Application, AppError> {
        let rotating = load_secret_key(&mut config, &store).await?;
        if store.is_single_process() {
            // One backend: the loops share the API's pool, so its runtime.
            config.loop_threads = 0;
        }
        let config = Arc::new(config);
        let auth = authenticate(&config, &store).await?;
        let listener = TcpListener::bind(config.listen_addr)
            .await
            .map_err(|source| AppError::Bind {
                addr: config.listen_addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(AppError::Serve)?;
        let replica_id = Uuid::new_v4();
        let metrics = Arc::new(metrics::Metrics::default());
        let loops = LoopRuntime::start(config.loop_threads, config.loop_nice)?;
        let loop_store = loop_store(&loops, &store, &config).await?;
        // In the fleet with what it runs before it takes any lease.
        store
            .announce_replica(
                replica_id,
                &config.capabilities.names(),
                env!("CARGO_PKG_VERSION"),
                store::schema::binary_version(),
            )
            .await?;
        let supervisor = Supervisor::new(
            loop_store.clone(),
            config.clone(),
            replica_id,
            metrics.clone(),
            loops.handle(),
        );
        let service_store = store.clone();
        let (service, stop_landings) =
            SessionService::new(store, config.clone(), supervisor.clone());

        let rescued = supervisor.rescue().await;
        let claimed = supervisor
            .claim_queued(config.claims_per_tick.saturating_sub(rescued))
            .await;
        tracing::info!(%addr, %replica_id, rescued, claimed, max_running = config.max_running, "warden listening");

        let pruner = session::pruner::Pruner::new(
            service_store.clone(),
            config.retention.clone(),
            config.workspace_root.clone(),
            (replica_id, config.lease.ttl),
            metrics.clone(),
        );
        let mut background = start_background(
            &config,
            &service,
            &supervisor,
            service_store,
            pruner,
            &loops,
            rotating,
        );
        // Stops answered before they landed, landed once their owner is gone.
        background.push(tokio::spawn(stop_landings.run()));
        let (server, stop_serving) = serve(listener, service, metrics, auth, &config);
        Ok(Application {
            addr,
            supervisor,
            server,
            background,
            stop_serving,
            loop_pool: loops.0.is_some().then(|| loop_store.pool().clone()),
            #[cfg(feature = "embedded")]
            embedded: None,
            _loops: loops,
        })
    }

    /// The bound address (port 0 in the config picks a free port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The supervisor of this instance.
    pub fn supervisor(&self) -> &Supervisor {
        &self.supervisor
    }

    /// Serves until `shutdown` resolves, then checkpoints every running
    /// session, releases its lease and stops.
    pub async fn run_until(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), AppError> {
        shutdown.await;
        self.shutdown().await
    }

    /// Graceful shutdown: sessions are checkpointed and released so another
    /// process resumes them at once.
    pub async fn shutdown(self) -> Result<(), AppError> {
        let started = Instant::now();
        self.supervisor.shutdown(Duration::from_secs(10)).await;
        self.stop_serving.cancel();
        for task in &self.background {
            task.abort();
        }
        let served = tokio::time::timeout(http::SHUTDOWN_GRACE, self.server).await;
        // The API's pool belongs to whoever built the store.
        if let Some(pool) = &self.loop_pool {
            pool.close().await;
        }
        // The embedded server waits for its one client to leave before it stops.
        #[cfg(feature = "embedded")]
        if let Some((pool, embedded)) = self.embedded {
            pool.close().await;
            if let Err(e) = tokio::task::spawn_blocking(move || embedded.stop()).await {
                tracing::warn!(error = %e, "embedded PostgreSQL did not stop cleanly");
            }
        }
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "warden stopped"
        );
        match served {
            Ok(Ok(Ok(()))) | Err(_) => Ok(()),
            Ok(Ok(Err(e))) => Err(AppError::Serve(e)),
            Ok(Err(join)) => Err(AppError::Serve(std::io::Error::other(join))),
        }
    }

    /// Ends everything at once without checkpoints or lease release, as a
    /// `kill -9` would. For crash-recovery tests.
    pub fn crash(self) {
        self.supervisor.abort_all();
        self.server.abort();
        for task in &self.background {
            task.abort();
        }
    }
}

/// Loads the keys sealing sessions' secrets (generating the key file on
/// first start), checks them against the database's (refusing to start
/// without a key it needs), then seals any plaintext key an earlier
/// version stored. The log says where the keys are and their public ids,
/// never a key. Returns the ring when it holds previous keys, for the
/// background re-seal.
async fn load_secret_key(
    config: &mut Config,
    store: &Store,
) -> Result<Option<secrets::Keyring>, AppError> {
    let key = match &config.secret_key {
        config::SecretKeySource::Key(key) => {
            tracing::info!(
                key_id = key.id(),
                "secret key from WARDEN_SECRET_KEYS or WARDEN_SECRET_KEY"
            );
            key.clone()
        }
        config::SecretKeySource::File(path) => {
            let (keys, created) = secrets::SecretKey::load_or_create(path)
                .map_err(|e| AppError::Secrets(e.to_string()))?;
            let mut keys = keys.into_iter();
            let key = keys
                .next()
                .ok_or_else(|| AppError::Secrets(format!("{}: no key", path.display())))?;
            if created {
                tracing::warn!(
                    path = %path.display(),
                    key_id = key.id(),
                    "generated a secret key for sessions' API keys and saved it (mode 0600); \
                keep it and back it up, or set WARDEN_SECRET_KEY: without it, sessions' own API keys cannot be read"
                );
            } else {
                tracing::info!(path = %path.display(), key_id = key.id(), previous = keys.len(), "secret keys read from their file");
            }
            config.secret_key_previous.splice(0..0, keys);
            key
        }
    };
    let ring = secrets::Keyring::new(key.clone(), config.secret_key_previous.clone());
    let ours = ring.ids().join(", ");
    match store.register_secret_key(&ring).await? {
        secrets::KeyRegistration::Current => {}
        secrets::KeyRegistration::Register => {
            tracing::info!(key_id = %key.id(), "registered this replica's secret key as the database's");
        }
        secrets::KeyRegistration::Rotate { from } => {
            tracing::warn!(from = %from, to = %key.id(), "secret key rotated: what the previous key sealed is sealed again under the new one, in the background");
        }
        secrets::KeyRegistration::Refuse { found, why } => {
            let missing = format!(
                "which this replica's keys ({ours}: WARDEN_SECRET_KEYS, WARDEN_SECRET_KEY, the key file, \
WARDEN_SECRET_KEY_PREVIOUS) do not hold: start it with key {found} in its ring"
            );
            let why = match why {
                secrets::Needed::Registered => {
                    format!("the fleet's current secret key is {found}, {missing}")
                }
                secrets::Needed::StillSeals => format!(
                    "secrets in this database are still sealed under {found}, {missing} \
(after `warden secrets rotate`, keep the old key until `warden secrets status` shows it seals nothing)"
                ),
                secrets::Needed::CheckFails => format!(
                    "this replica's key of id {found} does not open the key check value the database \
recorded for that id: it is another key under the same id (or the check value was damaged); give it the fleet's key {found}"
                ),
            };
            return Err(AppError::Secrets(format!(
                "this replica needs secret key {found}: {why}"
            )));
        }
    }
    let moved = session::seal_plaintext_keys(store, &key)
        .await
        .map_err(|e| AppError::Secrets(format!("cannot seal stored plaintext keys: {e}")))?;
    if moved > 0 {
        tracing::info!(
            sessions = moved,
            "sealed API keys stored in plaintext by an earlier version"
        );
    }
    config.secret_key = config::SecretKeySource::Key(key);
    Ok((!config.secret_key_previous.is_empty()).then_some(ring))
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut sig) => {
                sig.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT received"),
        _ = terminate => tracing::info!("SIGTERM received"),
    }
}

/// The API's authenticator; refuses to serve beyond loopback when nothing
/// protects the API.
async fn authenticate(config: &Config, store: &Store) -> Result<auth::Authenticator, AppError> {
    let auth = auth::Authenticator::new(
        store.clone(),
        config.auth.admin_token.as_ref(),
        config.auth.metrics_token.as_ref(),
        config.auth.off,
    )
    .await?;
    match auth.mode() {
        auth::AuthMode::On => tracing::info!("API keys required"),
        auth::AuthMode::Off => tracing::warn!(
            "WARDEN_AUTH=off: AUTHENTICATION IS DISABLED; anyone who can reach {} can read and control every session",
            config.listen_addr
        ),
        auth::AuthMode::Protected if config.listen_addr.ip().is_loopback() => tracing::warn!(
            "authentication is off (no WARDEN_ADMIN_TOKEN and no API keys): serving loopback only"
        ),
        auth::AuthMode::Protected => return Err(AppError::Unprotected(config.listen_addr)),
    }
    Ok(auth)
}

/// The store the session loops use: a pool of their own on the loops'
/// runtime when they have one, else the API's.
async fn loop_store(
    loops: &LoopRuntime,
    store: &Store,
    config: &Config,
) -> Result<Store, AppError> {
    let loop_store = match &loops.0 {
        // The loops' connections are made on the loops' runtime, so their
        // I/O is driven there too.
        Some(rt) => {
            // Every statement of the loops reaches a session by its key.
            // Without seq scans the planner takes the key on a database
            // whose statistics are stale (any fresh one): it otherwise
            // believed `sessions` a few pages long and scanned all of it
            // for each group commit, halving the rate at 1,000 sessions.
            let options = store
                .pool()
                .connect_options()
                .as_ref()
                .clone()
                .options([("enable_seqscan", "off")]);
            let max = config.db_max_connections;
            let pool = rt
                .spawn(async move { Store::pool_options(max).connect_with(options).await })
                .await
                .map_err(|e| AppError::Runtime(std::io::Error::other(e)))?
                .map_err(StoreError::from)?;
            store.sibling(pool)
        }
        None => store.clone(),
    };
    Ok(loop_store)
}

/// Starts the background work: approval expiry, the tree sweep, lease
/// upkeep on the loops' runtime, control notes, pruning, resealing
/// under a rotated key, and the workspace retention sweep.
fn start_background(
    config: &Config,
    service: &SessionService,
    supervisor: &Supervisor,
    service_store: Store,
    pruner: session::pruner::Pruner,
    loops: &LoopRuntime,
    rotating: Option<secrets::Keyring>,
) -> Vec<JoinHandle<()>> {
    let expiry = tokio::spawn(session::approvals::expire_forever(
        service.clone(),
        session::approvals::sweep_every(config.approval_timeout),
    ));
    let confirmations = tokio::spawn(session::confirm::expire_forever(
        service.clone(),
        session::approvals::sweep_every(config.approval_timeout),
    ));
    let tree_sweep = tokio::spawn(session::tree::sweep_forever(
        service.clone(),
        session::tree::SWEEP_EVERY,
    ));
    let notifier = tokio::spawn(session::notify::deliver_forever(service.notifier()));
    let mut background = vec![
        expiry,
        confirmations,
        tree_sweep,
        notifier,
        // Lease renewals and claims are loop work, on the loops' pool:
        // they run on the loops' runtime, so a heartbeat that renews
        // thousands of leases never holds an API thread.
        loops.handle().spawn(supervisor.clone().maintain()),
        // Control notes are relayed from the API's runtime (their listener
        // still holds a connection of the loops' pool): relaying is a few
        // flags and wake-ups, and a stop heard behind hundreds of runnable
        // loops on the niced runtime came late to the runner it stops.
        tokio::spawn(supervisor.clone().listen()),
        // On the API's runtime and pool, as the sweep: never the loops'.
        tokio::spawn(pruner.prune_forever()),
    ];
    if let Some(ring) = rotating {
        background.push(tokio::spawn(session::reseal_in_background(
            service_store.clone(),
            ring,
        )));
    }
    background.push(tokio::spawn(session::retention::sweep_forever(
        service_store,
        config.workspace_root.clone(),
        config.workspace_retention,
        policy::retention::sweep_every(config.workspace_retention),
    )));
    background
}

/// Serves the API on `listener` until the returned token is cancelled.
fn serve(
    listener: TcpListener,
    service: SessionService,
    metrics: Arc<metrics::Metrics>,
    auth: auth::Authenticator,
    config: &Config,
) -> (JoinHandle<Result<(), std::io::Error>>, CancellationToken) {
    let app = http::router(
        http::AppState {
            service,
            metrics,
            auth,
            streams: http::event_stream::StreamSlots::new(config.quotas.tenant_max_streams),
        },
        config.max_body_bytes,
        http::RequestLimits::new(
            config.quotas.request_timeout,
            config.quotas.max_concurrent_requests,
            &config.admission,
        ),
    );
    let stop_serving = CancellationToken::new();
    let graceful = stop_serving.clone();
    let server = tokio::spawn(http::serve::serve(
        listener,
        app,
        config.connections,
        graceful,
    ));
    (server, stop_serving)
}
