//! Semaphores and read-write locks as the rest of the table sees them:
//! what a group of holders (permits or readers) does to a mutex or writer
//! it refuses (another N, or a writer's mark left for readers), the
//! mark's removal, and the group's status. The group's own holds are in
//! `claims.rs`.

use std::time::Duration;

use lockwright_core::backend::{reentry_refused, refusal, Found, MARK_LIFE};
use lockwright_core::{Claim, FencingToken, Holder, LockKey, LockStatus, OwnerToken, Result};

use crate::claims::{hold_name, in_txn, left, name_row, Claims, NowAndName};
use crate::claims_sql::bound;
use crate::error::map_err;
use crate::layout::{classify, lone_holder, permits_of, Name, PERMITS, SHARED};
use crate::node::Pool;
use crate::queries::ttl_ms;

impl Claims {
    /// After a mutex's or writer's attempt found `key` held: a held
    /// semaphore refuses it (another N), and readers get the writer's mark,
    /// which keeps new readers out until the writer is served, gives up or
    /// its TTL runs out. Whether a mark was left.
    pub(crate) async fn after_refusal(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<bool> {
        let hash = crate::layout::key_hash(key);
        // Most refusals are a mutex's or writer's: one read, no lock.
        let group: Option<String> = on_pool!(&self.pool, p => bound!(query_scalar, &self.sql.live_group; &hash)
            .fetch_optional(p)
            .await
            .map_err(map_err)?);
        if group.is_none() {
            return Ok(false);
        }
        in_txn!(self, c => async {
            hold_name!(self, c, &hash, Some(key))?;
            let read: NowAndName = bound!(query_as, &self.sql.name_and_now; &hash)
                .fetch_one(&mut *c)
                .await?;
            let now = read.0;
            match classify(name_row(&read).as_ref(), now) {
                Name::Permits(kept) => {
                    // A group of permits is a semaphore, whatever N it says.
                    Ok(Err(refusal(key, Claim::MUTEX, Found::semaphore(kept))))
                }
                Name::Shared => {
                    let mine: Option<i64> = bound!(query_scalar, &self.sql.mine;
                        &hash, owner.as_str(), now)
                    .fetch_optional(&mut *c)
                        .await?;
                    if let Some(shared) = mine {
                        // A reader asking to write: never an upgrade (nor
                        // a downgraded writer's hold, kept among its
                        // readers, taken again).
                        return Ok(Err(reentry_refused(key, shared != 0)));
                    }
                    let until = now + ttl_ms(ttl.min(MARK_LIFE));
                    bound!(query, &self.sql.mark; &hash, owner.as_str(), key.as_str(), until)
                        .execute(&mut *c)
                        .await?;
                    Ok(Ok(true))
                }
                _ => Ok(Ok(false)),
            }
        }.await)
    }

    /// Takes away `owner`'s mark on `key`, if it left one.
    pub(crate) async fn unmark(&self, key: &LockKey, owner: &OwnerToken) -> Result<()> {
        let hash = crate::layout::key_hash(key);
        on_pool!(&self.pool, p => bound!(query, &self.sql.unmark; &hash, owner.as_str())
            .execute(p)
            .await
            .map_err(map_err)?
            .rows_affected());
        Ok(())
    }

    /// The holders of a name held by a group (`owner` its marker, and
    /// `lone` the live row's holds, fence and ms left), or `None` when the
    /// row is a mutex's or writer's.
    pub(crate) async fn inspect(
        &self,
        key: &LockKey,
        owner: &str,
        lone: (i64, i64, i64),
    ) -> Result<Option<LockStatus>> {
        let permits = if owner == SHARED {
            None
        } else if owner.starts_with(PERMITS) {
            permits_of(owner)
        } else {
            return Ok(None);
        };
        if let Some(holder) = lone_holder(owner) {
            // A lone permit: the name row is its only holder's.
            let (holds, fence, left_ms) = lone;
            let token = OwnerToken::from_string(holder).ok();
            let only = Holder::new(false, u32::try_from(holds).unwrap_or(u32::MAX))
                .with_owner(token.clone())
                .with_fence(u64::try_from(fence).ok().map(FencingToken))
                .with_remaining(left(left_ms, 0));
            return Ok(Some(
                LockStatus::of_holders(vec![only])
                    .with_permits(permits)
                    .with_owner(token),
            ));
        }
        let hash = crate::layout::key_hash(key);
        let rows: Vec<(String, i64, i64, i64, i64)> = on_pool!(&self.pool, p => bound!(query_as, &self.sql.inspect; &hash)
            .fetch_all(p)
            .await
            .map_err(map_err)?);
        let holders: Vec<Holder> = rows
            .into_iter()
            .map(|(o, shared, holds, fence, left_ms)| {
                Holder::new(shared != 0, u32::try_from(holds).unwrap_or(u32::MAX))
                    .with_owner(OwnerToken::from_string(o).ok())
                    .with_fence(u64::try_from(fence).ok().map(FencingToken))
                    .with_remaining(left(left_ms, 0))
            })
            .collect();
        let exclusive = holders.iter().any(|h| !h.shared);
        let single = (holders.len() == 1)
            .then(|| holders[0].owner.clone())
            .flatten();
        Ok(Some(
            LockStatus::of_holders(holders)
                .with_permits(permits.or(exclusive.then_some(1)))
                .with_owner(single),
        ))
    }
}
