//! Fair share of the fleet's free places among tenants with queued
//! sessions: each next place goes to the waiting tenant that runs the
//! fewest sessions for its weight (stride scheduling over the fleet-wide
//! running counts), so a tenant that queued thousands holds no more than
//! its share while another tenant's single session waits. Pure: the caller
//! reads the counts and claims what this decides, oldest first inside each
//! tenant.

/// One tenant with queued sessions, as the claim sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// Its sessions running across the fleet now.
    pub running: u64,
    /// Its weight (at least 1; 0 counts as 1).
    pub weight: u32,
    /// Its cap on running sessions across the fleet, if any.
    pub cap: Option<u64>,
    /// Its queued sessions (at most the free places matter).
    pub waiting: u64,
}

impl Demand {
    fn weight(&self) -> u64 {
        u64::from(self.weight.max(1))
    }

    /// Whether it can take one more place, having been given `given`.
    fn can_take(&self, given: u64) -> bool {
        given < self.waiting && self.cap.is_none_or(|cap| self.running + given < cap)
    }
}

/// How many of `free` places each tenant of `tenants` gets, in the same
/// order. Tenants come ordered by their oldest queued session, oldest
/// first: that order breaks ties, so among equals the one waiting longest
/// goes first and nobody waits forever behind a tie. A tenant at its cap
/// or with no more queued sessions gets no more; places nobody can take
/// stay free.
pub fn share_places(tenants: &[Demand], free: u64) -> Vec<u64> {
    let mut given = vec![0u64; tenants.len()];
    for _ in 0..free {
        let mut best: Option<usize> = None;
        for (i, t) in tenants.iter().enumerate() {
            if !t.can_take(given[i]) {
                continue;
            }
            // Lowest (running + given) / weight, compared without division.
            let better = match best {
                None => true,
                Some(b) => {
                    let tb = &tenants[b];
                    u128::from(t.running + given[i]) * u128::from(tb.weight())
                        < u128::from(tb.running + given[b]) * u128::from(t.weight())
                }
            };
            if better {
                best = Some(i);
            }
        }
        match best {
            Some(i) => given[i] += 1,
            None => break,
        }
    }
    given
}

/// A tenant's share of running places by weight, in percent of all places
/// that `tenants` hold (what the benchmark compares shares with).
pub fn weighted_share_percent(weights: &[u32], index: usize) -> f64 {
    let total: u64 = weights.iter().map(|w| u64::from((*w).max(1))).sum();
    match weights.get(index) {
        Some(w) if total > 0 => 100.0 * u64::from((*w).max(1)) as f64 / total as f64,
        _ => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demand(running: u64, weight: u32, cap: Option<u64>, waiting: u64) -> Demand {
        Demand {
            running,
            weight,
            cap,
            waiting,
        }
    }

    #[test]
    fn nothing_to_share_gives_nothing() {
        assert_eq!(share_places(&[], 5), Vec::<u64>::new());
        assert_eq!(share_places(&[demand(0, 1, None, 3)], 0), vec![0]);
        assert_eq!(share_places(&[demand(0, 1, None, 0)], 4), vec![0]);
    }

    #[test]
    fn one_tenant_takes_what_it_waits_for_up_to_the_free_places() {
        assert_eq!(share_places(&[demand(7, 1, None, 10)], 4), vec![4]);
        assert_eq!(share_places(&[demand(7, 1, None, 2)], 4), vec![2]);
    }

    #[test]
    fn equal_weights_from_equal_counts_split_evenly_oldest_first() {
        let t = [demand(0, 1, None, 100); 3];
        assert_eq!(share_places(&t, 3), vec![1, 1, 1]);
        assert_eq!(
            share_places(&t, 4),
            vec![2, 1, 1],
            "the tie goes to the oldest"
        );
        assert_eq!(share_places(&t, 1), vec![1, 0, 0]);
    }

    #[test]
    fn a_big_tenant_waits_while_small_ones_catch_up() {
        // A runs 5,000 and queues thousands; B and C run nothing.
        let t = [
            demand(5_000, 1, None, 5_000),
            demand(0, 1, None, 10),
            demand(0, 1, None, 10),
        ];
        assert_eq!(share_places(&t, 1), vec![0, 1, 0]);
        assert_eq!(share_places(&t, 2), vec![0, 1, 1]);
        assert_eq!(share_places(&t, 20), vec![0, 10, 10]);
        // Once B and C have nothing more to queue, A gets the rest.
        assert_eq!(share_places(&t, 25), vec![5, 10, 10]);
    }

    #[test]
    fn places_follow_the_weights() {
        let t = [demand(0, 3, None, 100), demand(0, 1, None, 100)];
        assert_eq!(share_places(&t, 4), vec![3, 1]);
        assert_eq!(share_places(&t, 8), vec![6, 2]);
        // Running counts weigh in: A already holds its share of 3:1.
        let t = [demand(30, 3, None, 100), demand(0, 1, None, 100)];
        assert_eq!(share_places(&t, 10), vec![0, 10]);
        assert_eq!(share_places(&t, 12), vec![1, 11]);
        // A weight of 0 counts as 1.
        let t = [demand(0, 0, None, 10), demand(0, 1, None, 10)];
        assert_eq!(share_places(&t, 2), vec![1, 1]);
    }

    #[test]
    fn a_cap_bounds_a_tenant_and_its_places_go_to_others() {
        let t = [demand(2, 1, Some(3), 100), demand(10, 1, None, 100)];
        assert_eq!(share_places(&t, 5), vec![1, 4]);
        // At its cap already, or a cap of zero: nothing.
        let t = [demand(3, 1, Some(3), 100), demand(0, 1, Some(0), 100)];
        assert_eq!(
            share_places(&t, 5),
            vec![0, 0],
            "places nobody can take stay free"
        );
        // Running beyond the cap (lowered meanwhile): nothing, no underflow.
        assert_eq!(share_places(&[demand(9, 1, Some(3), 5)], 2), vec![0]);
    }

    #[test]
    fn every_waiting_tenant_gets_a_place_within_a_bounded_number_of_places() {
        // No starvation: whatever the counts and weights, a tenant below
        // its cap with sessions waiting gets a place once the others have
        // caught up with it, and never later than that.
        for running in [0u64, 1, 10, 1_000] {
            for weight in [1u32, 2, 10] {
                let t = [
                    demand(running, 10, None, u64::MAX),
                    demand(0, weight, None, u64::MAX),
                    demand(running * 2, 1, None, u64::MAX),
                ];
                let free = running + 2;
                let given = share_places(&t, free);
                assert!(
                    given[1] >= 1,
                    "running {running}, weight {weight}: {given:?}"
                );
                assert_eq!(given.iter().sum::<u64>(), free);
            }
        }
    }

    #[test]
    fn shares_of_a_long_run_match_the_weights() {
        // Places freed one at a time over a long run, nobody ever ending:
        // running counts end proportional to the weights.
        let weights = [1u32, 2, 3];
        let mut running = [0u64; 3];
        for _ in 0..600 {
            let t: Vec<Demand> = (0..3)
                .map(|i| demand(running[i], weights[i], None, 1_000))
                .collect();
            let given = share_places(&t, 1);
            for (r, g) in running.iter_mut().zip(given) {
                *r += g;
            }
        }
        assert_eq!(running, [100, 200, 300]);
        let total: u64 = running.iter().sum();
        for (i, held) in running.iter().enumerate() {
            let share = 100.0 * *held as f64 / total as f64;
            assert!((share - weighted_share_percent(&weights, i)).abs() < 0.01);
        }
        assert_eq!(weighted_share_percent(&weights, 9), 0.0);
    }
}
