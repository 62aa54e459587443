//! `session_secrets`: sessions' own secrets, sealed, apart from their public
//! record. The store only keeps ciphertext; sealing and opening happen
//! above it with a key that never reaches the database.

use sqlx::PgConnection;
use uuid::Uuid;

use super::{Result, Store, StoreError, TenantScope};
use crate::secrets::{KeyRegistration, Keyring, Sealed};

/// Stores `sealed` as the secret `name` of session `id` (in the caller's transaction).
pub async fn insert_secret(
    conn: &mut PgConnection,
    id: Uuid,
    name: &str,
    sealed: &Sealed,
) -> Result<()> {
    sqlx::query!(
        "INSERT INTO session_secrets (session_id, name, key_id, nonce, ciphertext)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (session_id, name) DO UPDATE
            SET key_id = EXCLUDED.key_id, nonce = EXCLUDED.nonce, ciphertext = EXCLUDED.ciphertext",
        id,
        name,
        &sealed.key_id,
        &sealed.nonce,
        &sealed.ciphertext,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// How many secrets each key id seals, by id, on the caller's connection.
async fn secret_counts_on(conn: &mut PgConnection) -> Result<Vec<(String, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT key_id, count(*) AS "n!" FROM session_secrets GROUP BY key_id ORDER BY key_id"#
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|r| (r.key_id, r.n)).collect())
}

/// A plaintext `api_key` an earlier version left in a session's executor JSON.
pub struct PlaintextKey {
    /// The session.
    pub session_id: Uuid,
    /// The key, to be sealed and removed.
    pub api_key: String,
}

impl std::fmt::Debug for PlaintextKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PlaintextKey({}, <redacted>)", self.session_id)
    }
}

/// A stored secret with its place (session and name).
#[derive(Debug)]
pub struct StoredSecret {
    /// The session.
    pub session_id: Uuid,
    /// The secret's name.
    pub name: String,
    /// Its sealed value.
    pub sealed: Sealed,
}

impl Store {
    /// Checks `ring` against the database's keys and registers its current
    /// key when that is the decision (see [`crate::secrets::registration`]):
    /// the registered key, the key ids the fleet used that still seal a
    /// secret, and the key check value recorded for each id. Records a check value for
    /// every ring key that has none yet. One replica at a time: the
    /// registry is locked until the decision is written.
    pub async fn register_secret_key(&self, ring: &Keyring) -> Result<KeyRegistration> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        sqlx::query!("LOCK TABLE secret_key IN EXCLUSIVE MODE")
            .execute(&mut *tx)
            .await?;
        let registered = sqlx::query_scalar!("SELECT key_id FROM secret_key")
            .fetch_optional(&mut *tx)
            .await?;
        let checks = sqlx::query!("SELECT key_id, nonce, ciphertext FROM secret_key_checks")
            .fetch_all(&mut *tx)
            .await?;
        // Keys that still seal secrets are needed when the fleet used them
        // (a check value was recorded), or, on a database from before the
        // registry, whatever they are. A key never recorded (a value
        // restored beside a key that is lost) fails its sessions instead
        // of keeping every replica from starting.
        let needed: Vec<String> = secret_counts_on(&mut tx)
            .await?
            .into_iter()
            .map(|(id, _)| id)
            .filter(|id| registered.is_none() || checks.iter().any(|c| c.key_id == *id))
            .collect();
        let failed_checks: Vec<String> = checks
            .iter()
            .filter(|c| ring.has(&c.key_id))
            .filter(|c| {
                let check = Sealed {
                    key_id: c.key_id.clone(),
                    nonce: c.nonce.clone(),
                    ciphertext: c.ciphertext.clone(),
                };
                !ring
                    .keys()
                    .find(|k| k.id() == c.key_id)
                    .is_some_and(|k| k.opens_check(&check))
            })
            .map(|c| c.key_id.clone())
            .collect();
        let decision =
            crate::secrets::registration(registered.as_deref(), &needed, &failed_checks, ring);
        if matches!(decision, KeyRegistration::Refuse { .. }) {
            tx.rollback().await?;
            return Ok(decision);
        }
        if matches!(
            decision,
            KeyRegistration::Register | KeyRegistration::Rotate { .. }
        ) {
            sqlx::query!(
                "INSERT INTO secret_key (key_id) VALUES ($1)
                 ON CONFLICT (only_row) DO UPDATE SET key_id = EXCLUDED.key_id, set_at = now()",
                ring.current().id()
            )
            .execute(&mut *tx)
            .await?;
        }
        for key in ring.keys() {
            if checks.iter().any(|c| c.key_id == key.id()) {
                continue;
            }
            let check = key
                .check_value()
                .map_err(|e| StoreError::Secret(e.to_string()))?;
            sqlx::query!(
                "INSERT INTO secret_key_checks (key_id, nonce, ciphertext) VALUES ($1, $2, $3)
                 ON CONFLICT (key_id) DO NOTHING",
                &check.key_id,
                &check.nonce,
                &check.ciphertext,
            )
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(decision)
    }

    /// How many secrets each key id seals, by id.
    pub async fn secret_counts(&self) -> Result<Vec<(String, i64)>> {
        let mut conn = self.pool.acquire().await?;
        secret_counts_on(&mut conn).await
    }

    /// The registered sealing key's id, if one is registered.
    pub async fn registered_secret_key(&self) -> Result<Option<String>> {
        Ok(sqlx::query_scalar!("SELECT key_id FROM secret_key")
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Up to `limit` secrets sealed under one of `key_ids`, in (session,
    /// name) order after `after`: a caller pages through them once, so a
    /// secret that cannot be sealed again is not read again.
    pub async fn secrets_sealed_under(
        &self,
        key_ids: &[String],
        after: Option<(Uuid, String)>,
        limit: i64,
    ) -> Result<Vec<StoredSecret>> {
        let (after_id, after_name) = match after {
            Some((id, name)) => (Some(id), Some(name)),
            None => (None, None),
        };
        let rows = sqlx::query!(
            "SELECT session_id, name, key_id, nonce, ciphertext FROM session_secrets
             WHERE key_id = ANY($1)
               AND ($2::uuid IS NULL OR (session_id, name) > ($2::uuid, $3::text))
             ORDER BY session_id, name
             LIMIT $4",
            key_ids,
            after_id,
            after_name,
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| StoredSecret {
                session_id: r.session_id,
                name: r.name,
                sealed: Sealed {
                    key_id: r.key_id,
                    nonce: r.nonce,
                    ciphertext: r.ciphertext,
                },
            })
            .collect())
    }

    /// Replaces a secret sealed under `old_key_id` with `sealed`; false when
    /// it changed meanwhile (another replica sealed it again first).
    pub async fn reseal_secret(
        &self,
        session_id: Uuid,
        name: &str,
        old_key_id: &str,
        sealed: &Sealed,
    ) -> Result<bool> {
        let done = sqlx::query!(
            "UPDATE session_secrets SET key_id = $4, nonce = $5, ciphertext = $6
             WHERE session_id = $1 AND name = $2 AND key_id = $3",
            session_id,
            name,
            old_key_id,
            &sealed.key_id,
            &sealed.nonce,
            &sealed.ciphertext,
        )
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The sealed secret `name` of session `id`, if it has one and `scope`
    /// reaches the session.
    pub async fn session_secret(
        &self,
        id: Uuid,
        name: &str,
        scope: &TenantScope,
    ) -> Result<Option<Sealed>> {
        let row = sqlx::query!(
            "SELECT key_id, nonce, ciphertext FROM session_secrets
             WHERE session_id = $1 AND name = $2
               AND EXISTS (SELECT 1 FROM sessions s WHERE s.id = $1 AND ($3::text IS NULL OR s.tenant = $3))",
            id,
            name,
            scope.tenant(),
        )
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| Sealed {
            key_id: r.key_id,
            nonce: r.nonce,
            ciphertext: r.ciphertext,
        }))
    }

    /// Up to `limit` sessions whose executor JSON still holds a plaintext
    /// `api_key` (written before secrets were sealed).
    pub async fn plaintext_keys(&self, limit: i64) -> Result<Vec<PlaintextKey>> {
        let rows = sqlx::query!(
            r#"SELECT id, executor ->> 'api_key' AS "api_key!" FROM sessions
               WHERE executor ? 'api_key' AND jsonb_typeof(executor -> 'api_key') = 'string'
               LIMIT $1"#,
            limit,
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| PlaintextKey {
                session_id: r.id,
                api_key: r.api_key,
            })
            .collect())
    }

    /// Moves one plaintext key: stores `sealed` and removes the key from the
    /// executor JSON, in one transaction (a crash leaves either both or neither).
    pub async fn seal_plaintext_key(&self, id: Uuid, sealed: &Sealed) -> Result<()> {
        let mut tx = super::connection::begin_detached(&self.pool).await?;
        insert_secret(&mut tx, id, "api_key", sealed).await?;
        sqlx::query!(
            "UPDATE sessions SET executor = executor - 'api_key' WHERE id = $1",
            id
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }
}
