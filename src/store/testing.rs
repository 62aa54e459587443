//! Databases for the unit tests that need one: a private database on the
//! `DATABASE_URL` server, or, with it unset, a temporary embedded
//! PostgreSQL (the integration tests' harness does the same).

use sqlx::PgPool;

use super::Store;

/// A migrated database of one test, dropped with it.
pub struct TestDb {
    /// Its pool.
    pub pool: PgPool,
    guard: Guard,
}

enum Guard {
    Server {
        url: String,
        name: String,
    },
    #[cfg(feature = "embedded")]
    Embedded(Option<Box<super::embedded::Embedded>>),
}

impl TestDb {
    /// Creates and migrates the database.
    pub async fn new() -> TestDb {
        let server = std::env::var("DATABASE_URL")
            .ok()
            .filter(|u| !u.trim().is_empty());
        let (pool, guard) = match server {
            Some(url) => {
                let mut admin = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
                    .await
                    .expect("DATABASE_URL answers");
                let name = format!("warden_unit_{}", uuid::Uuid::new_v4().simple());
                // The name is ours: a prefix and a UUID's hex.
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut admin)
                    .await
                    .expect("test database created");
                let _ = sqlx::Connection::close(admin).await;
                let options: sqlx::postgres::PgConnectOptions =
                    url.parse().expect("DATABASE_URL parses");
                let pool = Store::pool_options(8)
                    .connect_with(options.database(&name))
                    .await
                    .expect("test database answers");
                (pool, Guard::Server { url, name })
            }
            #[cfg(not(feature = "embedded"))]
            None => panic!(
                "DATABASE_URL is unset and this build has no embedded PostgreSQL (feature `embedded`)"
            ),
            #[cfg(feature = "embedded")]
            None => {
                let embedded = tokio::task::spawn_blocking(super::embedded::Embedded::temporary)
                    .await
                    .expect("embedded start joined")
                    .expect("embedded PostgreSQL starts");
                let pool = Store::pool_options(super::embedded::EMBEDDED_CONNECTIONS)
                    .connect_with(embedded.connect_options())
                    .await
                    .expect("embedded PostgreSQL answers");
                (pool, Guard::Embedded(Some(Box::new(embedded))))
            }
        };
        Store::from_pool(pool.clone())
            .migrate()
            .await
            .expect("migrations apply");
        TestDb { pool, guard }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        match &mut self.guard {
            #[cfg(feature = "embedded")]
            Guard::Embedded(embedded) => drop(embedded.take()),
            Guard::Server { url, name } => {
                let (url, name) = (url.clone(), name.clone());
                // Dropped inside the test's runtime: drop the database from a
                // thread with a runtime of its own, and wait for it.
                let dropped = std::thread::spawn(move || {
                    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    else {
                        return;
                    };
                    rt.block_on(async move {
                        if let Ok(mut admin) =
                            <sqlx::PgConnection as sqlx::Connection>::connect(&url).await
                        {
                            let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                            )))
                            .execute(&mut admin)
                            .await;
                        }
                    });
                });
                let _ = dropped.join();
            }
        }
    }
}
