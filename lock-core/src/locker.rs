//! [`Locker`]: the type applications hold. Waiting, guards, renewal,
//! re-entrancy and multi-lock on top of any [`LockBackend`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::future::Future;
use std::task::{Context, Poll};

use backon::BackoffBuilder;
use futures::future::BoxFuture;
use tracing::Instrument;

use crate::backend::{
    Acquire, Capabilities, Grant, LockBackend, Notice, Watch, IN_LINE_POLL, MARK_LIFE,
};
use crate::background::Background;
use crate::election::Election;
use crate::error::{Error, ErrorKind, Result};
use crate::guard::{LockGuard, MultiGuard};
use crate::key::{Claim, IntoLockKey, LockKey, OwnerToken};
use crate::lease::{local_deadline, Lease, LockStatus};
use crate::meter::{self, AcquireMeter, HoldMeter, Labels, Outcome};
use crate::options::{LockOptions, WaitPolicy};
use crate::permits::{supports, ReadWriteLock, Semaphore};
use crate::watchdog::Watchdog;

/// How long [`Locker::close`] waits for background clean-ups.
const CLOSE_PATIENCE: Duration = Duration::from_secs(5);

/// The shortest sleep between polling attempts.
const MIN_POLL: Duration = Duration::from_millis(1);

/// How long after a holder's lease is due a polling waiter looks: the
/// store's clock and ours tick apart by about this much.
const DUE_MARGIN: Duration = Duration::from_millis(2);

/// The first and longest pause before a waiting acquire tries a store that
/// was unreachable again: long enough not to hammer a store that is coming
/// back (a ZooKeeper election, a PostgreSQL restart take seconds), short
/// enough to take the lock soon after it is back.
const OUTAGE_PAUSE: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

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
#[derive(Clone, Debug)]
pub struct Locker {
    backend: Arc<dyn LockBackend>,
    caps: Capabilities,
    watchdog: Arc<Watchdog>,
    background: Background,
    options: LockOptions,
    /// The `store` label of this locker's metrics.
    store: &'static str,
    /// Metrics carry each lock's name too.
    name_label: bool,
}

impl Locker {
    /// A locker over `backend` with default [`LockOptions`].
    pub fn new(backend: impl LockBackend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A locker over a shared backend.
    pub fn from_arc(backend: Arc<dyn LockBackend>) -> Self {
        Locker {
            caps: backend.capabilities(),
            watchdog: Watchdog::new(backend.clone()),
            backend,
            background: Background::default(),
            options: LockOptions::default(),
            store: "unknown",
            name_label: false,
        }
    }

    /// Labels this locker's metrics with `store` (the facade's `connect`
    /// sets the URL's scheme, such as `redis` or `postgres`).
    #[must_use]
    pub fn with_store_label(mut self, store: &'static str) -> Self {
        self.store = store;
        self
    }

    /// The `store` label of this locker's metrics.
    pub(crate) fn store_label(&self) -> &'static str {
        self.store
    }

    /// Labels this locker's metrics with each lock's name as well (`name`).
    /// Off by default: every name becomes a series of its own, so turn it
    /// on only for a small, fixed set of names.
    #[must_use]
    pub fn with_name_label(mut self, on: bool) -> Self {
        self.name_label = on;
        self
    }

    /// Waits, at most `within`, for this locker's clean-ups that run in the
    /// background: releases of dropped guards, and the undoing of acquires
    /// that were cancelled, timed out or failed while a request was in
    /// flight (leaving a wait queue included). Call it before the process
    /// exits, so that none is cut off and left for the store's TTL.
    /// Returns `true` when nothing is left pending.
    pub async fn settle(&self, within: Duration) -> bool {
        self.background.settle(within).await
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
        let held = self.watchdog.close();
        let released =
            futures::future::join_all(held.iter().map(|r| self.backend.release(&r.key, &r.owner)))
                .await;
        self.background.settle(CLOSE_PATIENCE).await;
        for (r, e) in held.iter().zip(&released) {
            if let Err(e) = e {
                let primitive = meter::primitive(&r.owner, false);
                Labels::new(self.store, primitive, &r.key, self.name_label).store_error(e.kind());
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
        let status = self.backend.inspect(&key.into_lock_key()?).await?;
        Ok(status.without_owners())
    }

    /// Whether anyone holds `key` right now (see [`status`](Self::status)).
    ///
    /// # Errors
    /// As [`status`](Self::status).
    pub async fn is_held(&self, key: impl IntoLockKey) -> Result<bool> {
        Ok(self.status(key).await?.held)
    }

    /// Replaces the options used by [`lock`](Self::lock) and [`try_lock`](Self::try_lock).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`](crate::ErrorKind::InvalidOptions) if they do
    /// not fit this backend.
    pub fn with_options(mut self, options: LockOptions) -> Result<Self> {
        options.validate(&self.caps)?;
        self.options = options;
        Ok(self)
    }

    /// The default options of this locker.
    pub fn options(&self) -> &LockOptions {
        &self.options
    }

    /// The backend underneath.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// What the backend promises.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// One attempt with the default options: `Ok(None)` if someone else holds it.
    ///
    /// # Errors
    /// `InvalidKey`, `Unavailable` (never reported as "held"), or a backend error.
    pub async fn try_lock(&self, key: impl IntoLockKey) -> Result<Option<LockGuard>> {
        let opts = self.options.clone().no_wait();
        self.acquire(key.into_lock_key()?, None, &opts).await
    }

    /// Acquires with the default options, waiting as their policy says.
    ///
    /// # Errors
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
    /// `Timeout` when the wait runs out while the lock is held by another
    /// owner; `Unavailable` (the last store error) when it runs out while
    /// the store cannot be reached; `InvalidOptions` for options the
    /// backend cannot honour; otherwise as [`try_lock`](Self::try_lock).
    pub async fn lock_with(&self, key: impl IntoLockKey, opts: &LockOptions) -> Result<LockGuard> {
        let key = key.into_lock_key()?;
        self.acquire(key.clone(), None, opts)
            .await?
            .ok_or_else(|| timeout_error(&key, opts.wait))
    }

    /// Acquires with explicit options, waiting as they say, and reports a
    /// lock still held by someone else when the wait runs out as `Ok(None)`
    /// (where [`lock_with`](Self::lock_with) says `Err(Timeout)`).
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
        self.acquire(key.into_lock_key()?, None, opts).await
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
        self.acquire(key.clone(), Some(owner.clone()), opts)
            .await?
            .ok_or_else(|| timeout_error(&key, opts.wait))
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

    /// Acquires `key` for `owner` and the claim it carries, with a wait
    /// that runs out as `Ok(None)`. `fresh`: the owner was just drawn.
    pub(crate) async fn try_acquire_owned(
        &self,
        key: &LockKey,
        owner: OwnerToken,
        fresh: bool,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        self.acquire_owned(key.clone(), owner, fresh, opts).await
    }

    /// Acquires for `owner`, a token just drawn that holds nothing (a
    /// campaign's): an attempt abandoned mid-flight is undone, as for
    /// [`lock_with`](Self::lock_with). A wait that runs out is `Ok(None)`.
    pub(crate) async fn acquire_fresh(
        &self,
        key: LockKey,
        owner: OwnerToken,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        self.metered(key, owner, true, opts, true).await
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
            supports(self, *claim)?;
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
            let owner = OwnerToken::generate().with_claim(claim);
            let outcome = self
                .acquire_owned(key.clone(), owner, true, &step)
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

    /// The acquire loop: `Ok(None)` only when the policy is `NoWait` (or its
    /// wait ran out) and the lock stayed held by someone else.
    async fn acquire(
        &self,
        key: LockKey,
        owner: Option<OwnerToken>,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        let fresh_owner = owner.is_none();
        let owner = owner.unwrap_or_else(OwnerToken::generate);
        self.acquire_owned(key, owner, fresh_owner, opts).await
    }

    /// [`acquire_loop`](Self::acquire_loop), timed and counted in metrics.
    async fn acquire_owned(
        &self,
        key: LockKey,
        owner: OwnerToken,
        fresh_owner: bool,
        opts: &LockOptions,
    ) -> Result<Option<LockGuard>> {
        self.metered(key, owner, fresh_owner, opts, false).await
    }

    /// The acquire in a `lockwright.acquire` span, with its metrics;
    /// `election`: a campaign's.
    async fn metered(
        &self,
        key: LockKey,
        owner: OwnerToken,
        fresh_owner: bool,
        opts: &LockOptions,
        election: bool,
    ) -> Result<Option<LockGuard>> {
        let labels = Labels::new(
            self.store,
            meter::primitive(&owner, election),
            &key,
            self.name_label,
        );
        let span = tracing::info_span!(
            "lockwright.acquire",
            name = %key,
            store = self.store,
            primitive = labels.primitive(),
            owner = owner.short(),
            wait = %opts.wait,
            outcome = tracing::field::Empty,
            fence = tracing::field::Empty,
            waited_seconds = tracing::field::Empty,
        );
        let meter = AcquireMeter::start(labels);
        let mut handed = false;
        let result = self
            .acquire_loop(key, owner, fresh_owner, opts, meter.labels(), &mut handed)
            .instrument(span.clone())
            .await;
        let outcome = match &result {
            Ok(Some(_)) => Outcome::Acquired,
            Ok(None) if opts.wait == WaitPolicy::NoWait => Outcome::Busy,
            Ok(None) => Outcome::TimedOut,
            Err(e) if e.kind() == ErrorKind::Unavailable => Outcome::Unavailable,
            Err(_) => Outcome::Failed,
        };
        let waited = span.in_scope(|| meter.finish(outcome, handed));
        span.record("outcome", outcome.as_str());
        span.record("waited_seconds", waited);
        if let Ok(Some(g)) = &result {
            if let Some(f) = g.fence() {
                span.record("fence", f.0);
            }
        }
        result
    }

    /// The loop itself. `fresh_owner`: the owner holds nothing yet (it was
    /// just drawn), so whatever an abandoned attempt may have been granted
    /// is released, where a caller's own owner may hold holds to keep.
    /// `handed` is set once an attempt found the lock held, so that a grant
    /// after it counts as a hand-off.
    async fn acquire_loop(
        &self,
        key: LockKey,
        mut owner: OwnerToken,
        fresh_owner: bool,
        opts: &LockOptions,
        labels: &Labels,
        handed: &mut bool,
    ) -> Result<Option<LockGuard>> {
        self.refuse_if_closed()?;
        opts.validate(&self.caps)?;
        supports(self, owner.claim())?;
        let start = Instant::now();
        let give_up = match opts.wait {
            WaitPolicy::NoWait => Some(start),
            WaitPolicy::For(d) => start.checked_add(d),
            WaitPolicy::Forever => None,
        };
        let max_poll = self
            .caps
            .max_poll
            .map_or(opts.max_poll, |m| m.min(opts.max_poll));
        let mut backoff = backon::ExponentialBuilder::default()
            .with_min_delay(MIN_POLL)
            .with_max_delay(max_poll.max(MIN_POLL))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build();
        let mut attempts = Attempts::new(
            self.backend.clone(),
            self.background.clone(),
            &key,
            &owner,
            fresh_owner,
        );
        // A writer refused while readers hold leaves a mark that keeps new
        // readers out (no writer starvation), and where the store keeps
        // places in line a refused reader's keeps it ahead of later
        // writers; giving up takes it away.
        let claim = owner.claim();
        let may_mark =
            self.caps.shared && (claim == Claim::MUTEX || (claim.is_shared() && self.caps.in_line));
        attempts.may_mark = may_mark;
        let mut watch: Option<Watch> = None;
        let mut subscribed = false;
        let mut outage = Outage::new(opts.wait != WaitPolicy::NoWait);
        // When the first attempt that found the key held was sent: any grant
        // delivered later was made after that. Not the latest such attempt: a
        // grant made before it can be delivered after it (a paused process,
        // a slow notification), and had it been live then, that attempt
        // would have been granted; it is stale, and must not be trusted from
        // a later start. `check`'s fault run found this on Redis.
        let mut queued_at: Option<Instant> = None;
        let mut said_waiting = false;
        loop {
            if self.watchdog.is_closed() {
                attempts.abandon().await;
                return Err(closed());
            }
            if !subscribed && self.caps.fair && opts.wait != WaitPolicy::NoWait {
                // A fair store queues waiters, so a caller prepared to wait
                // listens first and queues with its very first attempt (and
                // again after an outage made a subscription fail).
                subscribed = true;
                match self.subscribe(&mut attempts).await {
                    Ok(w) => watch = w,
                    Err(e) => {
                        labels.store_error(e.kind());
                        outage
                            .ride(e, &key, give_up, &mut attempts, &self.watchdog)
                            .await?;
                        subscribed = false;
                        continue;
                    }
                }
            }
            let sent = Instant::now();
            let attempt = match attempts.attempt(opts.ttl).await {
                Ok(a) => {
                    outage.over(&key);
                    attempts.settle();
                    a
                }
                Err(e) => {
                    labels.store_error(e.kind());
                    let ride = outage
                        .ride(e, &key, give_up, &mut attempts, &self.watchdog)
                        .await?;
                    owner = attempts.owner.clone();
                    if ride == Ride::Requeue {
                        // The old subscription and its grants were the
                        // retired owner's.
                        watch = None;
                        subscribed = false;
                        queued_at = None;
                    }
                    continue;
                }
            };
            let retry_after = match attempt {
                Acquire::Acquired(grant) => {
                    attempts.done();
                    // A store may grant less than the lease it trusts (a
                    // session store whose lease has that much left).
                    let trusted = self.caps.trusted_lease(opts.ttl);
                    let short = grant.lease.filter(|l| *l < trusted);
                    let sole = attempts.fresh_owner && grant.holds == 1;
                    let guard = self
                        .guard(&key, &owner, grant, opts, sent, short, labels)
                        .sole_owner(sole);
                    if short.is_some() && !opts.auto_renew {
                        // No watchdog will extend it: one renewal now gives
                        // the caller the whole lease it asked for.
                        guard.renew().await?;
                    }
                    return self.unless_closed(guard).await.map(Some);
                }
                Acquire::Contended { retry_after } => {
                    labels.contended();
                    *handed = true;
                    queued_at.get_or_insert(sent);
                    attempts.marked |= may_mark;
                    retry_after
                }
            };

            let now = Instant::now();
            if give_up.is_some_and(|g| now >= g) {
                attempts.abandon().await;
                return Ok(None);
            }
            if !said_waiting {
                // Once per wait, fair stores (queued from the first attempt) included.
                tracing::debug!(key = %key, wait = %opts.wait, "lock held by another owner; waiting");
                said_waiting = true;
            }
            if !subscribed {
                subscribed = true;
                watch = match self.subscribe(&mut attempts).await {
                    Ok(w) => w,
                    Err(e) => {
                        labels.store_error(e.kind());
                        outage
                            .ride(e, &key, give_up, &mut attempts, &self.watchdog)
                            .await?;
                        subscribed = false;
                        continue;
                    }
                };
                if watch.is_some() {
                    // The holder may have released between our attempt and the
                    // subscription; look again before sleeping.
                    continue;
                }
            }
            // With store-wide notification the fallback wake is when the
            // holder's lease could run out (or a queued waiter must refresh
            // its place); a watch that only hears this process's releases is
            // a hint beside the backoff, not instead of it.
            // A polling waiter looks again no later than the holder's
            // lease is due to end, where the store says when that is to the
            // millisecond: a holder that died is taken over at its lease's
            // end, not up to a whole poll later. (A store that counts whole
            // seconds would have it poll through the last one.)
            let mut pause = if self.caps.notify && watch.is_some() {
                retry_after.unwrap_or(opts.max_poll).max(MIN_POLL)
            } else {
                let next = backoff.next().unwrap_or(opts.max_poll);
                match retry_after {
                    Some(r) if self.caps.ttl_resolution <= DUE_MARGIN => {
                        next.min((r + DUE_MARGIN).max(MIN_POLL))
                    }
                    _ => next,
                }
            };
            if attempts.marked {
                // Renew the mark before it lapses and readers barge in; in
                // line, the name waits for this waiter's next look.
                let in_line = self.caps.in_line && (owner.is_writer() || claim.is_shared());
                pause = pause.min(if in_line { IN_LINE_POLL } else { MARK_LIFE / 4 });
            }
            if let Some(g) = give_up {
                pause = pause.min(g.saturating_duration_since(now));
            }
            let notice = match &mut watch {
                Some(w) => {
                    tokio::select! {
                        n = w.changed() => Some(n),
                        _ = tokio::time::sleep(pause) => None,
                        () = self.watchdog.closed() => None,
                    }
                }
                None => {
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        () = self.watchdog.closed() => {}
                    }
                    None
                }
            };
            if let (Some(Notice::Granted(grant)), Some(queued_at)) = (notice, queued_at) {
                let sole = attempts.fresh_owner && grant.holds == 1;
                if let Some(guard) = self.handed(&key, &owner, grant, opts, queued_at, labels) {
                    let guard = guard.sole_owner(sole);
                    attempts.done();
                    return self.unless_closed(guard).await.map(Some);
                }
                // Too little of it can be vouched for: attempt at once. A
                // grant still ours comes back with its live fence and a full
                // lease; a stale one, as contention.
                continue;
            }
        }
    }

    fn refuse_if_closed(&self) -> Result<()> {
        if self.watchdog.is_closed() {
            return Err(closed());
        }
        Ok(())
    }

    /// A guard made while [`close`](Self::close) ran is released at once.
    async fn unless_closed(&self, guard: LockGuard) -> Result<LockGuard> {
        if self.watchdog.is_closed() {
            let _ = guard.release().await;
            return Err(closed());
        }
        Ok(guard)
    }

    /// Subscribes to the key's notices as `attempts`' ticket.
    async fn subscribe(&self, attempts: &mut Attempts) -> Result<Option<Watch>> {
        let watch = self.backend.watch(&attempts.key, &attempts.ticket).await?;
        attempts.queued = watch.is_some();
        Ok(watch)
    }

    /// The lock was handed to us while we waited. The grant was made after
    /// `queued_at`, so the lease runs at least until `queued_at` plus the
    /// granted lease. A lease with at least half of it left goes to the
    /// caller as it is; a short hand-off lease is then extended by the
    /// watchdog halfway through it, so a holder done within that time never
    /// pays the extra round trip. Otherwise `None`: the caller attempts
    /// again rather than hand out a lease about to run out, or one that may
    /// have lapsed already (renewing it instead would keep this grant's
    /// fence even where the store has since handed us the lock again, under
    /// a higher one).
    fn handed(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        grant: Grant,
        opts: &LockOptions,
        queued_at: Instant,
        labels: &Labels,
    ) -> Option<LockGuard> {
        // A store that trusts a hold for less than the TTL (a session that
        // may expire sooner) hands over no more than that.
        let trusted = self.caps.trusted_lease(opts.ttl);
        let granted = grant.lease.map_or(trusted, |l| l.min(trusted));
        let left = local_deadline(queued_at, granted).saturating_duration_since(Instant::now());
        if left >= granted / 2 && (granted == trusted || opts.auto_renew) {
            let short = (granted < trusted).then_some(granted);
            return Some(self.guard(key, owner, grant, opts, queued_at, short, labels));
        }
        None
    }

    /// A guard for a lease granted after `sent`. `short`: the store granted
    /// only this lease, and the watchdog extends it to the TTL halfway
    /// through it (or at the usual period, if that comes first).
    // Each argument is a separate part of the hold; a struct would only
    // rename them.
    #[allow(clippy::too_many_arguments)]
    fn guard(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        grant: Grant,
        opts: &LockOptions,
        sent: Instant,
        short: Option<Duration>,
        labels: &Labels,
    ) -> LockGuard {
        // A store may trust a hold for less than the TTL (a session that
        // expires sooner): deadlines and renewals keep within that.
        let trusted = self.caps.trusted_lease(opts.ttl);
        let granted = short.unwrap_or(trusted).min(trusted);
        let lease = Lease {
            key: key.clone(),
            owner: owner.clone(),
            fence: grant.fence,
            holds: grant.holds,
            ttl: opts.ttl,
            deadline: local_deadline(sent, granted),
        };
        tracing::debug!(key = %key, fence = grant.fence.map(|f| f.0), holds = grant.holds,
            lease = ?granted, since_sent = ?sent.elapsed(), short_lease = short.is_some(), "lock acquired");
        let renew_every = opts
            .auto_renew
            .then(|| opts.renew_period().min(trusted / 3));
        let period = renew_every.unwrap_or_default();
        let first_renew = sent + short.map_or(period, |lease| period.min(lease / 2));
        LockGuard::new(
            lease,
            trusted,
            self.backend.clone(),
            self.watchdog.clone(),
            self.background.clone(),
            renew_every,
            first_renew,
            HoldMeter::start(labels.clone()),
        )
    }
}

/// The attempts of one acquire, each polled in place. If the caller drops
/// the acquire, or it ends in an error, whatever it may have left in the
/// store is undone by a task: a request still in flight is awaited first
/// and, for a fresh owner, whatever it was granted is released (so the
/// release can never overtake the request it undoes); a request that failed
/// (a timeout, a dropped connection) may have been granted before its reply
/// was lost, so it is released the same way; then a queued ticket leaves the
/// queue, dropping any hold it was handed. (A re-entrant hold cannot be told
/// apart from the holds it joined, so it is left to expire.)
struct Attempts {
    backend: Arc<dyn LockBackend>,
    background: Background,
    key: LockKey,
    owner: OwnerToken,
    fresh_owner: bool,
    ticket: OwnerToken,
    /// The ticket may be in the store's wait queue.
    queued: bool,
    /// A writer's (or reader's) refused attempt may have left a mark that
    /// keeps its place: giving up removes it ([`LockBackend::abandon`]).
    marked: bool,
    /// This acquire is a writer's or reader's on a store with readers: any
    /// refusal, one still in flight when the acquire is dropped included,
    /// may leave a mark.
    may_mark: bool,
    request: Option<BoxFuture<'static, Result<Acquire>>>,
    /// An attempt failed without an answer: it may have been granted.
    uncertain: bool,
    /// Owners given up after an outage, still to undo.
    retired: Vec<Retired>,
}

/// An owner a waiting acquire gave up after an attempt of it failed unseen.
#[derive(Debug)]
struct Retired {
    owner: OwnerToken,
    ticket: OwnerToken,
    /// It may be queued, or have left a writer's mark.
    queue: bool,
}

impl Retired {
    /// Releases whatever it may hold and leaves its place.
    async fn undo(&self, backend: &dyn LockBackend, key: &LockKey) -> Result<()> {
        backend.release(key, &self.owner).await?;
        if self.queue {
            backend.abandon(key, &self.owner, &self.ticket).await?;
        }
        Ok(())
    }
}

impl Attempts {
    fn new(
        backend: Arc<dyn LockBackend>,
        background: Background,
        key: &LockKey,
        owner: &OwnerToken,
        fresh: bool,
    ) -> Self {
        Attempts {
            backend,
            background,
            key: key.clone(),
            owner: owner.clone(),
            fresh_owner: fresh,
            ticket: OwnerToken::generate(),
            queued: false,
            marked: false,
            may_mark: false,
            request: None,
            uncertain: false,
            retired: Vec::new(),
        }
    }

    /// One cancel-safe attempt, queued once subscribed.
    fn attempt(&mut self, ttl: Duration) -> impl Future<Output = Result<Acquire>> + '_ {
        let (backend, key, owner) = (self.backend.clone(), self.key.clone(), self.owner.clone());
        let ticket = self.queued.then(|| self.ticket.clone());
        self.request = Some(Box::pin(async move {
            match ticket {
                Some(t) => backend.try_acquire_waiting(&key, &owner, ttl, &t).await,
                None => backend.try_acquire(&key, &owner, ttl).await,
            }
        }));
        std::future::poll_fn(move |cx: &mut Context<'_>| {
            let Some(request) = self.request.as_mut() else {
                return Poll::Ready(Err(Error::backend("acquire polled after completion")));
            };
            let outcome = std::task::ready!(request.as_mut().poll(cx));
            self.request = None;
            // A refusal the store marked unapplied (another N, an upgrade)
            // changed nothing there: nothing to undo.
            self.uncertain |= outcome.as_ref().is_err_and(|e| !e.is_unapplied());
            Poll::Ready(outcome)
        })
    }

    /// Retires the owner whose last attempt may have been granted unseen
    /// (and its ticket, if it may be queued or have left a mark), and goes
    /// on under a fresh owner with the same claim. The retired ones are
    /// undone once the store answers again ([`settle`](Self::settle)), or
    /// in the background when the acquire ends.
    fn redraw_owner(&mut self) -> Ride {
        let queue = self.queued || self.marked || self.may_mark;
        let fresh = self.owner.redrawn();
        let owner = std::mem::replace(&mut self.owner, fresh);
        let ticket = if queue {
            self.queued = false;
            self.marked = false;
            std::mem::replace(&mut self.ticket, OwnerToken::generate())
        } else {
            self.ticket.clone()
        };
        self.retired.push(Retired {
            owner,
            ticket,
            queue,
        });
        if queue {
            Ride::Requeue
        } else {
            Ride::Same
        }
    }

    /// Undoes the retired owners in the background now that the store
    /// answers (their holds released, their places left): the acquire
    /// goes on at once, and a cancelled one cannot drop them.
    fn settle(&mut self) {
        self.undo_retired();
    }

    /// Hands the retired owners to a background task that undoes them,
    /// trying again for a while if the store falters.
    fn undo_retired(&mut self) {
        let retired = std::mem::take(&mut self.retired);
        if retired.is_empty() {
            return;
        }
        let (backend, key) = (self.backend.clone(), self.key.clone());
        self.background.spawn(async move {
            let undone = retired.iter().map(|r| retry_briefly(|| r.undo(&*backend, &key)));
            for outcome in futures::future::join_all(undone).await {
                if let Err(e) = outcome {
                    tracing::warn!(key = %key, error = %e.chain(),
                        "could not undo an attempt cut off by an outage; if it was granted, the lock frees at its TTL");
                }
            }
        });
    }

    /// The lock is ours: nothing to undo.
    fn done(&mut self) {
        self.queued = false;
        self.marked = false;
        self.uncertain = false;
    }

    /// Leaves the queue now (the wait ran out).
    async fn abandon(&mut self) {
        let queued = std::mem::take(&mut self.queued);
        if std::mem::take(&mut self.marked) || queued {
            if let Err(e) = self
                .backend
                .abandon(&self.key, &self.owner, &self.ticket)
                .await
            {
                tracing::debug!(key = %self.key, error = %e.chain(),
                    "could not leave the wait queue; the place lapses by itself");
            }
        }
    }
}

impl Drop for Attempts {
    fn drop(&mut self) {
        self.undo_retired();
        let request = self.request.take();
        let undo = self.fresh_owner && self.uncertain;
        if request.is_none() && !self.queued && !self.marked && !undo {
            return;
        }
        let (marked, may_mark) = (self.marked, self.may_mark);
        let (backend, key, owner, ticket) = (
            self.backend.clone(),
            self.key.clone(),
            self.owner.clone(),
            self.ticket.clone(),
        );
        let (fresh_owner, queued) = (self.fresh_owner, self.queued);
        self.background.spawn(async move {
            let (maybe_granted, refused) = match request {
                Some(request) => {
                    let refused = matches!(request.await, Ok(Acquire::Contended { .. }));
                    (!refused, refused)
                }
                None => (undo, false),
            };
            // One try: it follows the request it undoes on the same
            // connection, and a store that is simply down (the request never
            // left) must not hold up an exiting process.
            if fresh_owner && maybe_granted {
                if let Err(e) = backend.release(&key, &owner).await {
                    tracing::warn!(key = %key, error = %e.chain(),
                        "could not undo an abandoned acquire; the lock frees at its TTL");
                }
            }
            // A writer refused by readers, just now or before, left a mark.
            if queued || marked || (may_mark && refused) {
                let left = retry_briefly(|| backend.abandon(&key, &owner, &ticket));
                if let Err(e) = left.await {
                    tracing::warn!(key = %key, error = %e.chain(),
                        "could not leave the wait queue; the place lapses by itself");
                }
            }
        });
    }
}

/// A waiting acquire's ride through a store that cannot be reached: the
/// attempt is made again, after a growing pause, until the wait ends, and
/// only then is the last store error reported (not `Timeout`, which would
/// hide an outage). An acquire that does not wait fails at once.
struct Outage {
    rides: bool,
    since: Option<Instant>,
    pause: Duration,
}

/// How a waiting acquire goes on after an outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ride {
    /// As before.
    Same,
    /// Under a fresh owner, queued afresh: the old subscription and any
    /// grant it delivers were the retired owner's.
    Requeue,
}

impl Outage {
    fn new(rides: bool) -> Self {
        Outage {
            rides,
            since: None,
            pause: OUTAGE_PAUSE.0,
        }
    }

    /// Returns `error` unless it is worth waiting out and the wait has time
    /// left; else sleeps (no further than `give_up`) and says how to go on.
    /// An attempt that may have been granted unseen is retired: the acquire
    /// goes on under a fresh owner (and, if it was queued, a fresh ticket),
    /// so undoing the old one cannot take away the hold it goes on to get,
    /// and a hand-off to the old one cannot be mistaken for its own. An
    /// owner the caller chose cannot be swapped, so its acquire reports the
    /// error instead (a retry could add a hold it does not know of).
    async fn ride(
        &mut self,
        error: Error,
        key: &LockKey,
        give_up: Option<Instant>,
        attempts: &mut Attempts,
        closed: &Watchdog,
    ) -> Result<Ride> {
        let retryable = error.kind() == ErrorKind::Unavailable;
        let uncertain = std::mem::take(&mut attempts.uncertain);
        let swappable = attempts.fresh_owner || !uncertain;
        let now = Instant::now();
        let left = give_up.map(|g| g.saturating_duration_since(now));
        if !(self.rides && retryable && swappable) || left.is_some_and(|l| l.is_zero()) {
            // Dropping `attempts` undoes an unseen grant and leaves the
            // queue in the background, retrying while the store comes back.
            attempts.uncertain = uncertain;
            return Err(error);
        }
        let ride = if uncertain {
            attempts.redraw_owner()
        } else {
            Ride::Same
        };
        match self.since {
            None => {
                self.since = Some(now);
                tracing::info!(key = %key, error = %error.chain(),
                    "store unavailable while waiting for the lock; trying again until the wait ends");
            }
            Some(since) => tracing::debug!(key = %key, error = %error.chain(),
                down_for = ?since.elapsed(), "store still unavailable; trying again"),
        }
        let jitter = 0.5 + f64::from(rand_below(1000)) / 2000.0;
        let pause = self
            .pause
            .mul_f64(jitter)
            .min(left.unwrap_or(Duration::MAX));
        self.pause = (self.pause * 2).min(OUTAGE_PAUSE.1);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = closed.closed() => {}
        }
        Ok(ride)
    }

    /// The store answered again.
    fn over(&mut self, key: &LockKey) {
        if let Some(since) = self.since.take() {
            tracing::info!(key = %key, down_for = ?since.elapsed(),
                "store reachable again; waiting for the lock goes on");
        }
        self.pause = OUTAGE_PAUSE.0;
    }
}

/// A number below `n` from the OS RNG (0 if it fails): jitter, not secrets.
fn rand_below(n: u32) -> u32 {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).map_or(0, |()| u32::from_le_bytes(b) % n.max(1))
}

/// How long leaving a wait queue keeps trying a store that is unreachable
/// for now: a stall or reconnect of a second or two must not leave the place
/// behind (the store would hand the lock to a waiter that gave up), yet a
/// store that is down for good must not keep a task alive.
const CLEANUP_PATIENCE: Duration = Duration::from_secs(3);

/// Runs `op` until it succeeds, fails for a reason retrying will not fix,
/// or [`CLEANUP_PATIENCE`] has passed; 50 ms between tries, doubling.
async fn retry_briefly<F, Fut>(mut op: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let give_up = Instant::now() + CLEANUP_PATIENCE;
    let mut pause = Duration::from_millis(50);
    loop {
        match op().await {
            Err(e) if e.is_retryable() && Instant::now() + pause < give_up => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

fn closed() -> Error {
    Error::new(
        ErrorKind::Closed,
        "this Locker was closed; it takes no new locks",
    )
}

pub(crate) fn timeout_error(key: &LockKey, wait: WaitPolicy) -> Error {
    Error::timeout(format!(
        "lock {:?} is held by another owner; not acquired (wait: {wait})",
        key.as_str()
    ))
}
