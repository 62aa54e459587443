//! Warden: runs and supervises long-running autonomous agent sessions.
//!
//! Layers, with dependencies pointing one way:
//! `http` → `session` → (`executor`, `store`) → `policy`.

pub mod config;
pub mod executor;
pub mod http;
pub mod llm;
pub mod metrics;
pub mod policy;
pub mod session;
pub mod store;

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
        /// Address.
        addr: SocketAddr,
        /// Cause.
        source: std::io::Error,
    },
    /// The server failed.
    #[error("server error: {0}")]
    Serve(std::io::Error),
}

/// A built Warden: bound listener, supervisor, background tasks.
pub struct Application {
    addr: SocketAddr,
    supervisor: Supervisor,
    server: JoinHandle<Result<(), std::io::Error>>,
    background: Vec<JoinHandle<()>>,
    stop_serving: CancellationToken,
}

impl Application {
    /// Connects to Postgres (applying migrations), then builds.
    pub async fn build(config: Config) -> Result<Application, AppError> {
        let store = Store::connect(&config.database_url, config.db_max_connections).await?;
        store.migrate().await?;
        Application::build_with_store(config, store).await
    }

    /// Builds on an existing store: binds the listener, rescues orphaned
    /// sessions, and starts serving.
    pub async fn build_with_store(config: Config, store: Store) -> Result<Application, AppError> {
        let config = Arc::new(config);
        let listener = TcpListener::bind(config.listen_addr)
            .await
            .map_err(|source| AppError::Bind {
                addr: config.listen_addr,
                source,
            })?;
        let addr = listener.local_addr().map_err(AppError::Serve)?;
        let replica_id = Uuid::new_v4();
        let metrics = Arc::new(metrics::Metrics::default());
        let supervisor =
            Supervisor::new(store.clone(), config.clone(), replica_id, metrics.clone());
        let service = SessionService::new(store, config.clone(), supervisor.clone());

        let rescued = supervisor.rescue().await;
        tracing::info!(%addr, %replica_id, rescued, "warden listening");

        let background = vec![
            tokio::spawn(supervisor.clone().maintain()),
            tokio::spawn(supervisor.clone().listen()),
        ];
        let app = http::router(http::AppState { service, metrics }, config.max_body_bytes);
        let stop_serving = CancellationToken::new();
        let graceful = stop_serving.clone();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { graceful.cancelled().await })
                .await
        });
        Ok(Application {
            addr,
            supervisor,
            server,
            background,
            stop_serving,
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
