//! `warden tenants ...`: the tenants' weights, running caps and tree
//! limits in the queue.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use warden::policy::delegation::{DEFAULT_MAX_CHILDREN, DEFAULT_MAX_DEPTH};
use warden::store::Store;

use super::store::{Schema, on_cli_store};

/// The subcommands of `warden tenants`.
#[derive(Debug, Subcommand)]
pub enum TenantsCommand {
    /// Set a tenant's weight, running cap and tree limits (the others kept)
    ///
    /// Reads DATABASE_URL, or the embedded database when it is unset.
    Set(SetTenant),
    /// Every tenant's settings with its running and active sessions
    ///
    /// Reads DATABASE_URL, or the embedded database when it is unset.
    List,
}

/// The arguments of `warden tenants set`; a flag left out keeps the
/// tenant's current value.
#[derive(Debug, Args)]
pub struct SetTenant {
    /// The tenant
    #[arg(value_parser = super::tenant_name)]
    pub tenant: String,
    /// Its share of free places when the queue is claimed, against the other
    /// waiting tenants' weights (default 1)
    #[arg(long, allow_negative_numbers = true, value_name = "1..1000", value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub weight: Option<i32>,
    /// Most sessions of the tenant running at once across the fleet, beyond
    /// which its sessions wait queued (default none)
    #[arg(long, allow_negative_numbers = true, value_name = "N|none", value_parser = max_running)]
    pub max_running: Option<Limit>,
    /// How deep its trees of child sessions may grow (default 3)
    #[arg(long, allow_negative_numbers = true, value_name = "1..64|default", value_parser = tree_limit)]
    pub max_depth: Option<Limit>,
    /// How many children one of its sessions may have (default 8)
    #[arg(long, allow_negative_numbers = true, value_name = "1..64|default", value_parser = tree_limit)]
    pub max_children: Option<Limit>,
}

/// A limit as given: a number, or the word that clears it (`None`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit(pub Option<i32>);

/// `--max-running`: a whole number from 0, or `none`.
fn max_running(raw: &str) -> Result<Limit, String> {
    match raw {
        "none" => Ok(Limit(None)),
        n => match n.parse::<i32>() {
            Ok(n) if n >= 0 => Ok(Limit(Some(n))),
            _ => Err("a whole number from 0, or none".into()),
        },
    }
}

/// `--max-depth`, `--max-children`: 1 to 64, or `default`.
fn tree_limit(raw: &str) -> Result<Limit, String> {
    match raw {
        "default" => Ok(Limit(None)),
        n => match n.parse::<i32>() {
            Ok(n) if (1..=64).contains(&n) => Ok(Limit(Some(n))),
            _ => Err("a whole number from 1 to 64, or default".into()),
        },
    }
}

/// Runs `warden tenants ...` on the CLI's database.
pub(super) async fn run(command: TenantsCommand) -> ExitCode {
    let schema = match command {
        TenantsCommand::List => Schema::Read,
        TenantsCommand::Set(_) => Schema::Write,
    };
    on_cli_store("tenants", schema, async |store| match command {
        TenantsCommand::Set(set) => self::set(store, set).await,
        TenantsCommand::List => list(store).await,
    })
    .await
}

/// Saves the tenant's settings, what was not given as it was, and prints them.
async fn set(store: &Store, set: SetTenant) -> ExitCode {
    let tenant = &set.tenant;
    let current = match store.tenant_settings().await {
        Ok(all) => all.into_iter().find(|t| &t.tenant == tenant),
        Err(err) => {
            eprintln!("warden tenants: {err}");
            return ExitCode::FAILURE;
        }
    };
    let current = current.as_ref();
    let or_current = |given: Option<Limit>, now: Option<i32>| given.map_or(now, |l| l.0);
    let weight = set.weight.unwrap_or(current.map_or(1, |t| t.weight));
    let max_running = or_current(set.max_running, current.and_then(|t| t.max_running));
    let max_depth = or_current(set.max_depth, current.and_then(|t| t.max_depth));
    let max_children = or_current(set.max_children, current.and_then(|t| t.max_children));
    let saved = match store.set_tenant_settings(tenant, weight, max_running).await {
        Ok(()) => {
            store
                .set_tenant_tree_limits(tenant, max_depth, max_children)
                .await
        }
        Err(err) => Err(err),
    };
    if let Err(err) = saved {
        eprintln!("warden tenants: {err}");
        return ExitCode::FAILURE;
    }
    let default = |n: Option<i32>, d: u32| n.map_or(format!("{d} (default)"), |n| n.to_string());
    println!(
        "tenant {tenant}: weight {weight}, max running {}, max depth {}, max children {}",
        max_running.map_or("none".to_string(), |n| n.to_string()),
        default(max_depth, DEFAULT_MAX_DEPTH),
        default(max_children, DEFAULT_MAX_CHILDREN),
    );
    ExitCode::SUCCESS
}

/// Every tenant as a tab-separated table.
async fn list(store: &Store) -> ExitCode {
    let all = match store.tenant_settings().await {
        Ok(all) => all,
        Err(err) => {
            eprintln!("warden tenants: {err}");
            return ExitCode::FAILURE;
        }
    };
    println!("TENANT\tWEIGHT\tMAX RUNNING\tMAX DEPTH\tMAX CHILDREN\tRUNNING\tACTIVE");
    let shown = |n: Option<i32>| n.map_or("-".to_string(), |n| n.to_string());
    for t in all {
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}",
            t.tenant,
            t.weight,
            shown(t.max_running),
            shown(t.max_depth),
            shown(t.max_children),
            t.running,
            t.active
        );
    }
    ExitCode::SUCCESS
}
