//! The scale phases (issue 45). `stored`: list pages filtered by status over
//! 1,000,000 stored sessions of 100 tenants while 1,000 run, then start-up to
//! ready after a crash with 100,000 sessions queued. `deep`: iterations per
//! second of one session resumed at iteration ~1,000,000 beside a fresh one.
//!
//! The stored and deep rows are written straight into the database, one
//! `INSERT … SELECT generate_series` per table, copying the columns of a
//! session created through the API so every row reads as a real one.

use super::{
    BenchResult, Duration, Instant, Options, PgPool, PgPoolOptions, Row, Scale, Server, Value,
    bench_key, create_sessions, cycling_session, finite_session, json, ms, open_loop, quantile,
    ratio, row, secs,
};

/// Tenants the stored sessions belong to.
const TENANTS: usize = 100;
/// How long the restart's pick-up is followed.
const WAIT_S: u64 = 150;
/// Page size of the measured lists.
const PAGE: usize = 50;
/// Requests per second of each measured list.
const LIST_RATE: u32 = 20;

fn tenant_name(i: usize) -> String {
    format!("tenant-{i:03}")
}

/// A pool of its own on the phase's database.
async fn pool(url: &str, connections: u32) -> BenchResult<PgPool> {
    Ok(PgPoolOptions::new()
        .max_connections(connections)
        .acquire_timeout(Duration::from_secs(600))
        .connect(url)
        .await?)
}

/// Polls `GET /api/autonomous/{id}` until `done` holds of it (or a minute).
async fn wait_for(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    done: impl Fn(&Value) -> bool,
) -> BenchResult<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let doc: Value = client
            .get(format!("{base}/api/autonomous/{id}"))
            .send()
            .await?
            .json()
            .await?;
        if done(&doc) {
            return Ok(doc);
        }
        if Instant::now() > deadline {
            return Err(format!("session {id} did not get there within a minute: {doc}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------- stored

/// Seeds `n` ended sessions of [`TENANTS`] tenants, shaped as `template`
/// (a session that ran and completed): statuses 60 % completed, 20 %
/// stopped, 15 % failed, 5 % interrupted, independent of the tenant;
/// created over the past year, newest last. No history rows: neither a
/// list nor the start-up reads them (the deep phase seeds a long history).
async fn seed_stored(db: &PgPool, template: &str, n: usize) -> BenchResult<Duration> {
    let t = Instant::now();
    sqlx::query(
        "INSERT INTO sessions (id, tenant, goal, mode, status, reason, summary, limits, executor,
                               next_steps, criteria, milestones, iterations, tokens_used,
                               tool_calls, elapsed_ms, last_event_seq, created_at, updated_at, ended_at)
         SELECT gen_random_uuid(), 'tenant-' || lpad((g % 100)::text, 3, '0'), t.goal, t.mode,
                s.status, s.reason, t.summary, t.limits, t.executor, t.next_steps, t.criteria,
                t.milestones, t.iterations, t.tokens_used, t.tool_calls, t.elapsed_ms,
                t.last_event_seq, at, at + interval '5 minutes', at + interval '5 minutes'
         FROM sessions t,
              generate_series(1, $2) g,
              LATERAL (SELECT now() - interval '1 year' - interval '1 hour'
                              + g * (interval '1 year' / $2) AS at) c,
              LATERAL (SELECT CASE WHEN (g / 100) % 20 < 12 THEN 'completed'
                                   WHEN (g / 100) % 20 < 16 THEN 'stopped'
                                   WHEN (g / 100) % 20 < 19 THEN 'failed'
                                   ELSE 'interrupted' END AS status,
                              CASE WHEN (g / 100) % 20 < 12 THEN 'goal_achieved'
                                   WHEN (g / 100) % 20 < 16 THEN 'max_iterations'
                                   WHEN (g / 100) % 20 < 19 THEN 'internal_error'
                                   ELSE 'user_stop' END AS reason) s
         WHERE t.id = $1::uuid",
    )
    .bind(template)
    .bind(n as i32)
    .execute(db)
    .await?;
    settle(db, "sessions").await?;
    Ok(t.elapsed())
}

/// Seeds `n` sessions queued over the last hour, shaped as `template` (a
/// running session), spread over the tenants.
async fn seed_queued(db: &PgPool, template: &str, n: usize) -> BenchResult<Duration> {
    let t = Instant::now();
    sqlx::query(
        "INSERT INTO sessions (id, tenant, goal, mode, status, limits, executor, next_steps,
                               criteria, milestones, created_at, updated_at, queued_at)
         SELECT gen_random_uuid(), 'tenant-' || lpad((g % 100)::text, 3, '0'), t.goal, t.mode,
                'queued', t.limits, t.executor, t.next_steps, t.criteria, t.milestones,
                at, at, at
         FROM sessions t, generate_series(1, $2) g,
              LATERAL (SELECT now() - interval '1 hour' + g * (interval '1 hour' / $2) AS at) c
         WHERE t.id = $1::uuid",
    )
    .bind(template)
    .bind(n as i32)
    .execute(db)
    .await?;
    settle(db, "sessions").await?;
    Ok(t.elapsed())
}

/// Leaves seeded `tables` as autovacuum would leave tables that old
/// (statistics, visibility map), and their pages written out, so the
/// seeding's writes do not go on into the measurements.
async fn settle(db: &PgPool, tables: &'static str) -> BenchResult<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM (ANALYZE) {tables}")))
        .execute(db)
        .await?;
    sqlx::query("CHECKPOINT").execute(db).await?;
    Ok(())
}

/// One list to measure: who asks (`key`: a tenant's, rotating over them,
/// or the global admin's) and for which status.
struct ListCase {
    label: String,
    keys: Vec<String>,
    /// The tenants the raw query is scoped to, aligned with `keys`
    /// (`None`: every tenant, as the admin sees).
    tenants: Vec<Option<String>>,
    status: &'static str,
}

/// Quantiles of a measured list and of its raw page.
struct Latencies {
    p99: Option<Duration>,
    p50: Option<Duration>,
    raw_p99: Option<Duration>,
    raw_p50: Option<Duration>,
    /// Pages that came back empty (a list that matched nothing).
    empty: usize,
}

impl Latencies {
    /// The row of this list, judged against the < 10 ms target.
    fn row(&self, what: String) -> Row {
        row(
            what,
            format!("{} (p50 {})", ms(self.p99), ms(self.p50)),
            format!(
                "{} (p50 {}), the same page's SELECT",
                ms(self.raw_p99),
                ms(self.raw_p50)
            ),
            ratio(secs(self.p99), secs(self.raw_p99)),
            "< 10 ms",
        )
        .judged(self.p99.map(|d| d < Duration::from_millis(10)))
    }
}

/// p99 of the list at [`LIST_RATE`]/s for the window, then of the raw SQL
/// of the same page on a pool of the benchmark's own, from a thread of
/// their own (as `status_latency`).
async fn list_p99(
    base: &str,
    db_url: &str,
    case: &ListCase,
    window: Duration,
) -> BenchResult<Latencies> {
    let (base, db_url) = (base.to_string(), db_url.to_string());
    let (keys, tenants, status) = (case.keys.clone(), case.tenants.clone(), case.status);
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(async move {
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(120))
                    .build()?;
                let url = format!("{base}/api/autonomous?limit={PAGE}&status={status}");
                let short = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
                let mut ours = open_loop(LIST_RATE, window, |i| {
                    let request = client.get(&url).bearer_auth(&keys[i % keys.len()]);
                    let short = short.clone();
                    async move {
                        let Ok(res) = request.send().await else {
                            return false;
                        };
                        if !res.status().is_success() {
                            return false;
                        }
                        let Ok(page) = res.json::<Value>().await else {
                            return false;
                        };
                        let n = page["items"].as_array().map_or(0, Vec::len);
                        if n == 0 {
                            short.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        true
                    }
                })
                .await;
                let reader = pool(&db_url, 4).await?;
                let mut raw = open_loop(LIST_RATE, window, |i| {
                    let (reader, tenant) = (reader.clone(), tenants[i % tenants.len()].clone());
                    async move {
                        sqlx::query(
                            "SELECT * FROM sessions WHERE ($1::text IS NULL OR tenant = $1)
                               AND status = $2 ORDER BY created_at DESC, id DESC LIMIT 50",
                        )
                        .bind(tenant)
                        .bind(status)
                        .fetch_all(&reader)
                        .await
                        .is_ok()
                    }
                })
                .await;
                reader.close().await;
                let empty = short.load(std::sync::atomic::Ordering::Relaxed);
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(Latencies {
                    p99: quantile(&mut ours, 0.99),
                    p50: quantile(&mut ours, 0.5),
                    raw_p99: quantile(&mut raw, 0.99),
                    raw_p50: quantile(&mut raw, 0.5),
                    empty,
                })
            })
    })
    .await?
}

/// p99 and p50 of GETs of `path` at `rate`/s for the window, keys rotating
/// over `keys`, from a thread of their own (as [`list_p99`]). No raw
/// counterpart: what these read has no one-statement equivalent worth
/// comparing (the sort they replaced read every session).
async fn get_p99(
    base: &str,
    path: String,
    keys: Vec<String>,
    rate: u32,
    window: Duration,
) -> BenchResult<(Option<Duration>, Option<Duration>)> {
    let url = format!("{base}{path}");
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(async move {
                let client = reqwest::Client::builder()
                    .timeout(Duration::from_secs(120))
                    .build()?;
                let mut took = open_loop(rate, window, |i| {
                    let request = client.get(&url).bearer_auth(&keys[i % keys.len()]);
                    async move {
                        match request.send().await {
                            Ok(res) if res.status().is_success() => res.bytes().await.is_ok(),
                            _ => false,
                        }
                    }
                })
                .await;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((
                    quantile(&mut took, 0.99),
                    quantile(&mut took, 0.5),
                ))
            })
    })
    .await?
}

/// The reads that used to grow with what is stored (SCALING.md): lists
/// sorted by `updated` and by `cost`, as the admin and as the tenants, and
/// `/metrics`, whose session counts by status it adds on every scrape.
async fn unbounded_reads(
    server: &Server,
    admin_key: &str,
    tenant_keys: &[String],
    n: usize,
    scale: &Scale,
) -> BenchResult<Vec<Row>> {
    let admin = vec![admin_key.to_string()];
    let cases = [
        ("sort=updated", "the global admin's key", &admin, LIST_RATE),
        (
            "sort=updated",
            "a tenant's key",
            &tenant_keys.to_vec(),
            LIST_RATE,
        ),
        ("sort=cost", "the global admin's key", &admin, LIST_RATE),
        (
            "sort=cost",
            "a tenant's key",
            &tenant_keys.to_vec(),
            LIST_RATE,
        ),
    ];
    let mut rows = Vec::new();
    for (sort, who, keys, rate) in cases {
        eprintln!("warden-bench: list {sort} as {who}");
        let path = format!("/api/autonomous?limit={PAGE}&{sort}");
        let (p99, p50) = get_p99(&server.base, path, keys.clone(), rate, scale.window).await?;
        rows.push(row(
            format!("  list p99 ({PAGE} rows, {sort}, no filter) at {rate}/s, {who}; {n} stored"),
            format!("{} (p50 {})", ms(p99), ms(p50)),
            "—".into(),
            "—".into(),
            "",
        ));
    }
    eprintln!("warden-bench: /metrics");
    let (p99, p50) = get_p99(&server.base, "/metrics".into(), admin, 5, scale.window).await?;
    rows.push(row(
        format!("  /metrics p99 at 5/s (its session counts by status); {n} stored"),
        format!("{} (p50 {})", ms(p99), ms(p50)),
        "—".into(),
        "—".into(),
        "",
    ));
    Ok(rows)
}

/// Keys of the global admin and of each tenant (operators).
async fn keys(base: &str, tenants: usize) -> BenchResult<(String, Vec<String>)> {
    let open = reqwest::Client::new();
    let admin = bench_key(&open, base, "ops", "admin", true).await?;
    let admin_client = super::client_with_key(&admin)?;
    let mut out = Vec::with_capacity(tenants);
    for t in 0..tenants {
        out.push(bench_key(&admin_client, base, &tenant_name(t), "operator", false).await?);
    }
    Ok((admin, out))
}

/// Phase `stored`: see the module's doc.
pub(crate) async fn stored_phase(
    opts: &Options,
    admin: &PgPool,
    scale: &Scale,
) -> BenchResult<Vec<Row>> {
    let n = scale.stored_sessions;
    let running = (n / 1_000).max(TENANTS);
    let waiting = n / 10;
    eprintln!("warden-bench: stored, {n} ended sessions of {TENANTS} tenants, {running} running");
    let server = Server::start(opts, admin, "stored").await?;
    let db = pool(&server.db_url, 2).await?;
    let (admin_key, tenant_keys) = keys(&server.base, TENANTS).await?;
    let clients: Vec<reqwest::Client> = tenant_keys
        .iter()
        .map(|k| super::client_with_key(k))
        .collect::<BenchResult<_>>()?;
    // A session that ran one step and ended: the stored rows' shape.
    let template = create_sessions(&clients[0], &server.base, 1, &finite_session(1, 0))
        .await?
        .remove(0);
    wait_for(&clients[0], &server.base, &template, |d| {
        !d["ended_at"].is_null()
    })
    .await?;
    let seeded = seed_stored(&db, &template, n).await?;
    eprintln!("warden-bench: seeded {n} in {:.1} s", seeded.as_secs_f64());
    let size = table_sizes(&db, "'sessions'").await?;
    let per_tenant = running / TENANTS;
    let mut running_ids = Vec::new();
    for client in &clients {
        running_ids.extend(
            create_sessions(client, &server.base, per_tenant, &cycling_session(1_000)).await?,
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut rows = vec![
        row(
            format!("  seeding {n} ended sessions (one INSERT … SELECT, then VACUUM ANALYZE)"),
            format!("{:.1} s", seeded.as_secs_f64()),
            "—".into(),
            "—".into(),
            "",
        ),
        row(
            format!("  the sessions table at {n} stored: heap; indexes"),
            size,
            "—".into(),
            "—".into(),
            "",
        ),
    ];
    rows.extend(list_rows(&server, &admin_key, &tenant_keys, n, running, scale).await?);
    rows.extend(unbounded_reads(&server, &admin_key, &tenant_keys, n, scale).await?);
    let restart = Restart {
        running_ids: &running_ids,
        waiting,
        tenant_keys: &tenant_keys,
    };
    rows.extend(startup(opts, admin, server, &db, restart, scale).await?);
    db.close().await;
    Ok(rows)
}

/// The four list rows of the stored phase: `running` and `interrupted`,
/// as the tenants (keys rotating) and as the global admin.
async fn list_rows(
    server: &Server,
    admin_key: &str,
    tenant_keys: &[String],
    n: usize,
    running: usize,
    scale: &Scale,
) -> BenchResult<Vec<Row>> {
    let all_tenants: Vec<Option<String>> = (0..TENANTS).map(|t| Some(tenant_name(t))).collect();
    let cases = [
        ("a tenant's key", "running"),
        ("a tenant's key", "interrupted"),
        ("the global admin's key", "running"),
        ("the global admin's key", "interrupted"),
    ]
    .map(|(who, status)| {
        let global = who.contains("admin");
        ListCase {
            label: who.into(),
            keys: if global {
                vec![admin_key.to_string()]
            } else {
                tenant_keys.to_vec()
            },
            tenants: if global {
                vec![None]
            } else {
                all_tenants.clone()
            },
            status,
        }
    });
    let mut rows = Vec::new();
    for case in &cases {
        eprintln!(
            "warden-bench: list status={} as {}",
            case.status, case.label
        );
        let measured = list_p99(&server.base, &server.db_url, case, scale.window).await?;
        if measured.empty > 0 {
            eprintln!(
                "warden-bench: warning: {} pages came back empty",
                measured.empty
            );
        }
        rows.push(measured.row(format!(
            "list p99 ({PAGE} rows, status={}) at {LIST_RATE}/s, {}; {n} stored of {TENANTS} tenants, {running} running",
            case.status, case.label
        )));
    }
    Ok(rows)
}

/// What the restart of [`startup`] starts from.
struct Restart<'a> {
    /// The sessions running when the server is killed.
    running_ids: &'a [String],
    /// Sessions to queue before the restart.
    waiting: usize,
    tenant_keys: &'a [String],
}

/// Heap and index sizes of `tables` (a quoted SQL list), summed, in MB.
async fn table_sizes(db: &PgPool, tables: &'static str) -> BenchResult<String> {
    let (heap, indexes): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT sum(pg_table_size(c.oid))::bigint, sum(pg_indexes_size(c.oid))::bigint
         FROM pg_class c WHERE c.relname IN ({tables}) AND c.relkind = 'r'"
    )))
    .fetch_one(db)
    .await?;
    Ok(format!(
        "{:.0} MB; {:.0} MB",
        heap as f64 / 1_048_576.0,
        indexes as f64 / 1_048_576.0
    ))
}

/// After the crash: `waiting` sessions queued (shaped as `template`), and
/// the dead replica's leases and heartbeat in the past, as they are once
/// the lease's 15 s have gone by.
async fn crashed_with_queue(
    db: &PgPool,
    template: &str,
    waiting: usize,
    orphans: usize,
) -> BenchResult<()> {
    let seeded = seed_queued(db, template, waiting).await?;
    eprintln!(
        "warden-bench: start-up with {waiting} queued ({:.1} s to seed), {orphans} orphaned",
        seeded.as_secs_f64()
    );
    sqlx::query(
        "UPDATE sessions SET lease_expires_at = now() - interval '1 minute'
         WHERE status = 'running'",
    )
    .execute(db)
    .await?;
    sqlx::query("UPDATE replicas SET heartbeat_at = now() - interval '1 hour'")
        .execute(db)
        .await?;
    Ok(())
}

/// Since `t0`, when the `orphans` were running again under a live lease,
/// and when twice as many were (the places full), polled every 100 ms
/// for [`WAIT_S`].
async fn picked_up(
    db: &PgPool,
    t0: Instant,
    orphans: i64,
) -> BenchResult<(Option<Duration>, Option<Duration>)> {
    let (mut rescued, mut full) = (None, None);
    let deadline = t0 + Duration::from_secs(WAIT_S);
    while Instant::now() < deadline && full.is_none() {
        let live = live_running(db).await?;
        if rescued.is_none() && live >= orphans {
            rescued = Some(t0.elapsed());
        }
        if live >= 2 * orphans {
            full = Some(t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((rescued, full))
}

/// The count of running sessions under a live lease.
async fn live_running(db: &PgPool) -> BenchResult<i64> {
    Ok(sqlx::query_scalar(
        "SELECT count(*) FROM sessions WHERE status = 'running' AND lease_expires_at > now()",
    )
    .fetch_one(db)
    .await?)
}

/// Start-up after a crash: the server is killed with its sessions running,
/// `waiting` queued sessions are added, the crashed replica's leases and
/// heartbeat are made to have lapsed (as they have after the lease's 15 s);
/// then a new process starts on the same database with room for the
/// orphans and as many of the queue, claiming at the default pace
/// (`WARDEN_CLAIMS_PER_TICK` 100 per 5-s heartbeat; the first batch is
/// claimed before the listener answers). Times process start → `/readyz`
/// answering 200, → the orphans running again, → its places full.
async fn startup(
    opts: &Options,
    admin: &PgPool,
    mut server: Server,
    db: &PgPool,
    restart: Restart<'_>,
    scale: &Scale,
) -> BenchResult<Vec<Row>> {
    let Restart {
        running_ids,
        waiting,
        tenant_keys,
    } = restart;
    let orphans = running_ids.len();
    let _ = server.child.kill();
    let _ = server.child.wait();
    let template = running_ids.first().ok_or("no running session")?;
    crashed_with_queue(db, template, waiting, orphans).await?;
    let places = (2 * orphans).to_string();
    server.owns_db = false;
    let (db_name, db_url) = (server.db_name.clone(), server.db_url.clone());
    drop(server);
    let t0 = Instant::now();
    let restarted = Server::launch(
        opts,
        &db_name,
        &db_url,
        true,
        &[("WARDEN_MAX_RUNNING", places.as_str())],
        None,
    )
    .await?;
    let ready = t0.elapsed();
    let (rescued, full) = picked_up(db, t0, orphans as i64).await?;
    // The queue's own list: each queued row carries its queue position.
    let tenants: Vec<Option<String>> = (0..TENANTS).map(|t| Some(tenant_name(t))).collect();
    let case = ListCase {
        label: "a tenant's key".into(),
        keys: tenant_keys.to_vec(),
        tenants,
        status: "queued",
    };
    let queued_list = list_p99(&restarted.base, &db_url, &case, scale.window).await?;
    restarted.stop(admin).await;
    let stored = scale.stored_sessions;
    let secs_of = |d: Option<Duration>| {
        d.map_or(format!("— (not within {WAIT_S} s)"), |d| {
            format!("{:.2} s", d.as_secs_f64())
        })
    };
    Ok(vec![
        row(
            format!(
                "start-up to ready (process start → /readyz 200), {stored} stored, {waiting} queued, {orphans} orphaned running"
            ),
            format!("{:.2} s", ready.as_secs_f64()),
            "—".into(),
            "—".into(),
            "< 5 s",
        )
        .judged(Some(ready < Duration::from_secs(5))),
        row(
            format!("  process start → the {orphans} orphans running again"),
            secs_of(rescued),
            "—".into(),
            "—".into(),
            "",
        ),
        row(
            format!("  process start → its {} places full ({orphans} more from the queue)", 2 * orphans),
            secs_of(full),
            "—".into(),
            "—".into(),
            "",
        ),
        queued_list.row(format!(
            "list p99 ({PAGE} rows, status=queued) at {LIST_RATE}/s, a tenant's key; {waiting} queued"
        )),
    ])
}

// ---------------------------------------------------------------- deep

/// A scripted session of 1-ms-free cycling steps with the largest
/// iteration cap a session takes.
fn deep_session() -> Value {
    let mut body = cycling_session(0);
    body["limits"] = json!({ "max_iterations": 1_000_000, "max_tokens": 10_000_000_000u64,
                             "max_wall_time_ms": 86_400_000 });
    body
}

/// What a statement of [`deepen`] moves its rows by.
#[derive(Clone, Copy)]
enum Shift {
    None,
    Iterations,
    Events,
}

/// The statements of [`deepen`], each with the shift it takes as `$2`.
const DEEPEN: [(&str, Shift); 11] = [
    (
        "CREATE TEMP TABLE deep_events ON COMMIT DROP AS
         SELECT kind, data, row_number() OVER (ORDER BY seq) - 1 AS rn FROM events
         WHERE session_id = $1::uuid AND kind NOT IN ('status_changed', 'budget_warning')",
        Shift::None,
    ),
    (
        "UPDATE iterations SET number = number + $2 WHERE session_id = $1::uuid",
        Shift::Iterations,
    ),
    (
        "INSERT INTO iterations (session_id, number, run, action, outcome, tokens, duration_ms,
                                 record, effects, started_at, finished_at, cycle, usage)
         SELECT i.session_id, k, i.run, i.action, i.outcome, i.tokens, i.duration_ms,
                jsonb_set(i.record::jsonb, '{number}', to_jsonb(k))::json, i.effects,
                now() - interval '10 days', now() - interval '10 days', i.cycle, i.usage
         FROM generate_series(1, $2) k,
              (SELECT * FROM iterations WHERE session_id = $1::uuid
               ORDER BY number LIMIT 1) i",
        Shift::Iterations,
    ),
    (
        "UPDATE events SET seq = seq + $2 WHERE session_id = $1::uuid",
        Shift::Events,
    ),
    (
        "INSERT INTO events (session_id, seq, kind, data, created_at)
         SELECT $1::uuid, k, e.kind, e.data, now() - interval '10 days'
         FROM generate_series(1, $2) k
         JOIN deep_events e ON e.rn = k % (SELECT count(*) FROM deep_events)",
        Shift::Events,
    ),
    (
        "CREATE TEMP TABLE deep_checkpoints ON COMMIT DROP AS
         SELECT * FROM checkpoints WHERE session_id = $1::uuid ORDER BY id",
        Shift::None,
    ),
    (
        "DELETE FROM checkpoints WHERE session_id = $1::uuid",
        Shift::None,
    ),
    (
        "INSERT INTO checkpoints (session_id, iteration, reason, state, created_at)
         SELECT $1::uuid, k * 10, 'interval', c.state, now() - interval '10 days'
         FROM generate_series(1, $2 / 10) k,
              (SELECT state FROM deep_checkpoints ORDER BY id LIMIT 1) c",
        Shift::Iterations,
    ),
    // Its own checkpoints after them (newer ids), their counters moved.
    (
        "INSERT INTO checkpoints (session_id, iteration, reason, state, created_at)
         SELECT session_id, iteration + $2, reason,
                jsonb_set(jsonb_set(jsonb_set(state::jsonb,
                    '{usage,iterations}', to_jsonb((state->'usage'->>'iterations')::bigint + $2)),
                    '{last_checkpoint_step}', to_jsonb((state->>'last_checkpoint_step')::bigint + $2)),
                    '{history}', coalesce((SELECT jsonb_agg(jsonb_set(h, '{number}',
                                     to_jsonb((h->>'number')::bigint + $2)))
                                 FROM jsonb_array_elements(state::jsonb->'history') h), '[]'))::json,
                created_at
         FROM deep_checkpoints WHERE session_id = $1::uuid ORDER BY id",
        Shift::Iterations,
    ),
    (
        "UPDATE sessions SET iterations = iterations + $2, tokens_used = tokens_used + $2,
                             last_checkpoint_iteration = last_checkpoint_iteration + $2,
                             attempt_iteration = CASE WHEN attempt_iteration > 0
                                                 THEN attempt_iteration + $2 ELSE 0 END
         WHERE id = $1::uuid",
        Shift::Iterations,
    ),
    (
        "UPDATE sessions SET last_event_seq = last_event_seq + $2 WHERE id = $1::uuid",
        Shift::Events,
    ),
];

/// Moves paused session `id` (at iteration `at`) to iteration `at + d`:
/// its own rows are renumbered past `d`, and the history before them is
/// filled with copies of its own iterations, events and checkpoints (one
/// checkpoint per 10 iterations, its `limits.checkpoint_interval`), each
/// in one `INSERT … SELECT`.
async fn deepen(db: &PgPool, id: &str, at: i64, d: i64) -> BenchResult<()> {
    let mut tx = db.begin().await?;
    let last_seq: i64 =
        sqlx::query_scalar("SELECT last_event_seq FROM sessions WHERE id = $1::uuid")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
    // As many events per iteration as the session has written so far.
    let e = d * last_seq / at.max(1);
    for (sql, shift) in DEEPEN {
        let query = sqlx::query(sql).bind(id);
        let query = match shift {
            Shift::None => query,
            Shift::Iterations => query.bind(d),
            Shift::Events => query.bind(e),
        };
        query
            .execute(&mut *tx)
            .await
            .map_err(|err| format!("deepen: {err}: {sql}"))?;
    }
    tx.commit().await?;
    settle(db, "iterations, events, checkpoints").await
}

/// Iterations per second of session `id` over `window` (from its own count).
async fn session_rate(
    client: &reqwest::Client,
    base: &str,
    id: &str,
    window: Duration,
) -> BenchResult<(f64, i64)> {
    let count = |doc: Value| doc["iterations"].as_i64().unwrap_or(0);
    let at = count(wait_for(client, base, id, |_| true).await?);
    let t = Instant::now();
    tokio::time::sleep(window).await;
    let doc = wait_for(client, base, id, |_| true).await?;
    if doc["status"] != "running" {
        return Err(format!("session {id} stopped running during the window: {doc}").into());
    }
    Ok(((count(doc) - at) as f64 / t.elapsed().as_secs_f64(), at))
}

/// Pauses session `id` and waits until it is paused.
async fn pause(client: &reqwest::Client, base: &str, id: &str) -> BenchResult<()> {
    client
        .post(format!("{base}/api/autonomous/{id}/pause"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .send()
        .await?
        .error_for_status()?;
    wait_for(client, base, id, |d| d["status"] == "paused").await?;
    Ok(())
}

/// A session run through the API for a few hundred iterations, paused,
/// and moved to iteration `target`; with the time the move took.
async fn deep_session_at(
    client: &reqwest::Client,
    base: &str,
    db: &PgPool,
    target: i64,
) -> BenchResult<(String, Duration)> {
    let deep = create_sessions(client, base, 1, &deep_session())
        .await?
        .remove(0);
    wait_for(client, base, &deep, |d| {
        d["iterations"].as_i64() >= Some(200)
    })
    .await?;
    pause(client, base, &deep).await?;
    let at = wait_for(client, base, &deep, |_| true).await?["iterations"]
        .as_i64()
        .unwrap_or(0);
    // A scripted step is chosen by its iteration number: moved by a whole
    // number of cycles, the session goes on with the part it was at (moved
    // by any other count it would redo parts, and the gate pauses it for
    // rework, as the smoke run at iteration 20,000 showed).
    let cycle = super::CYCLE as i64;
    let d = (target - at) / cycle * cycle;
    let t = Instant::now();
    deepen(db, &deep, at, d).await?;
    let seeded = t.elapsed();
    eprintln!(
        "warden-bench: deep session seeded in {:.1} s",
        seeded.as_secs_f64()
    );
    Ok((deep, seeded))
}

/// Phase `deep`: see the module's doc.
pub(crate) async fn deep_phase(
    opts: &Options,
    admin: &PgPool,
    client: &reqwest::Client,
    scale: &Scale,
) -> BenchResult<Vec<Row>> {
    let target = scale.deep_iteration;
    eprintln!("warden-bench: deep, one session at iteration ~{target} beside one at ~10");
    let server = Server::start(opts, admin, "deep").await?;
    let base = server.base.clone();
    let db = pool(&server.db_url, 2).await?;
    // The fresh one first, alone.
    let fresh = create_sessions(client, &base, 1, &deep_session())
        .await?
        .remove(0);
    wait_for(client, &base, &fresh, |d| {
        d["iterations"].as_i64() >= Some(10)
    })
    .await?;
    let (fresh_rate, fresh_at) = session_rate(client, &base, &fresh, scale.window).await?;
    pause(client, &base, &fresh).await?;
    let (deep, seeded) = deep_session_at(client, &base, &db, target).await?;
    let size = table_sizes(&db, "'iterations', 'events', 'checkpoints'").await?;
    let sent = Instant::now();
    client
        .post(format!("{base}/api/autonomous/{deep}/resume"))
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .send()
        .await?
        .error_for_status()?;
    let resumed = sent.elapsed();
    let (deep_rate, deep_at) = session_rate(client, &base, &deep, scale.window).await?;
    db.close().await;
    server.stop(admin).await;
    Ok(vec![
        row(
            format!("  seeding one session's history to iteration {target} (iterations, events, checkpoints)"),
            format!("{:.1} s", seeded.as_secs_f64()),
            "—".into(),
            "—".into(),
            "",
        ),
        row(
            "  iterations, events and checkpoints tables with it: heap; indexes",
            size,
            "—".into(),
            "—".into(),
            "",
        ),
        row(
            format!("  resume → running, the session at iteration {}", deep_at),
            ms(Some(resumed)),
            "—".into(),
            "—".into(),
            "",
        ),
        row(
            format!(
                "iterations/s of one session at iteration ~{deep_at} vs one at ~{fresh_at} (0-ms steps)"
            ),
            format!("{deep_rate:.0}"),
            format!("{fresh_rate:.0} at ~{fresh_at}"),
            ratio(Some(deep_rate), Some(fresh_rate)),
            "≥ 0.95×",
        )
        .judged(Some(deep_rate >= 0.95 * fresh_rate)),
    ])
}
