//! What a replica can run and what a session needs of it, so that in a
//! fleet of mixed versions no replica runs a session it would run wrong: a
//! feature an older binary ignores (a review gate silently skipped) or
//! fails on (an unknown field, five attempts, `failed`). A session's needs
//! are the features its request uses that are gated here
//! (`spec::needs`; migration 0027 derives the same in the database); a
//! replica announces the capabilities it has (all of them, minus those
//! `WARDEN_CAPABILITIES_OFF` switches off) and takes a lease only on a
//! session whose needs it covers.
//!
//! | the session needs … of a replica | placed |
//! |---|---|
//! | nothing this replica lacks | here (or the queue, as any session) |
//! | something this replica lacks, a live replica has all | the queue: that replica claims it |
//! | something no live replica has | refused (409 `capability_unavailable`) |

use std::collections::BTreeSet;

/// A feature a session may need of the replica that runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Capability {
    /// Scripted steps that delegate tasks to child sessions (`delegate`).
    Delegate,
    /// A review point every N steps (`limits.review_every` > 0): a safety
    /// rule, never to be skipped.
    ReviewEvery,
    /// Tool calls that wait for a person (`executor.approvals`): a safety rule.
    Approvals,
    /// A model's tools from MCP servers (`executor.tools` beyond `builtin`).
    McpTools,
}

impl Capability {
    /// Every capability this release knows, in the order they are listed.
    pub const ALL: [Capability; 4] = [
        Capability::Delegate,
        Capability::ReviewEvery,
        Capability::Approvals,
        Capability::McpTools,
    ];

    /// Its name, as stored in `replicas.capabilities` and `sessions.needs`.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Delegate => "delegate",
            Capability::ReviewEvery => "review_every",
            Capability::Approvals => "approvals",
            Capability::McpTools => "mcp_tools",
        }
    }

    /// The capability of that name.
    pub fn parse(name: &str) -> Option<Capability> {
        Capability::ALL.into_iter().find(|c| c.as_str() == name)
    }
}

/// The capabilities a replica has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities(BTreeSet<Capability>);

impl Default for Capabilities {
    /// Every capability of this release.
    fn default() -> Self {
        Capabilities(Capability::ALL.into_iter().collect())
    }
}

impl Capabilities {
    /// Every capability but those of `off`.
    pub fn without(off: &[Capability]) -> Capabilities {
        Capabilities(
            Capability::ALL
                .into_iter()
                .filter(|c| !off.contains(c))
                .collect(),
        )
    }

    /// What of `needs` this replica lacks (empty: it covers them).
    pub fn missing(&self, needs: &BTreeSet<Capability>) -> Vec<Capability> {
        needs.difference(&self.0).copied().collect()
    }

    /// Their names, as the replicas table stores them.
    pub fn names(&self) -> Vec<String> {
        self.0.iter().map(|c| c.as_str().to_string()).collect()
    }
}

/// Parses `WARDEN_CAPABILITIES_OFF`: names separated by commas (blank: none).
pub fn parse_list(raw: &str) -> Result<Vec<Capability>, String> {
    raw.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| {
            Capability::parse(name).ok_or_else(|| {
                let known: Vec<&str> = Capability::ALL.iter().map(|c| c.as_str()).collect();
                format!("unknown capability `{name}` (known: {})", known.join(", "))
            })
        })
        .collect()
}

/// Where a session ready to run goes, by who covers its needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// This replica covers them: as any session (here, or the queue).
    Here,
    /// Only other replicas do: the queue, for one of them to claim.
    Queue,
    /// No live replica does: refused.
    Nowhere,
}

/// The placement of a session whose needs this replica covers or not, and
/// some other live replica covers or not.
pub fn placement(here: bool, elsewhere: bool) -> Placement {
    match (here, elsewhere) {
        (true, _) => Placement::Here,
        (false, true) => Placement::Queue,
        (false, false) => Placement::Nowhere,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for c in Capability::ALL {
            assert_eq!(Capability::parse(c.as_str()), Some(c));
        }
        assert_eq!(Capability::parse("teleport"), None);
    }

    #[test]
    fn a_list_is_parsed_or_names_the_unknown_entry() {
        assert_eq!(parse_list(""), Ok(vec![]));
        assert_eq!(
            parse_list(" delegate, review_every ,"),
            Ok(vec![Capability::Delegate, Capability::ReviewEvery])
        );
        let err = parse_list("delegate,teleport").unwrap_err();
        assert!(
            err.contains("teleport") && err.contains("mcp_tools"),
            "{err}"
        );
    }

    #[test]
    fn a_replica_lacks_what_it_switched_off() {
        let all = Capabilities::default();
        let some = Capabilities::without(&[Capability::ReviewEvery]);
        let needs: BTreeSet<_> = [Capability::Delegate, Capability::ReviewEvery].into();
        assert!(all.missing(&needs).is_empty());
        assert_eq!(some.missing(&needs), vec![Capability::ReviewEvery]);
        assert!(some.missing(&BTreeSet::new()).is_empty());
        assert_eq!(
            some.names(),
            ["delegate", "approvals", "mcp_tools"].map(String::from)
        );
    }

    #[test]
    fn placement_follows_the_table() {
        assert_eq!(placement(true, true), Placement::Here);
        assert_eq!(placement(true, false), Placement::Here);
        assert_eq!(placement(false, true), Placement::Queue);
        assert_eq!(placement(false, false), Placement::Nowhere);
    }
}
