//! Semaphore permits and read holds (every claim but the mutex's) on
//! SQLite, each operation one transaction under the database's write lock.
//!
//! The lock's row in the lease table stays the one thing every claim on a
//! name meets, so the mutex keeps its one statement: while permits or read
//! holds are out, the row is held by the group, its `owner` the marker
//! `~permits:<N>` or `~shared` (no token can start with `~`), its `holds`
//! the number of holders, its `expires_at` the latest of their leases and
//! its `fence` the last grant's. A mutex or a writer meets a live group as
//! a holder of another owner (contended), and the group meets a live
//! mutex or writer the same way. Each holder of the group has a row in the
//! holders table `<table>_holders`, keyed by (key hash, owner): its kind,
//! holds, fence and lease. A row with no holds is a writer waiting for
//! readers to leave (its mark), until its TTL: new readers stay out while
//! one is live. A downgrade turns the writer's hold into a row of its own
//! in the holders table (the name row becomes `~shared`), so the read hold
//! is granted beside it and the writer's release or renewal, refused by
//! the mutex's statement, is found here.
//!
//! Rows of the holders table go with the hold, or with the sweep once
//! their lease has run out longer than the retention ago.

use std::time::Duration;

use locksmith_core::backend::{
    claim_changed, permits_mismatch, semaphore_or_rwlock, Acquire, Release, Renew,
};
use locksmith_core::{Claim, LockKey, OwnerToken, Result};
use sqlx::{SqliteConnection, SqlitePool};
use std::future::Future;
use std::pin::Pin;

use crate::error::map_err;
use crate::layout::{classify, holders_table, Name, NameRow, PERMITS, SHARED};
use crate::lease::granted;
use crate::queries::{ttl_ms, SQLITE_NOW};

/// A live holder row: (owner, shared, holds, fence, expires_at).
pub(crate) type HolderRow = (String, i64, i64, i64, i64);

pub(crate) fn left(until: i64, now: i64) -> Option<Duration> {
    Some(Duration::from_millis(
        u64::try_from(until - now).unwrap_or(0),
    ))
}

fn contended(until: Option<i64>, now: i64) -> Acquire {
    Acquire::Contended {
        retry_after: until.and_then(|u| left(u, now)),
    }
}

/// The claims of one lease table on one SQLite pool.
#[derive(Debug, Clone)]
pub(crate) struct Claims {
    pub(crate) pool: SqlitePool,
    pub(crate) table: String,
    pub(crate) holders: String,
}

/// An answer the store gave, or the caller's mistake it refused.
pub(crate) type Answer<T> = std::result::Result<Result<T>, sqlx::Error>;

/// One transaction's work, borrowing the connection.
type Work<'c, T> = Pin<Box<dyn Future<Output = Answer<T>> + Send + 'c>>;

impl Claims {
    pub(crate) fn new(pool: SqlitePool, table: &str) -> Self {
        Claims {
            pool,
            table: table.to_owned(),
            holders: holders_table(table),
        }
    }

    /// Runs `op` in one `BEGIN IMMEDIATE` transaction (the write lock
    /// first, so no reader's snapshot can go stale under it), committed
    /// when it answers and rolled back when it fails or refuses.
    pub(crate) async fn in_txn<T: Send>(
        &self,
        op: impl for<'c> FnOnce(&'c Claims, &'c mut SqliteConnection) -> Work<'c, T>,
    ) -> Result<T> {
        // sqlx's transaction, so that one dropped mid-way (a renewal cut
        // off by its timeout, a cancelled acquire) is rolled back before
        // its connection serves anyone else: a connection left inside
        // BEGIN IMMEDIATE would keep the write lock from every process.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_err)?;
        match op(self, &mut tx).await {
            Ok(Ok(answer)) => {
                tx.commit().await.map_err(map_err)?;
                Ok(answer)
            }
            Ok(Err(refused)) => {
                let _ = tx.rollback().await;
                Err(refused)
            }
            Err(e) => {
                let _ = tx.rollback().await;
                Err(map_err(e))
            }
        }
    }

    pub(crate) async fn now(c: &mut SqliteConnection) -> std::result::Result<i64, sqlx::Error> {
        sqlx::query_scalar(&format!("SELECT {SQLITE_NOW}"))
            .fetch_one(c)
            .await
    }

    pub(crate) async fn name_row(
        &self,
        c: &mut SqliteConnection,
        hash: &str,
    ) -> std::result::Result<Option<NameRow>, sqlx::Error> {
        sqlx::query_as(&format!(
            "SELECT owner, holds, fence, expires_at FROM {} WHERE key_hash = ?1",
            self.table
        ))
        .bind(hash)
        .fetch_optional(c)
        .await
    }

    async fn live_holders(
        &self,
        c: &mut SqliteConnection,
        hash: &str,
        now: i64,
    ) -> std::result::Result<Vec<HolderRow>, sqlx::Error> {
        sqlx::query_as(&format!(
            "SELECT owner, shared, holds, fence, expires_at FROM {}
             WHERE key_hash = ?1 AND expires_at > ?2",
            self.holders
        ))
        .bind(hash)
        .bind(now)
        .fetch_all(c)
        .await
    }

    /// Sets the name row to what its live holders say, in one statement:
    /// their count and latest lease; free (released now) when none is left.
    async fn settle_name(
        &self,
        c: &mut SqliteConnection,
        hash: &str,
    ) -> std::result::Result<(), sqlx::Error> {
        let (t, h, now) = (&self.table, &self.holders, SQLITE_NOW);
        let live = format!("FROM {h} WHERE key_hash = ?1 AND holds > 0 AND expires_at > {now}");
        sqlx::query(&format!(
            "UPDATE {t} SET
                holds = (SELECT COUNT(*) {live}),
                expires_at = COALESCE((SELECT MAX(expires_at) {live}), {now}),
                owner = CASE WHEN EXISTS (SELECT 1 {live}) THEN owner ELSE NULL END,
                value = NULL
             WHERE key_hash = ?1 AND substr(owner, 1, 1) = '~'"
        ))
        .bind(hash)
        .execute(c)
        .await?;
        Ok(())
    }

    /// One attempt at a permit or a read hold for `owner`.
    pub(crate) async fn acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        let (key, owner) = (key.clone(), owner.clone());
        self.in_txn(move |this, c| {
            Box::pin(async move { this.acquire_in(c, &key, &owner, ttl).await })
        })
        .await
    }

    async fn acquire_in(
        &self,
        c: &mut SqliteConnection,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Answer<Acquire> {
        let hash = crate::layout::key_hash(key);
        let claim = owner.claim();
        let me = owner.as_str();
        // The clock and the name row in one statement.
        let (now, owner_of, holds, fence, expires): (
            i64,
            Option<String>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
        ) = sqlx::query_as(&format!(
            "SELECT n.now, t.owner, t.holds, t.fence, t.expires_at
                 FROM (SELECT {SQLITE_NOW} AS now) n LEFT JOIN {} t ON t.key_hash = ?1",
            self.table
        ))
        .bind(&hash)
        .fetch_one(&mut *c)
        .await?;
        let row: Option<NameRow> = match (holds, fence, expires) {
            (Some(h), Some(f), Some(e)) => Some((owner_of, h, f, e)),
            _ => None,
        };
        let until = now + ttl_ms(ttl);
        let mut beside_writer = false;
        match (classify(row.as_ref(), now), claim) {
            (Name::Token(o), Claim::Exclusive { permits }) if o == me => {
                return Ok(Err(permits_mismatch(key, 1, permits)));
            }
            (Name::Token(o), Claim::Shared) if o == me => {
                return Ok(Err(claim_changed(key, false)));
            }
            (Name::Token(o), Claim::Shared) if owner.writer() == Some(o.as_str()) => {
                // A downgrade: the writer's hold moves to a row of its own.
                let (_, holds, fence, expires) = row.clone().expect("a live row");
                sqlx::query(&format!(
                    "INSERT OR REPLACE INTO {} (key_hash, owner, lock_key, shared, holds, fence,
                        expires_at) VALUES (?1, ?2, ?3, 0, ?4, ?5, ?6)",
                    self.holders
                ))
                .bind(&hash)
                .bind(&o)
                .bind(key.as_str())
                .bind(holds)
                .bind(fence)
                .bind(expires)
                .execute(&mut *c)
                .await?;
                sqlx::query(&format!(
                    "UPDATE {} SET owner = '{SHARED}' WHERE key_hash = ?1",
                    self.table
                ))
                .bind(&hash)
                .execute(&mut *c)
                .await?;
                beside_writer = true;
            }
            (Name::Token(_), Claim::Exclusive { permits }) => {
                return Ok(Err(permits_mismatch(key, 1, permits)));
            }
            (Name::Token(_), Claim::Shared) => {
                return Ok(Ok(contended(row.map(|r| r.3), now)));
            }
            (Name::Permits(kept), Claim::Exclusive { permits }) if kept != permits => {
                return Ok(Err(permits_mismatch(key, kept, permits)));
            }
            (Name::Permits(kept), Claim::Shared) => {
                return Ok(Err(semaphore_or_rwlock(key, kept, false)));
            }
            (Name::Shared, Claim::Exclusive { permits }) if permits > 1 => {
                return Ok(Err(semaphore_or_rwlock(key, permits, true)));
            }
            (Name::Shared, Claim::Exclusive { .. }) => {
                return Ok(Ok(contended(row.map(|r| r.3), now)));
            }
            _ => {}
        }
        // Expired rows are left to the sweep: every read here skips them,
        // and a grant replaces its owner's own.
        let rows = self.live_holders(&mut *c, &hash, now).await?;
        if let Some(mine) = rows.iter().find(|r| r.0 == me && r.2 > 0) {
            if (mine.1 != 0) != claim.is_shared() {
                return Ok(Err(claim_changed(key, mine.1 != 0)));
            }
            sqlx::query(&format!(
                "UPDATE {} SET holds = holds + 1, expires_at = MAX(expires_at, ?3)
                 WHERE key_hash = ?1 AND owner = ?2",
                self.holders
            ))
            .bind(&hash)
            .bind(me)
            .bind(until)
            .execute(&mut *c)
            .await?;
            self.settle_name(&mut *c, &hash).await?;
            return Ok(Ok(granted(mine.3, mine.2 + 1)));
        }
        let held: Vec<&HolderRow> = rows.iter().filter(|r| r.2 > 0).collect();
        let soonest = held.iter().map(|r| r.4).min();
        match claim {
            Claim::Exclusive { permits } => {
                if held.len() >= permits as usize {
                    return Ok(Ok(contended(soonest, now)));
                }
            }
            Claim::Shared => {
                let writers: Vec<&&HolderRow> = held.iter().filter(|r| r.1 == 0).collect();
                beside_writer |= owner
                    .writer()
                    .is_some_and(|w| !writers.is_empty() && writers.iter().all(|r| r.0 == w));
                let writers = writers.len();
                let marks = rows.iter().filter(|r| r.2 == 0).map(|r| r.4).max();
                if owner.writer().is_some() && !beside_writer {
                    // A downgrade whose writer no longer holds: refused,
                    // never a read hold after a gap.
                    return Ok(Ok(contended(None, now)));
                }
                if writers > 0 && !beside_writer {
                    return Ok(Ok(contended(soonest, now)));
                }
                if marks.is_some() && !beside_writer {
                    return Ok(Ok(contended(marks, now)));
                }
            }
        }
        let group = match claim {
            Claim::Exclusive { permits } => format!("{PERMITS}{permits}"),
            Claim::Shared => SHARED.to_owned(),
        };
        let last_fence = row.as_ref().map_or(0, |r| r.2);
        let fence: i64 = (now * 1000).max(last_fence + 1);
        let t = &self.table;
        sqlx::query(&format!(
            "INSERT INTO {t} (key_hash, lock_key, owner, holds, fence, expires_at, value)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, NULL)
             ON CONFLICT (key_hash) DO UPDATE SET
                lock_key = excluded.lock_key, owner = excluded.owner, holds = excluded.holds,
                fence = excluded.fence, value = NULL,
                expires_at = CASE WHEN {t}.expires_at > ?7 AND substr({t}.owner, 1, 1) = '~'
                                  THEN MAX({t}.expires_at, excluded.expires_at)
                                  ELSE excluded.expires_at END"
        ))
        .bind(&hash)
        .bind(key.as_str())
        .bind(&group)
        .bind(held.len() as i64 + 1)
        .bind(fence)
        .bind(until)
        .bind(now)
        .execute(&mut *c)
        .await?;
        sqlx::query(&format!(
            "INSERT OR REPLACE INTO {} (key_hash, owner, lock_key, shared, holds, fence,
                expires_at) VALUES (?1, ?2, ?3, ?4, 1, ?5, ?6)",
            self.holders
        ))
        .bind(&hash)
        .bind(me)
        .bind(key.as_str())
        .bind(i64::from(claim.is_shared()))
        .bind(fence)
        .bind(until)
        .execute(&mut *c)
        .await?;
        Ok(Ok(granted(fence, 1)))
    }

    /// Releases one hold of `owner`'s permit, read hold, or downgraded
    /// writer's hold.
    pub(crate) async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        let hash = crate::layout::key_hash(key);
        let me = owner.as_str().to_owned();
        self.in_txn(move |this, c| {
            Box::pin(async move {
                let (h, now) = (&this.holders, SQLITE_NOW);
                // The last hold, the common case: gone in one statement.
                let gone: Option<i64> = sqlx::query_scalar(&format!(
                    "DELETE FROM {h} WHERE key_hash = ?1 AND owner = ?2 AND holds = 1
                        AND expires_at > {now} RETURNING 1"
                ))
                .bind(&hash)
                .bind(&me)
                .fetch_optional(&mut *c)
                .await?;
                if gone.is_none() {
                    let left: Option<i64> = sqlx::query_scalar(&format!(
                        "UPDATE {h} SET holds = holds - 1 WHERE key_hash = ?1 AND owner = ?2
                            AND holds > 1 AND expires_at > {now} RETURNING holds"
                    ))
                    .bind(&hash)
                    .bind(&me)
                    .fetch_optional(&mut *c)
                    .await?;
                    return Ok(Ok(match left {
                        Some(n) => Release::StillHeld(u32::try_from(n).unwrap_or(u32::MAX)),
                        None => Release::NotHeld,
                    }));
                }
                this.settle_name(&mut *c, &hash).await?;
                Ok(Ok(Release::Freed))
            })
        })
        .await
    }

    /// Extends `owner`'s permit, read hold or downgraded writer's hold.
    pub(crate) async fn renew(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Renew> {
        let hash = crate::layout::key_hash(key);
        let me = owner.as_str().to_owned();
        self.in_txn(move |this, c| {
            Box::pin(async move {
                let (h, now) = (&this.holders, SQLITE_NOW);
                let done = sqlx::query(&format!(
                    "UPDATE {h} SET expires_at = {now} + ?3
                     WHERE key_hash = ?1 AND owner = ?2 AND holds > 0 AND expires_at > {now}"
                ))
                .bind(&hash)
                .bind(&me)
                .bind(ttl_ms(ttl))
                .execute(&mut *c)
                .await?;
                if done.rows_affected() == 0 {
                    return Ok(Ok(Renew::NotHeld));
                }
                this.settle_name(&mut *c, &hash).await?;
                Ok(Ok(Renew::Renewed))
            })
        })
        .await
    }
}
