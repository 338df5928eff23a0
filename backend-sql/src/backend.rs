//! [`SqlBackend`]: the [`LockBackend`] over a table of lease rows.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lockwright_core::backend::{
    lock_unpoisoned, Acquire, AcquireRequest, Capabilities, HoldId, LockBackend, Release, Renew,
    RenewRequest, Watch,
};
use lockwright_core::{Claim, Error, FencingToken, LockKey, LockStatus, OwnerToken, Result};
use tokio::sync::OnceCell;

use crate::claims::Claims;
use crate::claims_sql::{create_holders, sweep_holders, ClaimsSql};
use crate::config::{Dialect, Mode, SqlConfig, MIN_TTL};
use crate::error::{is_missing_column, is_missing_table, map_err};
use crate::layout::key_hash;
#[cfg(feature = "sqlite")]
use crate::node::use_wal;
use crate::node::{add_value_column, create, open_pool, probe, Pool, Renewer};
use crate::notify::LocalReleases;
use crate::queries::{ttl_ms, Queries, SWEEP_BATCH};

/// The statements of lease mode. Parameters: acquire (key hash, key, owner,
/// TTL in ms, the value a first grant writes or `NULL`); release (key hash,
/// owner; on PostgreSQL also the channel that a release freeing the name
/// notifies if someone waits, and the advisory lock key waiters hold
/// shared); renew (key hash, owner, TTL in ms; on MySQL the TTL comes
/// first). The key hash is the lowercase hex SHA-256 of the key.
#[derive(Debug, Clone)]
pub struct LeaseStatements {
    /// DDL creating the table. A table of an earlier version lacks its
    /// `value` column, which [`SqlBackend::migrate`] adds.
    pub create: Vec<String>,
    /// Takes a free, expired or own (re-entrant) key.
    pub acquire: String,
    /// Drops one hold, owner-checked.
    pub release: String,
    /// Extends the lease, owner-checked.
    pub renew: String,
}

/// Locks in a SQL database as lease rows: each lock is a row of one table,
/// with a unique key, the owner token, a hold count, a fencing column that
/// only ever grows, and an expiry on the database's clock. (Session locks,
/// `?mode=session`, are [`SqlSessionBackend`](crate::SqlSessionBackend).)
/// Cheap to clone; clones share the pool.
#[derive(Debug, Clone)]
pub struct SqlBackend {
    pub(crate) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: SqlConfig,
    pub(crate) pool: Pool,
    pub(crate) queries: Queries,
    pub(crate) schema: OnceCell<()>,
    pub(crate) local: Arc<LocalReleases>,
    /// SQLite: the database file, which a status read must not create.
    pub(crate) file: Option<std::path::PathBuf>,
    /// When this client last started a sweep (see [`SqlBackend::sweep`]).
    pub(crate) swept: Mutex<Option<std::time::Instant>>,
    /// Permits and read holds.
    pub(crate) claims: Claims,
    /// The writers this client marked as waiting for readers (key,
    /// owner): a grant takes the mark away.
    pub(crate) marked: Mutex<HashSet<(LockKey, String)>>,
    /// The connection renewal batches go over.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) renewer: Renewer,
}

impl SqlBackend {
    /// Opens a backend for `url` (see [`SqlConfig::from_url`]). No connection
    /// is made yet: a database that is down shows up as `Unavailable` on the
    /// first operation, and work resumes when it is back.
    ///
    /// # Errors
    /// `Config`/`InvalidOptions` for a bad URL or table name, and `Config`
    /// for `?mode=session`, which is [`SqlSessionBackend`](crate::SqlSessionBackend)'s.
    pub fn connect(url: &str) -> Result<Self> {
        Self::with_config(SqlConfig::from_url(url)?)
    }

    /// Opens a backend from a parsed configuration.
    ///
    /// # Errors
    /// `Config` if the driver rejects the URL, or the dialect's cargo feature is off.
    pub fn with_config(config: SqlConfig) -> Result<Self> {
        if config.mode == Mode::Session {
            return Err(Error::config(format!(
                "{}: session locks need SqlSessionBackend (or lockwright::connect)",
                config.url
            )));
        }
        let (pool, scope) = open_pool(&config)?;
        let queries = Queries::new(config.dialect, &config.table);
        let local = LocalReleases::for_scope(
            &scope,
            &config.table,
            #[cfg(feature = "postgres")]
            crate::listen::listener(&config)?,
        );
        // For SQLite the scope is the file's absolute path.
        let file = (config.dialect == Dialect::Sqlite).then(|| std::path::PathBuf::from(&scope));
        let claims = Claims::new(pool.clone(), ClaimsSql::new(config.dialect, &config.table));
        Ok(SqlBackend {
            inner: Arc::new(Inner {
                config,
                pool,
                queries,
                schema: OnceCell::new(),
                local,
                file,
                swept: Mutex::new(None),
                claims,
                marked: Mutex::new(HashSet::new()),
                renewer: Renewer::default(),
            }),
        })
    }

    /// The configuration in use (its URL prints without secrets).
    pub fn config(&self) -> &SqlConfig {
        &self.inner.config
    }

    /// The SQL this backend runs, for inspection, migrations
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

    /// Creates the lease table if it does not exist, and gives a table of
    /// an earlier version the `value` column it lacks (locks held in it
    /// stay held). Every operation does this on first use; call it to fail
    /// fast at start-up.
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
                let table = &self.inner.config.table;
                let ddl = create_holders(self.inner.config.dialect, table);
                create(&self.inner.pool, &ddl).await?;
                add_value_column(&self.inner.pool, &self.inner.config.table).await?;
                Ok::<(), Error>(())
            })
            .await?;
        Ok(())
    }
}

impl SqlBackend {
    /// Deletes the lease rows that have been free (released, or their lease
    /// ended) for longer than the [retention](SqlConfig::retention), and
    /// returns how many went. Acquires start one in the background at most
    /// every quarter of the retention, so a free row is gone within 1.25 ×
    /// the retention while any client of the table keeps acquiring; call
    /// this to collect at other times.
    ///
    /// # Errors
    /// `Unavailable` if the database cannot be reached.
    pub async fn sweep(&self) -> Result<u64> {
        self.migrate().await?;
        let retention = ttl_ms(self.inner.config.retention);
        // Batches keep each statement short; a backlog left by an earlier
        // version is worked off over several sweeps.
        let gone = self
            .sweep_with(&self.inner.queries.sweep, retention)
            .await?;
        let (dialect, table) = (self.inner.config.dialect, &self.inner.config.table);
        let stmt = sweep_holders(dialect, table, SWEEP_BATCH);
        Ok(gone + self.sweep_with(&stmt, retention).await?)
    }

    /// Runs the sweep statement `stmt` (retention in ms) batch after batch
    /// until one comes back short, or 100 batches.
    async fn sweep_with(&self, stmt: &str, retention: i64) -> Result<u64> {
        let mut gone = 0;
        for _ in 0..100 {
            let n = on_pool!(&self.inner.pool, p => sqlx::query(stmt)
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
    pub(crate) fn sweep_now_and_then(&self) {
        let every = self.sweep_every();
        let now = std::time::Instant::now();
        {
            let mut last = lock_unpoisoned(&self.inner.swept);
            if last.is_some_and(|t| now.duration_since(t) < every) {
                return;
            }
            *last = Some(now);
        }
        let this = self.clone();
        tokio::spawn(async move {
            if let Err(e) = this.sweep().await {
                tracing::debug!(error = %e.chain(), "sweep of free lease rows failed");
            }
        });
    }
}

impl SqlBackend {
    /// Permits and read holds.
    /// PostgreSQL: tells every process's waiters that `key` was freed by a
    /// statement that did not say so itself (a permit's or read hold's).
    /// The release stands either way: a waiter that misses it polls.
    async fn notify(&self, key: &LockKey) {
        #[cfg(feature = "postgres")]
        #[allow(irrefutable_let_patterns)]
        if let Pool::Postgres(p) = &self.inner.pool {
            let channel = self.inner.local.channel(key);
            let sent = sqlx::query(
                "SELECT CASE WHEN NOT pg_try_advisory_xact_lock($2)
                             THEN pg_notify($1, '') IS NULL END",
            )
            .bind(&channel)
            .bind(crate::notify::waited_key(&channel))
            .execute(p)
            .await;
            if let Err(e) = sent {
                tracing::debug!(key = %key, error = %e, "release not announced; waiters poll");
            }
        }
        #[cfg(not(feature = "postgres"))]
        let _ = key;
    }

    fn claims(&self) -> &Claims {
        &self.inner.claims
    }

    fn marks(&self) -> std::sync::MutexGuard<'_, HashSet<(LockKey, String)>> {
        lock_unpoisoned(&self.inner.marked)
    }
}

#[async_trait]
impl LockBackend for SqlBackend {
    fn capabilities(&self) -> Capabilities {
        // Releases wake this process's waiters at once, and on PostgreSQL
        // every process's (`NOTIFY`); a lease that ran out is found by
        // polling, which stays beside it: no `notify`.
        Capabilities::default()
            .with_fencing(true)
            .with_values(true)
            .with_permits(true)
            .with_shared(true)
            .with_listing(true)
            .with_min_ttl(MIN_TTL)
            // Rows go a retention after the lock is free, swept by acquires.
            .with_retention(self.inner.config.retention + self.sweep_every())
    }

    /// The table exists (created if missing), which needs the database
    /// reachable and the credentials accepted.
    async fn verify(&self) -> Result<()> {
        probe(&self.inner.config).await?;
        self.migrate().await
    }

    /// Reads only: a table (or SQLite file) that does not exist yet is not
    /// created, and every key in it reads as free.
    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        if self.not_made_yet() {
            return Ok(LockStatus::free());
        }
        let hash = key_hash(key);
        let q = &self.inner.queries;
        let read = match self.read_row(&q.inspect, &hash).await {
            // A table of an earlier version that no writer of this one has
            // set up yet: it holds no values. Not altered here, as a
            // reader may have no right to.
            Err(e) if is_missing_column(&e) => self.read_row(&q.inspect_legacy, &hash).await,
            other => other,
        };
        let row = match read {
            Ok(row) => row,
            Err(e) if is_missing_table(&e) => None,
            Err(e) => return Err(map_err(e)),
        };
        if let Some((holds, fence, left_ms, owner, _)) = &row {
            let lone = (*holds, *fence, *left_ms);
            if let Some(status) = self.claims().inspect(key, owner, lone).await? {
                return Ok(status);
            }
        }
        Ok(match row {
            Some((holds, fence, left_ms, owner, value)) => {
                LockStatus::held(u32::try_from(holds).unwrap_or(u32::MAX))
                    .with_fence(u64::try_from(fence).ok().map(FencingToken))
                    .with_remaining(Some(Duration::from_millis(
                        u64::try_from(left_ms).unwrap_or(0),
                    )))
                    .with_owner(OwnerToken::from_string(owner).ok())
                    .with_value(value)
            }
            None => LockStatus::free(),
        })
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let (key, owner, ttl) = (request.key(), request.owner(), request.ttl);
        if request.claim() != Claim::MUTEX {
            if let Some(marker) = lone_permit(&request.hold) {
                // A free name's first permit is one statement, the mutex's.
                let first = self.lease_acquire_as(key, &marker, None, ttl).await?;
                if matches!(first, Acquire::Acquired(_)) {
                    return Ok(first);
                }
            } else {
                self.migrate().await?;
                self.sweep_now_and_then();
            }
            return self.claims().acquire(&request.hold, ttl).await;
        }
        let acquired = self.lease_acquire(request).await?;
        {
            let claims = self.claims();
            let mark = (key.clone(), owner.as_str().to_owned());
            match acquired {
                Acquire::Contended { .. } => {
                    if claims.after_refusal(key, owner, ttl).await? {
                        self.marks().insert(mark);
                    }
                }
                Acquire::Acquired(_) => {
                    // The grant stands whatever happens to the mark, which
                    // at worst keeps readers out until its TTL.
                    if self.marks().remove(&mark) {
                        if let Err(e) = claims.unmark(key, owner).await {
                            tracing::debug!(key = %key, error = %e.chain(),
                                "a writer's mark stays until its TTL");
                        }
                    }
                }
            }
        }
        Ok(acquired)
    }

    async fn release(&self, hold: &HoldId) -> Result<Release> {
        let (key, owner) = (&hold.key, &hold.owner);
        let r = if hold.claim() == Claim::MUTEX {
            self.lease_release(key, owner).await?
        } else if let Some(marker) = lone_permit(hold) {
            self.lease_release_as(key, &marker).await?
        } else {
            Release::NotHeld
        };
        // A permit, a read hold, or a writer's hold that a downgrade moved.
        let (r, notified) = match r {
            Release::NotHeld => (self.claims().release(key, owner).await?, false),
            // The name row's release statement notified other processes.
            r => (r, true),
        };
        // Waiters in this process try at once; on PostgreSQL, everyone's.
        if r == Release::Freed {
            self.inner.local.released(key);
            if !notified {
                self.notify(key).await;
            }
        }
        Ok(r)
    }

    /// Mutexes' and lone permits' leases in one statement per 100 (on
    /// PostgreSQL and SQLite returning which were renewed; on MySQL, the
    /// rare batch with one no longer held is asked again lease by lease);
    /// permits and read holds each on its own, in the holders table.
    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        let markers: Vec<Option<String>> = requests
            .iter()
            .map(|r| match r.hold.claim() {
                Claim::MUTEX => Some(r.owner().as_str().to_owned()),
                _ => lone_permit(&r.hold),
            })
            .collect();
        let rows: Vec<(usize, (&LockKey, &str, Duration))> = requests
            .iter()
            .zip(&markers)
            .enumerate()
            .filter_map(|(i, (r, m))| m.as_deref().map(|m| (i, (r.key(), m, r.ttl))))
            .collect();
        let mut out: Vec<Option<Result<Renew>>> = vec![None; requests.len()];
        if !rows.is_empty() {
            let batch: Vec<_> = rows.iter().map(|(_, row)| *row).collect();
            match self.lease_renew_many(&batch).await {
                Ok(renewed) => {
                    for (n, (i, _)) in rows.iter().enumerate() {
                        if renewed.contains(&n) {
                            out[*i] = Some(Ok(Renew::Renewed));
                        }
                    }
                }
                Err(e) => {
                    for (i, _) in &rows {
                        out[*i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        // Not renewed on the name row: held another way, or not at all.
        let rest = requests.iter().zip(&out).map(|(r, done)| async move {
            match done {
                Some(d) => d.clone(),
                None => self.claims().renew(r.key(), r.owner(), r.ttl).await,
            }
        });
        futures::future::join_all(rest).await
    }

    /// A writer giving up takes its mark away, so readers enter again.
    async fn abandon(&self, hold: &HoldId, _ticket: &OwnerToken) -> Result<()> {
        let (key, owner) = (&hold.key, &hold.owner);
        // Only a mark this client left: a mutex's give-up costs nothing.
        if self
            .marks()
            .remove(&(key.clone(), owner.as_str().to_owned()))
        {
            self.claims().unmark(key, owner).await?;
        }
        Ok(())
    }

    /// The rows that have an owner (see `lease.rs`): a group's name row
    /// carries its marker, so every kind is among them.
    async fn list(&self, prefix: &str) -> Result<Vec<LockKey>> {
        self.names(prefix).await
    }

    async fn proclaim(&self, hold: &HoldId, value: &[u8]) -> Result<Renew> {
        self.lease_proclaim(&hold.key, &hold.owner, value).await
    }

    async fn watch(&self, key: &LockKey, _ticket: &OwnerToken) -> Result<Option<Watch>> {
        Ok(Some(self.inner.local.watch(key)))
    }
}

/// The name row's owner while `hold`'s permit is the only one out, for a
/// semaphore's claim (see [`inline`](crate::layout::inline)).
fn lone_permit(hold: &HoldId) -> Option<String> {
    match hold.claim() {
        Claim::Exclusive { permits } if permits > 1 => {
            crate::layout::inline(permits, hold.owner.as_str())
        }
        _ => None,
    }
}
