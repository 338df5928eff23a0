//! The database as lease mode reaches it: one connection pool per
//! dialect, and what runs on the pool outside any lock operation (the
//! switch to WAL, the DDL, the probe that says why a database cannot be
//! reached).
//!
//! Session mode does not use it: a session lock lives exactly as long as
//! its connection, so each held lock takes a connection of its own, out
//! of any pool, in `session_locks`.

use std::time::Duration;

use lockwright_core::{Error, Result};

use crate::config::{Dialect, SqlConfig};
#[cfg(any(feature = "sqlite", feature = "mysql"))]
use crate::error::is_duplicate_column;
#[cfg(feature = "sqlite")]
use crate::error::is_sqlite_busy;
use crate::error::{bad_url, map_err};
use crate::layout::add_value_column as add_value_column_ddl;

#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
compile_error!("lockwright-sql needs at least one of the features sqlite, postgres, mysql");

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

/// A pooled connection idle this long is pinged before it is used again.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const PING_IF_IDLE: Duration = Duration::from_secs(1);

/// Pings only a connection that sat idle for [`PING_IF_IDLE`], not every
/// one taken from the pool (sqlx's default): a statement on a connection
/// in steady use is one round trip, not two. A long-idle connection is
/// the one a restart or an idle timeout has most likely cut; one cut in
/// the last second fails its statement as `Unavailable`, and is dropped.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn pinged_when_idle<DB: sqlx::Database>(
    options: sqlx::pool::PoolOptions<DB>,
) -> sqlx::pool::PoolOptions<DB> {
    options
        .test_before_acquire(false)
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= PING_IF_IDLE {
                    sqlx::Connection::ping(conn).await?;
                }
                Ok(true)
            })
        })
}

/// The one connection renewal batches go over, outside the pool: sqlx
/// pings every connection given back to its pool (another round trip per
/// statement), and a batch would pay for it. Dialed on first use, and
/// again after any error on it.
#[derive(Debug, Default)]
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub(crate) struct Renewer(pub(crate) tokio::sync::Mutex<Option<Dedicated>>);

/// [`Renewer`]'s connection.
#[derive(Debug)]
pub(crate) enum Dedicated {
    #[cfg(feature = "postgres")]
    Pg(sqlx::PgConnection),
    #[cfg(feature = "mysql")]
    My(sqlx::MySqlConnection),
}

/// A connection of `pool`'s database of its own, dialed within `within`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn dial<DB: sqlx::Database>(
    pool: &sqlx::Pool<DB>,
    within: Duration,
) -> Result<DB::Connection> {
    use sqlx::ConnectOptions;
    match tokio::time::timeout(within, pool.connect_options().connect()).await {
        Ok(c) => c.map_err(map_err),
        Err(_) => Err(Error::unavailable(format!(
            "no connection to the database within {within:?}"
        ))),
    }
}

/// [`dial`] for MySQL, set up as the pool's connections are.
#[cfg(feature = "mysql")]
pub(crate) async fn dial_mysql(
    pool: &sqlx::MySqlPool,
    within: Duration,
) -> Result<sqlx::MySqlConnection> {
    let mut c = dial(pool, within).await?;
    sqlx::Executor::execute(&mut c, MYSQL_SESSION)
        .await
        .map_err(map_err)?;
    Ok(c)
}

/// Fewer gap locks, so concurrent upserts of one key rarely deadlock.
#[cfg(feature = "mysql")]
const MYSQL_SESSION: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

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
            let pool = pinged_when_idle(PgPoolOptions::new())
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
            let pool = pinged_when_idle(MySqlPoolOptions::new())
                .max_connections(config.pool_max)
                .acquire_timeout(config.connect_timeout)
                .after_connect(|conn, _| {
                    Box::pin(async move { conn.execute(MYSQL_SESSION).await.map(|_| ()) })
                })
                .connect_lazy_with(opts);
            Ok((Pool::MySql(pool), config.url.expose().to_owned()))
        }
        #[allow(unreachable_patterns)]
        other => Err(Error::config(format!(
            "{}: {other:?} support is not compiled in; enable lockwright's cargo feature `{}`",
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
            let mut tx = pg_ddl_begin(p).await?;
            sqlx::query(stmt).execute(&mut *tx).await.map_err(map_err)?;
            tx.commit().await.map_err(map_err)?;
        }
        #[cfg(feature = "sqlite")]
        Pool::Sqlite(p) => {
            let mut conn = sqlite_ddl_begin(p).await?;
            let created = sqlx::query(stmt).execute(&mut *conn).await.map(|_| ());
            sqlite_ddl_end(conn, created).await?;
        }
        #[allow(unreachable_patterns)]
        other => {
            on_pool!(other, p => sqlx::query(stmt).execute(p).await.map(|_| ()).map_err(map_err)?);
        }
    }
    Ok(())
}

/// How long adding the `value` column waits for the table's lock. An
/// `ALTER TABLE` queued behind a long transaction makes every later
/// statement on the table queue behind it too (every lock of the table
/// stalls): better to give up and say why, and try again on the next use.
#[cfg(any(feature = "postgres", feature = "mysql"))]
const DDL_LOCK_WAIT_SECS: u64 = 5;

/// The error of an `ALTER TABLE` adding the `value` column, naming the
/// statement to run by hand where the reason is one the user must act on.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn ddl_failed(table: &str, ddl: &str, e: sqlx::Error) -> Error {
    if is_lock_wait(&e) {
        Error::unavailable(format!(
            "the lease table {table} predates leader values, and adding its `value` column \
             waited more than {DDL_LOCK_WAIT_SECS} s for the table's lock, which a long \
             transaction holds; it is tried again on the next use, or run `{ddl}` yourself"
        ))
        .with_source(e)
    } else if is_denied(&e) {
        Error::config(format!(
            "the lease table {table} predates leader values, and this role may not add its \
             `value` column: run `{ddl}` as the table's owner"
        ))
        .with_source(e)
    } else {
        map_err(e)
    }
}

/// A lock wait that ran out: PostgreSQL 55P03, MySQL/MariaDB 1205.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn is_lock_wait(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return my.number() == 1205;
    }
    db.code().as_deref() == Some("55P03")
}

/// A refused privilege: PostgreSQL 42501, MySQL/MariaDB 1142.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn is_denied(e: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = e else {
        return false;
    };
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        return my.number() == 1142;
    }
    db.code().as_deref() == Some("42501")
}

/// Gives a lease table of an earlier version its `value` column, and
/// leaves one that has it alone. The catalog is read first, so a table
/// that has the column (every start but the first after an upgrade) is
/// never altered: an `ALTER TABLE` takes the table's strongest lock, even
/// to do nothing. Many processes starting at once add it once: they take
/// turns (PostgreSQL's advisory lock, SQLite's write lock), or the losers
/// of the race are told "duplicate column" and take that as done (MySQL).
pub(crate) async fn add_value_column(pool: &Pool, table: &str) -> Result<()> {
    match pool {
        #[cfg(feature = "postgres")]
        Pool::Postgres(p) => {
            let mut tx = pg_ddl_begin(p).await?;
            // to_regclass reads the name as the statements do: unquoted,
            // folded to lower case, found on the search path.
            let there: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass($1)
                                AND attname = 'value' AND NOT attisdropped)",
            )
            .bind(table)
            .fetch_one(&mut *tx)
            .await
            .map_err(map_err)?;
            if !there {
                let ddl = add_value_column_ddl(Dialect::Postgres, table);
                // SET LOCAL ends with the transaction, so the pool's
                // connection keeps the server's setting afterwards.
                sqlx::query(&format!("SET LOCAL lock_timeout = '{DDL_LOCK_WAIT_SECS}s'"))
                    .execute(&mut *tx)
                    .await
                    .map_err(map_err)?;
                sqlx::query(&ddl)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| ddl_failed(table, &ddl, e))?;
            }
            tx.commit().await.map_err(map_err)?;
        }
        #[cfg(feature = "mysql")]
        Pool::MySql(p) => {
            let there: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.COLUMNS
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = 'value'",
            )
            .bind(table)
            .fetch_one(p)
            .await
            .map_err(map_err)?;
            if there == 0 {
                let ddl = add_value_column_ddl(Dialect::MySql, table);
                let mut conn = p.acquire().await.map_err(map_err)?;
                let set = format!("SET SESSION lock_wait_timeout = {DDL_LOCK_WAIT_SECS}");
                let added = async {
                    sqlx::query(&set).execute(&mut *conn).await?;
                    match sqlx::query(&ddl).execute(&mut *conn).await {
                        Err(e) if !is_duplicate_column(&e) => Err(e),
                        _ => Ok(()),
                    }
                }
                .await;
                // The session setting would outlive this call on the
                // pool's connection: put it back, or never reuse it.
                let reset = sqlx::query("SET SESSION lock_wait_timeout = DEFAULT")
                    .execute(&mut *conn)
                    .await;
                if reset.is_err() {
                    use sqlx::Connection;
                    let _ = conn.detach().close().await;
                }
                added.map_err(|e| ddl_failed(table, &ddl, e))?;
            }
        }
        #[cfg(feature = "sqlite")]
        Pool::Sqlite(p) => {
            let mut conn = sqlite_ddl_begin(p).await?;
            let added = async {
                let there: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = 'value'",
                )
                .bind(table)
                .fetch_one(&mut *conn)
                .await?;
                if there == 0 {
                    let ddl = add_value_column_ddl(Dialect::Sqlite, table);
                    match sqlx::query(&ddl).execute(&mut *conn).await {
                        Err(e) if !is_duplicate_column(&e) => return Err(e),
                        _ => {}
                    }
                }
                Ok(())
            }
            .await;
            sqlite_ddl_end(conn, added).await?;
        }
    }
    Ok(())
}

/// A transaction holding the advisory lock that PostgreSQL's DDL here runs
/// under, so that processes setting the table up at once take turns.
#[cfg(feature = "postgres")]
async fn pg_ddl_begin(p: &sqlx::PgPool) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let mut tx = p.begin().await.map_err(map_err)?;
    sqlx::query("SELECT pg_advisory_xact_lock(7418327730937188175)")
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    Ok(tx)
}

/// A connection in `BEGIN IMMEDIATE`, for DDL. A DDL statement starts as a
/// read of the schema and then writes. In WAL mode, when another
/// connection wrote in between (several clients creating the table of a
/// new file at once), SQLite answers BUSY at once without waiting the busy
/// timeout, as waiting cannot refresh a stale snapshot. BEGIN IMMEDIATE
/// takes the write lock first, and that does wait.
#[cfg(feature = "sqlite")]
async fn sqlite_ddl_begin(
    p: &sqlx::SqlitePool,
) -> Result<sqlx::pool::PoolConnection<sqlx::Sqlite>> {
    let mut conn = p.acquire().await.map_err(map_err)?;
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    Ok(conn)
}

/// Commits what [`sqlite_ddl_begin`] began if `done` is `Ok`, else rolls it
/// back.
#[cfg(feature = "sqlite")]
async fn sqlite_ddl_end(
    mut conn: sqlx::pool::PoolConnection<sqlx::Sqlite>,
    done: std::result::Result<(), sqlx::Error>,
) -> Result<()> {
    use sqlx::Connection;
    let ended = match done {
        Ok(()) => sqlx::query("COMMIT").execute(&mut *conn).await.map(|_| ()),
        Err(e) => {
            let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
            Err(e)
        }
    };
    if ended.is_err() {
        // Never hand back to the pool a connection in a transaction.
        let _ = conn.detach().close().await;
    }
    ended.map_err(map_err)
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
