//! Live streams (Server-Sent Events). Every event is read from Postgres by
//! sequence number, so a reconnect with `Last-Event-ID` continues without a
//! gap or a duplicate, whichever replica wrote it. An in-process
//! announcement wakes a stream early; a periodic re-read covers events
//! written by other replicas. Nothing is buffered per client beyond one
//! page, so a client that stops reading never slows a session.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use futures::Stream;
use tokio::sync::broadcast;
use uuid::Uuid;

use super::views::{EventView, SessionView};
use crate::policy::lifecycle::Status;
use crate::session::TenantScope;
use crate::session::{LoggedEvent, SessionReads, SessionService};

/// Live-stream connections per tenant (`WARDEN_TENANT_MAX_STREAMS`): a
/// slot is taken when a stream starts and given back when its response
/// body is dropped, that is when the client goes away.
#[derive(Clone)]
pub struct StreamSlots {
    max: usize,
    open: std::sync::Arc<std::sync::Mutex<HashMap<String, usize>>>,
}

/// One open stream's hold on its tenant's slots.
pub struct StreamSlot {
    tenant: String,
    open: std::sync::Arc<std::sync::Mutex<HashMap<String, usize>>>,
}

impl StreamSlots {
    /// At most `max` open streams per tenant.
    pub fn new(max: usize) -> StreamSlots {
        StreamSlots {
            max,
            open: Default::default(),
        }
    }

    /// A slot for one more stream of `tenant`, or the 429 that says the limit.
    pub fn acquire(&self, tenant: &str) -> Result<StreamSlot, super::error::ApiError> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let count = open.entry(tenant.to_string()).or_insert(0);
        if *count >= self.max {
            return Err(super::error::ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "stream_limit",
                format!(
                    "tenant {tenant:?} already has {} live streams open, the most WARDEN_TENANT_MAX_STREAMS={} allows; close one first",
                    *count, self.max
                ),
            ));
        }
        *count += 1;
        Ok(StreamSlot {
            tenant: tenant.to_string(),
            open: self.open.clone(),
        })
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = open.get_mut(&self.tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.tenant);
            }
        }
    }
}

/// Holds `slot` for as long as the stream lives.
fn holding<S: Stream>(stream: S, slot: StreamSlot) -> impl Stream<Item = S::Item> {
    use futures::StreamExt;
    stream.map(move |item| {
        let _held = &slot;
        item
    })
}

/// How often a stream re-reads Postgres without an announcement.
const POLL: Duration = Duration::from_millis(500);
/// Events read per query.
const PAGE: i64 = 200;

/// Whether the request asks for an event stream.
pub fn wants_stream(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

/// `Last-Event-ID` as a number, if sent.
pub fn last_event_id(headers: &HeaderMap) -> Option<i64> {
    headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

/// Waits for an announcement about `id` (or any lag) or until `POLL` elapses.
async fn wait_for(rx: &mut broadcast::Receiver<Uuid>, id: Option<Uuid>) {
    let deadline = tokio::time::Instant::now() + POLL;
    loop {
        tokio::select! {
            received = rx.recv() => match received {
                Ok(got) if id.is_none_or(|id| id == got) => return,
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => {
                    tokio::time::sleep_until(deadline).await;
                    return;
                }
            },
            _ = tokio::time::sleep_until(deadline) => return,
        }
    }
}

struct SessionTail {
    store: SessionReads,
    id: Uuid,
    scope: TenantScope,
    after: i64,
    rx: broadcast::Receiver<Uuid>,
    pending: VecDeque<LoggedEvent>,
    /// A `gap` event to send first: the resume point lies in a part of the
    /// log that compaction thinned.
    gap: Option<Event>,
}

/// Where a stream resumes: after which sequence number, and up to which
/// number compaction thinned the log (`None` when never).
#[derive(Debug, Clone, Copy)]
pub struct Resume {
    /// The last sequence number the client has.
    pub after: i64,
    /// The session's `compacted_through` mark.
    pub compacted_through: Option<i64>,
}

/// The explicit `gap` event for a resume from inside the compacted part of
/// the log: routine events between `after` and the mark are gone, so the
/// client is told rather than left to find numbers missing. It carries no
/// SSE id, so the client's own resume point does not move.
fn gap_event(resume: Resume) -> Option<Event> {
    let through = resume.compacted_through?;
    if resume.after >= through {
        return None;
    }
    let data = serde_json::json!({
        "after": resume.after,
        "compacted_through": through,
        "detail": "routine events up to compacted_through were compacted away; decisions, reflections, status changes and control events that follow are still sent",
    });
    Some(Event::default().event("gap").data(data.to_string()))
}

fn session_stream(
    store: SessionReads,
    id: Uuid,
    scope: TenantScope,
    resume: Resume,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let tail = SessionTail {
        rx: store.subscribe(),
        store,
        id,
        scope,
        after: resume.after,
        pending: VecDeque::new(),
        gap: gap_event(resume),
    };
    futures::stream::unfold(tail, |mut t| async move {
        if let Some(gap) = t.gap.take() {
            return Some((Ok(gap), t));
        }
        loop {
            // An end event in the log need not be the end: a resumed session
            // has one per run. The stream ends below, once caught up with a
            // session whose current state is ended.
            if let Some(event) = t.pending.pop_front() {
                let seq = event.seq;
                let kind = event.event.kind();
                let view = EventView::from(event);
                let sse = Event::default()
                    .id(seq.to_string())
                    .event(kind)
                    .json_data(&view)
                    .unwrap_or_else(|_| Event::default().comment("unserializable event"));
                return Some((Ok(sse), t));
            }
            match t.store.events(t.id, &t.scope, t.after, PAGE).await {
                Ok(rows) if !rows.is_empty() => {
                    t.after = rows.last().map_or(t.after, |r| r.seq);
                    t.pending.extend(rows);
                    continue;
                }
                Ok(_) => {}
                Err(err) => {
                    tracing::warn!(error = %err, session_id = %t.id, "event stream stopped on a storage error");
                    return None;
                }
            }
            // Caught up with a session whose loop already ended: read once
            // more if its last events landed after the read above, then
            // nothing more will come.
            match t.store.session(t.id, &t.scope).await {
                Ok(Some(s))
                    if !matches!(
                        s.status,
                        Status::Running | Status::AwaitingRefinement | Status::AwaitingConfirmation
                    ) =>
                {
                    if t.after < s.last_event_seq {
                        continue;
                    }
                    return None;
                }
                Ok(None) | Err(_) => return None,
                Ok(Some(_)) => {}
            }
            wait_for(&mut t.rx, Some(t.id)).await;
        }
    })
}

/// The SSE response for one session's log from `resume`, read within `scope`.
pub fn session_events(
    store: SessionReads,
    id: Uuid,
    scope: TenantScope,
    resume: Resume,
    slot: StreamSlot,
) -> Response {
    Sse::new(holding(session_stream(store, id, scope, resume), slot))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// What the list stream last sent of a session: a change to any part is
/// sent again (the step in flight is this replica's, from memory).
type SentKey = (Status, i64, DateTime<Utc>, Option<u64>);

struct ListTail {
    store: SessionReads,
    service: SessionService,
    since: DateTime<Utc>,
    rx: broadcast::Receiver<Uuid>,
    sent: HashMap<Uuid, SentKey>,
    pending: VecDeque<SessionView>,
    scope: TenantScope,
}

fn list_stream(
    service: SessionService,
    since: DateTime<Utc>,
    scope: TenantScope,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let store = service.reads().clone();
    let tail = ListTail {
        rx: store.subscribe(),
        store,
        service,
        since,
        scope,
        sent: HashMap::new(),
        pending: VecDeque::new(),
    };
    futures::stream::unfold(tail, |mut t| async move {
        loop {
            if let Some(view) = t.pending.pop_front() {
                let id = view.updated_at.timestamp_micros().to_string();
                let sse = Event::default()
                    .id(id)
                    .event("session")
                    .json_data(&view)
                    .unwrap_or_else(|_| Event::default().comment("unserializable session"));
                return Some((Ok(sse), t));
            }
            // Re-read a little before the last change seen: commits can land
            // out of timestamp order. `sent` drops what was already delivered.
            let from = t.since - chrono::Duration::seconds(2);
            match t.store.sessions_changed_since(from, 500, &t.scope).await {
                Ok(rows) => {
                    for s in rows {
                        let step = t.service.step_in_flight(s.id);
                        let key = (
                            s.status,
                            s.iterations,
                            s.updated_at,
                            step.as_ref().map(|step| step.iteration),
                        );
                        if t.sent.get(&s.id) == Some(&key) {
                            continue;
                        }
                        t.since = t.since.max(s.updated_at);
                        t.sent.insert(s.id, key);
                        let view = SessionView::from(s).with_step(step, Utc::now());
                        t.pending.push_back(view);
                    }
                    if !t.pending.is_empty() {
                        continue;
                    }
                }
                Err(err) => {
                    tracing::warn!(error = %err, "session list stream stopped on a storage error");
                    return None;
                }
            }
            wait_for(&mut t.rx, None).await;
        }
    })
}

/// The SSE response of every change after `since` of a session `scope` reaches.
pub fn session_changes(
    service: SessionService,
    since: DateTime<Utc>,
    scope: TenantScope,
    slot: StreamSlot,
) -> Response {
    Sse::new(holding(list_stream(service, since, scope), slot))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
