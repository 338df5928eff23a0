//! What the rest of the table sees of a group of holders (permits or
//! readers): a mutex or writer it refuses (another N, or a writer's mark
//! left for readers), the mark's removal, and the group's status.

use std::time::Duration;

use locksmith_core::backend::{claim_changed, permits_mismatch, MARK_LIFE};
use locksmith_core::{FencingToken, Holder, LockKey, LockStatus, OwnerToken, Result};

use crate::claims::{left, Claims};
use crate::error::map_err;
use crate::layout::{classify, Name, PERMITS, SHARED};
use crate::queries::{ttl_ms, SQLITE_NOW};

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
        // Most refusals are a mutex's or writer's: one read, no write lock.
        let group: Option<String> = sqlx::query_scalar(&format!(
            "SELECT owner FROM {} WHERE key_hash = ?1 AND expires_at > {SQLITE_NOW}
                AND substr(owner, 1, 1) = '~'",
            self.table
        ))
        .bind(crate::layout::key_hash(key))
        .fetch_optional(&self.pool)
        .await
        .map_err(map_err)?;
        if group.is_none() {
            return Ok(false);
        }
        let (key, owner) = (key.clone(), owner.clone());
        self.in_txn(move |this, c| {
            Box::pin(async move {
                let hash = crate::layout::key_hash(&key);
                let now = Self::now(&mut *c).await?;
                let row = this.name_row(&mut *c, &hash).await?;
                match classify(row.as_ref(), now) {
                    Name::Permits(kept) => Ok(Err(permits_mismatch(&key, kept, 1))),
                    Name::Shared => {
                        let mine: Option<i64> = sqlx::query_scalar(&format!(
                            "SELECT shared FROM {} WHERE key_hash = ?1 AND owner = ?2
                                AND holds > 0 AND expires_at > ?3",
                            this.holders
                        ))
                        .bind(&hash)
                        .bind(owner.as_str())
                        .bind(now)
                        .fetch_optional(&mut *c)
                        .await?;
                        if let Some(shared) = mine {
                            // A reader asking to write: never an upgrade.
                            return Ok(Err(claim_changed(&key, shared != 0)));
                        }
                        sqlx::query(&format!(
                            "INSERT INTO {} (key_hash, owner, lock_key, shared, holds, fence,
                                expires_at) VALUES (?1, ?2, ?3, 0, 0, 0, ?4)
                             ON CONFLICT (key_hash, owner) DO UPDATE
                                SET expires_at = excluded.expires_at WHERE holds = 0",
                            this.holders
                        ))
                        .bind(&hash)
                        .bind(owner.as_str())
                        .bind(key.as_str())
                        .bind(now + ttl_ms(ttl.min(MARK_LIFE)))
                        .execute(&mut *c)
                        .await?;
                        Ok(Ok(true))
                    }
                    _ => Ok(Ok(false)),
                }
            })
        })
        .await
    }

    /// Takes away `owner`'s mark on `key`, if it left one.
    pub(crate) async fn unmark(&self, key: &LockKey, owner: &OwnerToken) -> Result<()> {
        sqlx::query(&format!(
            "DELETE FROM {} WHERE key_hash = ?1 AND owner = ?2 AND holds = 0",
            self.holders
        ))
        .bind(crate::layout::key_hash(key))
        .bind(owner.as_str())
        .execute(&self.pool)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    /// The holders of a name held by a group (`owner` its marker), or
    /// `None` when the row is a mutex's or writer's.
    pub(crate) async fn inspect(&self, key: &LockKey, owner: &str) -> Result<Option<LockStatus>> {
        let permits = if owner == SHARED {
            None
        } else if let Some(n) = owner.strip_prefix(PERMITS) {
            n.parse::<u32>().ok()
        } else {
            return Ok(None);
        };
        let hash = crate::layout::key_hash(key);
        let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(&format!(
            "SELECT owner, shared, holds, fence, expires_at - {SQLITE_NOW} FROM {}
             WHERE key_hash = ?1 AND holds > 0 AND expires_at > {SQLITE_NOW}",
            self.holders
        ))
        .bind(&hash)
        .fetch_all(&self.pool)
        .await
        .map_err(map_err)?;
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
