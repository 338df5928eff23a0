//! [`SqlBackend`]: the [`LockBackend`] over a lease table.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use locksmith_core::{
    Acquire, Binding, Capabilities, Error, FencingToken, Grant, LockBackend, LockKey, OwnerToken,
    Release, Renew, Result, Watch,
};
use sha2::{Digest, Sha256};
use tokio::sync::{watch, OnceCell};

use crate::config::{Dialect, SqlConfig};
use crate::queries::Queries;

#[derive(Debug, Clone)]
enum Pool {
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
}

/// Locks as rows of one table: a unique key per lock, the owner token, a
/// hold count, a fencing column that only ever grows, and an expiry on the
/// database's clock. Cheap to clone; clones share the pool.
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
        let (pool, local_scope) = match config.dialect {
            #[cfg(feature = "sqlite")]
            Dialect::Sqlite => sqlite_pool(&config)?,
            #[allow(unreachable_patterns)]
            other => {
                return Err(Error::config(format!(
                    "{:?} support is not compiled in; enable this crate's cargo feature for it",
                    other
                )))
            }
        };
        let queries = Queries::new(config.dialect, &config.table);
        let local = LocalReleases::for_scope(format!("{local_scope}\u{0}{}", config.table));
        Ok(SqlBackend {
            inner: Arc::new(Inner {
                config,
                pool,
                queries,
                schema: OnceCell::new(),
                local,
            }),
        })
    }

    /// The configuration in use (its URL prints without secrets).
    pub fn config(&self) -> &SqlConfig {
        &self.inner.config
    }

    /// Creates the lease table if it does not exist. Every operation does this
    /// on first use; call it to fail fast at start-up instead.
    ///
    /// # Errors
    /// `Unavailable` if the database cannot be reached.
    pub async fn migrate(&self) -> Result<()> {
        self.inner
            .schema
            .get_or_try_init(|| async {
                for stmt in &self.inner.queries.create {
                    match &self.inner.pool {
                        #[cfg(feature = "sqlite")]
                        Pool::Sqlite(p) => sqlx::query(stmt).execute(p).await.map_err(map_err)?,
                    };
                }
                Ok::<(), Error>(())
            })
            .await?;
        Ok(())
    }
}

/// The key's fixed-width identity in the table.
fn key_hash(key: &LockKey) -> String {
    hex::encode(Sha256::digest(key.as_str().as_bytes()))
}

fn ttl_ms(ttl: Duration) -> i64 {
    // The core caps TTLs at a year; the clamp only keeps this total.
    i64::try_from(ttl.as_millis().max(1)).unwrap_or(i64::MAX / 4)
}

#[cfg(feature = "sqlite")]
fn sqlite_pool(config: &SqlConfig) -> Result<(Pool, String)> {
    use sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous,
    };
    use std::str::FromStr;

    let opts = SqliteConnectOptions::from_str(config.url.expose())
        .map_err(|e| Error::config(format!("{}: {e}", config.url)))?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(5));
    let scope = std::path::absolute(opts.get_filename())
        .unwrap_or_else(|_| PathBuf::from(opts.get_filename()))
        .display()
        .to_string();
    let pool = SqlitePoolOptions::new()
        .max_connections(config.pool_max)
        .acquire_timeout(config.connect_timeout)
        .connect_lazy_with(opts);
    Ok((Pool::Sqlite(pool), scope))
}

/// Maps driver errors onto the contract's kinds, in one place: anything that
/// means "could not talk to the database" is `Unavailable`.
fn map_err(e: sqlx::Error) -> Error {
    use sqlx::Error as E;
    let kind_unavailable = match &e {
        E::Io(_) | E::Tls(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => true,
        E::Database(db) => db.code().is_some_and(|c| is_unavailable_code(&c)),
        _ => false,
    };
    let msg = e.to_string();
    if kind_unavailable {
        Error::unavailable(format!("database unavailable: {msg}")).with_source(e)
    } else if matches!(e, E::Configuration(_)) {
        Error::config(msg).with_source(e)
    } else {
        Error::backend(msg).with_source(e)
    }
}

fn is_unavailable_code(code: &str) -> bool {
    // SQLite reports (extended) result codes as numbers: BUSY 5, LOCKED 6,
    // READONLY 8, IOERR 10, FULL 13, CANTOPEN 14.
    code.parse::<i64>()
        .is_ok_and(|n| matches!(n & 0xff, 5 | 6 | 8 | 10 | 13 | 14))
}

#[async_trait]
impl LockBackend for SqlBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: true,
            min_ttl: Duration::from_millis(10),
            ttl_resolution: Duration::from_millis(1),
            binding: Binding::Lease,
            // Releases made by this process wake this process's waiters at
            // once; other processes are found by polling.
            notify: false,
            batch_renew: false,
        }
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        self.migrate().await?;
        let q = &self.inner.queries.acquire;
        let row: Option<(i64, i64)> = match &self.inner.pool {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(p) => sqlx::query_as(q)
                .bind(key_hash(key))
                .bind(key.as_str())
                .bind(owner.as_str())
                .bind(ttl_ms(ttl))
                .fetch_optional(p)
                .await
                .map_err(map_err)?,
        };
        Ok(match row {
            Some((fence, holds)) => Acquire::Acquired(Grant {
                fence: Some(FencingToken(u64::try_from(fence).unwrap_or(0))),
                holds: u32::try_from(holds).unwrap_or(u32::MAX),
            }),
            None => Acquire::Contended { retry_after: None },
        })
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        self.migrate().await?;
        let q = &self.inner.queries.release;
        let row: Option<(i64,)> = match &self.inner.pool {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(p) => sqlx::query_as(q)
                .bind(key_hash(key))
                .bind(owner.as_str())
                .fetch_optional(p)
                .await
                .map_err(map_err)?,
        };
        Ok(match row {
            None => Release::NotHeld,
            Some((0,)) => {
                self.inner.local.released(key);
                Release::Freed
            }
            Some((n,)) => Release::StillHeld(u32::try_from(n).unwrap_or(u32::MAX)),
        })
    }

    async fn renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
        self.migrate().await?;
        let q = &self.inner.queries.renew;
        let changed = match &self.inner.pool {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(p) => sqlx::query(q)
                .bind(key_hash(key))
                .bind(owner.as_str())
                .bind(ttl_ms(ttl))
                .execute(p)
                .await
                .map_err(map_err)?
                .rows_affected(),
        };
        Ok(if changed == 1 {
            Renew::Renewed
        } else {
            Renew::NotHeld
        })
    }

    async fn watch(&self, key: &LockKey) -> Result<Option<Watch>> {
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
