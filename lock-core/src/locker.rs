//! [`Locker`]: the type applications hold. Waiting, guards, renewal,
//! re-entrancy and multi-lock on top of any [`LockBackend`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::acquire::{supports, timeout_error, Acquirer, Identity};
use crate::backend::{renew_one, Capabilities, LockBackend, Release, Renew, RenewRequest};
use crate::election::Election;
use crate::error::{Error, Result};
use crate::guard::{LockGuard, MultiGuard};
use crate::identity::HolderInfo;
use crate::key::{Claim, IntoLockKey, OwnerToken};
use crate::lease::Lease;
use crate::meter::{self, Labels};
use crate::options::{validate_ttl, LockOptions, WaitPolicy};
use crate::permits::{Mutex, ReadWriteLock, Semaphore};
use crate::request::HoldKind;
use crate::request::LockRequest;
use crate::scoped;

/// How long [`Locker::close`] waits for background clean-ups.
const CLOSE_PATIENCE: Duration = Duration::from_secs(5);

/// A handle on one lock store. Cheap to clone; clones share one connection
/// pool and one renewal watchdog.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockwright_core::Result<()> {
/// use lockwright_core::{backend::MemoryBackend, LockOptions, Locker};
/// use std::time::Duration;
///
/// let locker = Locker::new(MemoryBackend::new());
/// let guard = locker
///     .lock_with("nightly-report", &LockOptions::new().wait_for(Duration::from_secs(5)))
///     .await?;
/// // ... the critical section; select on guard.lost() if it is long ...
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Locker {
    /// The store, its watchdog and clean-ups, and the metrics labels: what
    /// an acquire uses.
    acquirer: Acquirer,
    /// The options of [`lock`](Self::lock) and [`try_lock`](Self::try_lock).
    options: LockOptions,
}

// Written out to read as it did before the acquire machinery moved into
// `Acquirer`: the same fields, in the same order.
impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.acquirer;
        f.debug_struct("Locker")
            .field("backend", &a.backend)
            .field("caps", &a.caps)
            .field("watchdog", &a.watchdog)
            .field("background", &a.background)
            .field("options", &self.options)
            .field("store", &a.store)
            .field("name_label", &a.name_label)
            .field("identity", &a.identity)
            .finish()
    }
}

impl Locker {
    /// A locker over `backend` with default [`LockOptions`].
    pub fn new(backend: impl LockBackend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A locker over a shared backend.
    pub fn from_arc(backend: Arc<dyn LockBackend>) -> Self {
        Locker {
            acquirer: Acquirer::new(backend),
            options: LockOptions::default(),
        }
    }

    /// Labels this locker's metrics with `store` (the facade's `connect`
    /// sets the URL's scheme, such as `redis` or `postgres`).
    #[must_use]
    pub fn with_store_label(mut self, store: &'static str) -> Self {
        self.acquirer.store = store;
        self
    }

    /// The `store` label of this locker's metrics.
    pub(crate) fn store_label(&self) -> &'static str {
        self.acquirer.store
    }

    /// Labels this locker's metrics with each lock's name as well (`name`).
    /// Off by default: every name becomes a series of its own, so turn it
    /// on only for a small, fixed set of names.
    #[must_use]
    pub fn with_name_label(mut self, on: bool) -> Self {
        self.acquirer.name_label = on;
        self
    }

    /// Records who holds each hold this locker takes: this host, this
    /// process's id and `label` (a pod's name, say), which
    /// [`status`](Self::status), [`list`](Self::list) and `lockwright
    /// status` show beside each holder. Off by default: it keeps one more
    /// lock in the store, the locker's identity record, from its first
    /// hold until [`close`](Self::close) (or a minute after the process
    /// ends), renewed every 20 s. A hold taken as a caller's own owner
    /// ([`lock_as`](Self::lock_as)) is named only if that owner was drawn
    /// by a locker with identity (a guard's [`owner`](LockGuard::owner)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// # use lockwright_core::{backend::MemoryBackend, Locker};
    /// let locker = Locker::new(MemoryBackend::new()).with_identity(Some("worker-7"))?;
    /// let _job = locker.lock("nightly").await?;
    /// let who = locker.status("nightly").await?.who.expect("recorded");
    /// assert_eq!(who.label.as_deref(), Some("worker-7"));
    /// assert_eq!(who.pid, std::process::id());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`](crate::ErrorKind::InvalidOptions) for a
    /// label over [`MAX_LABEL_LEN`](crate::identity::MAX_LABEL_LEN) bytes,
    /// or with a control character but newline and tab.
    pub fn with_identity(mut self, label: Option<&str>) -> Result<Self> {
        let info = HolderInfo::this_process(label)?;
        self.acquirer.identity = Some(Identity::new(info));
        Ok(self)
    }

    /// Who this locker records as the holder of its holds, if it does.
    pub fn identity(&self) -> Option<&HolderInfo> {
        self.acquirer.identity.as_deref().map(|i| &i.info)
    }

    /// A token for a new owner, tagged with the identity record's name
    /// when this locker keeps one.
    pub(crate) fn draw_owner(&self) -> OwnerToken {
        self.acquirer.draw_owner()
    }

    /// Waits, at most `within`, for this locker's clean-ups that run in the
    /// background: releases of dropped guards, and the undoing of acquires
    /// that were cancelled, timed out or failed while a request was in
    /// flight (leaving a wait queue included). Call it before the process
    /// exits, so that none is cut off and left for the store's TTL.
    /// Returns `true` when nothing is left pending.
    pub async fn settle(&self, within: Duration) -> bool {
        self.acquirer.background.settle(within).await
    }

    /// Releases every lock this locker (and its clones) still holds, stops
    /// the renewal watchdog and waits, at most `CLOSE_PATIENCE` (5 s), for
    /// the background clean-ups ([`settle`](Self::settle)). Call it before
    /// the process exits: a guard dropped as `main` returns is released by a
    /// task that the shutting-down runtime may never run. After `close`,
    /// acquires (those still waiting included) fail with
    /// [`ErrorKind::Closed`](crate::ErrorKind::Closed); guards still alive
    /// fire their lost signal with [`LostReason::Closed`](crate::LostReason)
    /// before their lock is released, and their `release` is a no-op that
    /// succeeds.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// # use lockwright_core::{backend::MemoryBackend, ErrorKind, Locker};
    /// let locker = Locker::new(MemoryBackend::new());
    /// let _job = locker.lock("nightly").await?;
    /// locker.close().await?; // "nightly" is free in the store now
    /// assert_eq!(locker.lock("nightly").await.unwrap_err().kind(), ErrorKind::Closed);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// The first error of a release that failed (the store unreachable, say);
    /// every other lock was still released, and that one frees at its TTL.
    pub async fn close(&self) -> Result<()> {
        let a = &self.acquirer;
        let record = a.take_record();
        let held = a.watchdog.close();
        // The record is bookkeeping: its release is tried with the rest
        // (a held one was released in the batch already), and a failure
        // is not the caller's: the record frees at its TTL.
        let record = async {
            if let Some(Err(e)) =
                futures::future::OptionFuture::from(record.map(|g| g.release())).await
            {
                tracing::debug!(error = %e.chain(), "the holder identity record frees at its TTL");
            }
        };
        let (released, ()) = futures::future::join(
            futures::future::join_all(held.iter().map(|r| a.backend.release(&r.hold))),
            record,
        )
        .await;
        a.background.settle(CLOSE_PATIENCE).await;
        for (r, e) in held.iter().zip(&released) {
            if let Err(e) = e {
                let primitive = meter::primitive(&r.hold.kind, false);
                Labels::new(a.store, primitive, &r.hold.key, a.name_label).store_error(e.kind());
            }
        }
        let failed = released.iter().filter(|r| r.is_err()).count();
        match released.into_iter().find_map(|r| r.err()) {
            Some(e) => Err(Error::new(
                e.kind(),
                format!(
                    "closing: {failed} of {} locks could not be released (they free at their TTL)",
                    held.len()
                ),
            )
            .with_source(e)),
            None => Ok(()),
        }
    }

    /// Replaces the options used by [`lock`](Self::lock) and [`try_lock`](Self::try_lock).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`](crate::ErrorKind::InvalidOptions) if they do
    /// not fit this backend.
    pub fn with_options(mut self, options: LockOptions) -> Result<Self> {
        options.validate(&self.acquirer.caps)?;
        self.options = options;
        Ok(self)
    }

    /// The default options of this locker.
    pub fn options(&self) -> &LockOptions {
        &self.options
    }

    /// The backend underneath.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.acquirer.backend
    }

    /// What the backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        &self.acquirer.caps
    }

    /// One attempt with the default options: `Ok(None)` if someone else holds it.
    ///
    /// # Errors
    /// `InvalidKey`, `Unavailable` (never reported as "held"), or a backend error.
    pub async fn try_lock(&self, key: impl IntoLockKey) -> Result<Option<LockGuard>> {
        let opts = self.options.clone().no_wait();
        let request = LockRequest::new(key.into_lock_key()?, None);
        self.acquire(request, &opts).await
    }

    /// Acquires with the default options, waiting as their policy says.
    ///
    /// # Errors
    /// `Busy` when the default options do not wait and the lock is held;
    /// `Timeout` when the wait runs out; otherwise as [`try_lock`](Self::try_lock).
    pub async fn lock(&self, key: impl IntoLockKey) -> Result<LockGuard> {
        let opts = self.options.clone();
        self.lock_with(key, &opts).await
    }

    /// Acquires with explicit options. A store that cannot be reached is
    /// tried again, with a growing pause, until the wait ends (a restart,
    /// a failover, an election ridden out); a lock taken meanwhile by an
    /// attempt whose answer was lost is given back.
    ///
    /// # Errors
    /// `Busy` when `opts` do not wait and the lock is held by another
    /// owner; `Timeout` when the wait runs out while the lock is held by another
    /// owner; `Unavailable` (the last store error) when it runs out while
    /// the store cannot be reached; `InvalidOptions` for options the
    /// backend cannot honour; otherwise as [`try_lock`](Self::try_lock).
    pub async fn lock_with(&self, key: impl IntoLockKey, opts: &LockOptions) -> Result<LockGuard> {
        let key = key.into_lock_key()?;
        self.acquire(LockRequest::new(key.clone(), None), opts)
            .await?
            .ok_or_else(|| timeout_error(&key, opts.wait))
    }

    /// Acquires with explicit options, waiting as they say, and reports a
    /// lock still held by someone else when the wait runs out as `Ok(None)`
    /// (where [`lock_with`](Self::lock_with) says `Err(Busy)` or `Err(Timeout)`).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// use lockwright_core::{backend::MemoryBackend, LockOptions, Locker};
    /// use std::time::Duration;
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let opts = LockOptions::new().wait_for(Duration::from_millis(50));
    /// let held = locker.lock_with("report", &opts).await?;
    /// assert!(locker.try_lock_with("report", &opts).await?.is_none());
    /// held.release().await?;
    /// assert!(locker.try_lock_with("report", &opts).await?.is_some());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`try_lock`](Self::try_lock), and `InvalidOptions` for options the
    /// backend cannot honour.
    pub async fn try_lock_with(
        &self,
        key: impl IntoLockKey,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        let request = LockRequest::new(key.into_lock_key()?, None);
        self.acquire(request, opts).await
    }

    /// Acquires as a given owner, with the arguments in
    /// [`lock_with`](Self::lock_with)'s order and the owner last. If that
    /// owner already holds the key, the store adds a hold (re-entrancy) and
    /// the lock frees only when every hold's guard is released; any other
    /// owner stays excluded throughout.
    ///
    /// A re-entrant acquire whose future is dropped while its request is in
    /// flight may leave one extra hold, which the store drops at TTL expiry
    /// after the owner's other guards stop renewing.
    ///
    /// # Errors
    /// As [`lock_with`](Self::lock_with).
    pub async fn lock_as(
        &self,
        key: impl IntoLockKey,
        opts: &LockOptions,
        owner: &OwnerToken,
    ) -> Result<LockGuard> {
        let key = key.into_lock_key()?;
        self.acquire(LockRequest::new(key.clone(), Some(owner.clone())), opts)
            .await?
            .ok_or_else(|| timeout_error(&key, opts.wait))
    }

    /// As [`lock_as`](Self::lock_as), but `Ok(None)` if another owner
    /// still holds the key when the wait ends.
    ///
    /// # Errors
    /// As [`lock_as`](Self::lock_as), without `Busy` and `Timeout`.
    pub async fn try_lock_as(
        &self,
        key: impl IntoLockKey,
        opts: &LockOptions,
        owner: &OwnerToken,
    ) -> Result<Option<LockGuard>> {
        let key = key.into_lock_key()?;
        self.acquire(LockRequest::new(key, Some(owner.clone())), opts)
            .await
    }

    /// Takes `key` with the default options, runs `work` under it and
    /// gives it back, awaited, before returning `work`'s output: the name
    /// is free for the next claimant the moment this returns, whether the
    /// work ended, returned an error of its own or panicked (the panic goes
    /// on after the release). No guard is left to drop and no
    /// [`close`](Self::close) is needed for it.
    ///
    /// If the lock is lost while the work runs, the work is stopped at its
    /// next await point and the answer is `Err(Lost)`: act on the
    /// protected resource only through awaits, or check
    /// [`LockGuard::is_lost`] between steps that do not await.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// use lockwright_core::{backend::MemoryBackend, Locker};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let charged = locker
    ///     .with_lock("order-1138", async |guard| {
    ///         // ... charge the card, passing guard.fence() along ...
    ///         guard.fence().is_some()
    ///     })
    ///     .await?;
    /// assert!(charged);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`lock`](Self::lock) while taking it; `Lost` if the lock was lost
    /// while the work ran or was found gone at the release.
    pub async fn with_lock<T>(
        &self,
        key: impl IntoLockKey,
        work: impl AsyncFnOnce(&LockGuard) -> T,
    ) -> Result<T> {
        let opts = self.options.clone();
        self.with_lock_with(key, &opts, work).await
    }

    /// [`with_lock`](Self::with_lock), taking the lock with `opts`.
    ///
    /// # Errors
    /// As [`lock_with`](Self::lock_with) while taking it; then as
    /// [`with_lock`](Self::with_lock).
    pub async fn with_lock_with<T>(
        &self,
        key: impl IntoLockKey,
        opts: &LockOptions,
        work: impl AsyncFnOnce(&LockGuard) -> T,
    ) -> Result<T> {
        let guard = self.lock_with(key, opts).await?;
        scoped::run_under(guard, async move |g: &mut LockGuard| work(g).await).await
    }

    /// Gives back a lease kept past its guard ([`LockGuard::leak`]), as
    /// its owner: the store checks the owner, so a lease someone else
    /// holds now is left alone.
    ///
    /// # Errors
    /// `Lost` when the store no longer has it for this owner (its TTL ran
    /// out, or it was broken or taken over); `Unavailable` when the store
    /// cannot be reached (the lease then ends at its TTL).
    pub async fn release_lease(&self, lease: &Lease) -> Result<()> {
        match self.backend().release(&lease.hold()).await? {
            Release::NotHeld => Err(Error::lost(format!(
                "lock {:?} was no longer held by this lease's owner",
                lease.key.as_str()
            ))),
            Release::Freed | Release::StillHeld(_) => Ok(()),
        }
    }

    /// Sets a lease kept past its guard ([`LockGuard::leak`]) to end `ttl`
    /// from now on the store's clock (longer or shorter than it had), as
    /// its owner. Nothing renews it after that. On a store whose locks
    /// live with the client's session (ZooKeeper, etcd, SQL session
    /// locks) this only checks that it is still held: the lock lasts as
    /// long as the session.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// use lockwright_core::{backend::MemoryBackend, Locker};
    /// use std::time::Duration;
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let lease = locker.lock("export").await?.leak(); // held, no guard
    /// locker.extend_lease(&lease, Duration::from_secs(60)).await?;
    /// assert!(locker.try_lock("export").await?.is_none());
    /// locker.release_lease(&lease).await?;
    /// assert!(locker.try_lock("export").await?.is_some());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// `InvalidOptions` for a TTL the store cannot keep; otherwise as
    /// [`release_lease`](Self::release_lease).
    pub async fn extend_lease(&self, lease: &Lease, ttl: Duration) -> Result<()> {
        validate_ttl(ttl, self.capabilities())?;
        let renewal = RenewRequest {
            ttl,
            ..lease.renewal()
        };
        match renew_one(&**self.backend(), renewal).await? {
            Renew::Renewed => Ok(()),
            Renew::NotHeld => Err(Error::lost(format!(
                "lock {:?} was no longer held by this lease's owner",
                lease.key.as_str()
            ))),
        }
    }

    /// The mutex named `name`, as a handle with the verbs every handle
    /// has (see [`Mutex`]); the same lock as this locker's `lock(name)`.
    ///
    /// # Errors
    /// `InvalidKey` for a bad name.
    pub fn mutex(&self, name: impl IntoLockKey) -> Result<Mutex> {
        Ok(Mutex::new(self.clone(), name.into_lock_key()?))
    }

    /// The election named `name`: its leader is whoever holds that key
    /// (see [`Election`]).
    ///
    /// # Errors
    /// `InvalidKey` for a bad name; `Unsupported` when the store keeps no
    /// value with a lock ([`Capabilities::values`]).
    pub fn election(&self, name: impl IntoLockKey) -> Result<Election> {
        Election::new(self.clone(), name.into_lock_key()?)
    }

    /// The semaphore named `name`, of `permits` permits: at most that many
    /// holders at once (see [`Semaphore`]).
    ///
    /// # Errors
    /// `InvalidKey` for a bad name; `InvalidOptions` for 0 or more than
    /// [`MAX_PERMITS`](crate::MAX_PERMITS) permits; `Unsupported` when the
    /// store cannot grant them ([`Capabilities::permits`]).
    pub fn semaphore(&self, name: impl IntoLockKey, permits: u32) -> Result<Semaphore> {
        Semaphore::new(self.clone(), name.into_lock_key()?, permits)
    }

    /// The read-write lock named `name` (see [`ReadWriteLock`]).
    ///
    /// # Errors
    /// `InvalidKey` for a bad name; `Unsupported` when the store cannot
    /// grant shared holds ([`Capabilities::shared`]).
    pub fn rwlock(&self, name: impl IntoLockKey) -> Result<ReadWriteLock> {
        ReadWriteLock::new(self.clone(), name.into_lock_key()?)
    }

    /// The one acquire (see [`LockRequest`]), for this type's methods and
    /// the handles it makes: an election's campaign, a semaphore's or a
    /// read-write lock's take. A wait that runs out is `Ok(None)`.
    pub(crate) async fn acquire(
        &self,
        request: LockRequest,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        self.acquirer.acquire(request, opts).await
    }

    /// Acquires several keys all-or-nothing, in one global (sorted) order so
    /// two callers locking overlapping sets cannot deadlock. Duplicate keys
    /// count once. If any key cannot be had within the wait, every key taken
    /// so far is released before the error is returned.
    ///
    /// # Errors
    /// `InvalidOptions` for an empty set; otherwise as [`lock_with`](Self::lock_with).
    pub async fn lock_all<I>(&self, keys: I, opts: &LockOptions) -> Result<MultiGuard>
    where
        I: IntoIterator,
        I::Item: IntoLockKey,
    {
        self.lock_all_claims(keys.into_iter().map(|k| (k, Claim::MUTEX)), opts)
            .await
    }

    /// As [`lock_all`](Self::lock_all), each key with its own [`Claim`]: a
    /// semaphore's permit, a read or a write hold, or a mutex. Ordered and
    /// all-or-nothing as `lock_all` is, so two callers taking overlapping
    /// sets in any mix of claims cannot deadlock on each other.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// use lockwright_core::{backend::MemoryBackend, Claim, LockOptions, Locker};
    ///
    /// let locker = Locker::new(MemoryBackend::new());
    /// let opts = LockOptions::new().no_wait();
    /// let all = locker
    ///     .lock_all_claims([("catalogue", Claim::Shared), ("exports", Claim::permits(3)?)], &opts)
    ///     .await?;
    /// assert_eq!(all.guards().len(), 2);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// `InvalidOptions` for an empty set or a key named twice with two
    /// claims; `Unsupported` for a claim the store cannot grant; otherwise
    /// as [`lock_with`](Self::lock_with).
    pub async fn lock_all_claims<I, K>(&self, items: I, opts: &LockOptions) -> Result<MultiGuard>
    where
        I: IntoIterator<Item = (K, Claim)>,
        K: IntoLockKey,
    {
        let mut items = items
            .into_iter()
            .map(|(k, c)| Ok((k.into_lock_key()?, c)))
            .collect::<Result<Vec<_>>>()?;
        items.sort_by(|a, b| a.0.cmp(&b.0));
        items.dedup();
        if let Some(w) = items.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(Error::invalid_options(format!(
                "{:?} is named twice, {} and {}",
                w[0].0.as_str(),
                w[0].1,
                w[1].1
            )));
        }
        if items.is_empty() {
            return Err(Error::invalid_options("lock_all needs at least one key"));
        }
        for (_, claim) in &items {
            supports(&self.acquirer.caps, *claim)?;
        }
        let start = Instant::now();
        let mut held = MultiGuard { guards: Vec::new() };
        for (key, claim) in items {
            let wait = match opts.wait {
                WaitPolicy::For(d) => WaitPolicy::For(d.saturating_sub(start.elapsed())),
                other => other,
            };
            let step = LockOptions {
                wait,
                ..opts.clone()
            };
            let request = LockRequest::new(key.clone(), None).of_kind(HoldKind::of_claim(claim));
            let outcome = self
                .acquire(request, &step)
                .await
                .and_then(|g| g.ok_or_else(|| timeout_error(&key, opts.wait)));
            match outcome {
                Ok(g) => held.guards.push(g),
                Err(e) => {
                    // Awaited, so on return nothing of the set is still held.
                    let _ = held.release().await;
                    return Err(e);
                }
            }
        }
        Ok(held)
    }
}

impl Locker {
    /// Background clean-ups not yet finished, for tests that check a
    /// release was awaited rather than left to a task.
    #[cfg(test)]
    pub(crate) fn background_pending(&self) -> usize {
        self.acquirer.background.pending()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{MemoryBackend, Renew};

    /// A record the store forgot (a restart) is lost to the watchdog, yet
    /// its guard is still armed: close must give it back itself, or the
    /// locker's drop releases it after close returned, and a failure is
    /// then logged after the caller's last word (seen in `run`).
    #[tokio::test]
    async fn close_leaves_no_release_of_a_lost_identity_record_behind() {
        let locker = Locker::new(MemoryBackend::new())
            .with_identity(Some("t"))
            .unwrap();
        let job = locker.lock("job").await.unwrap();
        let who = locker.acquirer.identity.clone().unwrap();
        let record = || who.record.try_lock().unwrap();
        let id = record().guard.as_ref().unwrap().watch_id();
        let watchdog = &locker.acquirer.watchdog;
        watchdog.renewed(id, Instant::now(), Renew::NotHeld);
        assert!(record().guard.as_ref().unwrap().is_lost());
        let background = locker.acquirer.background.clone();
        locker.close().await.unwrap();
        drop(job);
        drop(locker);
        drop(who);
        // Counted as it is spawned, before it can run.
        assert_eq!(
            background.pending(),
            0,
            "a release was left to run after close"
        );
    }
}
