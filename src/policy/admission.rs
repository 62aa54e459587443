//! Admission of requests and parked worker claims on one replica, so no
//! tenant or key can take the slots every tenant shares: a tenant's requests
//! may hold only its share of the request slots, and worker claims that wait
//! for a task hold places in a pool of their own, capped per key, per tenant
//! and per replica. Pure: the HTTP layer keeps the counts and asks here.

/// The most request slots one tenant's requests may hold at once: `percent`
/// of the replica's `slots` (rounded down), at least one, at most all.
pub fn tenant_request_cap(slots: usize, percent: u32) -> usize {
    let share = (slots as u128 * u128::from(percent.min(100))) / 100;
    usize::try_from(share)
        .unwrap_or(slots)
        .clamp(1, slots.max(1))
}

/// Whether a tenant holding `held` request slots may take one more.
pub fn admit_request(held: usize, cap: usize) -> bool {
    held < cap
}

/// The caps on parked claims (claims waiting for a task).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimCaps {
    /// Per worker key.
    pub per_key: usize,
    /// Per tenant, all its keys together.
    pub per_tenant: usize,
    /// Per replica, every tenant together.
    pub replica: usize,
}

/// Claims parked now by the caller's key, its tenant and the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClaimsHeld {
    /// The caller's key's.
    pub key: usize,
    /// The caller's tenant's.
    pub tenant: usize,
    /// The replica's.
    pub replica: usize,
}

/// Which cap refused a claim: the narrowest that is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimRefusal {
    /// The key has its most parked claims.
    Key,
    /// The tenant has its most parked claims.
    Tenant,
    /// The replica's pool of parked claims is full.
    Replica,
}

/// Whether one more claim may park, given what is parked and the caps; a
/// refusal names the narrowest cap that is full (the key's before the
/// tenant's before the replica's), the one the caller can act on.
pub fn admit_claim(held: ClaimsHeld, caps: ClaimCaps) -> Result<(), ClaimRefusal> {
    if held.key >= caps.per_key {
        Err(ClaimRefusal::Key)
    } else if held.tenant >= caps.per_tenant {
        Err(ClaimRefusal::Tenant)
    } else if held.replica >= caps.replica {
        Err(ClaimRefusal::Replica)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_share_is_a_percentage_of_the_slots_at_least_one_at_most_all() {
        // (slots, percent, cap)
        let table = [
            (512, 25, 128),
            (512, 100, 512),
            (512, 1, 5),
            (512, 0, 1),
            (40, 5, 2),
            (10, 25, 2),
            (3, 25, 1),
            (1, 25, 1),
            (1, 100, 1),
            (100, 150, 100),
            (0, 50, 1),
            (usize::MAX, 100, usize::MAX),
            (usize::MAX, 50, usize::MAX / 2),
        ];
        for (slots, percent, cap) in table {
            assert_eq!(
                tenant_request_cap(slots, percent),
                cap,
                "{percent} % of {slots}"
            );
        }
    }

    #[test]
    fn a_tenant_takes_slots_up_to_its_cap() {
        assert!(admit_request(0, 1));
        assert!(admit_request(127, 128));
        assert!(!admit_request(128, 128));
        assert!(!admit_request(129, 128));
    }

    #[test]
    fn a_claim_parks_below_every_cap_and_a_refusal_names_the_narrowest_full_one() {
        let caps = ClaimCaps {
            per_key: 2,
            per_tenant: 3,
            replica: 4,
        };
        let held = |key, tenant, replica| ClaimsHeld {
            key,
            tenant,
            replica,
        };
        // (held, answer)
        let table = [
            (held(0, 0, 0), Ok(())),
            (held(1, 2, 3), Ok(())),
            (held(2, 2, 2), Err(ClaimRefusal::Key)),
            (held(2, 3, 4), Err(ClaimRefusal::Key)),
            (held(1, 3, 3), Err(ClaimRefusal::Tenant)),
            (held(1, 3, 4), Err(ClaimRefusal::Tenant)),
            (held(0, 2, 4), Err(ClaimRefusal::Replica)),
            (held(0, 0, 9), Err(ClaimRefusal::Replica)),
        ];
        for (counts, answer) in table {
            assert_eq!(admit_claim(counts, caps), answer, "{counts:?}");
        }
        let none = ClaimCaps {
            per_key: 0,
            per_tenant: 5,
            replica: 5,
        };
        assert_eq!(
            admit_claim(ClaimsHeld::default(), none),
            Err(ClaimRefusal::Key),
            "a cap of 0 parks nothing"
        );
    }
}
