//! Shared harness: a real Warden on a random port over a fresh Postgres
//! database (one per test, see [`TestDb`]), driven through HTTP.
//!
//! With `DATABASE_URL` set, each test gets a private database on that
//! server. Unset, each test gets its own temporary embedded PostgreSQL, and
//! nothing here reads `PGHOST`, `PGPORT` or any default server address.

pub mod fake_llm;
pub mod views;

pub use views::{
    BudgetWarningView, EventView, IterationView, ListView, SessionView, problem, view,
};

use std::collections::HashMap;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;
use warden::Application;
use warden::config::Config;
use warden::store::Store;

/// Whether the tests run on embedded PostgreSQL (`DATABASE_URL` unset).
pub fn embedded() -> bool {
    server_url().is_none()
}

/// The Postgres server of the tests, when `DATABASE_URL` names one.
pub fn server_url() -> Option<String> {
    std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
}

/// For a test that needs what one embedded backend cannot give (two
/// processes on one database, LISTEN/NOTIFY across processes, a private
/// server to break). Such a test is `#[ignore = "needs a Postgres server: …"]`
/// and runs where one is (`.ci/run` passes `--include-ignored` on its
/// server leg); asked to run without one, it fails saying why, never passes.
pub fn require_server_postgres(why: &str) {
    assert!(
        !embedded(),
        "this test needs a Postgres server ({why}): set DATABASE_URL to run it"
    );
}

/// A migrated database of one test, dropped with it: a private database on
/// the `DATABASE_URL` server, or a temporary embedded PostgreSQL.
pub struct TestDb {
    pub pool: PgPool,
    guard: DbGuard,
}

enum DbGuard {
    Server {
        admin_url: String,
        name: String,
    },
    #[cfg(feature = "embedded")]
    Embedded(Option<Box<warden::store::embedded::Embedded>>),
}

impl TestDb {
    pub async fn new() -> TestDb {
        let (pool, guard) = match server_url() {
            Some(url) => {
                let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
                    .await
                    .expect("DATABASE_URL answers");
                let name = format!("warden_test_{}", uuid::Uuid::new_v4().simple());
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut admin)
                    .await
                    .expect("test database created");
                let _ = sqlx::Connection::close(admin).await;
                let options: sqlx::postgres::PgConnectOptions =
                    url.parse().expect("DATABASE_URL parses");
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(20)
                    .connect_with(options.database(&name))
                    .await
                    .expect("test database answers");
                (
                    pool,
                    DbGuard::Server {
                        admin_url: url,
                        name,
                    },
                )
            }
            #[cfg(not(feature = "embedded"))]
            None => panic!(
                "DATABASE_URL is unset and this build has no embedded PostgreSQL (feature `embedded`)"
            ),
            #[cfg(feature = "embedded")]
            None => {
                let embedded =
                    tokio::task::spawn_blocking(warden::store::embedded::Embedded::temporary)
                        .await
                        .expect("embedded start joined")
                        .expect("embedded PostgreSQL starts");
                let pool = Store::pool_options(warden::store::embedded::EMBEDDED_CONNECTIONS)
                    .connect_with(embedded.connect_options())
                    .await
                    .expect("embedded PostgreSQL answers");
                (pool, DbGuard::Embedded(Some(Box::new(embedded))))
            }
        };
        Store::from_pool(pool.clone())
            .migrate()
            .await
            .expect("migrations apply");
        TestDb { pool, guard }
    }
}

/// The store over `pool` as the test's database needs it: one process and
/// in-process control notes on embedded PostgreSQL.
pub fn store_on(pool: PgPool) -> Store {
    if embedded() {
        // As the server flushes its temporary data directory to the disk.
        Store::embedded(pool, &std::env::temp_dir()).expect("the temporary directory opens")
    } else {
        Store::from_pool(pool)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match &mut self.guard {
            // Stops on a thread of its own once the pool's connection closes.
            #[cfg(feature = "embedded")]
            DbGuard::Embedded(embedded) => drop(embedded.take()),
            DbGuard::Server { admin_url, name } => {
                let (url, name) = (admin_url.clone(), name.clone());
                // Dropped inside the test's runtime: drop the database from
                // a thread with a runtime of its own, and wait for it.
                let dropped = std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime");
                    rt.block_on(async move {
                        if let Ok(mut admin) =
                            <sqlx::PgConnection as sqlx::Connection>::connect(&url).await
                        {
                            // The name is ours: warden_test_ and a UUID's hex.
                            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                            )))
                            .execute(&mut admin)
                            .await;
                        }
                    });
                });
                let _ = dropped.join();
            }
        }
    }
}

/// The admin token every test server gets (`WARDEN_ADMIN_TOKEN`).
pub const ADMIN_TOKEN: &str = "test-admin-token-0f1e2d3c4b5a69788796a5b4c3d2e1f0";
/// The key sealing sessions' secrets in every test server (`WARDEN_SECRET_KEY`).
pub const TEST_SECRET_KEY: &str =
    "77617264656e207465737420736563726574206b657920333220627974657321";
/// The tenant of the key the harness sends by default.
pub const TEST_TENANT: &str = "test";

/// A running Warden instance and an HTTP client for it. The client sends an
/// operator key of tenant `test` (created through `/api/keys`) by default.
pub struct TestApp {
    pub app: Option<Application>,
    pub base: String,
    pub client: reqwest::Client,
    /// The key `client` sends (empty when the server runs without auth).
    pub key: String,
    /// The database it runs on, when the test knows it ([`TestApp::pool`]).
    pub pool: Option<PgPool>,
    /// The database [`TestApp::start`] made for it; declared last so it is
    /// dropped after the server that uses it.
    pub db: Option<TestDb>,
}

/// A client that sends `key` as a bearer token on every request.
pub fn client_with_key(key: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}")).expect("header");
    headers.insert(reqwest::header::AUTHORIZATION, value);
    reqwest::Client::builder()
        .default_headers(headers)
        .build()
        .expect("client")
}

/// Creates a key through `POST /api/keys` with the admin token; returns
/// the answer (its `secret` is the key).
pub async fn create_key(base: &str, tenant: &str, role: &str) -> Value {
    let res = reqwest::Client::new()
        .post(format!("{base}/api/keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "tenant": tenant, "role": role }))
        .send()
        .await
        .expect("sent");
    let status = res.status();
    let doc: Value = res.json().await.expect("json");
    assert_eq!(status, StatusCode::CREATED, "key not created: {doc}");
    doc
}

/// With `TEST_LOG` set, the servers' logs go to the test output (captured
/// per test by the harness, shown for failures or with `--nocapture`).
pub fn init_logs() {
    static INIT: std::sync::Once = std::sync::Once::new();
    if std::env::var_os("TEST_LOG").is_none() {
        return;
    }
    INIT.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

/// Configuration for tests: short leases so crash recovery is quick, a
/// short throttle cooldown, random port.
pub fn test_config() -> Config {
    config_with(&[])
}

/// The test configuration with extra variables (e.g. a model endpoint).
pub fn config_with(extra: &[(&str, &str)]) -> Config {
    let workspaces = std::env::temp_dir().join(format!("warden-test-{}", uuid::Uuid::new_v4()));
    let workspaces = workspaces.to_string_lossy().to_string();
    let mut vars: HashMap<String, String> = [
        ("DATABASE_URL", "postgres://unused-in-tests/warden"),
        ("WARDEN_LISTEN_ADDR", "127.0.0.1:0"),
        ("WARDEN_LEASE_TTL_MS", "1000"),
        ("WARDEN_HEARTBEAT_INTERVAL_MS", "200"),
        ("WARDEN_THROTTLE_COOLDOWN_MS", "50"),
        ("WARDEN_LLM_RETRY_BASE_MS", "10"),
        ("WARDEN_LLM_MAX_RETRIES", "2"),
        ("WARDEN_WORKSPACE_ROOT", workspaces.as_str()),
        // The fake agents and model servers listen on loopback; the
        // egress tests override this to prove the default refuses them.
        ("WARDEN_EGRESS_ALLOW", "127.0.0.1"),
        ("WARDEN_ADMIN_TOKEN", ADMIN_TOKEN),
        // One key for every test server, so a restarted one opens what an
        // earlier one sealed (and none writes a key file into the checkout).
        ("WARDEN_SECRET_KEY", TEST_SECRET_KEY),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    for (k, v) in extra {
        vars.insert(k.to_string(), v.to_string());
    }
    Config::from_vars(&vars).expect("test configuration is valid")
}

impl TestApp {
    /// Starts Warden with the test configuration on a database of its own,
    /// which lives as long as the app (zero2prod's `spawn_app`).
    pub async fn start() -> TestApp {
        TestApp::start_with(test_config()).await
    }

    /// Starts Warden with `config` on a database of its own.
    pub async fn start_with(config: Config) -> TestApp {
        let db = TestDb::new().await;
        let mut app = TestApp::spawn_with(db.pool.clone(), config).await;
        app.db = Some(db);
        app
    }

    /// Starts Warden on `pool` with the test configuration: for a test that
    /// needs the database before the app, or two apps on one database.
    pub async fn spawn(pool: PgPool) -> TestApp {
        TestApp::spawn_with(pool, test_config()).await
    }

    /// Starts Warden on `pool` with `config`.
    pub async fn spawn_with(pool: PgPool, config: Config) -> TestApp {
        init_logs();
        let app = Application::build_with_store(config, store_on(pool.clone()))
            .await
            .expect("warden starts");
        let base = format!("http://{}", app.addr());
        let mut test_app = TestApp::connect(Some(app), base).await;
        test_app.pool = Some(pool);
        test_app
    }

    /// The database the app runs on, for a test that reads or writes the
    /// store beside the API.
    pub fn pool(&self) -> &PgPool {
        self.pool
            .as_ref()
            .expect("an app started on a database (start or spawn), not connected to one")
    }

    /// A client of the Warden at `base`: with an operator key of tenant
    /// `test` when the server requires keys, without one when auth is off.
    pub async fn connect(app: Option<Application>, base: String) -> TestApp {
        let probe = reqwest::Client::new()
            .get(format!("{base}/api/keys"))
            .send()
            .await
            .expect("sent");
        if probe.status() == StatusCode::UNAUTHORIZED {
            let key = create_key(&base, TEST_TENANT, "operator").await["secret"]
                .as_str()
                .expect("secret")
                .to_string();
            TestApp {
                app,
                base,
                client: client_with_key(&key),
                key,
                pool: None,
                db: None,
            }
        } else {
            TestApp {
                app,
                base,
                client: reqwest::Client::new(),
                key: String::new(),
                pool: None,
                db: None,
            }
        }
    }

    /// GET with the admin token instead of the default key.
    pub async fn admin_get(&self, path: &str) -> reqwest::Response {
        reqwest::Client::new()
            .get(self.url(path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("sent")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// POST /api/autonomous with `body`; asserts 201 and returns the document.
    pub async fn create(&self, body: Value) -> Value {
        let res = self
            .client
            .post(self.url("/api/autonomous"))
            .json(&body)
            .send()
            .await
            .expect("request sent");
        let status = res.status();
        let doc: Value = res.json().await.expect("json body");
        assert_eq!(status, StatusCode::CREATED, "create failed: {doc}");
        doc
    }

    /// A scripted session with `steps` and optional `limits`; returns its id.
    pub async fn create_scripted(&self, steps: Value, limits: Value) -> String {
        let doc = self
            .create(json!({
                "goal": "Create README.md with a project description",
                "limits": limits,
                "executor": { "kind": "scripted", "steps": steps }
            }))
            .await;
        doc["id"].as_str().expect("id").to_string()
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        let res = self.client.get(self.url(path)).send().await.expect("sent");
        let status = res.status();
        let body = res.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    pub async fn post(&self, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self.client.post(self.url(path));
        if let Some(body) = body {
            req = req.json(&body);
        }
        let res = req.send().await.expect("sent");
        let status = res.status();
        let body = res.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    pub async fn patch(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let res = self
            .client
            .patch(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("sent");
        let status = res.status();
        let body = res.json().await.unwrap_or(Value::Null);
        (status, body)
    }

    pub async fn session(&self, id: &str) -> Value {
        let (status, body) = self.get(&format!("/api/autonomous/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body
    }

    /// The session's status document, typed: a missing counter fails here.
    pub async fn session_view(&self, id: &str) -> SessionView {
        view(&self.session(id).await)
    }

    /// Polls the session until `done` holds, or panics after `timeout`.
    pub async fn wait_until(
        &self,
        id: &str,
        timeout: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.session(id).await;
            if done(&s) {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "condition not reached within {timeout:?}; last status: {s}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the session is no longer running.
    pub async fn wait_settled(&self, id: &str) -> Value {
        // A session whose owner died shows `queued` until a replica takes it.
        self.wait_until(id, Duration::from_secs(20), |s| {
            s["status"] != "running" && s["status"] != "queued"
        })
        .await
    }

    /// Every iteration of a session.
    pub async fn iterations(&self, id: &str) -> Vec<Value> {
        let (status, body) = self
            .get(&format!("/api/autonomous/{id}/iterations?limit=500"))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        view::<ListView<Value>>(&body).items
    }

    /// Every event of a session.
    pub async fn events(&self, id: &str) -> Vec<Value> {
        let (status, body) = self
            .get(&format!("/api/autonomous/{id}/events?limit=500"))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        view::<ListView<Value>>(&body).items
    }

    /// Every iteration of a session, typed: each must have its fields.
    pub async fn iteration_views(&self, id: &str) -> Vec<IterationView> {
        self.iterations(id).await.iter().map(view).collect()
    }

    /// Every event of a session, typed: a filter on `kind` cannot pass
    /// because the field is missing.
    pub async fn event_views(&self, id: &str) -> Vec<EventView> {
        self.events(id).await.iter().map(view).collect()
    }

    /// Decision events (without `continue` gate evaluations).
    pub async fn decisions(&self, id: &str) -> Vec<Value> {
        let (status, body) = self
            .get(&format!("/api/autonomous/{id}/decisions?limit=500"))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        view::<ListView<Value>>(&body).items
    }

    /// Graceful shutdown (checkpoint and release every session).
    pub async fn shutdown(&mut self) {
        if let Some(app) = self.app.take() {
            app.shutdown().await.expect("clean shutdown");
        }
    }

    /// Abrupt end, as `kill -9`.
    pub fn crash(&mut self) {
        if let Some(app) = self.app.take() {
            app.crash();
        }
    }
}

/// `n` distinct successful steps, each using `tokens` tokens and taking `delay_ms`.
pub fn distinct_steps(n: usize, tokens: u64, delay_ms: u64) -> Value {
    Value::Array(
        (1..=n)
            .map(|i| {
                json!({
                    "action": format!("step_{i}"),
                    "arguments": { "i": i },
                    "tokens": tokens,
                    "output": format!("did step {i}"),
                    "delay_ms": delay_ms,
                })
            })
            .collect(),
    )
}

/// Asserts iteration numbers are exactly 1..=n.
pub fn assert_gap_free(iterations: &[Value]) {
    let numbers: Vec<i64> = iterations
        .iter()
        .map(|i| i["number"].as_i64().expect("number"))
        .collect();
    let expected: Vec<i64> = (1..=numbers.len() as i64).collect();
    assert_eq!(
        numbers, expected,
        "iteration numbers must be gap-free and unique"
    );
}

/// The one way a test starts a `warden` process: on which database, with
/// which environment, then [`Warden::serve`] (the service on a loopback
/// port, waited for until ready) or [`Warden::run`] (a command such as
/// `keys create`, to its end).
pub struct Warden {
    command: std::process::Command,
    /// The embedded PostgreSQL's data directory, when on one.
    data_dir: Option<std::path::PathBuf>,
    /// Whether the service gets the tests' admin token.
    admin_token: bool,
    /// A data directory made for this process alone, removed with it.
    own_data_dir: Option<std::path::PathBuf>,
    port: Option<u16>,
}

impl Warden {
    /// On `pool`'s database: the same database on the `DATABASE_URL`
    /// server, or on embedded PostgreSQL a data directory of its own (the
    /// test's embedded server has one backend, held by `pool`).
    pub fn on(pool: &PgPool) -> Warden {
        if embedded() {
            let dir =
                std::env::temp_dir().join(format!("warden-svc-{}", uuid::Uuid::new_v4().simple()));
            let mut warden = Warden::on_data_dir(&dir);
            warden.own_data_dir = Some(dir);
            warden
        } else {
            Warden::at_url(&database_url(pool))
        }
    }

    /// On the Postgres server database at `url`.
    pub fn at_url(url: &str) -> Warden {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_warden"));
        command.env("DATABASE_URL", url);
        Warden::with(command)
    }

    /// On the embedded PostgreSQL in `data_dir`, which the test owns (it
    /// outlives the process, e.g. to restart on it); libpq's variables
    /// point nowhere, so nothing reaches a server by default.
    pub fn on_data_dir(data_dir: &std::path::Path) -> Warden {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_warden"));
        command
            .env_remove("DATABASE_URL")
            .env("PGHOST", "127.0.0.1")
            .env("PGPORT", "1")
            .env("WARDEN_DATA_DIR", data_dir);
        let mut warden = Warden::with(command);
        warden.data_dir = Some(data_dir.to_path_buf());
        warden
    }

    fn with(command: std::process::Command) -> Warden {
        Warden {
            command,
            data_dir: None,
            admin_token: true,
            own_data_dir: None,
            port: None,
        }
    }

    /// One more environment variable (later ones win).
    pub fn env(mut self, key: &str, value: impl AsRef<std::ffi::OsStr>) -> Warden {
        self.command.env(key, value);
        self
    }

    /// More environment variables (later ones win).
    pub fn envs(mut self, vars: &[(&str, &str)]) -> Warden {
        self.command.envs(vars.iter().copied());
        self
    }

    /// Without an admin token: with no key either, a loopback client needs none.
    pub fn without_admin_token(mut self) -> Warden {
        self.admin_token = false;
        self
    }

    /// Runs as user `uid` and group `gid` (a test running as root starts
    /// it as another user).
    #[cfg(unix)]
    pub fn run_as(mut self, uid: u32, gid: u32) -> Warden {
        use std::os::unix::process::CommandExt;
        self.command.uid(uid).gid(gid);
        self
    }

    /// Listens on `port` (a restart answering where its predecessor did).
    pub fn port(mut self, port: u16) -> Warden {
        self.port = Some(port);
        self
    }

    /// Runs `warden ARGS` to its end.
    pub fn run(mut self, args: &[&str]) -> std::process::Output {
        let output = self.command.args(args).output().expect("warden runs");
        if let Some(dir) = &self.own_data_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        output
    }

    /// Starts the service without waiting for it (see [`Warden::serve`]).
    pub fn spawn(mut self) -> ServiceProcess {
        // The service's defaults, under what the test set: fast leases, so a
        // process that dies is noticed within a test; the tests' keys.
        let mut defaults: Vec<(&str, std::ffi::OsString)> = vec![
            ("WARDEN_LEASE_TTL_MS", "2000".into()),
            ("WARDEN_HEARTBEAT_INTERVAL_MS", "500".into()),
            ("WARDEN_SECRET_KEY", TEST_SECRET_KEY.into()),
            ("RUST_LOG", "warn".into()),
        ];
        if self.admin_token {
            defaults.push(("WARDEN_ADMIN_TOKEN", ADMIN_TOKEN.into()));
        }
        if let Some(dir) = &self.data_dir {
            defaults.push((
                "WARDEN_WORKSPACE_ROOT",
                dir.join("workspaces").into_os_string(),
            ));
        }
        let set: Vec<std::ffi::OsString> = self
            .command
            .get_envs()
            .map(|(k, _)| k.to_os_string())
            .collect();
        for (key, value) in defaults {
            if !set.iter().any(|k| k == key) {
                self.command.env(key, value);
            }
        }
        let port = self.port.unwrap_or_else(free_port);
        let log = std::env::temp_dir().join(format!("warden-test-{}.log", uuid::Uuid::new_v4()));
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = self
            .command
            .env("WARDEN_LISTEN_ADDR", format!("127.0.0.1:{port}"))
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("warden starts");
        ServiceProcess {
            child,
            base: format!("http://127.0.0.1:{port}"),
            port,
            log,
            data_dir: self.own_data_dir.take(),
        }
    }

    /// Starts the service and waits until it answers ready (panics with its
    /// log if it exits first).
    pub async fn serve(self) -> ServiceProcess {
        let mut process = self.spawn();
        let client = reqwest::Client::new();
        let ready = format!("{}/readyz", process.base);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(res) = client.get(&ready).send().await
                && res.status() == StatusCode::OK
            {
                break;
            }
            if let Ok(Some(status)) = process.child.try_wait() {
                panic!("warden exited ({status}): {}", process.logs());
            }
            assert!(Instant::now() < deadline, "warden did not become ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        process
    }
}

/// The URL of `pool`'s database on the `DATABASE_URL` server.
pub fn database_url(pool: &PgPool) -> String {
    let opts = pool.connect_options();
    let db = opts.get_database().unwrap_or("postgres");
    let base_url = server_url().expect("DATABASE_URL is set");
    let server = match base_url.rfind('/') {
        Some(i) if base_url[..i].contains("://") && i > base_url.find("://").unwrap_or(0) + 2 => {
            &base_url[..i]
        }
        _ => &base_url,
    };
    format!("{server}/{db}")
}

/// A free port on the loopback interface.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A `warden` service started by [`Warden::serve`], ended (SIGKILL) when
/// dropped. Its log (stdout and stderr) goes to a file, read by
/// [`ServiceProcess::logs`].
pub struct ServiceProcess {
    child: std::process::Child,
    pub base: String,
    port: u16,
    log: std::path::PathBuf,
    /// Its embedded PostgreSQL's data, when made for it alone.
    data_dir: Option<std::path::PathBuf>,
}

impl ServiceProcess {
    /// The process id (to read its `/proc/<pid>/status`).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Everything the process has logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Ends it as `kill -9` does: nothing checkpointed, released or flushed.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }

    /// How it exited, once it has, within `timeout`.
    pub async fn exit_status(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "warden did not exit within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
        if let Some(dir) = &self.data_dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Polls `holds` every 20 ms until it is true; panics saying what was awaited
/// when `timeout` passes first. The one way the tests wait for a condition.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut holds: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually_ok(timeout, what, || {
        let held = holds();
        async move {
            if held.await {
                Ok(())
            } else {
                Err(String::new())
            }
        }
    })
    .await
}

/// Polls `attempt` every 20 ms until it gives `Ok`, and returns that value;
/// panics saying what was awaited, and what the last attempt saw (its
/// `Err`), when `timeout` passes first.
pub async fn eventually_ok<T, F, Fut>(timeout: Duration, what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let seen = match attempt().await {
            Ok(value) => return value,
            Err(seen) => seen,
        };
        assert!(
            Instant::now() < deadline,
            "waited {timeout:?} for {what}, in vain; last seen: {seen}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A body the operation accepts, so that what answers is the session
/// lookup and not the body check (a malformed body is refused the same way
/// for every id, existing or not).
pub fn valid_body(method: &reqwest::Method, template: &str) -> Option<Value> {
    match (method.as_str(), template) {
        ("PATCH", "/api/autonomous/{id}") => Some(json!({ "limits": { "max_iterations": 7 } })),
        ("POST", "/api/autonomous/{id}/resume") => Some(json!({ "guidance": "go on" })),
        ("POST", "/api/autonomous/{id}/fork") => Some(json!({ "checkpoint_iteration": 1 })),
        ("POST", "/api/autonomous/{id}/refinement") => {
            Some(json!({ "choice": "custom", "goal": "Write the changelog" }))
        }
        ("POST", "/api/autonomous/{id}/approvals/{call_id}") => {
            Some(json!({ "decision": "approve" }))
        }
        ("POST", "/api/insights/thresholds/apply") => Some(json!({ "max_iterations": 7 })),
        ("PUT", "/api/autonomous/{id}/notify") | ("PUT", "/api/notify") => {
            Some(json!({ "url": "http://127.0.0.1:9/hook" }))
        }
        _ => None,
    }
}

/// Sends `req` and reads what came back: status, content type and the body
/// as JSON (`null` when it is none).
pub async fn answer_of(req: reqwest::RequestBuilder) -> (StatusCode, String, Value) {
    let res = req.send().await.expect("sent");
    let status = res.status();
    let content_type = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    (
        status,
        content_type,
        res.json().await.unwrap_or(Value::Null),
    )
}
