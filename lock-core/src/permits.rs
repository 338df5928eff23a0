//! Semaphores and read-write locks: the mutex's contract for more than
//! one holder.
//!
//! Both are locks whose acquires carry a [`Claim`]: a semaphore's permit
//! is an exclusive claim of N permits (the mutex is the one-permit case),
//! a writer an exclusive claim of one, a reader a shared claim. Every hold
//! is its own lease, with what a mutex's guard has: owner-checked release
//! and renewal, expiry at its TTL, the watchdog, the lost signal and a
//! fence per grant where the store has fences. A store offers them where
//! its [`Capabilities`](crate::backend::Capabilities) say so
//! (`permits`, `shared`); elsewhere they are `Unsupported`.

use std::fmt;

use crate::acquire::{supports, timeout_error};
use crate::error::{Error, ErrorKind, Result};
use crate::guard::LockGuard;
use crate::key::{Claim, LockKey, OwnerToken};
use crate::lease::LockStatus;
use crate::locker::Locker;
use crate::options::LockOptions;
use crate::request::HoldKind;
use crate::request::LockRequest;
use crate::scoped;

/// At most N holders of a name at once, on the store's clock. Made by
/// [`Locker::semaphore`].
///
/// Every holder of a name must agree on N: the store keeps N while any
/// permit is held and refuses another N with `InvalidOptions`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockwright_core::Result<()> {
/// use lockwright_core::{backend::MemoryBackend, LockOptions, Locker};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let backups = locker.semaphore("backups", 2)?;
/// let opts = LockOptions::new().no_wait();
/// let first = backups.acquire(&opts).await?;
/// let second = backups.acquire(&opts).await?;
/// assert!(backups.try_acquire(&opts).await?.is_none(), "both permits are out");
/// first.release().await?;
/// let third = backups.acquire(&opts).await?;
/// assert!(third.fence() > second.fence());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    locker: Locker,
    key: LockKey,
    claim: Claim,
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.key)
            .field("claim", &self.claim)
            .finish()
    }
}

impl Semaphore {
    pub(crate) fn new(locker: Locker, key: LockKey, permits: u32) -> Result<Self> {
        let claim = Claim::permits(permits)?;
        supports(locker.capabilities(), claim)?;
        Ok(Semaphore { locker, key, claim })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &LockKey {
        &self.key
    }

    /// How many holders it admits at once.
    pub fn permits(&self) -> u32 {
        self.claim.exclusive_permits().unwrap_or(1)
    }

    /// Takes a permit, waiting as `opts` say.
    ///
    /// # Errors
    /// `Busy` (with `no_wait`) or `Timeout` when every permit stayed out
    /// for the whole wait;
    /// `InvalidOptions` when the store keeps another N for the name;
    /// otherwise as [`Locker::lock_with`].
    pub async fn acquire(&self, opts: &LockOptions) -> Result<LockGuard> {
        required(&self.key, self.try_acquire(opts).await?, opts)
    }

    /// As [`acquire`](Self::acquire), but a wait that runs out is `Ok(None)`.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire), without `Busy` and `Timeout`.
    pub async fn try_acquire(&self, opts: &LockOptions) -> Result<Option<LockGuard>> {
        take(
            &self.locker,
            &self.key,
            HoldKind::of_claim(self.claim),
            None,
            opts,
        )
        .await
    }

    /// Takes a permit as `owner`: if it holds one already, the store adds
    /// a hold to it (re-entry), as [`Locker::lock_as`] does for a mutex.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_as(&self, opts: &LockOptions, owner: &OwnerToken) -> Result<LockGuard> {
        let held = take(
            &self.locker,
            &self.key,
            HoldKind::of_claim(self.claim),
            Some(owner),
            opts,
        )
        .await?;
        required(&self.key, held, opts)
    }

    /// Takes a permit with `opts`, runs `work` under it and gives it back,
    /// awaited, before returning: as [`Locker::with_lock`] does for a mutex.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire) while taking it; then as [`Locker::with_lock`].
    pub async fn with_permit<T>(
        &self,
        opts: &LockOptions,
        work: impl AsyncFnOnce(&LockGuard) -> T,
    ) -> Result<T> {
        let permit = self.acquire(opts).await?;
        scoped::run_under(permit, async move |g: &mut LockGuard| work(g).await).await
    }

    /// How many of the permits are held and how many are free now, as
    /// the store says (Redisson's `availablePermits`). A snapshot, like
    /// [`status`](Self::status): a permit counted free may be taken before
    /// this caller asks for it; [`try_acquire`](Self::try_acquire) is the
    /// only way to have one. Each holder counts once, however many times
    /// it re-entered.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// use lockwright_core::{backend::MemoryBackend, LockOptions, Locker};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let exports = locker.semaphore("exports", 3)?;
    /// let one = exports.acquire(&LockOptions::new()).await?;
    /// let now = exports.available().await?;
    /// assert_eq!((now.held, now.free), (1, 2));
    /// one.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`Locker::status`].
    pub async fn available(&self) -> Result<Permits> {
        let status = self.status().await?;
        let held = u32::try_from(status.holder_count()).unwrap_or(u32::MAX);
        // Holders that asked for another number keep the store's count.
        let permits = status
            .permits
            .filter(|_| held > 0)
            .unwrap_or(self.permits());
        Ok(Permits {
            held,
            free: permits.saturating_sub(held),
        })
    }

    /// Who holds permits now, as the store says (see [`Locker::status`]).
    ///
    /// # Errors
    /// As [`Locker::status`].
    pub async fn status(&self) -> Result<LockStatus> {
        self.locker.status(&self.key).await
    }
}

/// A semaphore's permits held and free, from [`Semaphore::available`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Permits {
    /// Permits held now: one per holder.
    pub held: u32,
    /// Permits no one holds now.
    pub free: u32,
}

/// Any number of readers or one writer. Made by [`Locker::rwlock`].
///
/// A writer waiting for readers to leave stops new readers from entering,
/// so a stream of readers never starves it. A writer reads by a
/// [`downgrade`](Self::downgrade); a reader cannot become a writer (two
/// readers doing so at once would wait on each other for ever): asking
/// with a reader's owner is `InvalidOptions`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockwright_core::Result<()> {
/// use lockwright_core::{backend::MemoryBackend, LockOptions, Locker};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let catalogue = locker.rwlock("catalogue")?;
/// let opts = LockOptions::new().no_wait();
/// let r1 = catalogue.read(&opts).await?;
/// let r2 = catalogue.read(&opts).await?;
/// assert!(catalogue.try_write(&opts).await?.is_none(), "readers keep the writer out");
/// r1.release().await?;
/// r2.release().await?;
/// let w = catalogue.write(&opts).await?;
/// let r = catalogue.downgrade(w).await?; // reads what it wrote, others may read too
/// r.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ReadWriteLock {
    locker: Locker,
    key: LockKey,
}

impl fmt::Debug for ReadWriteLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadWriteLock")
            .field("name", &self.key)
            .finish()
    }
}

impl ReadWriteLock {
    pub(crate) fn new(locker: Locker, key: LockKey) -> Result<Self> {
        supports(locker.capabilities(), Claim::Shared)?;
        Ok(ReadWriteLock { locker, key })
    }

    /// The lock's name.
    pub fn name(&self) -> &LockKey {
        &self.key
    }

    /// Takes a read hold, waiting as `opts` say.
    ///
    /// # Errors
    /// `Busy` (with `no_wait`) or `Timeout` when a writer held or waited
    /// for the whole wait;
    /// otherwise as [`Locker::lock_with`].
    pub async fn read(&self, opts: &LockOptions) -> Result<LockGuard> {
        required(
            &self.key,
            take(&self.locker, &self.key, read(), None, opts).await?,
            opts,
        )
    }

    /// As [`read`](Self::read), but a wait that runs out is `Ok(None)`.
    ///
    /// # Errors
    /// As [`read`](Self::read), without `Busy` and `Timeout`.
    pub async fn try_read(&self, opts: &LockOptions) -> Result<Option<LockGuard>> {
        take(&self.locker, &self.key, read(), None, opts).await
    }

    /// Takes the write hold, waiting as `opts` say.
    ///
    /// # Errors
    /// `Busy` (with `no_wait`) or `Timeout` when readers or another writer
    /// held it for the whole wait; otherwise as [`Locker::lock_with`].
    pub async fn write(&self, opts: &LockOptions) -> Result<LockGuard> {
        required(
            &self.key,
            take(&self.locker, &self.key, HoldKind::Writer, None, opts).await?,
            opts,
        )
    }

    /// As [`write`](Self::write), but a wait that runs out is `Ok(None)`.
    ///
    /// # Errors
    /// As [`write`](Self::write), without `Busy` and `Timeout`.
    pub async fn try_write(&self, opts: &LockOptions) -> Result<Option<LockGuard>> {
        take(&self.locker, &self.key, HoldKind::Writer, None, opts).await
    }

    /// Takes a read hold as `owner`, adding a hold if it reads already.
    ///
    /// # Errors
    /// `InvalidOptions` if `owner` holds the write lock (downgrade
    /// instead); otherwise as [`read`](Self::read).
    pub async fn read_as(&self, opts: &LockOptions, owner: &OwnerToken) -> Result<LockGuard> {
        let held = take(&self.locker, &self.key, read(), Some(owner), opts).await?;
        required(&self.key, held, opts)
    }

    /// Takes the write hold as `owner`, adding a hold if it writes already.
    ///
    /// # Errors
    /// `InvalidOptions` if `owner` holds a read lock (a read hold is
    /// never upgraded); otherwise as [`write`](Self::write).
    pub async fn write_as(&self, opts: &LockOptions, owner: &OwnerToken) -> Result<LockGuard> {
        let held = take(&self.locker, &self.key, HoldKind::Writer, Some(owner), opts).await?;
        required(&self.key, held, opts)
    }

    /// Takes a read hold with `opts`, runs `work` under it and gives it
    /// back, awaited, before returning: as [`Locker::with_lock`] does for a mutex.
    ///
    /// # Errors
    /// As [`read`](Self::read) while taking it; then as [`Locker::with_lock`].
    pub async fn with_read<T>(
        &self,
        opts: &LockOptions,
        work: impl AsyncFnOnce(&LockGuard) -> T,
    ) -> Result<T> {
        let reader = self.read(opts).await?;
        scoped::run_under(reader, async move |g: &mut LockGuard| work(g).await).await
    }

    /// Takes the write hold with `opts`, runs `work` under it and gives it
    /// back, awaited, before returning: as [`Locker::with_lock`] does for a mutex.
    ///
    /// # Errors
    /// As [`write`](Self::write) while taking it; then as [`Locker::with_lock`].
    pub async fn with_write<T>(
        &self,
        opts: &LockOptions,
        work: impl AsyncFnOnce(&LockGuard) -> T,
    ) -> Result<T> {
        let writer = self.write(opts).await?;
        scoped::run_under(writer, async move |g: &mut LockGuard| work(g).await).await
    }

    /// Turns a write hold into a read hold without a moment unlocked: a
    /// read hold is granted beside the write hold (whoever waits), then
    /// the write hold is released. The read guard has its own owner and,
    /// where the store has fences, a fence above the writer's.
    ///
    /// # Errors
    /// `Lost` if `writer` no longer holds the lock (a store grants the
    /// read hold only beside a live write hold); `InvalidOptions` for a
    /// guard of another name; the store's errors. On every error the
    /// writer's guard is released, as any dropped guard is.
    pub async fn downgrade(&self, writer: LockGuard) -> Result<LockGuard> {
        if writer.key() != &self.key {
            return Err(Error::invalid_options(format!(
                "downgrade of a guard of {:?} on the lock {:?}",
                writer.key().as_str(),
                self.key.as_str()
            )));
        }
        let kind = HoldKind::Reader {
            beside: Some(writer.owner().clone()),
        };
        let opts = LockOptions {
            ttl: writer.lease().ttl,
            ..self.locker.options().clone()
        }
        .no_wait();
        let request = LockRequest::new(self.key.clone(), None).of_kind(kind);
        let reader = self.locker.acquire(request, &opts).await?;
        let Some(reader) = reader else {
            let _ = writer.release().await;
            return Err(Error::lost(format!(
                "{:?}: the write lock to downgrade is no longer held",
                self.key.as_str()
            )));
        };
        match writer.release().await {
            Ok(()) => Ok(reader),
            // The write hold was gone by now (its lease ran out): the
            // read hold cannot claim to follow it without a gap.
            Err(e) if e.kind() == ErrorKind::Lost => {
                let _ = reader.release().await;
                Err(e)
            }
            Err(e) => {
                // The read hold stands; the write hold frees at its TTL.
                tracing::warn!(key = %self.key, error = %e.chain(),
                    "downgrade: the write hold could not be released; it frees at its TTL");
                Ok(reader)
            }
        }
    }

    /// Who holds the lock now, as the store says (see [`Locker::status`]).
    ///
    /// # Errors
    /// As [`Locker::status`].
    pub async fn status(&self) -> Result<LockStatus> {
        self.locker.status(&self.key).await
    }
}

/// A reader's hold, beside no writer.
fn read() -> HoldKind {
    HoldKind::Reader { beside: None }
}

/// One acquire of `key` making a hold of `kind`, as `owner` (a re-entry)
/// or a token drawn for it; a wait that runs out is `Ok(None)`.
async fn take(
    locker: &Locker,
    key: &LockKey,
    kind: HoldKind,
    owner: Option<&OwnerToken>,
    opts: &LockOptions,
) -> Result<Option<LockGuard>> {
    let request = LockRequest::new(key.clone(), owner.cloned()).of_kind(kind);
    locker.acquire(request, opts).await
}

/// The guard, or the `Timeout` of a wait that ran out.
fn required(key: &LockKey, held: Option<LockGuard>, opts: &LockOptions) -> Result<LockGuard> {
    held.ok_or_else(|| timeout_error(key, opts.wait))
}
