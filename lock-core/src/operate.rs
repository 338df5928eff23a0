//! What an operator asks of a [`Locker`]: what a key's state is
//! ([`status`](Locker::status)), which names are held
//! ([`list`](Locker::list)), and the forced release of a stuck holder
//! ([`force_release`](Locker::force_release)). None of it takes a lock.

use std::collections::HashMap;

use futures::stream::{self, StreamExt, TryStreamExt};

use crate::error::Result;
use crate::identity::{is_record_name, record_name, HolderInfo};
use crate::key::{IntoLockKey, LockKey};
use crate::lease::LockStatus;
use crate::locker::Locker;

/// How many names [`Locker::list`] reads at once.
const LIST_READS: usize = 16;

impl Locker {
    /// What the store holds for `key` right now: held or free, holds, the
    /// current fence, the lease left, queued waiters (each where the store
    /// has it). A snapshot for dashboards and operators, read without
    /// taking the lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// # use lockwright_core::{backend::MemoryBackend, Locker};
    /// let locker = Locker::new(MemoryBackend::new());
    /// assert!(!locker.is_held("report").await?);
    /// let guard = locker.lock("report").await?;
    /// let status = locker.status("report").await?;
    /// assert!(status.held && status.holds == 1);
    /// assert_eq!(status.fence, guard.fence());
    /// assert!(status.remaining.is_some());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// `InvalidKey`; `Unsupported` where the store cannot tell; the store's
    /// errors (`Unavailable`, …).
    pub async fn status(&self, key: impl IntoLockKey) -> Result<LockStatus> {
        // The holder's token is for quorum backends' bookkeeping: whoever
        // has it can release the lock, so applications never see it.
        let status = self.backend().inspect(&key.into_lock_key()?).await?;
        let known = self.identities(&status.tags()).await;
        Ok(status
            .with_who(&|tag| known.get(tag).cloned())
            .without_owners())
    }

    /// The identity records of `tags`, where they are held: best effort,
    /// as a record is only what a holder says of itself (a record that
    /// cannot be read leaves its holders without one).
    async fn identities(&self, tags: &[String]) -> HashMap<String, HolderInfo> {
        let wanted: Vec<(String, LockKey)> = tags
            .iter()
            .filter_map(|t| Some((t.clone(), record_name(t)?)))
            .collect();
        let backend = self.backend().clone();
        let read = stream::iter(wanted)
            .map(move |(tag, name)| {
                let backend = backend.clone();
                async move {
                    let status = backend.inspect(&name).await.ok()?;
                    let info = HolderInfo::from_record(status.value.as_deref()?)?;
                    status.held.then_some((tag, info))
                }
            })
            .buffer_unordered(LIST_READS);
        let found: Vec<Option<(String, HolderInfo)>> = read.collect().await;
        found.into_iter().flatten().collect()
    }

    /// Breaks the hold of `key` whose [`id`](crate::Holder::id) is `holder`
    /// (as [`status`](Self::status) shows it), whoever holds it: for an
    /// operator with a stuck lock, never for an application's own. The
    /// holder's next renewal fails, so its guard reports the lock lost,
    /// and where the store has fences the next grant's is above the broken
    /// holder's (but for a downgrade's read hold on ZooKeeper or etcd: see
    /// [`LockBackend::force_release`](crate::backend::LockBackend::force_release)).
    /// Logs one `lockwright::audit` line. `Ok(false)`: no live holder has
    /// that id.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// # use lockwright_core::{backend::MemoryBackend, Locker};
    /// let locker = Locker::new(MemoryBackend::new());
    /// let stuck = locker.lock("report").await?;
    /// let id = locker.status("report").await?.id.expect("the holder's id");
    /// assert!(locker.force_release("report", &id).await?);
    /// let next = locker.lock("report").await?;
    /// assert!(next.fence() > stuck.fence());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// `InvalidKey`; `Unsupported` where the store cannot break one holder
    /// (SQL's session locks); the store's errors.
    pub async fn force_release(&self, key: impl IntoLockKey, holder: &str) -> Result<bool> {
        let key = key.into_lock_key()?;
        let broke = self.backend().force_release(&key, holder).await?;
        if broke {
            crate::audit::broke(&key, holder);
        }
        Ok(broke)
    }

    /// Whether anyone holds `key` right now (see [`status`](Self::status)).
    ///
    /// # Errors
    /// As [`status`](Self::status).
    pub async fn is_held(&self, key: impl IntoLockKey) -> Result<bool> {
        Ok(self.status(key).await?.held)
    }

    /// Every name starting with `prefix` that is held now, of every kind
    /// (lock, semaphore, read-write lock, election), each with its
    /// [`status`](Self::status), sorted by name. Reads only: one listing of
    /// the store's names, then one status read per name, so a name may
    /// change hands while it is read (each status is a snapshot).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// # use lockwright_core::{backend::MemoryBackend, Locker};
    /// let locker = Locker::new(MemoryBackend::new());
    /// let _report = locker.lock("jobs/report").await?;
    /// let _free = locker.lock("jobs/backup").await?.release().await?;
    /// let held = locker.list("jobs/").await?;
    /// assert_eq!(held.len(), 1);
    /// assert_eq!(held[0].0.as_str(), "jobs/report");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// `Unsupported` where the store cannot enumerate its keys (memcached,
    /// SQL's session locks); the store's errors.
    pub async fn list(&self, prefix: &str) -> Result<Vec<(LockKey, LockStatus)>> {
        let mut names = self.backend().list(prefix).await?;
        names.retain(|n| n.as_str().starts_with(prefix) && !is_record_name(n.as_str()));
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        let read = stream::iter(names)
            .map(|name| async move {
                let status = self.backend().inspect(&name).await?;
                Ok::<_, crate::Error>((name, status))
            })
            .buffered(LIST_READS);
        let all: Vec<(LockKey, LockStatus)> = read.try_collect().await?;
        let held: Vec<_> = all.into_iter().filter(|(_, s)| s.held).collect();
        let mut tags: Vec<String> = held.iter().flat_map(|(_, s)| s.tags()).collect();
        tags.sort();
        tags.dedup();
        let known = self.identities(&tags).await;
        Ok(held
            .into_iter()
            .map(|(name, s)| {
                let s = s.with_who(&|tag| known.get(tag).cloned());
                (name, s.without_owners())
            })
            .collect())
    }
}
