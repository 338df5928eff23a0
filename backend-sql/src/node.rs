//! The database as lease mode reaches it: one connection pool per
//! dialect, and what runs on the pool outside any lock operation (the
//! switch to WAL, the DDL, the probe that says why a database cannot be
//! reached).
//!
//! Session mode does not use it: a session lock lives exactly as long as
//! its connection, so each held lock takes a connection of its own, out
//! of any pool, in `session_locks`.

#[cfg(feature = "sqlite")]
use std::time::Duration;

use locksmith_core::{Error, Result};

use crate::config::{Dialect, SqlConfig};
#[cfg(feature = "sqlite")]
use crate::error::is_sqlite_busy;
use crate::error::{bad_url, map_err};

#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
compile_error!("locksmith-sql needs at least one of the features sqlite, postgres, mysql");

#[derive(Debug, Clone)]
pub(crate) enum Pool {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
}

/// Runs the same sqlx code on whichever pool this is; `$p` is the typed pool.
macro_rules! on_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite($p) => $body,
            #[cfg(feature = "postgres")]
            Pool::Postgres($p) => $body,
            #[cfg(feature = "mysql")]
            Pool::MySql($p) => $body,
        }
    };
}

/// Builds the pool for a dialect, and a scope naming the database so that
/// backends of one process on one database share release notifications.
pub(crate) fn open_pool(config: &SqlConfig) -> Result<(Pool, String)> {
    let bad = |e| bad_url(&config.url, e);
    match config.dialect {
        #[cfg(feature = "sqlite")]
        Dialect::Sqlite => {
            use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions, SqliteSynchronous};
            use std::str::FromStr;
            let opts = SqliteConnectOptions::from_str(config.url.expose())
                .map_err(bad)?
                .create_if_missing(true)
                // Not WAL here: see `use_wal`.
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(config.busy_timeout);
            let scope = std::path::absolute(opts.get_filename())
                .unwrap_or_else(|_| opts.get_filename().to_owned())
                .display()
                .to_string();
            let pool = SqlitePoolOptions::new()
                .max_connections(config.pool_max)
                .acquire_timeout(config.connect_timeout)
                .connect_lazy_with(opts);
            Ok((Pool::Sqlite(pool), scope))
        }
        #[cfg(feature = "postgres")]
        Dialect::Postgres => {
            use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
            use std::str::FromStr;
            let opts = PgConnectOptions::from_str(config.url.expose()).map_err(bad)?;
            let pool = PgPoolOptions::new()
                .max_connections(config.pool_max)
                .acquire_timeout(config.connect_timeout)
                .connect_lazy_with(opts);
            Ok((Pool::Postgres(pool), config.url.expose().to_owned()))
        }
        #[cfg(feature = "mysql")]
        Dialect::MySql => {
            use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
            use sqlx::Executor;
            use std::str::FromStr;
            let opts = MySqlConnectOptions::from_str(config.url.expose()).map_err(bad)?;
            let pool = MySqlPoolOptions::new()
                .max_connections(config.pool_max)
                .acquire_timeout(config.connect_timeout)
                // Fewer gap locks, so concurrent upserts of one key rarely deadlock.
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                            .await
                            .map(|_| ())
                    })
                })
                .connect_lazy_with(opts);
            Ok((Pool::MySql(pool), config.url.expose().to_owned()))
        }
        #[allow(unreachable_patterns)]
        other => Err(Error::config(format!(
            "{}: {other:?} support is not compiled in; enable locksmith's cargo feature `{}`",
            config.url,
            match other {
                Dialect::Sqlite => "sqlite",
                Dialect::Postgres => "postgres",
                Dialect::MySql => "mysql",
            }
        ))),
    }
}

/// Puts an SQLite file in WAL mode (readers never wait for the writer),
/// once. WAL is a property of the file, so this is done here and not on
/// every new connection: switching a new file needs it to itself, and
/// SQLite refuses at once ("database is locked"), without waiting out the
/// busy timeout, while other connections are opening it, as several
/// clients starting on a fresh file do. So the switch waits for a quiet
/// moment, up to the busy timeout.
#[cfg(feature = "sqlite")]
pub(crate) async fn use_wal(pool: &sqlx::SqlitePool, within: Duration) -> Result<()> {
    let start = std::time::Instant::now();
    loop {
        let mode: std::result::Result<(String,), sqlx::Error> =
            sqlx::query_as("PRAGMA journal_mode = WAL")
                .fetch_one(pool)
                .await;
        match mode {
            Ok((mode,)) => {
                if !mode.eq_ignore_ascii_case("wal") {
                    tracing::debug!(
                        mode,
                        "SQLite kept its journal mode; WAL is not available here"
                    );
                }
                return Ok(());
            }
            Err(e) if is_sqlite_busy(&e) && start.elapsed() < within => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(map_err(e)),
        }
    }
}

/// Runs one DDL statement. PostgreSQL's `CREATE TABLE IF NOT EXISTS` is not
/// safe against a concurrent twin (it can fail on the catalog's unique
/// index), so there it runs under a transaction-scoped advisory lock.
pub(crate) async fn create(pool: &Pool, stmt: &str) -> Result<()> {
    match pool {
        #[cfg(feature = "postgres")]
        Pool::Postgres(p) => {
            let mut tx = p.begin().await.map_err(map_err)?;
            sqlx::query("SELECT pg_advisory_xact_lock(7418327730937188175)")
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
            sqlx::query(stmt).execute(&mut *tx).await.map_err(map_err)?;
            tx.commit().await.map_err(map_err)?;
        }
        // A DDL statement starts as a read of the schema and then writes. In
        // WAL mode, when another connection wrote in between (several clients
        // creating the table of a new file at once), SQLite answers BUSY at
        // once without waiting the busy timeout, as waiting cannot refresh
        // a stale snapshot. BEGIN IMMEDIATE takes the write lock first, and
        // that does wait.
        #[cfg(feature = "sqlite")]
        Pool::Sqlite(p) => {
            use sqlx::Connection;
            let mut conn = p.acquire().await.map_err(map_err)?;
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut *conn)
                .await
                .map_err(map_err)?;
            let created = sqlx::query(stmt).execute(&mut *conn).await;
            let ended = match created {
                Ok(_) => sqlx::query("COMMIT").execute(&mut *conn).await,
                Err(e) => {
                    let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                    Err(e)
                }
            };
            if ended.is_err() {
                // Never hand back to the pool a connection in a transaction.
                let _ = conn.detach().close().await;
            }
            ended.map_err(map_err)?;
        }
        #[allow(unreachable_patterns)]
        other => {
            on_pool!(other, p => sqlx::query(stmt).execute(p).await.map(|_| ()).map_err(map_err)?);
        }
    }
    Ok(())
}

/// Opens and closes one connection outside the pool, so that a database
/// that cannot be reached says why (refused, unknown host, TLS, …): the
/// pool reports every such failure only as "timed out".
pub(crate) async fn probe(config: &SqlConfig) -> Result<()> {
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    let bad = |e| bad_url(&config.url, e);
    let connect = async {
        match config.dialect {
            #[cfg(feature = "postgres")]
            Dialect::Postgres => {
                use sqlx::{ConnectOptions, Connection};
                use std::str::FromStr;
                let opts =
                    sqlx::postgres::PgConnectOptions::from_str(config.url.expose()).map_err(bad)?;
                let c = opts.connect().await.map_err(map_err)?;
                let _ = c.close().await;
            }
            #[cfg(feature = "mysql")]
            Dialect::MySql => {
                use sqlx::{ConnectOptions, Connection};
                use std::str::FromStr;
                let opts =
                    sqlx::mysql::MySqlConnectOptions::from_str(config.url.expose()).map_err(bad)?;
                let c = opts.connect().await.map_err(map_err)?;
                let _ = c.close().await;
            }
            // A file: nothing to reach.
            _ => {}
        }
        Ok(())
    };
    match tokio::time::timeout(config.connect_timeout, connect).await {
        Ok(r) => r,
        Err(_) => Err(Error::unavailable(format!(
            "{}: no connection within {:?}",
            config.url, config.connect_timeout
        ))),
    }
}
