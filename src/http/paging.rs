//! What every paged list shares: the page size a query may ask for, and
//! filling a page in key order up to a row count and a byte budget.

use std::future::Future;

use super::error::{ApiError, ApiResult};
use super::views::{AfterPage, DecisionQuery, HistoryPageQuery, PAGE_BYTE_BUDGET, fits_budget};

/// Largest page of the session list.
pub const MAX_LIST_LIMIT: i64 = 200;
/// Largest page of a session's iterations, checkpoints, events, decisions or reflections.
pub const MAX_PAGE_LIMIT: i64 = 500;
/// Page size of a session's history when the query names none.
pub const DEFAULT_PAGE_LIMIT: i64 = 100;

/// The query of a per-session history: where its page starts and how long
/// it may be.
pub trait Paging {
    /// The number (iteration number, checkpoint id, event seq) the page
    /// starts after.
    fn after(&self) -> Option<i64>;
    /// The page size asked for.
    fn limit(&self) -> Option<i64>;
}

impl Paging for AfterPage {
    fn after(&self) -> Option<i64> {
        self.after
    }
    fn limit(&self) -> Option<i64> {
        self.limit
    }
}

impl Paging for HistoryPageQuery {
    fn after(&self) -> Option<i64> {
        self.after
    }
    fn limit(&self) -> Option<i64> {
        self.limit
    }
}

impl Paging for DecisionQuery {
    fn after(&self) -> Option<i64> {
        self.after
    }
    fn limit(&self) -> Option<i64> {
        self.limit
    }
}

/// The page size: `limit`, or `default` when absent; a 400 outside 1..=`max`.
pub fn page_limit(limit: Option<i64>, default: i64, max: i64) -> ApiResult<i64> {
    match limit {
        None => Ok(default),
        Some(l) if (1..=max).contains(&l) => Ok(l),
        Some(l) => Err(ApiError::bad_request(format!(
            "limit must be between 1 and {max}, got {l}"
        ))),
    }
}

/// The key to continue after: the last row's, when the page came back full
/// (a shorter page is the last one).
pub fn next_after<T, K>(rows: &[T], limit: i64, key: impl Fn(&T) -> K) -> Option<K> {
    (rows.len() as i64 == limit)
        .then(|| rows.last().map(key))
        .flatten()
}

/// Fills a page of up to `limit` rows after `after`, read `batch` at a time,
/// ending early at `PAGE_BYTE_BUDGET` as `weigh` counts (a list whose rows
/// weigh nothing reads its page at once with a `batch` of `limit`): the rows
/// and the key to continue after (null on the last page).
pub async fn fill_page<T, F, Fut>(
    after: i64,
    limit: i64,
    batch: i64,
    mut read: F,
    key: impl Fn(&T) -> i64,
    mut weigh: impl FnMut(&mut T) -> usize,
) -> ApiResult<(Vec<T>, Option<i64>)>
where
    F: FnMut(i64, i64) -> Fut,
    Fut: Future<Output = ApiResult<Vec<T>>>,
{
    let mut items = Vec::new();
    let mut used = 0usize;
    let mut cursor = after;
    loop {
        let want = (limit - items.len() as i64).min(batch);
        let rows = read(cursor, want).await?;
        let fetched = rows.len() as i64;
        for mut row in rows {
            let weight = weigh(&mut row);
            if !fits_budget(items.len(), used, weight, PAGE_BYTE_BUDGET) {
                // Full by bytes: the client goes on after the last row given.
                let next = items.last().map(&key);
                return Ok((items, next));
            }
            used = used.saturating_add(weight);
            cursor = key(&row);
            items.push(row);
        }
        if fetched < want {
            return Ok((items, None));
        }
        if items.len() as i64 == limit {
            return Ok((items, Some(cursor)));
        }
    }
}
