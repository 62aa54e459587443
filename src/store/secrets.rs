//! `session_secrets`: sessions' own secrets, sealed, apart from their public
//! record. The store only keeps ciphertext; sealing and opening happen
//! above it with a key that never reaches the database.

use sqlx::PgConnection;
use uuid::Uuid;

use super::{Result, Store};
use crate::secrets::Sealed;

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

impl Store {
    /// The sealed secret `name` of session `id`, if it has one.
    pub async fn session_secret(&self, id: Uuid, name: &str) -> Result<Option<Sealed>> {
        let row = sqlx::query!(
            "SELECT key_id, nonce, ciphertext FROM session_secrets
             WHERE session_id = $1 AND name = $2",
            id,
            name,
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
        let mut tx = self.pool.begin().await?;
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
