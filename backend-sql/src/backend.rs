//! [`SqlBackend`]: the [`LockBackend`] over a lease table (or session locks).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use locksmith_core::backend::{
    Acquire, Binding, Capabilities, Grant, LockBackend, Release, Renew, Watch,
};
use locksmith_core::{Error, FencingToken, LockKey, LockStatus, OwnerToken, Result};
use sha2::{Digest, Sha256};
use tokio::sync::{watch, OnceCell};

use crate::config::{Dialect, Mode, SqlConfig};
use crate::queries::{Queries, SWEEP_BATCH};
use crate::session::SessionLocks;

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

/// The statements of lease mode. Parameters: acquire (key hash, key, owner,
/// TTL in ms); release (key hash, owner); renew (key hash, owner, TTL in ms;
/// on MySQL the TTL comes first). The key hash is the lowercase hex SHA-256
/// of the key.
#[derive(Debug, Clone)]
pub struct LeaseStatements {
    /// DDL creating the table.
    pub create: Vec<String>,
    /// Takes a free, expired or own (re-entrant) key.
    pub acquire: String,
    /// Drops one hold, owner-checked.
    pub release: String,
    /// Extends the lease, owner-checked.
    pub renew: String,
}

/// Locks in a SQL database. In the default lease mode each lock is a row of
/// one table: a unique key, the owner token, a hold count, a fencing column
/// that only ever grows, and an expiry on the database's clock. In session
/// mode (PostgreSQL and MySQL) each held lock is a server-side session lock
/// on a dedicated connection. Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct SqlBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: SqlConfig,
    pool: Pool,
    queries: Queries,
    schema: OnceCell<()>,
    local: Arc<LocalReleases>,
    session: Option<SessionLocks>,
    /// When this client last started a sweep (see [`SqlBackend::sweep`]).
    swept: Mutex<Option<std::time::Instant>>,
}

impl SqlBackend {
    /// Opens a backend for `url` (see [`SqlConfig::from_url`]). No connection
    /// is made yet: a database that is down shows up as `Unavailable` on the
    /// first operation, and work resumes when it is back.
    ///
    /// # Errors
    /// `Config`/`InvalidOptions` for a bad URL or table name.
    pub fn connect(url: &str) -> Result<Self> {
        Self::with_config(SqlConfig::from_url(url)?)
    }

    /// Opens a backend from a parsed configuration.
    ///
    /// # Errors
    /// `Config` if the driver rejects the URL, or the dialect's cargo feature is off.
    pub fn with_config(config: SqlConfig) -> Result<Self> {
        let (pool, scope) = open_pool(&config)?;
        let session = match config.mode {
            Mode::Lease => None,
            Mode::Session => Some(SessionLocks::new(&config)?),
        };
        let queries = Queries::new(config.dialect, &config.table);
        let local = LocalReleases::for_scope(format!("{scope}\u{0}{}", config.table));
        Ok(SqlBackend {
            inner: Arc::new(Inner {
                config,
                pool,
                queries,
                schema: OnceCell::new(),
                local,
                session,
                swept: Mutex::new(None),
            }),
        })
    }

    /// The configuration in use (its URL prints without secrets).
    pub fn config(&self) -> &SqlConfig {
        &self.inner.config
    }

    /// Server-side ids (PostgreSQL backend pid, MySQL connection id) of the
    /// connections holding this client's session locks; empty in lease mode.
    #[cfg_attr(not(feature = "internals"), allow(dead_code))]
    pub(crate) fn session_ids(&self) -> Vec<i64> {
        self.inner
            .session
            .as_ref()
            .map(SessionLocks::session_ids)
            .unwrap_or_default()
    }

    /// The SQL this backend runs in lease mode, for inspection, migrations
    /// by hand, and benchmarks that run the same statements directly.
    pub fn lease_statements(&self) -> LeaseStatements {
        let q = &self.inner.queries;
        LeaseStatements {
            create: q.create.clone(),
            acquire: q.acquire.clone(),
            release: q.release.clone(),
            renew: q.renew.clone(),
        }
    }

    /// Creates the lease table if it does not exist. Every lease-mode
    /// operation does this on first use; call it to fail fast at start-up.
    ///
    /// # Errors
    /// `Unavailable` if the database cannot be reached.
    pub async fn migrate(&self) -> Result<()> {
        self.inner
            .schema
            .get_or_try_init(|| async {
                // The only pool when SQLite is the only SQL feature.
                #[cfg(feature = "sqlite")]
                #[allow(irrefutable_let_patterns)]
                if let Pool::Sqlite(p) = &self.inner.pool {
                    use_wal(p, self.inner.config.busy_timeout).await?;
                }
                for stmt in &self.inner.queries.create {
                    create(&self.inner.pool, stmt).await?;
                }
                Ok::<(), Error>(())
            })
            .await?;
        Ok(())
    }
}

impl SqlBackend {
    /// Deletes the lease rows that have been free (released, or their lease
    /// ended) for longer than the [retention](SqlConfig::retention), and
    /// returns how many went. Lease-mode acquires start one in the
    /// background at most every quarter of the retention, so a free row is
    /// gone within 1.25 × the retention while any client of the table keeps
    /// acquiring; call this to collect at other times. Session mode keeps no
    /// rows and deletes nothing.
    ///
    /// # Errors
    /// `Unavailable` if the database cannot be reached.
    pub async fn sweep(&self) -> Result<u64> {
        if self.inner.session.is_some() {
            return Ok(0);
        }
        self.migrate().await?;
        let retention = ttl_ms(self.inner.config.retention);
        let mut gone = 0;
        // Batches keep each statement short; a backlog left by an earlier
        // version is worked off over several sweeps.
        for _ in 0..100 {
            let n = on_pool!(&self.inner.pool, p => sqlx::query(&self.inner.queries.sweep)
                .bind(retention)
                .execute(p)
                .await
                .map_err(map_err)?
                .rows_affected());
            gone += n;
            if n < SWEEP_BATCH {
                break;
            }
        }
        Ok(gone)
    }

    /// How often this client's acquires start a sweep: a quarter of the
    /// retention, so a free row is gone within 1.25 × the retention.
    fn sweep_every(&self) -> Duration {
        self.inner.config.retention / 4
    }

    /// Starts a background sweep if this client has not started one within
    /// [`sweep_every`](Self::sweep_every).
    fn sweep_now_and_then(&self) {
        let every = self.sweep_every();
        let now = std::time::Instant::now();
        {
            let mut last = self.inner.swept.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| now.duration_since(t) < every) {
                return;
            }
            *last = Some(now);
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.sweep().await {
                tracing::debug!("sweep of free lease rows failed: {e}");
            }
        });
    }
}

/// Puts an SQLite file in WAL mode (readers never wait for the writer),
/// once. WAL is a property of the file, so this is done here and not on
/// every new connection: switching a new file needs it to itself, and
/// SQLite refuses at once, without waiting out the busy timeout, while other
/// connections are opening it (the "database is locked" the suite saw about
/// one run in fifteen with eight clients on a fresh file). So the switch
/// waits for a quiet moment, up to the busy timeout.
#[cfg(feature = "sqlite")]
async fn use_wal(pool: &sqlx::SqlitePool, within: Duration) -> Result<()> {
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
            Err(sqlx::Error::Database(db))
                if db.code().as_deref() == Some("5") && start.elapsed() < within =>
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => return Err(map_err(e)),
        }
    }
}

/// Runs one DDL statement. PostgreSQL's `CREATE TABLE IF NOT EXISTS` is not
/// safe against a concurrent twin (it can fail on the catalog's unique
/// index), so there it runs under a transaction-scoped advisory lock.
async fn create(pool: &Pool, stmt: &str) -> Result<()> {
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
        // WAL mode, when another connection wrote in between (8 clients
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

/// The key's fixed-width identity in the table.
pub(crate) fn key_hash(key: &LockKey) -> String {
    hex::encode(Sha256::digest(key.as_str().as_bytes()))
}

/// The shortest lease renewal keeps reliably; see `capabilities`.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(250);

fn ttl_ms(ttl: Duration) -> i64 {
    // The core caps TTLs at a year; the clamp only keeps this total.
    i64::try_from(ttl.as_millis().max(1)).unwrap_or(i64::MAX / 4)
}

/// Builds the pool for a dialect, and a scope naming the database so that
/// backends of one process on one database share release notifications.
fn open_pool(config: &SqlConfig) -> Result<(Pool, String)> {
    let bad_url = |e: sqlx::Error| Error::config(format!("{}: {e}", config.url));
    match config.dialect {
        #[cfg(feature = "sqlite")]
        Dialect::Sqlite => {
            use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions, SqliteSynchronous};
            use std::str::FromStr;
            let opts = SqliteConnectOptions::from_str(config.url.expose())
                .map_err(bad_url)?
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
            let opts = PgConnectOptions::from_str(config.url.expose()).map_err(bad_url)?;
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
            let opts = MySqlConnectOptions::from_str(config.url.expose()).map_err(bad_url)?;
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

/// Maps driver errors onto the contract's kinds, in one place: anything that
/// means "could not talk to the database" is `Unavailable`.
pub(crate) fn map_err(e: sqlx::Error) -> Error {
    use sqlx::Error as E;
    let unavailable = match &e {
        E::Io(_) | E::Tls(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => true,
        E::Protocol(_) => true,
        E::Database(db) => db_unavailable(db.as_ref()),
        _ => false,
    };
    let permanent = match &e {
        E::Database(db) => db_refused(db.as_ref()),
        // A TLS mode this build cannot speak will not work on a retry.
        E::Tls(t) => t.to_string().contains("without TLS support"),
        _ => false,
    };
    if permanent {
        Error::config("the database refused the configuration").with_source(e)
    } else if unavailable {
        Error::unavailable("database unavailable").with_source(e)
    } else if matches!(e, E::Configuration(_)) {
        Error::config("the database driver refused the configuration").with_source(e)
    } else {
        Error::backend("the database answered with an error").with_source(e)
    }
}

/// Server errors that retrying will not fix: refused credentials, a
/// database or role that does not exist, a file that is not a database or
/// cannot be created, a table name the SQL parser rejects.
fn db_refused(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // Primary result codes: CANTOPEN 14 (a missing directory), NOTADB
        // 26; ERROR 1 covers a syntax error from a reserved table name.
        let code = db.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(0);
        return matches!(code & 0xff, 14 | 26)
            || (code & 0xff == 1 && db.message().contains("syntax error"));
    }
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        // Class 28 authorization (unknown role, wrong password), 3D000
        // unknown database, 42601 syntax error, 42501 insufficient privilege.
        let c = pg.code();
        return c.starts_with("28") || matches!(c, "3D000" | "42601" | "42501");
    }
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        // Access denied (1044 database, 1045 user, 1142 table), unknown
        // database 1049, syntax error 1064.
        return matches!(my.number(), 1044 | 1045 | 1049 | 1064 | 1142);
    }
    false
}

/// Server errors that mean "the database cannot serve us now".
fn db_unavailable(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // Primary result codes: BUSY 5, LOCKED 6, READONLY 8, IOERR 10,
        // FULL 13.
        let code = db.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(0);
        return matches!(code & 0xff, 5 | 6 | 8 | 10 | 13);
    }
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        // Class 08 connection exceptions, 57P0x shutting down or starting
        // up, class 53 out of resources (e.g. too many connections).
        let c = pg.code();
        return c.starts_with("08") || c.starts_with("57P") || c.starts_with("53");
    }
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        // Too many connections, shutdown in progress, lock wait timeout,
        // read-only server.
        return matches!(my.number(), 1040 | 1053 | 1205 | 1290 | 1836);
    }
    false
}

/// MySQL reports a deadlock victim with 1213 and a lock-wait timeout with 1205.
#[cfg(feature = "mysql")]
fn is_mysql_conflict(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().is_some_and(|c| c == "1213" || c == "40001"))
}

impl SqlBackend {
    async fn lease_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        self.migrate().await?;
        self.sweep_now_and_then();
        let q = &self.inner.queries;
        let row: Option<(i64, i64)> = match &self.inner.pool {
            #[cfg(feature = "mysql")]
            Pool::MySql(p) => return self.mysql_acquire(p, key, owner, ttl).await,
            #[allow(unreachable_patterns)]
            other => on_pool!(other, p => sqlx::query_as(&q.acquire)
                .bind(key_hash(key))
                .bind(key.as_str())
                .bind(owner.as_str())
                .bind(ttl_ms(ttl))
                .fetch_optional(p)
                .await
                .map_err(map_err)?),
        };
        Ok(match row {
            Some((fence, holds)) => granted(fence, holds),
            None => Acquire::Contended { retry_after: None },
        })
    }

    #[cfg(feature = "mysql")]
    async fn mysql_acquire(
        &self,
        p: &sqlx::MySqlPool,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        use crate::queries::MYSQL_REENTRY_FLAG;
        let q = &self.inner.queries;
        let hash = key_hash(key);
        let mut attempts = 0;
        let done = loop {
            let r = sqlx::query(&q.acquire)
                .bind(&hash)
                .bind(key.as_str())
                .bind(owner.as_str())
                .bind(ttl_ms(ttl))
                .execute(p)
                .await;
            match r {
                Ok(done) => break done,
                // Concurrent first inserts of one key can deadlock in InnoDB;
                // the victim changed nothing, and someone else got there first.
                Err(e) if is_mysql_conflict(&e) => {
                    attempts += 1;
                    if attempts == 2 {
                        return Ok(Acquire::Contended { retry_after: None });
                    }
                }
                Err(e) => return Err(map_err(e)),
            }
        };
        let id = done.last_insert_id();
        if id == 0 {
            return Ok(Acquire::Contended { retry_after: None });
        }
        if id < MYSQL_REENTRY_FLAG {
            return Ok(granted(id as i64, 1));
        }
        let (holds,): (i64,) = sqlx::query_as(&q.holds)
            .bind(&hash)
            .bind(owner.as_str())
            .fetch_one(p)
            .await
            .map_err(map_err)?;
        Ok(granted((id - MYSQL_REENTRY_FLAG) as i64, holds))
    }

    async fn lease_release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        self.migrate().await?;
        let q = &self.inner.queries;
        let remaining: Option<i64> = match &self.inner.pool {
            #[cfg(feature = "mysql")]
            Pool::MySql(p) => {
                let done = sqlx::query(&q.release)
                    .bind(key_hash(key))
                    .bind(owner.as_str())
                    .execute(p)
                    .await
                    .map_err(map_err)?;
                (done.rows_affected() == 1).then_some(done.last_insert_id() as i64)
            }
            #[allow(unreachable_patterns)]
            other => on_pool!(other, p => sqlx::query_scalar(&q.release)
                .bind(key_hash(key))
                .bind(owner.as_str())
                .fetch_optional(p)
                .await
                .map_err(map_err)?),
        };
        Ok(match remaining {
            None => Release::NotHeld,
            Some(0) => Release::Freed,
            Some(n) => Release::StillHeld(u32::try_from(n).unwrap_or(u32::MAX)),
        })
    }

    async fn lease_renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
        self.migrate().await?;
        let q = &self.inner.queries.renew;
        let changed = match &self.inner.pool {
            // Placeholders are positional in MySQL: the TTL comes first there.
            #[cfg(feature = "mysql")]
            Pool::MySql(p) => sqlx::query(q)
                .bind(ttl_ms(ttl))
                .bind(key_hash(key))
                .bind(owner.as_str())
                .execute(p)
                .await
                .map_err(map_err)?
                .rows_affected(),
            #[allow(unreachable_patterns)]
            other => on_pool!(other, p => sqlx::query(q)
                .bind(key_hash(key))
                .bind(owner.as_str())
                .bind(ttl_ms(ttl))
                .execute(p)
                .await
                .map_err(map_err)?
                .rows_affected()),
        };
        Ok(if changed == 1 {
            Renew::Renewed
        } else {
            Renew::NotHeld
        })
    }
}

fn granted(fence: i64, holds: i64) -> Acquire {
    Acquire::Acquired(Grant {
        fence: Some(FencingToken(u64::try_from(fence).unwrap_or(0))),
        holds: u32::try_from(holds).unwrap_or(u32::MAX),
        lease: None,
    })
}

#[async_trait]
impl LockBackend for SqlBackend {
    fn capabilities(&self) -> Capabilities {
        let session = self.inner.session.is_some();
        // Releases made by this process wake this process's waiters at
        // once; other processes are found by polling: no `notify`.
        Capabilities::default()
            // Session locks have no row to keep a counter in; see the crate docs.
            .with_fencing(!session)
            // Renewed every third of it, a lease must outlast a commit, a
            // busy wait behind other writers and a scheduling delay on a
            // loaded host; 10 ms did not (SQLite lost it 5 runs in 5).
            .with_min_ttl(MIN_TTL)
            .with_binding(if session {
                Binding::Session
            } else {
                Binding::Lease
            })
            // Rows go a retention after the lock is free, swept by acquires;
            // session locks keep no rows.
            .with_retention(if session {
                Duration::ZERO
            } else {
                self.inner.config.retention + self.sweep_every()
            })
    }

    /// Lease mode: the table exists (created if missing). Session mode: a
    /// connection is made and answers.
    async fn verify(&self) -> Result<()> {
        match self.inner.session {
            None => self.migrate().await,
            Some(_) => {
                on_pool!(&self.inner.pool, p => sqlx::query("SELECT 1")
                    .execute(p)
                    .await
                    .map(|_| ())
                    .map_err(map_err))
            }
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        if let Some(s) = &self.inner.session {
            return s.inspect(key).await;
        }
        self.migrate().await?;
        let hash = key_hash(key);
        let q = &self.inner.queries.inspect;
        let row: Option<(i64, i64, i64)> = on_pool!(&self.inner.pool, p => sqlx::query_as(q)
            .bind(&hash)
            .fetch_optional(p)
            .await
            .map_err(map_err)?);
        Ok(match row {
            Some((holds, fence, left_ms)) => {
                LockStatus::held(u32::try_from(holds).unwrap_or(u32::MAX))
                    .with_fence(u64::try_from(fence).ok().map(FencingToken))
                    .with_remaining(Some(Duration::from_millis(
                        u64::try_from(left_ms).unwrap_or(0),
                    )))
            }
            None => LockStatus::free(),
        })
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        match &self.inner.session {
            Some(s) => s.try_acquire(key, owner).await,
            None => self.lease_acquire(key, owner, ttl).await,
        }
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        let r = match &self.inner.session {
            Some(s) => s.release(key, owner).await?,
            None => self.lease_release(key, owner).await?,
        };
        // One place for both modes: waiters in this process try at once.
        if r == Release::Freed {
            self.inner.local.released(key);
        }
        Ok(r)
    }

    async fn renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
        match &self.inner.session {
            Some(s) => s.renew(key, owner).await,
            None => self.lease_renew(key, owner, ttl).await,
        }
    }

    async fn watch(&self, key: &LockKey, _ticket: &OwnerToken) -> Result<Option<Watch>> {
        Ok(Some(self.inner.local.watch(key)))
    }
}

/// Release notifications between backends of one process that share a
/// database and table: a waiter here hears a release made here at once,
/// instead of at its next poll. Channels are dropped with their last watcher.
#[derive(Debug, Default)]
struct LocalReleases {
    channels: Mutex<HashMap<LockKey, Weak<watch::Sender<u64>>>>,
}

impl LocalReleases {
    fn for_scope(scope: String) -> Arc<Self> {
        static SCOPES: OnceLock<Mutex<HashMap<String, Weak<LocalReleases>>>> = OnceLock::new();
        let mut scopes = SCOPES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        scopes.retain(|_, w| w.strong_count() > 0);
        if let Some(existing) = scopes.get(&scope).and_then(Weak::upgrade) {
            return existing;
        }
        let fresh = Arc::new(LocalReleases::default());
        scopes.insert(scope, Arc::downgrade(&fresh));
        fresh
    }

    fn watch(&self, key: &LockKey) -> Watch {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        channels.retain(|_, w| w.strong_count() > 0);
        let sender = match channels.get(key).and_then(Weak::upgrade) {
            Some(s) => s,
            None => {
                let s = Arc::new(watch::channel(0u64).0);
                channels.insert(key.clone(), Arc::downgrade(&s));
                s
            }
        };
        Watch::new(sender.subscribe(), Some(Box::new(sender)))
    }

    fn released(&self, key: &LockKey) {
        let channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = channels.get(key).and_then(Weak::upgrade) {
            s.send_modify(|v| *v += 1);
        }
    }
}
