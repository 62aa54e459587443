//! The store's iteration commits under concurrency: many sessions finishing
//! steps at once are committed in shared transactions (group commit), and
//! each still gets exactly its own rows, counters and gap-free events.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use serde_json::json;
use sqlx::{PgPool, Row};
use uuid::Uuid;
use warden::policy::lifecycle::Mode;
use warden::store::{
    Counters, JsonText, Lease, NewEvent, NewIteration, NewSession, Store, StoreError,
};

const LEASE_TTL: Duration = Duration::from_secs(60);

/// A running session held by a fresh owner; returns its lease.
async fn running_session(store: &Store) -> Lease {
    let config = common::test_config();
    let new = NewSession {
        id: Uuid::new_v4(),
        goal: "count to five".into(),
        mode: Mode::Fixed,
        limits: config.defaults.limits_for(Mode::Fixed),
        executor: serde_json::from_value(json!({"kind": "scripted", "steps": []})).unwrap(),
        original_goal: None,
        refinement: None,
        criteria: Vec::new(),
        milestones: Vec::new(),
        refinement_tokens: 0,
        tenant: "test".into(),
    };
    let (_, lease) = store
        .insert_session(&new, Some(Uuid::new_v4()), LEASE_TTL, &[])
        .await
        .expect("session inserted");
    lease.expect("a session with an owner has a lease")
}

fn iteration(number: i64) -> NewIteration {
    let now = Utc::now();
    NewIteration {
        number,
        run: 1,
        action: format!("step-{number}"),
        outcome: "success",
        tokens: 10,
        duration_ms: 0,
        record: JsonText::from(&json!({"number": number})),
        effects: JsonText::from(&json!({})),
        transcript: None,
        cycle: 1,
        next_cycle: None,
        checkpoint: None,
        started_at: now,
        finished_at: now,
        usage: None,
        cost_usd: None,
        price_pattern: None,
        price_valid_from: None,
    }
}

fn counters(number: i64) -> Counters {
    let number = u64::try_from(number).expect("a step number");
    Counters {
        usage: warden::policy::guardrails::Usage {
            iterations: number,
            tokens: number * 10,
            ..Default::default()
        },
        ..Counters::default()
    }
}

async fn commit(store: &Store, lease: Lease, number: i64) -> Result<(), StoreError> {
    let events = vec![
        NewEvent::new("iteration_started", json!({"number": number})),
        NewEvent::new("iteration_completed", json!({"number": number})),
    ];
    store
        .commit_iteration(
            &lease,
            iteration(number),
            counters(number),
            (None, None),
            events,
            None,
        )
        .await
        .map(|_| ())
}

/// Event sequence numbers of a session, in order.
async fn event_seqs(pool: &PgPool, id: Uuid) -> Vec<i64> {
    sqlx::query_scalar("SELECT seq FROM events WHERE session_id = $1 ORDER BY seq")
        .bind(id)
        .fetch_all(pool)
        .await
        .expect("events read")
}

#[tokio::test]
async fn concurrent_sessions_share_commits_and_keep_their_own_rows() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    const SESSIONS: usize = 120;
    const STEPS: i64 = 5;
    let store = Arc::new(crate::common::store_on(pool.clone()));
    let mut leases = Vec::new();
    for _ in 0..SESSIONS {
        leases.push(running_session(&store).await);
    }
    // One runner whose lease was taken over: every commit it tries must fail
    // alone, whatever group it lands in.
    let stolen = Lease {
        session_id: leases[0].session_id,
        token: Uuid::new_v4(),
    };
    let events_before = event_seqs(&pool, leases[1].session_id).await.len() as i64;

    let mut tasks = tokio::task::JoinSet::new();
    for (index, lease) in leases.iter().copied().enumerate() {
        let store = store.clone();
        let lease = if index == 0 { stolen } else { lease };
        tasks.spawn(async move {
            let mut results = Vec::new();
            for number in 1..=STEPS {
                results.push(commit(&store, lease, number).await);
            }
            (index, results)
        });
    }
    while let Some(joined) = tasks.join_next().await {
        let (index, results) = joined.expect("committer task ran");
        for result in results {
            match (index, result) {
                (0, Err(StoreError::LeaseLost(id))) => assert_eq!(id, stolen.session_id),
                (0, other) => panic!("the stolen lease committed: {other:?}"),
                (_, Ok(())) => {}
                (_, Err(err)) => panic!("session {index} failed to commit: {err}"),
            }
        }
    }

    for lease in &leases[1..] {
        let row = sqlx::query(
            "SELECT iterations, tokens_used, last_event_seq,
                    (SELECT array_agg(number ORDER BY number) FROM iterations WHERE session_id = $1) AS numbers
             FROM sessions WHERE id = $1",
        )
        .bind(lease.session_id)
        .fetch_one(&pool)
        .await
        .expect("session read");
        assert_eq!(row.get::<i64, _>("iterations"), STEPS);
        assert_eq!(row.get::<i64, _>("tokens_used"), STEPS * 10);
        assert_eq!(
            row.get::<Vec<i64>, _>("numbers"),
            (1..=STEPS).collect::<Vec<_>>()
        );
        let seqs = event_seqs(&pool, lease.session_id).await;
        let expected: Vec<i64> = (1..=events_before + 2 * STEPS).collect();
        assert_eq!(seqs, expected, "events are gap-free and numbered once");
        assert_eq!(
            row.get::<i64, _>("last_event_seq"),
            *expected.last().unwrap_or(&0)
        );
    }
    let stolen_rows: i64 =
        sqlx::query_scalar("SELECT count(*) FROM iterations WHERE session_id = $1")
            .bind(stolen.session_id)
            .fetch_one(&pool)
            .await
            .expect("iterations counted");
    assert_eq!(stolen_rows, 0, "nothing was written under the stolen lease");

    // Rows written by one transaction share its xmin: fewer transactions than
    // iterations means commits were shared.
    let (rows, transactions): (i64, i64) =
        sqlx::query_as("SELECT count(*), count(DISTINCT xmin::text) FROM iterations")
            .fetch_one(&pool)
            .await
            .expect("transactions counted");
    assert_eq!(rows, (SESSIONS as i64 - 1) * STEPS);
    assert!(
        transactions < rows,
        "{rows} iterations were committed in {transactions} transactions"
    );
}

#[tokio::test]
async fn a_failing_iteration_does_not_fail_the_others_in_its_group() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    const SESSIONS: usize = 40;
    let store = Arc::new(crate::common::store_on(pool.clone()));
    let mut leases = Vec::new();
    for _ in 0..SESSIONS {
        leases.push(running_session(&store).await);
    }
    let broken = leases[0];
    commit(&store, broken, 1)
        .await
        .expect("first iteration commits");

    // The broken session commits iteration 1 again (a primary-key violation)
    // while the others commit theirs.
    let mut tasks = tokio::task::JoinSet::new();
    for (index, lease) in leases.iter().copied().enumerate() {
        let store = store.clone();
        tasks.spawn(async move { (index, commit(&store, lease, 1).await) });
    }
    while let Some(joined) = tasks.join_next().await {
        let (index, result) = joined.expect("committer task ran");
        match (index, result) {
            (0, Err(StoreError::Database(_))) => {}
            (0, other) => panic!("the duplicate iteration was accepted: {other:?}"),
            (_, Ok(())) => {}
            (_, Err(err)) => panic!("session {index} failed beside the broken one: {err}"),
        }
    }
    let seqs = event_seqs(&pool, broken.session_id).await;
    assert_eq!(
        seqs.len(),
        2,
        "the failed commit appended no events: {seqs:?}"
    );
    let committed: i64 = sqlx::query_scalar("SELECT count(*) FROM iterations")
        .fetch_one(&pool)
        .await
        .expect("iterations counted");
    assert_eq!(committed, SESSIONS as i64);
}

#[tokio::test]
async fn old_and_new_runners_of_one_session_commit_at_once() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    const SESSIONS: usize = 60;
    let store = Arc::new(crate::common::store_on(pool.clone()));
    let mut tasks = tokio::task::JoinSet::new();
    let mut leases = Vec::new();
    for _ in 0..SESSIONS {
        let lease = running_session(&store).await;
        leases.push(lease);
        // A runner whose lease was taken over finishes a later step, without
        // events, while the new holder commits its own: both land in the
        // committer's queue together, often in one group.
        let stale = Lease {
            session_id: lease.session_id,
            token: Uuid::new_v4(),
        };
        let current_store = store.clone();
        tasks.spawn(async move { (true, commit(&current_store, lease, 1).await) });
        let stale_store = store.clone();
        tasks.spawn(async move {
            let no_events = Vec::new();
            let result = stale_store
                .commit_iteration(
                    &stale,
                    iteration(2),
                    counters(2),
                    (None, None),
                    no_events,
                    None,
                )
                .await
                .map(|_| ());
            (false, result)
        });
    }
    while let Some(joined) = tasks.join_next().await {
        match joined.expect("committer task ran") {
            (true, result) => result.expect("the lease holder commits"),
            (false, result) => assert!(
                matches!(result, Err(StoreError::LeaseLost(_))),
                "the stale runner committed: {result:?}"
            ),
        }
    }
    for lease in leases {
        let numbers: Vec<i64> = sqlx::query_scalar(
            "SELECT number FROM iterations WHERE session_id = $1 ORDER BY number",
        )
        .bind(lease.session_id)
        .fetch_all(&pool)
        .await
        .expect("iterations read");
        assert_eq!(numbers, vec![1], "only the holder's iteration is stored");
        assert_eq!(event_seqs(&pool, lease.session_id).await, vec![1, 2]);
    }
}

/// The counts by status straight from the sessions table, for `tenant`
/// (`None`: every tenant).
async fn counted(pool: &PgPool, tenant: Option<&str>) -> std::collections::BTreeMap<String, i64> {
    sqlx::query(
        "SELECT status, count(*) FROM sessions WHERE $1::text IS NULL OR tenant = $1 GROUP BY status",
    )
    .bind(tenant)
    .fetch_all(pool)
    .await
    .expect("counted")
    .into_iter()
    .map(|r| (r.get::<String, _>(0), r.get::<i64, _>(1)))
    .collect()
}

#[tokio::test]
async fn status_counts_follow_inserts_status_changes_and_deletes() {
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let store = crate::common::store_on(pool.clone());
    let mut leases = Vec::new();
    for _ in 0..6 {
        leases.push(running_session(&store).await);
    }
    let ids: Vec<Uuid> = leases.iter().map(|l| l.session_id).collect();
    // Two end, one is ended twice over (no change), one is deleted; a bulk
    // insert adds three of another tenant in one statement.
    sqlx::query("UPDATE sessions SET status = 'stopped', reason = 'user_stop' WHERE id = ANY($1)")
        .bind(&ids[..2])
        .execute(&pool)
        .await
        .expect("ended");
    sqlx::query("UPDATE sessions SET status = status WHERE id = $1")
        .bind(ids[0])
        .execute(&pool)
        .await
        .expect("no change");
    sqlx::query("DELETE FROM sessions WHERE id = $1")
        .bind(ids[5])
        .execute(&pool)
        .await
        .expect("deleted");
    sqlx::query(
        "INSERT INTO sessions (id, tenant, goal, mode, status, reason, limits, executor)
         SELECT gen_random_uuid(), 'other', goal, mode, 'completed', 'goal_achieved', limits, executor
         FROM sessions, generate_series(1, 3) WHERE id = $1",
    )
    .bind(ids[2])
    .execute(&pool)
    .await
    .expect("bulk insert");
    for tenant in [None, Some("test"), Some("other")] {
        let kept = store.status_counts(tenant).await.expect("kept counts");
        assert_eq!(
            kept,
            counted(&pool, tenant).await,
            "{tenant:?}, deltas pending"
        );
    }
    let expected = std::collections::BTreeMap::from([
        ("completed".to_string(), 3),
        ("running".to_string(), 3),
        ("stopped".to_string(), 2),
    ]);
    assert_eq!(store.sessions_by_status().await.expect("metrics"), expected);
    // Folded, the same counts, from the counter rows alone.
    store.fold_tenant_counts().await.expect("folded");
    let pending: i64 = sqlx::query_scalar("SELECT count(*) FROM session_status_count_deltas")
        .fetch_one(&pool)
        .await
        .expect("deltas");
    assert_eq!(pending, 0);
    for tenant in [None, Some("test"), Some("other")] {
        let kept = store.status_counts(tenant).await.expect("kept counts");
        assert_eq!(kept, counted(&pool, tenant).await, "{tenant:?}, folded");
    }
}

/// Every page of `order` (two sessions a page) under `scope`, in order.
async fn listed_in(
    store: &Store,
    order: warden::store::SessionOrder,
    scope: &warden::store::TenantScope,
) -> Vec<Uuid> {
    let filter = warden::store::SessionFilter::default();
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list_sessions(&filter, order, after, 2, scope)
            .await
            .expect("a page");
        seen.extend(page.iter().map(|s| s.id));
        match page.last() {
            Some(last) if page.len() == 2 => after = Some(order.cursor_of(last)),
            _ => return seen,
        }
    }
}

#[tokio::test]
async fn lists_by_update_and_cost_merge_running_and_settled_sessions_in_order() {
    use warden::store::{SessionOrder, SessionSortKey, TenantScope};
    let db = crate::common::TestDb::new().await;
    let pool = db.pool.clone();
    let store = crate::common::store_on(pool.clone());
    let mut ids = Vec::new();
    for _ in 0..7 {
        ids.push(running_session(&store).await.session_id);
    }
    // Interleaved: running sessions changed as commits change them (no
    // status named), others ended, paused or queued at times between, one
    // ended and resumed, one changed again after it ended.
    let at = |minutes: i64| Utc::now() - chrono::Duration::minutes(minutes);
    let set = |id: Uuid, sql: &'static str, minutes: i64, cost: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query(sql)
                .bind(id)
                .bind(at(minutes))
                .bind(cost.parse::<rust_decimal::Decimal>().expect("cost"))
                .execute(&pool)
                .await
                .expect("changed");
        }
    };
    const COMMIT: &str = "UPDATE sessions SET updated_at = $2, cost_usd = $3 WHERE id = $1";
    const END: &str = "UPDATE sessions SET status = 'completed', reason = 'goal_achieved',
                       updated_at = $2, cost_usd = $3, ended_at = $2 WHERE id = $1";
    const PAUSE: &str = "UPDATE sessions SET status = 'paused', reason = 'user_pause',
                         updated_at = $2, cost_usd = $3 WHERE id = $1";
    const RESUME: &str = "UPDATE sessions SET status = 'running', reason = NULL,
                          updated_at = $2, cost_usd = $3, ended_at = NULL WHERE id = $1";
    set(ids[0], COMMIT, 10, "0.5").await;
    set(ids[1], END, 20, "2.5").await;
    set(ids[2], COMMIT, 30, "1.5").await;
    set(ids[3], PAUSE, 40, "0.25").await;
    set(ids[4], END, 50, "3").await;
    set(ids[4], RESUME, 5, "3").await;
    set(ids[5], END, 60, "0.75").await;
    set(ids[5], COMMIT, 15, "4").await;
    set(ids[6], END, 25, "1.5").await;
    let kept: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sessions
         WHERE settled_updated_at IS DISTINCT FROM CASE WHEN status <> 'running' THEN updated_at END
            OR settled_cost_usd IS DISTINCT FROM CASE WHEN status <> 'running' THEN cost_usd END",
    )
    .fetch_one(&pool)
    .await
    .expect("settled keys");
    assert_eq!(kept, 0, "the settled keys follow status, time and cost");
    for (key, column) in [
        (SessionSortKey::Updated, "updated_at"),
        (SessionSortKey::Cost, "cost_usd"),
    ] {
        for descending in [true, false] {
            let dir = if descending { "DESC" } else { "ASC" };
            let expected: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT id FROM sessions ORDER BY {column} {dir}, id {dir}"
            )))
            .fetch_all(&pool)
            .await
            .expect("ordered");
            let order = SessionOrder { key, descending };
            for scope in [TenantScope::Global, TenantScope::tenant_only("test")] {
                let listed = listed_in(&store, order, &scope).await;
                assert_eq!(listed, expected, "{column} {dir}, {scope:?}");
            }
            let other = listed_in(&store, order, &TenantScope::tenant_only("other")).await;
            assert!(other.is_empty(), "another tenant lists none: {other:?}");
        }
    }
}

// A caller that gives up while its transaction begins (a request timed
// out, a worker hung up on its waiting heartbeat) must not leave the
// connection inside a transaction: the statements that use the connection
// next would join it and never commit. One connection, so each insert runs
// on the connection of the begin given up just before it.
#[tokio::test]
#[ignore = "needs a Postgres server: a pool of its own beside the test database's"]
async fn a_begin_given_up_leaves_no_transaction_for_the_next_statement() {
    common::require_server_postgres("a pool of its own beside the test database's");
    let db = common::TestDb::new().await;
    let options = (*db.pool.connect_options()).clone();
    let one = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .expect("a one-connection pool");
    sqlx::query("CREATE TABLE given_up (n int)")
        .execute(&one)
        .await
        .expect("table");
    for n in 0..20 {
        // Polled once, then dropped while its `BEGIN` is under way.
        tokio::select! {
            biased;
            _ = warden::store::begin_detached(&one) => {}
            () = std::future::ready(()) => {}
        }
        sqlx::query("INSERT INTO given_up VALUES ($1)")
            .bind(n)
            .execute(&one)
            .await
            .expect("insert");
        // Seen committed from another connection.
        let (seen,): (i64,) = sqlx::query_as("SELECT count(*) FROM given_up")
            .fetch_one(&db.pool)
            .await
            .expect("count");
        assert_eq!(seen, i64::from(n) + 1, "insert {n} committed");
    }
}
