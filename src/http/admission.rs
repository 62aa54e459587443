//! Per-tenant and per-key shares of a replica's request handling. The
//! replica-wide cap (`WARDEN_MAX_CONCURRENT_REQUESTS`) is taken before
//! authentication, so it protects the process from anyone; once the caller
//! is known, its tenant's share of those slots (`WARDEN_TENANT_REQUEST_SHARE`)
//! is taken too, so one tenant's flood leaves the others their slots. A
//! worker claim that waits for a task gives both back and holds a place in
//! a pool of its own instead (`WARDEN_MAX_PARKED_CLAIMS`), capped per key
//! and per tenant. The arithmetic is `policy::admission`'s.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::OwnedSemaphorePermit;

use super::error::ApiError;
use crate::auth::Principal;
use crate::config::AdmissionLimits;
use crate::policy::admission::{self, ClaimCaps, ClaimRefusal, ClaimsHeld};

/// What a client refused a request slot by its tenant's share is told to wait, s.
const REQUEST_RETRY_AFTER: u32 = 1;
/// What a refused claim is told to wait, s: a parked claim's place comes
/// back only when the claim ends, up to a minute later.
const CLAIM_RETRY_AFTER: u32 = 5;

/// The replica's per-tenant request counts and parked claims (cheap to
/// clone: every clone is the same book).
#[derive(Clone)]
pub struct Admission(Arc<Inner>);

struct Inner {
    /// `WARDEN_MAX_CONCURRENT_REQUESTS`, named in refusals.
    slots: usize,
    /// `WARDEN_TENANT_REQUEST_SHARE`, named in refusals.
    share: u32,
    /// The request slots one tenant may hold.
    tenant_cap: usize,
    /// Request slots held per tenant.
    requests: Mutex<HashMap<String, usize>>,
    /// The caps on parked claims.
    claim_caps: ClaimCaps,
    /// Parked claims per key, per tenant and in all.
    claims: Mutex<ClaimBook>,
}

#[derive(Default)]
struct ClaimBook {
    keys: HashMap<String, usize>,
    tenants: HashMap<String, usize>,
    total: usize,
}

fn count_up(counts: &mut HashMap<String, usize>, name: &str) {
    *counts.entry(name.to_string()).or_insert(0) += 1;
}

/// One fewer for `name`; no entry is kept at zero, so the maps hold only
/// the tenants and keys with something in progress.
fn count_down(counts: &mut HashMap<String, usize>, name: &str) {
    if let Some(count) = counts.get_mut(name) {
        *count = count.saturating_sub(1);
        if *count == 0 {
            counts.remove(name);
        }
    }
}

impl Admission {
    /// The book of a replica with `slots` request slots under `limits`.
    pub fn new(slots: usize, limits: &AdmissionLimits) -> Admission {
        Admission(Arc::new(Inner {
            slots,
            share: limits.tenant_request_share,
            tenant_cap: admission::tenant_request_cap(slots, limits.tenant_request_share),
            requests: Mutex::default(),
            claim_caps: ClaimCaps {
                per_key: limits.key_max_parked_claims,
                per_tenant: limits.tenant_max_parked_claims,
                replica: limits.max_parked_claims,
            },
            claims: Mutex::default(),
        }))
    }

    /// A slot of `tenant`'s share, or the 429 that says the share is taken.
    fn tenant_slot(&self, tenant: &str) -> Result<TenantSlot, ApiError> {
        let mut requests = self
            .0
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let held = requests.get(tenant).copied().unwrap_or(0);
        if !admission::admit_request(held, self.0.tenant_cap) {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "tenant_request_limit",
                format!(
                    "this tenant has {held} requests in progress on this replica, its share \
(WARDEN_TENANT_REQUEST_SHARE={} % of WARDEN_MAX_CONCURRENT_REQUESTS={}); retry shortly",
                    self.0.share, self.0.slots
                ),
            )
            .with_retry_after(REQUEST_RETRY_AFTER));
        }
        count_up(&mut requests, tenant);
        Ok(TenantSlot {
            admission: self.clone(),
            tenant: tenant.to_string(),
        })
    }

    /// A place among the parked claims for `key` of `tenant`, or the
    /// refusal naming the cap that is full.
    fn parked_claim(&self, key: &str, tenant: &str) -> Result<ParkedClaim, ApiError> {
        let caps = self.0.claim_caps;
        let mut book = self.0.claims.lock().unwrap_or_else(PoisonError::into_inner);
        let held = ClaimsHeld {
            key: book.keys.get(key).copied().unwrap_or(0),
            tenant: book.tenants.get(tenant).copied().unwrap_or(0),
            replica: book.total,
        };
        if let Err(refusal) = admission::admit_claim(held, caps) {
            let (status, code, detail) = match refusal {
                ClaimRefusal::Key => (
                    StatusCode::TOO_MANY_REQUESTS,
                    "claim_limit",
                    format!(
                        "this key has {} claims waiting on this replica, the most WARDEN_KEY_MAX_PARKED_CLAIMS allows",
                        held.key
                    ),
                ),
                ClaimRefusal::Tenant => (
                    StatusCode::TOO_MANY_REQUESTS,
                    "claim_limit",
                    format!(
                        "this tenant has {} claims waiting on this replica, the most WARDEN_TENANT_MAX_PARKED_CLAIMS allows",
                        held.tenant
                    ),
                ),
                ClaimRefusal::Replica => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "overloaded",
                    format!(
                        "{} claims are waiting on this replica, the most WARDEN_MAX_PARKED_CLAIMS allows",
                        held.replica
                    ),
                ),
            };
            return Err(ApiError::new(
                status,
                code,
                format!("{detail}; retry after a waiting claim ends"),
            )
            .with_retry_after(CLAIM_RETRY_AFTER));
        }
        count_up(&mut book.keys, key);
        count_up(&mut book.tenants, tenant);
        book.total += 1;
        Ok(ParkedClaim {
            admission: self.clone(),
            key: key.to_string(),
            tenant: tenant.to_string(),
        })
    }
}

/// One request's slot of its tenant's share, given back on drop.
struct TenantSlot {
    admission: Admission,
    tenant: String,
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        let mut requests = self
            .admission
            .0
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        count_down(&mut requests, &self.tenant);
    }
}

/// A waiting claim's place in the parked-claims pool, given back on drop.
pub struct ParkedClaim {
    admission: Admission,
    key: String,
    tenant: String,
}

impl std::fmt::Debug for ParkedClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParkedClaim")
            .field("key", &self.key)
            .field("tenant", &self.tenant)
            .finish()
    }
}

impl Drop for ParkedClaim {
    fn drop(&mut self) {
        let mut book = self
            .admission
            .0
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        count_down(&mut book.keys, &self.key);
        count_down(&mut book.tenants, &self.tenant);
        book.total = book.total.saturating_sub(1);
    }
}

/// What one request holds: a replica slot from the start, a slot of its
/// tenant's share once the caller is known. Handed to the request as an
/// extension (clones share the hold), so a claim can give both back when
/// it parks; the request limits give back whatever is left when it ends.
#[derive(Clone)]
pub struct RequestSlot {
    admission: Admission,
    held: Arc<Mutex<Held>>,
}

#[derive(Default)]
struct Held {
    replica: Option<OwnedSemaphorePermit>,
    tenant: Option<TenantSlot>,
}

impl RequestSlot {
    /// A request holding `replica`, one of the replica's slots.
    pub fn new(admission: Admission, replica: OwnedSemaphorePermit) -> RequestSlot {
        RequestSlot {
            admission,
            held: Arc::new(Mutex::new(Held {
                replica: Some(replica),
                tenant: None,
            })),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a slot of `tenant`'s share as well, or answers the 429.
    fn take_tenant_share(&self, tenant: &str) -> Result<(), ApiError> {
        let slot = self.admission.tenant_slot(tenant)?;
        self.held().tenant = Some(slot);
        Ok(())
    }

    /// Gives back every slot the request holds.
    pub fn release(&self) {
        let (replica, tenant) = {
            let mut held = self.held();
            (held.replica.take(), held.tenant.take())
        };
        // Dropped outside the lock: the tenant slot takes the book's.
        drop((replica, tenant));
    }

    /// Moves the slots this request holds into a hold of their own, kept
    /// until it is dropped: for an answer computed after the handler
    /// returns (a streamed replay), which the request limits would
    /// otherwise stop counting once the headers are sent.
    pub fn hand_over(&self) -> RequestSlot {
        let (replica, tenant) = {
            let mut held = self.held();
            (held.replica.take(), held.tenant.take())
        };
        RequestSlot {
            admission: self.admission.clone(),
            held: Arc::new(Mutex::new(Held { replica, tenant })),
        }
    }

    /// Parks a claim of `caller`: a place among the parked claims (429 for
    /// the key's or the tenant's cap, 503 for the replica's), then the
    /// request's slots given back, so waiting holds nothing others need.
    pub fn park(&self, caller: &Principal) -> Result<ParkedClaim, ApiError> {
        // `actor` is a key's public prefix, unique per key.
        let parked = self.admission.parked_claim(&caller.actor, &caller.tenant)?;
        self.release();
        Ok(parked)
    }
}

/// After the gate: a request of a known caller takes a slot of its
/// tenant's share (probes, open pages, live streams and the metrics token
/// have no tenant here and are not counted).
pub async fn tenant_share(req: Request, next: Next) -> Response {
    let slot = req.extensions().get::<RequestSlot>().cloned();
    let tenant = req
        .extensions()
        .get::<Principal>()
        .map(|p| p.tenant.clone());
    if let (Some(slot), Some(tenant)) = (slot, tenant)
        && let Err(refused) = slot.take_tenant_share(&tenant)
    {
        return refused.into_response();
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::Semaphore;

    fn limits(share: u32, per_key: usize, per_tenant: usize, replica: usize) -> AdmissionLimits {
        AdmissionLimits {
            tenant_request_share: share,
            body_read_timeout: Duration::from_secs(5),
            max_parked_claims: replica,
            tenant_max_parked_claims: per_tenant,
            key_max_parked_claims: per_key,
        }
    }

    fn caller(tenant: &str, key: &str) -> Principal {
        let mut p = Principal::unrestricted(Some(tenant.to_string()));
        p.actor = key.to_string();
        p
    }

    #[test]
    fn a_tenant_holds_at_most_its_share_and_released_slots_come_back() {
        let slots = Arc::new(Semaphore::new(8));
        let admission = Admission::new(8, &limits(25, 1, 1, 1));
        let request = || {
            RequestSlot::new(
                admission.clone(),
                slots.clone().try_acquire_owned().expect("a replica slot"),
            )
        };
        let (a1, a2, a3) = (request(), request(), request());
        assert!(a1.take_tenant_share("a").is_ok());
        assert!(a2.take_tenant_share("a").is_ok());
        let refused = a3.take_tenant_share("a").expect_err("25 % of 8 is 2");
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let b = request();
        assert!(b.take_tenant_share("b").is_ok(), "another tenant is not");
        assert_eq!(slots.available_permits(), 4);
        a1.release();
        assert_eq!(slots.available_permits(), 5, "the replica slot is back");
        assert!(a3.take_tenant_share("a").is_ok(), "so is the share");
        drop((a2, a3, b));
        assert_eq!(slots.available_permits(), 8);
        assert!(
            admission.0.requests.lock().unwrap().is_empty(),
            "no count is kept at zero"
        );
    }

    #[test]
    fn parked_claims_are_capped_per_key_tenant_and_replica_and_hold_no_request_slot() {
        let slots = Arc::new(Semaphore::new(8));
        let admission = Admission::new(8, &limits(100, 2, 3, 4));
        let request = |tenant: &str| {
            let slot = RequestSlot::new(
                admission.clone(),
                slots.clone().try_acquire_owned().expect("a replica slot"),
            );
            slot.take_tenant_share(tenant).expect("a tenant slot");
            slot
        };
        let k1 = caller("a", "wdn_00000001");
        let k2 = caller("a", "wdn_00000002");
        let other = caller("b", "wdn_00000003");
        let first = request("a").park(&k1).expect("parked");
        assert_eq!(slots.available_permits(), 8, "a parked claim holds no slot");
        let second = request("a").park(&k1).expect("parked");
        let refused = request("a").park(&k1).expect_err("the key's cap");
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let third = request("a").park(&k2).expect("another key of the tenant");
        let refused = request("a").park(&k2).expect_err("the tenant's cap");
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        let fourth = request("b").park(&other).expect("another tenant");
        let refused = request("b").park(&other).expect_err("the replica's pool");
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(slots.available_permits(), 8, "refused claims hold nothing");
        assert!(admission.0.requests.lock().unwrap().is_empty());
        drop(first);
        let again = request("a").park(&k1).expect("an ended claim's place");
        drop((second, third, fourth, again));
        let book = admission.0.claims.lock().unwrap();
        assert!(book.keys.is_empty() && book.tenants.is_empty() && book.total == 0);
    }
}
