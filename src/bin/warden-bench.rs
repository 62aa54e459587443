//! `warden-bench`: starts the `warden` binary against a real Postgres, drives
//! it through the public HTTP API with scripted sessions, and prints each
//! figure beside the raw Postgres figure for the same pattern measured in the
//! same run, so results read as ratios rather than absolute times.
//!
//! Run with `cargo build --release --locked && target/release/warden-bench`
//! (`--quick` for a smoke run of a few seconds). See BENCHMARKS.md.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use serde_json::{Value, json};
use sqlx::postgres::{PgPool, PgPoolOptions};

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Distinct steps per scripted cycle: more than the rework look-back and the
/// stuck windows, so a repeating benchmark session is never judged stuck.
const CYCLE: usize = 32;
/// Warden's default Postgres pool; the raw baselines use the same size.
const POOL: u32 = 16;

/// How big each phase is.
#[derive(Debug, Clone)]
struct Scale {
    throughput_sessions: Vec<usize>,
    window: Duration,
    stop_sessions: usize,
    memory_sessions: usize,
    status_rate_per_s: u32,
    /// Session counts of the embedded phase (one connection: fewer).
    embedded_sessions: Vec<usize>,
}

impl Scale {
    fn full() -> Scale {
        Scale {
            throughput_sessions: vec![1, 100, 1_000],
            window: Duration::from_secs(10),
            stop_sessions: 1_000,
            memory_sessions: 10_000,
            status_rate_per_s: 100,
            embedded_sessions: vec![1, 32],
        }
    }

    fn quick() -> Scale {
        Scale {
            throughput_sessions: vec![1, 20],
            window: Duration::from_secs(2),
            stop_sessions: 20,
            memory_sessions: 200,
            status_rate_per_s: 20,
            embedded_sessions: vec![1, 8],
        }
    }
}

struct Options {
    scale: Scale,
    /// Phases to run: `throughput`, `stop`, `memory` (all when empty).
    only: Vec<String>,
    admin_url: String,
    warden: PathBuf,
}

fn usage() -> &'static str {
    "usage: warden-bench [--quick] [--sessions N,N..] [--window SECS] [--only PHASE]\n\
                    [--database-url URL] [--warden PATH]\n\
     \n\
     --quick          a few sessions for a few seconds (a smoke run)\n\
     --sessions N,..  session counts of the throughput phase (default 1,100,1000)\n\
     --window SECS    how long each throughput measurement lasts (default 10)\n\
     --only PHASE     run one phase: throughput, status, stop, memory or embedded\n\
                      (repeatable; embedded: the same on the embedded PostgreSQL)\n\
     --database-url   a Postgres URL whose user may create databases\n\
                      (default: $DATABASE_URL, else postgres://postgres@127.0.0.1:5432/postgres)\n\
     --warden PATH    the warden binary (default: beside this program)"
}

impl Options {
    /// Whether `phase` was asked for.
    fn runs(&self, phase: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|p| p == phase)
    }
}

fn parse_args() -> BenchResult<Options> {
    let mut scale = Scale::full();
    let mut admin_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let mut warden = std::env::current_exe()?
        .parent()
        .map(|dir| dir.join("warden"))
        .unwrap_or_else(|| PathBuf::from("warden"));
    let mut only = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => scale = Scale::quick(),
            "--sessions" => {
                let list = args.next().ok_or("--sessions needs a value")?;
                scale.throughput_sessions = list
                    .split(',')
                    .map(|n| n.trim().parse::<usize>().ok().filter(|n| *n > 0))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        format!("--sessions takes counts like 1,100,1000, not {list}")
                    })?;
            }
            "--window" => {
                let value = args.next().ok_or("--window needs a value")?;
                let secs: f64 = value
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s > 0.0 && s.is_finite())
                    .ok_or_else(|| format!("--window takes seconds, not {value}"))?;
                scale.window = Duration::from_secs_f64(secs);
            }
            "--only" => {
                let phase = args.next().ok_or("--only needs a value")?;
                if !["throughput", "status", "stop", "memory", "embedded"].contains(&phase.as_str())
                {
                    return Err(format!(
                        "--only takes throughput, status, stop, memory or embedded, not {phase}"
                    )
                    .into());
                }
                only.push(phase);
            }
            "--database-url" => admin_url = args.next().ok_or("--database-url needs a value")?,
            "--warden" => warden = PathBuf::from(args.next().ok_or("--warden needs a value")?),
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}\n{}", usage()).into()),
        }
    }
    if !warden.exists() {
        return Err(format!(
            "{} does not exist; build it first: cargo build --release --locked",
            warden.display()
        )
        .into());
    }
    Ok(Options {
        scale,
        only,
        admin_url,
        warden,
    })
}

// ---------------------------------------------------------------- numbers

/// The `q`-quantile (0..=1) of `samples`, nearest rank.
fn quantile(samples: &mut [Duration], q: f64) -> Option<Duration> {
    if samples.is_empty() {
        return None;
    }
    samples.sort_unstable();
    let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    Some(samples[rank - 1])
}

fn ms(d: Option<Duration>) -> String {
    match d {
        Some(d) if d < Duration::from_millis(10) => format!("{:.2} ms", d.as_secs_f64() * 1e3),
        Some(d) => format!("{:.1} ms", d.as_secs_f64() * 1e3),
        None => "—".into(),
    }
}

fn ratio(ours: Option<f64>, raw: Option<f64>) -> String {
    match (ours, raw) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "—".into(),
    }
}

fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

/// Counters and histograms scraped from `/metrics`.
#[derive(Debug, Default, Clone)]
struct Scrape {
    values: BTreeMap<String, f64>,
}

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let values = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .filter_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                Some((name.to_string(), value.parse().ok()?))
            })
            .collect();
        Scrape { values }
    }

    fn get(&self, name: &str) -> f64 {
        self.values.get(name).copied().unwrap_or(0.0)
    }

    /// Cumulative buckets of histogram `name` as (upper bound, count), +Inf last.
    fn buckets(&self, name: &str) -> Vec<(f64, f64)> {
        let prefix = format!("{name}_bucket{{le=\"");
        let mut out: Vec<(f64, f64)> = self
            .values
            .iter()
            .filter_map(|(k, v)| {
                let le = k.strip_prefix(&prefix)?.strip_suffix("\"}")?;
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((bound, *v))
            })
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// The `q`-quantile of the observations a histogram gained between two
/// scrapes, interpolated linearly inside its bucket (as Prometheus'
/// `histogram_quantile` does).
fn histogram_quantile(before: &Scrape, after: &Scrape, name: &str, q: f64) -> Option<f64> {
    let b0 = before.buckets(name);
    let b1 = after.buckets(name);
    let delta: Vec<(f64, f64)> = b1
        .iter()
        .map(|(le, c)| {
            let prev = b0.iter().find(|(l, _)| l == le).map_or(0.0, |(_, c0)| *c0);
            (*le, c - prev)
        })
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for (le, count) in delta {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let width = count - lower.1;
            let frac = if width > 0.0 {
                (rank - lower.1) / width
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * frac);
        }
        lower = (le, count);
    }
    None
}

// ---------------------------------------------------------------- server

/// A `warden` process on its own fresh database.
struct Server {
    child: Child,
    base: String,
    db_name: String,
    db_url: String,
    workspaces: PathBuf,
    /// The embedded PostgreSQL's data directory (embedded phase), removed at stop.
    data_dir: Option<PathBuf>,
}

async fn create_database(admin: &PgPool, name: &str) -> BenchResult<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(admin)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(admin)
        .await?;
    Ok(())
}

fn database_url(admin_url: &str, name: &str) -> String {
    match admin_url.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{name}"),
        None => format!("{admin_url}/{name}"),
    }
}

fn free_port() -> BenchResult<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

impl Server {
    async fn start(opts: &Options, admin: &PgPool, phase: &str) -> BenchResult<Server> {
        let db_name = format!("warden_bench_{}_{phase}", std::process::id());
        create_database(admin, &db_name).await?;
        let db_url = database_url(&opts.admin_url, &db_name);
        let mut command = Command::new(&opts.warden);
        command.env("DATABASE_URL", &db_url);
        Server::spawn(command, db_name, db_url, None).await
    }

    /// A warden on the embedded PostgreSQL (no `DATABASE_URL`) in a fresh
    /// data directory.
    async fn start_embedded(opts: &Options, phase: &str) -> BenchResult<Server> {
        let name = format!("warden_bench_{}_{phase}", std::process::id());
        let data_dir = std::env::temp_dir().join(format!("{name}_data"));
        let _ = std::fs::remove_dir_all(&data_dir);
        let mut command = Command::new(&opts.warden);
        command
            .env_remove("DATABASE_URL")
            .env("WARDEN_DATA_DIR", &data_dir);
        Server::spawn(command, name, String::new(), Some(data_dir)).await
    }

    async fn spawn(
        mut command: Command,
        db_name: String,
        db_url: String,
        data_dir: Option<PathBuf>,
    ) -> BenchResult<Server> {
        let port = free_port()?;
        let workspaces = std::env::temp_dir().join(&db_name);
        std::fs::create_dir_all(&workspaces)?;
        let child = command
            .env("WARDEN_LISTEN_ADDR", format!("127.0.0.1:{port}"))
            .env("WARDEN_WORKSPACE_ROOT", &workspaces)
            // Benchmark sessions run unattended far past the gate's
            // "100 steps without a person" default.
            .env("WARDEN_GATE_STEP_LIMIT", "1000000")
            .env("WARDEN_DB_MAX_CONNECTIONS", POOL.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        let server = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            db_name,
            db_url,
            workspaces,
            data_dir,
        };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = client
                .get(format!("{}/readyz", server.base))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return Ok(server);
            }
            if Instant::now() > deadline {
                return Err("warden did not become ready within 30 s".into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size of the server process, from /proc (Linux).
    fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }

    async fn scrape(&self, client: &reqwest::Client) -> BenchResult<Scrape> {
        let text = client
            .get(format!("{}/metrics", self.base))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(Scrape::parse(&text))
    }

    async fn stop(mut self, admin: &PgPool) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.workspaces);
        if let Some(dir) = &self.data_dir {
            let _ = std::fs::remove_dir_all(dir);
            return;
        }
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.db_name
        )))
        .execute(admin)
        .await;
        let _ = std::fs::remove_dir_all(&self.workspaces);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

// ---------------------------------------------------------------- sessions

/// A scripted session cycling through distinct steps of `delay_ms` each.
fn cycling_session(delay_ms: u64) -> Value {
    let steps: Vec<Value> = (1..=CYCLE)
        .map(|part| {
            json!({ "action": "write_part", "arguments": { "part": part }, "tokens": 1,
                    "output": format!("part {part} of report.md written"), "delay_ms": delay_ms })
        })
        .collect();
    json!({
        "goal": "Write the 32 parts of report.md",
        "mode": "fixed",
        "limits": { "max_iterations": 1_000_000, "max_tokens": 10_000_000_000u64,
                    "max_wall_time_ms": 86_400_000 },
        "executor": { "kind": "scripted", "repeat": true, "steps": steps }
    })
}

/// A session whose first step takes ten minutes: always one step in flight.
fn long_step_session() -> Value {
    json!({
        "goal": "Write report.md",
        "mode": "fixed",
        "executor": { "kind": "scripted", "steps": [
            { "action": "write_file", "arguments": { "path": "report.md" }, "tokens": 1,
              "output": "written", "delay_ms": 600_000 } ] }
    })
}

async fn create_sessions(
    client: &reqwest::Client,
    base: &str,
    n: usize,
    body: &Value,
) -> BenchResult<Vec<String>> {
    let url = format!("{base}/api/autonomous");
    let results: Vec<BenchResult<String>> = stream::iter(0..n)
        .map(|_| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let res = client.post(&url).json(body).send().await?;
                let status = res.status();
                let created: Value = res.json().await?;
                if !status.is_success() || created["status"] != "running" {
                    return Err(format!("create answered {status}: {created}").into());
                }
                Ok(created["id"].as_str().unwrap_or_default().to_string())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Starts `request(i)` at a steady rate for `window`, whatever the answers'
/// latency (an open loop), and returns the latency of each that succeeded.
async fn open_loop<F, Fut>(rate_per_s: u32, window: Duration, request: F) -> Vec<Duration>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = bool> + Send + 'static,
{
    let period = Duration::from_secs_f64(1.0 / f64::from(rate_per_s.max(1)));
    let mut tick = tokio::time::interval(period);
    let end = Instant::now() + window;
    let mut tasks = Vec::new();
    let mut i = 0usize;
    while Instant::now() < end {
        tick.tick().await;
        let sent = request(i);
        i += 1;
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            sent.await.then(|| t.elapsed())
        }));
    }
    let mut out = Vec::new();
    for task in tasks {
        if let Ok(Some(d)) = task.await {
            out.push(d);
        }
    }
    out
}

/// GETs `url_for(i)` in an open loop; a request counts when it answers 2xx.
async fn steady_get(
    client: &reqwest::Client,
    rate_per_s: u32,
    window: Duration,
    url_for: impl Fn(usize) -> String,
) -> Vec<Duration> {
    open_loop(rate_per_s, window, |i| {
        let request = client.get(url_for(i));
        async move { request.send().await.is_ok_and(|r| r.status().is_success()) }
    })
    .await
}

/// The same, for a raw query on the benchmark's own pool (bound to the
/// i-th id when it takes one).
async fn steady_query(
    pool: &PgPool,
    rate_per_s: u32,
    window: Duration,
    sql: &'static str,
    ids: Arc<Vec<uuid::Uuid>>,
) -> Vec<Duration> {
    open_loop(rate_per_s, window, |i| {
        let pool = pool.clone();
        let id = ids.get(i % ids.len().max(1)).copied();
        async move {
            let query = sqlx::query(sql);
            let query = match id {
                Some(id) if sql.contains("$1") => query.bind(id),
                _ => query,
            };
            query.fetch_all(&pool).await.is_ok()
        }
    })
    .await
}

/// p99 of `GET /api/autonomous/{id}` and of the list endpoint at a steady
/// rate for the scale's window, beside the same reads made directly.
async fn status_latency(
    client: &reqwest::Client,
    server: &Server,
    ids: &[String],
    scale: &Scale,
    load: &str,
) -> BenchResult<Vec<Row>> {
    let reader = PgPoolOptions::new()
        .max_connections(4)
        .connect(&server.db_url)
        .await?;
    let uuids: Arc<Vec<uuid::Uuid>> = Arc::new(ids.iter().filter_map(|i| i.parse().ok()).collect());
    let base = &server.base;
    let rate = scale.status_rate_per_s;
    let list_rate = (rate / 5).max(1);
    let (mut get, mut list, mut raw_get, mut raw_list) = tokio::join!(
        steady_get(client, rate, scale.window, |i| format!(
            "{base}/api/autonomous/{}",
            ids[i % ids.len().max(1)]
        )),
        steady_get(client, list_rate, scale.window, |_| format!(
            "{base}/api/autonomous?limit=50"
        )),
        steady_query(
            &reader,
            rate,
            scale.window,
            "SELECT * FROM sessions WHERE id = $1",
            uuids.clone()
        ),
        steady_query(
            &reader,
            list_rate,
            scale.window,
            "SELECT * FROM sessions ORDER BY created_at DESC, id DESC LIMIT 50",
            uuids
        ),
    );
    reader.close().await;
    let get_p99 = quantile(&mut get, 0.99);
    let raw_get_p99 = quantile(&mut raw_get, 0.99);
    let list_p99 = quantile(&mut list, 0.99);
    let raw_list_p99 = quantile(&mut raw_list, 0.99);
    Ok(vec![
        row(
            format!("GET /api/autonomous/{{id}} p99 at {rate}/s, {load}"),
            ms(get_p99),
            format!("{} (SELECT by id)", ms(raw_get_p99)),
            ratio(secs(get_p99), secs(raw_get_p99)),
            "< 10 ms",
        ),
        row(
            format!("GET /api/autonomous?limit=50 p99 at {list_rate}/s, {load}"),
            ms(list_p99),
            format!("{} (SELECT 50 rows)", ms(raw_list_p99)),
            ratio(secs(list_p99), secs(raw_list_p99)),
            "< 10 ms",
        ),
    ])
}

// ---------------------------------------------------------------- raw Postgres

/// Single-row insert-and-update transactions by `concurrency` tasks sharing
/// a pool of `POOL` connections for `window`: transactions per second and
/// each transaction's latency.
async fn raw_write(
    admin_url: &str,
    admin: &PgPool,
    concurrency: usize,
    window: Duration,
) -> BenchResult<(f64, Vec<Duration>)> {
    let name = format!("warden_bench_{}_raw", std::process::id());
    create_database(admin, &name).await?;
    let pool = PgPoolOptions::new()
        .max_connections(POOL)
        .connect(&database_url(admin_url, &name))
        .await?;
    sqlx::query("CREATE TABLE counters (id bigint PRIMARY KEY, n bigint NOT NULL)")
        .execute(&pool)
        .await?;
    sqlx::query(
        "CREATE TABLE rows (owner bigint NOT NULL, n bigint NOT NULL, record jsonb NOT NULL,
                            created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (owner, n))",
    )
    .execute(&pool)
    .await?;
    sqlx::query("INSERT INTO counters SELECT g, 0 FROM generate_series(1, $1) g")
        .bind(concurrency as i64)
        .execute(&pool)
        .await?;
    let record = json!({ "action": "write_part", "arguments": { "part": 1 }, "outcome": "success",
                         "observation": "part 1 of report.md written", "tokens": 1 });
    let end = Instant::now() + window;
    let started = Instant::now();
    let tasks: Vec<_> = (1..=concurrency as i64)
        .map(|owner| {
            let (pool, record) = (pool.clone(), record.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while Instant::now() < end {
                    let t = Instant::now();
                    let one = async {
                        let mut tx = pool.begin().await?;
                        let n: i64 = sqlx::query_scalar(
                            "UPDATE counters SET n = n + 1 WHERE id = $1 RETURNING n",
                        )
                        .bind(owner)
                        .fetch_one(&mut *tx)
                        .await?;
                        sqlx::query("INSERT INTO rows (owner, n, record) VALUES ($1, $2, $3)")
                            .bind(owner)
                            .bind(n)
                            .bind(&record)
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await
                    };
                    if one.await.is_ok() {
                        latencies.push(t.elapsed());
                    }
                }
                latencies
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap_or_default());
    }
    let elapsed = started.elapsed().as_secs_f64();
    pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(admin)
    .await?;
    Ok((all.len() as f64 / elapsed, all))
}

// ---------------------------------------------------------------- report

struct Row {
    what: String,
    ours: String,
    raw: String,
    ratio: String,
    target: String,
}

fn row(what: impl Into<String>, ours: String, raw: String, ratio: String, target: &str) -> Row {
    Row {
        what: what.into(),
        ours,
        raw,
        ratio,
        target: target.into(),
    }
}

async fn machine(admin: &PgPool) -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(admin)
        .await
        .unwrap_or_default();
    let sync: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(admin)
        .await
        .unwrap_or_default();
    let fsync: String = sqlx::query_scalar("SHOW fsync")
        .fetch_one(admin)
        .await
        .unwrap_or_default();
    format!(
        "{cores} cores ({cpu}); PostgreSQL {version} on the same machine, fsync={fsync}, synchronous_commit={sync}; Warden's loops pool {POOL} connections, the API's a quarter of that"
    )
}

#[tokio::main]
async fn main() {
    if let Err(err) = run().await {
        eprintln!("warden-bench: {err}");
        std::process::exit(1);
    }
}

async fn run() -> BenchResult<()> {
    let opts = parse_args()?;
    let scale = opts.scale.clone();
    let admin = PgPoolOptions::new()
        .max_connections(2)
        .connect(&opts.admin_url)
        .await
        .map_err(|e| format!("cannot reach Postgres at {}: {e}", opts.admin_url))?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .timeout(Duration::from_secs(120))
        .build()?;
    let machine = machine(&admin).await;
    eprintln!("warden-bench: {machine}");
    let mut rows = Vec::new();

    if opts.runs("throughput") {
        // 1. Durable iterations per second, supervisor overhead, and status
        //    latency at the largest size.
        let largest = scale.throughput_sessions.iter().copied().max().unwrap_or(1);
        for &n in &scale.throughput_sessions {
            eprintln!("warden-bench: throughput with {n} sessions");
            let (raw_rate, mut raw_lat) =
                raw_write(&opts.admin_url, &admin, n, scale.window).await?;
            let server = Server::start(&opts, &admin, &format!("t{n}")).await?;
            let ids = create_sessions(&client, &server.base, n, &cycling_session(0)).await?;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let before = server.scrape(&client).await?;
            let t0 = Instant::now();
            tokio::time::sleep(scale.window).await;
            let after = server.scrape(&client).await?;
            let elapsed = t0.elapsed().as_secs_f64();
            let rate = (after.get("warden_iterations_total")
                - before.get("warden_iterations_total"))
                / elapsed;
            if rate <= 0.0 {
                return Err(format!("no iterations were committed with {n} sessions").into());
            }
            let running = after.get("warden_sessions{status=\"running\"}");
            if running < n as f64 {
                eprintln!(
                    "warden-bench: warning: only {running} of {n} sessions were still running"
                );
            }
            rows.push(row(
                format!("durable iterations/s, {n} session(s)"),
                format!("{rate:.0}"),
                format!("{raw_rate:.0} tx/s"),
                ratio(Some(rate), Some(raw_rate)),
                if n == 1_000 { "≥ 3,000" } else { "" },
            ));
            let name = "warden_iteration_overhead_seconds";
            let raw_p50 = secs(quantile(&mut raw_lat, 0.5));
            let raw_p99 = secs(quantile(&mut raw_lat, 0.99));
            for (q, raw, label, target) in
                [(0.5, raw_p50, "p50", ""), (0.99, raw_p99, "p99", "< 1 ms")]
            {
                let ours = histogram_quantile(&before, &after, name, q);
                rows.push(row(
                    format!("supervisor overhead per iteration {label}, {n} session(s)"),
                    ms(ours.map(Duration::from_secs_f64)),
                    format!("{} per tx", ms(raw.map(Duration::from_secs_f64))),
                    ratio(ours, raw),
                    target,
                ));
            }
            // The same overhead without the waits for durable writes (the
            // commit, checkpoints): what the loop and its policies cost.
            let name = "warden_iteration_supervisor_seconds";
            for (q, label) in [(0.5, "p50"), (0.99, "p99")] {
                let ours = histogram_quantile(&before, &after, name, q);
                rows.push(row(
                    format!("  of which loop and policies (durable writes excluded) {label}"),
                    ms(ours.map(Duration::from_secs_f64)),
                    "—".into(),
                    "—".into(),
                    "",
                ));
            }

            if n == largest {
                eprintln!("warden-bench: status and list latency with {n} sessions running");
                let load = format!("{n} running flat out");
                rows.extend(status_latency(&client, &server, &ids, &scale, &load).await?);
            }
            server.stop(&admin).await;
        }
    }

    if opts.runs("status") {
        // 2. Status and list latency at a realistic load: as many sessions as
        //    the largest throughput run, each step taking a second.
        let n = scale.throughput_sessions.iter().copied().max().unwrap_or(1);
        eprintln!("warden-bench: status and list latency with {n} sessions, 1-s steps");
        let server = Server::start(&opts, &admin, "status").await?;
        let ids = create_sessions(&client, &server.base, n, &cycling_session(1_000)).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let load = format!("{n} running, 1-s steps");
        rows.extend(status_latency(&client, &server, &ids, &scale, &load).await?);
        server.stop(&admin).await;
    }

    if opts.runs("stop") {
        // 3. Stop latency with every session in the middle of a step.
        let n = scale.stop_sessions;
        eprintln!("warden-bench: stop latency with {n} sessions, one step in flight each");
        let (_, mut raw_lat) =
            raw_write(&opts.admin_url, &admin, 4, Duration::from_secs(2)).await?;
        let server = Server::start(&opts, &admin, "stop").await?;
        let ids = create_sessions(&client, &server.base, n, &long_step_session()).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let base = server.base.clone();
        let results: Vec<Option<Duration>> = stream::iter(ids)
            .map(|id| {
                let (client, url) = (client.clone(), format!("{base}/api/autonomous/{id}/stop"));
                async move {
                    let t = Instant::now();
                    // No key on loopback: a state change must say it is JSON.
                    let res = client
                        .post(url)
                        .header(reqwest::header::CONTENT_TYPE, "application/json")
                        .send()
                        .await
                        .ok()?;
                    let body: Value = res.json().await.ok()?;
                    (body["status"] == "interrupted").then(|| t.elapsed())
                }
            })
            .buffer_unordered(4)
            .collect()
            .await;
        let failed = results.iter().filter(|r| r.is_none()).count();
        if failed == n {
            return Err("no stop answered `interrupted`".into());
        }
        if failed > 0 {
            eprintln!("warden-bench: warning: {failed} stops did not answer `interrupted`");
        }
        let mut stops: Vec<Duration> = results.into_iter().flatten().collect();
        server.stop(&admin).await;
        let raw_p50 = quantile(&mut raw_lat, 0.5);
        let raw_p99 = quantile(&mut raw_lat, 0.99);
        for (q, raw, label, target) in
            [(0.5, raw_p50, "p50", ""), (0.99, raw_p99, "p99", "< 50 ms")]
        {
            let ours = quantile(&mut stops, q);
            rows.push(row(
                format!("stop → interrupted persisted {label}, {n} running"),
                ms(ours),
                format!("{} per tx", ms(raw)),
                ratio(secs(ours), secs(raw)),
                target,
            ));
        }
    }

    if opts.runs("memory") {
        // 4. Memory per session whose steps wait one second.
        let n = scale.memory_sessions;
        eprintln!("warden-bench: resident memory with {n} sessions whose steps wait 1 s");
        let server = Server::start(&opts, &admin, "mem").await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let rss0 = server.rss_bytes();
        let created = Instant::now();
        let ids = create_sessions(&client, &server.base, n, &cycling_session(1_000)).await?;
        let create_rate = n as f64 / created.elapsed().as_secs_f64();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let before = server.scrape(&client).await?;
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let rss1 = server.rss_bytes();
        let after = server.scrape(&client).await?;
        let rate = (after.get("warden_iterations_total") - before.get("warden_iterations_total"))
            / t0.elapsed().as_secs_f64();
        eprintln!("warden-bench: status and list latency with {n} sessions waiting");
        let load = format!("{n} running, 1-s steps");
        let latency = status_latency(&client, &server, &ids, &scale, &load).await?;
        server.stop(&admin).await;
        let per_session = match (rss0, rss1) {
            (Some(a), Some(b)) => {
                format!("{:.1} KB", b.saturating_sub(a) as f64 / n as f64 / 1024.0)
            }
            _ => "— (no /proc)".into(),
        };
        rows.push(row(
            format!("resident memory per waiting session, {n} sessions"),
            per_session,
            format!(
                "base {:.1} MB → {:.1} MB",
                rss0.unwrap_or(0) as f64 / 1_048_576.0,
                rss1.unwrap_or(0) as f64 / 1_048_576.0
            ),
            "—".into(),
            "≤ 100 KB",
        ));
        rows.push(row(
            format!("  meanwhile: iterations/s of those {n} sessions; creates/s"),
            format!("{rate:.0}; {create_rate:.0}"),
            format!("demand {n}/s"),
            "—".into(),
            "",
        ));
        rows.extend(latency);
    }

    if opts.runs("embedded") {
        rows.extend(embedded_phase(&opts, &admin, &client, &scale).await?);
    }

    println!("Machine: {machine}\n");
    println!("| measurement | Warden | raw Postgres, same pattern | ratio | target |");
    println!("|---|---:|---:|---:|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} |",
            r.what, r.ours, r.raw, r.ratio, r.target
        );
    }
    admin.close().await;
    Ok(())
}

/// Phase 5: the same service on the embedded PostgreSQL (no `DATABASE_URL`:
/// one process, one connection shared by the API and the loops): throughput,
/// status latency under that load, stop latency. No raw column: nothing but
/// the warden process can reach its database.
async fn embedded_phase(
    opts: &Options,
    admin: &PgPool,
    client: &reqwest::Client,
    scale: &Scale,
) -> BenchResult<Vec<Row>> {
    let mut rows = Vec::new();
    let largest = scale.embedded_sessions.iter().copied().max().unwrap_or(1);
    for &n in &scale.embedded_sessions {
        eprintln!("warden-bench: embedded PostgreSQL, throughput with {n} sessions");
        let server = Server::start_embedded(opts, &format!("e{n}")).await?;
        let ids = create_sessions(client, &server.base, n, &cycling_session(0)).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = server.scrape(client).await?;
        let t0 = Instant::now();
        tokio::time::sleep(scale.window).await;
        let after = server.scrape(client).await?;
        let rate = (after.get("warden_iterations_total") - before.get("warden_iterations_total"))
            / t0.elapsed().as_secs_f64();
        if rate <= 0.0 {
            return Err(format!("embedded: no iterations were committed with {n} sessions").into());
        }
        rows.push(row(
            format!("embedded: durable iterations/s, {n} session(s)"),
            format!("{rate:.0}"),
            "—".into(),
            "—".into(),
            "",
        ));
        if n == largest {
            eprintln!("warden-bench: embedded PostgreSQL, status latency with {n} sessions");
            let base = &server.base;
            let rate = scale.status_rate_per_s;
            let (mut get, mut list) = tokio::join!(
                steady_get(client, rate, scale.window, |i| format!(
                    "{base}/api/autonomous/{}",
                    ids[i % ids.len().max(1)]
                )),
                steady_get(client, (rate / 5).max(1), scale.window, |_| format!(
                    "{base}/api/autonomous?limit=50"
                )),
            );
            for (what, samples) in [("GET /{id}", &mut get), ("list", &mut list)] {
                for q in [0.5, 0.99] {
                    rows.push(row(
                        format!(
                            "embedded: {what} p{}, {n} running flat out",
                            (q * 100.0) as u32
                        ),
                        ms(quantile(samples, q)),
                        "—".into(),
                        "—".into(),
                        "",
                    ));
                }
            }
        }
        server.stop(admin).await;
    }

    let n = largest;
    eprintln!("warden-bench: embedded PostgreSQL, stop latency with {n} sessions");
    let server = Server::start_embedded(opts, "estop").await?;
    let ids = create_sessions(client, &server.base, n, &long_step_session()).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let base = server.base.clone();
    let mut stops: Vec<Duration> = stream::iter(ids)
        .map(|id| {
            let (client, url) = (client.clone(), format!("{base}/api/autonomous/{id}/stop"));
            async move {
                let t = Instant::now();
                let res = client
                    .post(url)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .send()
                    .await
                    .ok()?;
                let body: Value = res.json().await.ok()?;
                (body["status"] == "interrupted").then(|| t.elapsed())
            }
        })
        .buffer_unordered(4)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .flatten()
        .collect();
    server.stop(admin).await;
    if stops.is_empty() {
        return Err("embedded: no stop answered `interrupted`".into());
    }
    for q in [0.5, 0.99] {
        rows.push(row(
            format!(
                "embedded: stop → interrupted persisted p{}, {n} running",
                (q * 100.0) as u32
            ),
            ms(quantile(&mut stops, q)),
            "—".into(),
            "—".into(),
            "",
        ));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let mut v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&mut v, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(quantile(&mut v, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(quantile(&mut v, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(quantile(&mut [], 0.5), None);
    }

    #[test]
    fn histogram_quantile_interpolates_inside_the_bucket() {
        let before = Scrape::parse(
            "h_bucket{le=\"0.001\"} 10\nh_bucket{le=\"0.002\"} 10\nh_bucket{le=\"+Inf\"} 10\n",
        );
        let after = Scrape::parse(
            "h_bucket{le=\"0.001\"} 60\nh_bucket{le=\"0.002\"} 110\nh_bucket{le=\"+Inf\"} 110\n",
        );
        // 100 new observations: 50 ≤ 1 ms, 50 in (1, 2] ms.
        let p50 = histogram_quantile(&before, &after, "h", 0.5).unwrap_or(f64::NAN);
        assert!((p50 - 0.001).abs() < 1e-12, "{p50}");
        let p99 = histogram_quantile(&before, &after, "h", 0.99).unwrap_or(f64::NAN);
        assert!((p99 - 0.00198).abs() < 1e-9, "{p99}");
        assert_eq!(histogram_quantile(&after, &after, "h", 0.5), None);
    }

    #[test]
    fn database_url_swaps_the_database() {
        assert_eq!(
            database_url("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
    }
}
