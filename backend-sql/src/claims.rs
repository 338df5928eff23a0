//! Semaphore permits and read holds (every claim but the mutex's) on
//! SQLite, PostgreSQL and MySQL/MariaDB, each operation one transaction
//! that holds the name first (see `claims_sql` for how each dialect does).
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
//! A lone permit (a free name's first) costs what a mutex costs: the
//! mutex's own statements take, re-enter, renew and release it in the name
//! row, its owner `~permits:<N>/<token>` (`layout::inline`). A second
//! claim meets it here, under the row's lock, and moves it to the holders
//! table first; from then on the row's owner is the group's, so the lone
//! holder's next release or renewal finds nothing through the mutex's
//! statement and comes here.
//!
//! Rows of the holders table go with the hold, or with the sweep once
//! their lease has run out longer than the retention ago.

use std::time::Duration;

use lockwright_core::backend::{judge, refusal, Acquire, Found, HoldId, Release, Renew};
use lockwright_core::{Claim, LockKey, OwnerToken, Result};

use crate::claims_sql::{bound, ClaimsSql};
use crate::error::map_err;
use crate::layout::{classify, granted, lone_holder, permits_of, Name, NameRow, PERMITS, SHARED};
use crate::node::Pool;
use crate::queries::ttl_ms;

/// A live holder row: (owner, shared, holds, fence, expires_at).
pub(crate) type HolderRow = (String, i64, i64, i64, i64);

/// The clock and the name row: (now, owner, holds, fence, expires_at).
pub(crate) type NowAndName = (i64, Option<String>, Option<i64>, Option<i64>, Option<i64>);

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

/// The name row of a `name_and_now` answer, if the name has one.
pub(crate) fn name_row(read: &NowAndName) -> Option<NameRow> {
    match read {
        (_, owner, Some(h), Some(f), Some(e)) => Some((owner.clone(), *h, *f, *e)),
        _ => None,
    }
}

/// The claims of one lease table on one pool.
#[derive(Debug, Clone)]
pub(crate) struct Claims {
    pub(crate) pool: Pool,
    pub(crate) sql: std::sync::Arc<ClaimsSql>,
}

/// An answer the store gave, or the caller's mistake it refused.
pub(crate) type Answer<T> = std::result::Result<Result<T>, sqlx::Error>;

/// Commits a transaction that answered, and rolls back one that failed or
/// refused. sqlx rolls back one dropped mid-way (a renewal cut off by its
/// timeout, a cancelled acquire) before its connection serves anyone
/// else: a connection left inside it would hold the name (or SQLite's
/// write lock) from every process.
pub(crate) async fn finish<DB: sqlx::Database, T>(
    tx: sqlx::Transaction<'_, DB>,
    answer: Answer<T>,
) -> Result<T> {
    match answer {
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

/// Runs `$body` with `$c`, a connection in a claims transaction of the
/// typed pool `$p`, on whichever dialect the pool is: the same code, typed
/// for each driver.
macro_rules! in_txn {
    ($claims:expr, $c:ident => $body:expr) => {{
        let claims: &Claims = $claims;
        match &claims.pool {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(p) => {
                let mut tx = p.begin_with(claims.sql.begin).await.map_err(map_err)?;
                let $c = &mut *tx;
                let answer = $body;
                $crate::claims::finish(tx, answer).await
            }
            #[cfg(feature = "postgres")]
            Pool::Postgres(p) => {
                let mut tx = p.begin_with(claims.sql.begin).await.map_err(map_err)?;
                let $c = &mut *tx;
                let answer = $body;
                $crate::claims::finish(tx, answer).await
            }
            #[cfg(feature = "mysql")]
            Pool::MySql(p) => {
                let mut tries = 0;
                loop {
                    let mut tx = p.begin_with(claims.sql.begin).await.map_err(map_err)?;
                    let $c = &mut *tx;
                    let answer = $body;
                    match answer {
                        // InnoDB rolled the deadlock's victim back whole
                        // (gap locks of neighbouring names can meet).
                        Err(e) if crate::error::is_mysql_conflict(&e) && tries < 3 => {
                            tries += 1;
                            drop(e);
                            let _ = tx.rollback().await;
                        }
                        answer => break $crate::claims::finish(tx, answer).await,
                    }
                }
            }
        }
    }};
}
pub(crate) use in_txn;

/// Locks `hash`'s name row first where the dialect needs it (`key` makes
/// the row if it is missing).
macro_rules! hold_name {
    ($claims:expr, $c:expr, $hash:expr, $key:expr) => {{
        let sql = &$claims.sql;
        let key: Option<&LockKey> = $key;
        let ensured = match (&sql.ensure_name, key) {
            (Some(s), Some(k)) => bound!(query, s; $hash, k.as_str())
                .execute(&mut *$c)
                .await
                .map(drop),
            _ => Ok(()),
        };
        match (ensured, &sql.lock_name) {
            (Err(e), _) => Err(e),
            (Ok(()), Some(s)) => bound!(query, s; $hash).execute(&mut *$c).await.map(drop),
            (Ok(()), None) => Ok(()),
        }
    }};
}
pub(crate) use hold_name;

/// One attempt at a permit or a read hold, in the transaction `$c`.
macro_rules! acquire_in {
    ($this:expr, $c:ident, $hold:expr, $ttl:expr) => {
        async {
            let this: &Claims = $this;
            let hold: &HoldId = $hold;
            let key: &LockKey = &hold.key;
            let hash = crate::layout::key_hash(key);
            let claim = hold.claim();
            let me = hold.owner.as_str();
            // The writer a reader's claim is made beside (a downgrade).
            let writer: Option<&str> = hold.kind.beside().map(OwnerToken::as_str);
            hold_name!(this, $c, &hash, Some(key))?;
            // The clock and the name row in one statement.
            let read: NowAndName = bound!(query_as, &this.sql.name_and_now; &hash)
                .fetch_one(&mut *$c)
                .await?;
            let now = read.0;
            let row = name_row(&read);
            let until = now + ttl_ms($ttl);
            let mut beside_writer = false;
            let name = classify(row.as_ref(), now);
            // Only semaphores' and readers' claims come here (a mutex's or
            // writer's takes the name row's statements).
            let found = match &name {
                Name::Token(o) => Found {
                    own_shared: (o == me).then_some(false),
                    kept: Some(1),
                    readers: false,
                },
                // A group of permits is a semaphore, whatever N it says.
                Name::Permits(kept) => Found::semaphore(*kept),
                Name::Shared => Found {
                    readers: true,
                    ..Found::NOTHING
                },
                Name::Free => Found::NOTHING,
            };
            if let Err(e) = judge(key, claim, found) {
                return Ok(Err(e));
            }
            match (name, claim) {
                (Name::Token(o), Claim::Shared) if writer == Some(o.as_str()) => {
                    // A downgrade: the writer's hold moves to a row of its own.
                    let (_, holds, fence, expires) = row.clone().expect("a live row");
                    bound!(query, &this.sql.put_holder;
                        &hash, &o, key.as_str(), 0_i64, holds, fence, expires)
                    .execute(&mut *$c)
                    .await?;
                    bound!(query, &this.sql.name_owner; &hash, SHARED)
                        .execute(&mut *$c)
                        .await?;
                    beside_writer = true;
                }
                (Name::Token(_), Claim::Exclusive { .. }) => {
                    return Ok(Err(refusal(key, claim, found)));
                }
                (Name::Token(_), Claim::Shared) => {
                    return Ok(Ok(contended(row.map(|r| r.3), now)));
                }
                (Name::Permits(_), Claim::Shared) => {
                    return Ok(Err(refusal(key, claim, found)));
                }
                (Name::Shared, Claim::Exclusive { .. }) => {
                    return Ok(Ok(contended(row.map(|r| r.3), now)));
                }
                _ => {}
            }
            if let Some((Some(marker), holds, fence, expires)) = row.as_ref().filter(|r| r.3 > now) {
                if let Some(lone) = lone_holder(marker) {
                    // The group grows past a lone permit: its holder moves
                    // to the holders table, and the row's owner becomes the
                    // group's, so the mutex's statements no longer find it.
                    bound!(query, &this.sql.put_holder;
                        &hash, lone, key.as_str(), 0_i64, *holds, *fence, *expires)
                    .execute(&mut *$c)
                    .await?;
                    let group = format!("{PERMITS}{}", permits_of(marker).unwrap_or(0));
                    bound!(query, &this.sql.name_owner; &hash, &group)
                        .execute(&mut *$c)
                        .await?;
                }
            }
            // Expired rows are left to the sweep: every read here skips
            // them, and a grant replaces its owner's own.
            let rows: Vec<HolderRow> = bound!(query_as, &this.sql.live_holders; &hash, now)
                .fetch_all(&mut *$c)
                .await?;
            if let Some(mine) = rows.iter().find(|r| r.0 == me && r.2 > 0) {
                let own = Found {
                    own_shared: Some(mine.1 != 0),
                    ..Found::NOTHING
                };
                if let Err(e) = judge(key, claim, own) {
                    return Ok(Err(e));
                }
                bound!(query, &this.sql.add_hold; &hash, me, until)
                    .execute(&mut *$c)
                    .await?;
                bound!(query, &this.sql.settle_name; &hash)
                    .execute(&mut *$c)
                    .await?;
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
                    beside_writer |= writer
                        .is_some_and(|w| !writers.is_empty() && writers.iter().all(|r| r.0 == w));
                    let writers = writers.len();
                    let marks = rows.iter().filter(|r| r.2 == 0).map(|r| r.4).max();
                    if writer.is_some() && !beside_writer {
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
            let holders = held.len() as i64 + 1;
            bound!(query, &this.sql.put_name;
                &hash, key.as_str(), &group, holders, fence, until, now)
            .execute(&mut *$c)
            .await?;
            bound!(query, &this.sql.put_holder;
                &hash, me, key.as_str(), i64::from(claim.is_shared()), 1_i64, fence, until)
            .execute(&mut *$c)
            .await?;
            Ok(Ok(granted(fence, 1)))
        }
        .await
    };
}

impl Claims {
    pub(crate) fn new(pool: Pool, sql: ClaimsSql) -> Self {
        Claims {
            pool,
            sql: std::sync::Arc::new(sql),
        }
    }

    /// One attempt at `hold`, a permit or a read hold.
    pub(crate) async fn acquire(&self, hold: &HoldId, ttl: Duration) -> Result<Acquire> {
        in_txn!(self, c => acquire_in!(self, c, hold, ttl))
    }

    /// Releases one hold of `owner`'s permit, read hold, or downgraded
    /// writer's hold.
    pub(crate) async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        let hash = crate::layout::key_hash(key);
        let me = owner.as_str();
        in_txn!(self, c => async {
            hold_name!(self, c, &hash, None)?;
            // The last hold, the common case: gone in one statement.
            let gone = bound!(query, &self.sql.drop_last; &hash, me)
                .execute(&mut *c)
                .await?
                .rows_affected();
            if gone == 0 {
                // No RETURNING on MySQL: a re-entered hold is read after.
                let taken = bound!(query, &self.sql.drop_one; &hash, me)
                    .execute(&mut *c)
                    .await?
                    .rows_affected();
                if taken == 0 {
                    return Ok(Ok(Release::NotHeld));
                }
                let left: i64 = bound!(query_scalar, &self.sql.holds; &hash, me)
                    .fetch_one(&mut *c)
                    .await?;
                return Ok(Ok(Release::StillHeld(u32::try_from(left).unwrap_or(u32::MAX))));
            }
            bound!(query, &self.sql.settle_name; &hash).execute(&mut *c).await?;
            Ok(Ok(Release::Freed))
        }.await)
    }

    /// Extends `owner`'s permit, read hold or downgraded writer's hold.
    pub(crate) async fn renew(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Renew> {
        let hash = crate::layout::key_hash(key);
        let me = owner.as_str();
        in_txn!(self, c => async {
            hold_name!(self, c, &hash, None)?;
            let done = bound!(query, &self.sql.renew; &hash, me, ttl_ms(ttl))
                .execute(&mut *c)
                .await?;
            if done.rows_affected() == 0 {
                return Ok(Ok(Renew::NotHeld));
            }
            bound!(query, &self.sql.settle_name; &hash).execute(&mut *c).await?;
            Ok(Ok(Renew::Renewed))
        }.await)
    }
}
