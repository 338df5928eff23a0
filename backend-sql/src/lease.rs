//! Lease mode's own statements as the backend runs them: one statement
//! per acquire, release, renewal and proclaim of a mutex's (or writer's)
//! row, every time on the database's clock. What they are is in
//! [`queries`](crate::queries); this is how each dialect sends them and
//! reads the answer.

use std::collections::HashSet;
use std::time::Duration;

use lockwright_core::backend::{Acquire, AcquireRequest, Release, Renew};
use lockwright_core::{Error, LockKey, OwnerToken, Result, MAX_VALUE_LEN};

use crate::backend::SqlBackend;
#[cfg(feature = "mysql")]
use crate::error::is_mysql_conflict;
use crate::error::{is_missing_table, map_err};
use crate::layout::{granted, key_hash};
#[cfg(feature = "postgres")]
use crate::node::dial;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::node::Dedicated;
use crate::node::Pool;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
use crate::queries::renew_batch;
use crate::queries::{list_names, ttl_ms};

/// Leases one renewal statement carries at most.
const RENEW_BATCH: usize = 100;

impl SqlBackend {
    pub(crate) async fn lease_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let (key, owner) = (request.key(), request.owner());
        self.lease_acquire_as(key, owner.as_str(), request.value(), request.ttl)
            .await
    }

    /// [`lease_acquire`](Self::lease_acquire) of the row's owner text
    /// `owner` (a token, or a lone permit's [`inline`](crate::layout::inline)
    /// marker) with `value`.
    pub(crate) async fn lease_acquire_as(
        &self,
        key: &LockKey,
        owner: &str,
        value: Option<&[u8]>,
        ttl: Duration,
    ) -> Result<Acquire> {
        self.migrate().await?;
        self.sweep_now_and_then();
        let q = &self.inner.queries;
        let row: Option<(i64, i64)> = match &self.inner.pool {
            #[cfg(feature = "mysql")]
            Pool::MySql(p) => return self.mysql_acquire(p, key, owner, value, ttl).await,
            #[allow(unreachable_patterns)]
            other => on_pool!(other, p => sqlx::query_as(&q.acquire)
                .bind(key_hash(key))
                .bind(key.as_str())
                .bind(owner)
                .bind(ttl_ms(ttl))
                .bind(value)
                .fetch_optional(p)
                .await
                .map_err(map_err)?),
        };
        Ok(match row {
            Some((fence, holds)) => granted(fence, holds),
            None => Acquire::Contended {
                retry_after: self.due(key).await,
            },
        })
    }

    /// SQLite: when the holder's lease is due, read at once (the file is
    /// local; a waiter looks again then). PostgreSQL's waiters are woken
    /// by `NOTIFY` instead, and a read would cost a round trip.
    async fn due(&self, key: &LockKey) -> Option<Duration> {
        if self.inner.config.dialect != crate::config::Dialect::Sqlite {
            return None;
        }
        let row = self
            .read_row(&self.inner.queries.inspect, &key_hash(key))
            .await;
        let left = row.ok().flatten()?.2;
        Some(Duration::from_millis(u64::try_from(left).unwrap_or(0)))
    }

    #[cfg(feature = "mysql")]
    pub(crate) async fn mysql_acquire(
        &self,
        p: &sqlx::MySqlPool,
        key: &LockKey,
        owner: &str,
        value: Option<&[u8]>,
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
                .bind(owner)
                .bind(ttl_ms(ttl))
                .bind(value)
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
        if (crate::queries::MYSQL_HELD_FLAG..MYSQL_REENTRY_FLAG).contains(&id) {
            let left = id - crate::queries::MYSQL_HELD_FLAG;
            return Ok(Acquire::Contended {
                retry_after: Some(Duration::from_millis(left)),
            });
        }
        if id < MYSQL_REENTRY_FLAG {
            return Ok(granted(id as i64, 1));
        }
        let fence = (id - MYSQL_REENTRY_FLAG) as i64;
        let holds: Option<i64> = sqlx::query_scalar(&q.holds)
            .bind(&hash)
            .bind(owner)
            .fetch_optional(p)
            .await
            .map_err(map_err)?;
        if let Some(holds) = holds {
            return Ok(granted(fence, holds));
        }
        // A lone permit's re-entry, granted, whose hold a second claim
        // moved to the holders table before this read.
        let moved = crate::layout::lone_holder(owner).ok_or_else(|| {
            Error::backend(format!("the row of {key} changed hands after a re-entry"))
        })?;
        let holds: i64 = sqlx::query_scalar(&q.holds_moved)
            .bind(&hash)
            .bind(moved)
            .fetch_one(p)
            .await
            .map_err(map_err)?;
        Ok(granted(fence, holds))
    }

    pub(crate) async fn lease_release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        self.lease_release_as(key, owner.as_str()).await
    }

    /// [`lease_release`](Self::lease_release) of the row's owner text.
    pub(crate) async fn lease_release_as(&self, key: &LockKey, owner: &str) -> Result<Release> {
        self.migrate().await?;
        let q = &self.inner.queries;
        let remaining: Option<i64> = match &self.inner.pool {
            #[cfg(feature = "mysql")]
            Pool::MySql(p) => {
                let done = sqlx::query(&q.release)
                    .bind(key_hash(key))
                    .bind(owner)
                    .execute(p)
                    .await
                    .map_err(map_err)?;
                (done.rows_affected() == 1).then_some(done.last_insert_id() as i64)
            }
            // The freed name's channel is notified by the same statement.
            #[cfg(feature = "postgres")]
            Pool::Postgres(p) => {
                let channel = self.inner.local.channel(key);
                let waited = crate::notify::waited_key(&channel);
                sqlx::query_scalar(&q.release)
                    .bind(key_hash(key))
                    .bind(owner)
                    .bind(channel)
                    .bind(waited)
                    .fetch_optional(p)
                    .await
                    .map_err(map_err)?
            }
            #[allow(unreachable_patterns)]
            other => on_pool!(other, p => sqlx::query_scalar(&q.release)
                .bind(key_hash(key))
                .bind(owner)
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

    /// Extends one row's lease, owner-checked, by the row's owner text
    /// `owner`: how MySQL's batches ask again lease by lease (see
    /// [`lease_renew_chunk`](Self::lease_renew_chunk)).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) async fn lease_renew_as(
        &self,
        key: &LockKey,
        owner: &str,
        ttl: Duration,
    ) -> Result<Renew> {
        self.migrate().await?;
        let q = &self.inner.queries.renew;
        let changed = match &self.inner.pool {
            // Placeholders are positional in MySQL: the TTL comes first there.
            #[cfg(feature = "mysql")]
            Pool::MySql(p) => sqlx::query(q)
                .bind(ttl_ms(ttl))
                .bind(key_hash(key))
                .bind(owner)
                .execute(p)
                .await
                .map_err(map_err)?
                .rows_affected(),
            #[allow(unreachable_patterns)]
            other => on_pool!(other, p => sqlx::query(q)
                .bind(key_hash(key))
                .bind(owner)
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

    /// Renews the name rows `rows` (key, the row's owner text, TTL) in one
    /// statement per [`RENEW_BATCH`]: the indexes of those renewed. A row
    /// not renewed may still be held another way (a moved writer's hold,
    /// a permit): the caller asks the holders table about it.
    pub(crate) async fn lease_renew_many(
        &self,
        rows: &[(&LockKey, &str, Duration)],
    ) -> Result<HashSet<usize>> {
        self.migrate().await?;
        let mut renewed = HashSet::new();
        let mut from = 0;
        for chunk in rows.chunks(RENEW_BATCH) {
            for i in self.lease_renew_chunk(chunk).await? {
                renewed.insert(from + i);
            }
            from += chunk.len();
        }
        Ok(renewed)
    }

    // MySQL's arm answers by itself: built with MySQL alone, the end is
    // never reached.
    #[allow(unreachable_code, unused_variables)]
    async fn lease_renew_chunk(&self, rows: &[(&LockKey, &str, Duration)]) -> Result<Vec<usize>> {
        let hashes: Vec<String> = rows.iter().map(|(k, _, _)| key_hash(k)).collect();
        let config = &self.inner.config;
        let back: Vec<(String, String)> = match &self.inner.pool {
            #[cfg(feature = "postgres")]
            Pool::Postgres(p) => {
                let q = sqlx::query_as(&self.inner.queries.renew_many)
                    .bind(&hashes)
                    .bind(rows.iter().map(|(_, o, _)| *o).collect::<Vec<_>>())
                    .bind(rows.iter().map(|(_, _, t)| ttl_ms(*t)).collect::<Vec<_>>());
                // Out of its slot while in use: a batch cut off (the
                // watchdog's timeout) or failed drops it, and the next one
                // dials afresh rather than write to a dead connection.
                let mut slot = self.inner.renewer.0.lock().await;
                let mut c = match slot.take() {
                    Some(Dedicated::Pg(c)) => c,
                    _ => dial(p, config.connect_timeout).await?,
                };
                let rows = q.fetch_all(&mut c).await.map_err(map_err)?;
                *slot = Some(Dedicated::Pg(c));
                rows
            }
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(p) => {
                let sql = renew_batch(config.dialect, &config.table, rows.len());
                let mut q = sqlx::query_as(&sql);
                for ((_, owner, ttl), hash) in rows.iter().zip(&hashes) {
                    q = q.bind(hash).bind(*owner).bind(ttl_ms(*ttl));
                }
                q.fetch_all(p).await.map_err(map_err)?
            }
            #[cfg(feature = "mysql")]
            Pool::MySql(p) => {
                let sql = renew_batch(config.dialect, &config.table, rows.len());
                let mut q = sqlx::query(&sql);
                for ((_, owner, ttl), hash) in rows.iter().zip(&hashes) {
                    q = q.bind(hash).bind(*owner).bind(ttl_ms(*ttl));
                }
                let mut slot = self.inner.renewer.0.lock().await;
                let mut c = match slot.take() {
                    Some(Dedicated::My(c)) => c,
                    _ => crate::node::dial_mysql(p, config.connect_timeout).await?,
                };
                let matched = q.execute(&mut c).await.map_err(map_err)?.rows_affected();
                *slot = Some(Dedicated::My(c));
                drop(slot);
                let distinct: HashSet<(&String, &str)> =
                    hashes.iter().zip(rows.iter().map(|(_, o, _)| *o)).collect();
                if matched == distinct.len() as u64 {
                    return Ok((0..rows.len()).collect());
                }
                // Some lease was not ours any more: which, one at a time
                // (rare; renewing the others again does no harm).
                let each = rows.iter().map(|(k, o, t)| self.lease_renew_as(k, o, *t));
                let outcomes = futures::future::join_all(each).await;
                let mut renewed = Vec::new();
                for (i, r) in outcomes.into_iter().enumerate() {
                    if r? == Renew::Renewed {
                        renewed.push(i);
                    }
                }
                return Ok(renewed);
            }
        };
        let back: HashSet<(String, String)> = back.into_iter().collect();
        Ok(rows
            .iter()
            .zip(&hashes)
            .enumerate()
            .filter(|(_, ((_, owner, _), hash))| {
                back.contains(&((*hash).clone(), (*owner).to_owned()))
            })
            .map(|(i, _)| i)
            .collect())
    }

    /// One owner-checked `UPDATE` of the value; the lease is left alone.
    pub(crate) async fn lease_proclaim(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        value: &[u8],
    ) -> Result<Renew> {
        if value.len() > MAX_VALUE_LEN {
            // MySQL's column would refuse it, PostgreSQL's and SQLite's not.
            return Err(Error::invalid_options(format!(
                "a leader's value is at most {MAX_VALUE_LEN} bytes, not {}",
                value.len()
            )));
        }
        self.migrate().await?;
        let q = &self.inner.queries.proclaim;
        let changed = match &self.inner.pool {
            // Positional placeholders: the value comes first in MySQL's text.
            #[cfg(feature = "mysql")]
            Pool::MySql(p) => sqlx::query(q)
                .bind(value)
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
                .bind(value)
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

    /// An SQLite file not made yet: a reader (`inspect`, `names`) finds
    /// nothing in it, and must not make it.
    pub(crate) fn not_made_yet(&self) -> bool {
        self.inner.file.as_ref().is_some_and(|f| !f.exists())
    }

    /// The names of the rows that have an owner, starting with `prefix`
    /// (none from a table or SQLite file not made yet).
    pub(crate) async fn names(&self, prefix: &str) -> Result<Vec<LockKey>> {
        if self.not_made_yet() {
            return Ok(Vec::new());
        }
        let dialect = self.inner.config.dialect;
        let stmt = list_names(dialect, &self.inner.config.table);
        // MySQL's statement names the prefix twice.
        let twice = dialect == crate::config::Dialect::MySql;
        let rows: std::result::Result<Vec<(String,)>, sqlx::Error> = on_pool!(&self.inner.pool, p => {
            let query = sqlx::query_as(&stmt).bind(prefix);
            let query = if twice { query.bind(prefix) } else { query };
            query.fetch_all(p).await
        });
        match rows {
            // Every row's name was a valid key when it was written.
            Ok(rows) => Ok(rows
                .into_iter()
                .filter_map(|(k,)| LockKey::new(k).ok())
                .collect()),
            Err(e) if is_missing_table(&e) => Ok(Vec::new()),
            Err(e) => Err(map_err(e)),
        }
    }

    /// The live row of `key`: holds, fence, ms left, owner, value.
    pub(crate) async fn read_row(
        &self,
        query: &str,
        hash: &str,
    ) -> std::result::Result<Option<Row>, sqlx::Error> {
        on_pool!(&self.inner.pool, p => sqlx::query_as(query)
            .bind(hash)
            .fetch_optional(p)
            .await)
    }
}

/// A live lease row as `inspect` reads it.
pub(crate) type Row = (i64, i64, i64, String, Option<Vec<u8>>);
