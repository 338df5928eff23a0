//! The handles: [`Mutex`], and semaphores and read-write locks, the
//! mutex's contract for more than one holder; and the one family of verbs
//! they all take holds by (`hold_verbs!`).
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

/// The one family of verbs every handle has for each hold it takes, with
/// the same meaning everywhere (`V` is `lock`, `acquire`, `read` or
/// `write`):
///
/// | form | waits | someone else holds it |
/// |---|---|---|
/// | `V()` | as the `Locker`'s default options say | `Err(Busy)` or `Err(Timeout)` |
/// | `try_V()` | never: one attempt | `Ok(None)` |
/// | `V_with(opts)` | as `opts` say | `Err(Busy)` or `Err(Timeout)` |
/// | `try_V_with(opts)` | as `opts` say | `Ok(None)` |
/// | `V_as(opts, owner)`, `try_V_as(opts, owner)` | as `opts` say, re-entering `owner`'s hold | as `V_with`, `try_V_with` |
/// | `with_V(work)`, `with_V_with(opts, work)` | as `V`, `V_with` | as `V`, `V_with`; the work runs under the hold, which is given back before it returns |
///
/// `$kind` names the handle's method that says what kind of hold `V` takes.
macro_rules! hold_verbs {
    ($Handle:ident, $kind:ident, $what:literal,
     $V:ident, $try_V:ident, $V_with:ident, $try_V_with:ident,
     $V_as:ident, $try_V_as:ident, $with_V:ident, $with_V_with:ident) => {
        impl $Handle {
            #[doc = concat!("Takes ", $what, ", waiting as the `Locker`'s default options say.")]
            ///
            /// # Errors
            /// `Busy` when the defaults do not wait and someone else holds
            /// it, `Timeout` when their wait runs out; `Unavailable` when
            /// the store cannot be reached; `InvalidOptions` for options
            /// the store cannot honour; `Closed` after the locker's close.
            pub async fn $V(&self) -> Result<LockGuard> {
                let opts = self.locker.options().clone();
                self.$V_with(&opts).await
            }

            #[doc = concat!("Makes one attempt to take ", $what, " with the default options' lease: `Ok(None)` if someone else holds it.")]
            ///
            /// # Errors
            #[doc = concat!("As [`", stringify!($V), "`](Self::", stringify!($V), "), without `Busy` and `Timeout`.")]
            pub async fn $try_V(&self) -> Result<Option<LockGuard>> {
                let opts = self.locker.options().clone().no_wait();
                self.$try_V_with(&opts).await
            }

            #[doc = concat!("Takes ", $what, ", waiting as `opts` say.")]
            ///
            /// # Errors
            #[doc = concat!("As [`", stringify!($V), "`](Self::", stringify!($V), "), for `opts`.")]
            pub async fn $V_with(&self, opts: &LockOptions) -> Result<LockGuard> {
                required(&self.key, self.$try_V_with(opts).await?, opts)
            }

            #[doc = concat!("Takes ", $what, ", waiting as `opts` say: `Ok(None)` if someone else still holds it when the wait ends.")]
            ///
            /// # Errors
            #[doc = concat!("As [`", stringify!($V_with), "`](Self::", stringify!($V_with), "), without `Busy` and `Timeout`.")]
            pub async fn $try_V_with(&self, opts: &LockOptions) -> Result<Option<LockGuard>> {
                take(&self.locker, &self.key, self.$kind(), None, opts).await
            }

            #[doc = concat!("Takes ", $what, " as `owner`, waiting as `opts` say: if that owner holds it already, the store adds a hold (re-entry), released with the last guard.")]
            ///
            /// # Errors
            #[doc = concat!("As [`", stringify!($V_with), "`](Self::", stringify!($V_with), ").")]
            pub async fn $V_as(&self, opts: &LockOptions, owner: &OwnerToken) -> Result<LockGuard> {
                required(&self.key, self.$try_V_as(opts, owner).await?, opts)
            }

            #[doc = concat!("As [`", stringify!($V_as), "`](Self::", stringify!($V_as), "), but `Ok(None)` if someone else still holds it when the wait ends.")]
            ///
            /// # Errors
            #[doc = concat!("As [`", stringify!($V_as), "`](Self::", stringify!($V_as), "), without `Busy` and `Timeout`.")]
            pub async fn $try_V_as(
                &self,
                opts: &LockOptions,
                owner: &OwnerToken,
            ) -> Result<Option<LockGuard>> {
                take(&self.locker, &self.key, self.$kind(), Some(owner), opts).await
            }

            #[doc = concat!("Takes ", $what, " as [`", stringify!($V), "`](Self::", stringify!($V), ") does, runs `work` under it and gives it back, awaited, before returning: see [`Locker::with_lock`].")]
            ///
            /// # Errors
            #[doc = concat!("As [`", stringify!($V), "`](Self::", stringify!($V), ") while taking it; then as [`Locker::with_lock`].")]
            pub async fn $with_V<T>(&self, work: impl AsyncFnOnce(&LockGuard) -> T) -> Result<T> {
                let opts = self.locker.options().clone();
                self.$with_V_with(&opts, work).await
            }

            #[doc = concat!("As [`", stringify!($with_V), "`](Self::", stringify!($with_V), "), taking it with `opts`.")]
            ///
            /// # Errors
            #[doc = concat!("As [`", stringify!($V_with), "`](Self::", stringify!($V_with), ") while taking it; then as [`Locker::with_lock`].")]
            pub async fn $with_V_with<T>(
                &self,
                opts: &LockOptions,
                work: impl AsyncFnOnce(&LockGuard) -> T,
            ) -> Result<T> {
                let held = self.$V_with(opts).await?;
                scoped::run_under(held, async move |g: &mut LockGuard| work(g).await).await
            }
        }
    };
}

hold_verbs!(
    Mutex,
    mutex_kind,
    "the lock",
    lock,
    try_lock,
    lock_with,
    try_lock_with,
    lock_as,
    try_lock_as,
    with_lock,
    with_lock_with
);
hold_verbs!(
    Semaphore,
    permit_kind,
    "a permit",
    acquire,
    try_acquire,
    acquire_with,
    try_acquire_with,
    acquire_as,
    try_acquire_as,
    with_permit,
    with_permit_with
);
hold_verbs!(
    ReadWriteLock,
    read_kind,
    "a read hold",
    read,
    try_read,
    read_with,
    try_read_with,
    read_as,
    try_read_as,
    with_read,
    with_read_with
);
hold_verbs!(
    ReadWriteLock,
    write_kind,
    "the write hold",
    write,
    try_write,
    write_with,
    try_write_with,
    write_as,
    try_write_as,
    with_write,
    with_write_with
);

/// One name's mutex: the handle form of [`Locker::lock`] and its
/// siblings, with the verbs every handle has. Made by [`Locker::mutex`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockwright_core::Result<()> {
/// use lockwright_core::{backend::MemoryBackend, Locker};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let nightly = locker.mutex("nightly-report")?;
/// let ran = nightly.with_lock(async |guard| guard.fence().is_some()).await?;
/// assert!(ran);
/// let held = nightly.lock().await?;
/// assert!(nightly.try_lock().await?.is_none(), "held: one attempt, no wait");
/// held.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Mutex {
    locker: Locker,
    key: LockKey,
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex").field("name", &self.key).finish()
    }
}

impl Mutex {
    pub(crate) fn new(locker: Locker, key: LockKey) -> Self {
        Mutex { locker, key }
    }

    /// The mutex's name.
    pub fn name(&self) -> &LockKey {
        &self.key
    }

    /// Who holds it now, as the store says (see [`Locker::status`]).
    ///
    /// # Errors
    /// As [`Locker::status`].
    pub async fn status(&self) -> Result<LockStatus> {
        self.locker.status(&self.key).await
    }

    fn mutex_kind(&self) -> HoldKind {
        HoldKind::Mutex
    }
}

/// At most N holders of a name at once, on the store's clock. Made by
/// [`Locker::semaphore`].
///
/// Every holder of a name must agree on N: the store keeps N while any
/// permit is held and refuses another N with `InvalidOptions`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockwright_core::Result<()> {
/// use lockwright_core::{backend::MemoryBackend, Locker};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let backups = locker.semaphore("backups", 2)?;
/// let first = backups.acquire().await?;
/// let second = backups.acquire().await?;
/// assert!(backups.try_acquire().await?.is_none(), "both permits are out");
/// first.release().await?;
/// let third = backups.acquire().await?;
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

    fn permit_kind(&self) -> HoldKind {
        HoldKind::of_claim(self.claim)
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
    /// use lockwright_core::{backend::MemoryBackend, Locker};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let exports = locker.semaphore("exports", 3)?;
    /// let one = exports.acquire().await?;
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
/// use lockwright_core::{backend::MemoryBackend, Locker};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let catalogue = locker.rwlock("catalogue")?;
/// let r1 = catalogue.read().await?;
/// let r2 = catalogue.read().await?;
/// assert!(catalogue.try_write().await?.is_none(), "readers keep the writer out");
/// r1.release().await?;
/// r2.release().await?;
/// let w = catalogue.write().await?;
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

    fn read_kind(&self) -> HoldKind {
        read()
    }

    fn write_kind(&self) -> HoldKind {
        HoldKind::Writer
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
        // No lock at least for: the writer goes now, and the reader is
        // the caller's to keep as long as it likes.
        let opts = LockOptions {
            ttl: writer.lease().ttl,
            at_least: None,
            ..self.locker.options().clone()
        }
        .no_wait();
        let request = LockRequest::new(self.key.clone(), None).of_kind(kind);
        let reader = self.locker.acquire(request, &opts).await?;
        let Some(reader) = reader else {
            let _ = writer.release_now().await;
            return Err(Error::lost(format!(
                "{:?}: the write lock to downgrade is no longer held",
                self.key.as_str()
            )));
        };
        match writer.release_now().await {
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
