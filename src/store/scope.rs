//! Whose sessions a caller may reach. Every store function that reads or
//! writes a session or its history takes one and binds [`TenantScope::tenant`]
//! into its SQL (`$n::text IS NULL OR tenant = $n`), so an authorization
//! check cannot be forgotten in a handler: a row of another tenant is not
//! found, exactly like a missing one.

/// The tenants a caller may reach: one, or every tenant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TenantScope {
    /// Only this tenant's sessions.
    Tenant(String),
    /// Every tenant's sessions: a global admin, authentication turned off,
    /// or this replica's own work on sessions it holds a lease on or
    /// recovers (the loop, the queue, takeover).
    Global,
}

impl TenantScope {
    /// A scope of one tenant.
    pub fn tenant_only(tenant: impl Into<String>) -> TenantScope {
        TenantScope::Tenant(tenant.into())
    }

    /// The value bound into SQL: the tenant, or `NULL` for every tenant.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            TenantScope::Tenant(t) => Some(t),
            TenantScope::Global => None,
        }
    }

    /// Whether a session of `tenant` is within the scope (for state held in
    /// memory; rows are filtered by the SQL).
    pub fn allows(&self, tenant: &str) -> bool {
        match self {
            TenantScope::Tenant(t) => t == tenant,
            TenantScope::Global => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_scope_allows_only_its_tenant() {
        let scope = TenantScope::tenant_only("acme");
        assert_eq!(scope.tenant(), Some("acme"));
        assert!(scope.allows("acme"));
        assert!(!scope.allows("acme2"));
        assert!(!scope.allows(""));
        assert!(!scope.allows("ACME"));
    }

    #[test]
    fn the_global_scope_allows_every_tenant() {
        assert_eq!(TenantScope::Global.tenant(), None);
        assert!(TenantScope::Global.allows("acme"));
        assert!(TenantScope::Global.allows("default"));
    }
}
