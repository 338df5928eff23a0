//! Guards: proof that a lock is held, released on drop.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::backend::{renew_one, Binding, HoldId, LockBackend, Release, Renew, RenewRequest};
use crate::background::Background;
use crate::error::{Error, ErrorKind, Result};
use crate::key::{FencingToken, LockKey, OwnerToken};
use crate::lease::{wait_lost, Lease, LeaseState, LostReason};
use crate::meter::HoldMeter;
use crate::scoped::Hold;
use crate::watchdog::{RenewalFailure, Watchdog};

/// Proof that a lock is held. While it lives the watchdog renews the lease
/// (unless turned off); dropping it releases the lock in the background, and
/// [`release`](LockGuard::release) does so and reports the outcome.
///
/// Select on [`lost`](LockGuard::lost) around the critical section: it
/// completes if the lock can no longer be guaranteed, before anyone else could
/// have taken it.
#[must_use = "the lock is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct LockGuard {
    lease: Lease,
    state: watch::Receiver<LeaseState>,
    backend: Arc<dyn LockBackend>,
    watchdog: Arc<Watchdog>,
    background: Background,
    id: u64,
    armed: bool,
    meter: Arc<HoldMeter>,
    /// The owner was drawn for this guard and held the lock once when it
    /// was granted: unless another guard joined it since (`lock_as`, which
    /// the release checks), a release whose reply was lost may be sent
    /// again (see [`release`](Self::release)).
    sole: bool,
    /// Lock at least for: until when a release keeps the hold
    /// ([`LockOptions::at_least`](crate::LockOptions::at_least)).
    keep_until: Option<Instant>,
}

impl LockGuard {
    /// `first_renew`: when the watchdog first renews (with `renew_every`).
    // Each argument is a separate part of the hold; a struct would only
    // rename them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        lease: Lease,
        trusted: Duration,
        backend: Arc<dyn LockBackend>,
        watchdog: Arc<Watchdog>,
        background: Background,
        renew_every: Option<Duration>,
        first_renew: Instant,
        meter: Arc<HoldMeter>,
    ) -> Self {
        let request = lease.renewal();
        let (id, state) = watchdog.register(
            request,
            trusted,
            renew_every,
            first_renew,
            lease.deadline,
            meter.clone(),
        );
        LockGuard {
            lease,
            state,
            backend,
            watchdog,
            background,
            id,
            armed: true,
            meter,
            sole: false,
            keep_until: None,
        }
    }

    /// Keeps the hold, once released, until `at` (lock at least for).
    pub(crate) fn keep_until(mut self, at: Option<Instant>) -> Self {
        self.keep_until = at;
        self
    }

    /// Marks the owner as drawn for this guard alone, holding once (see
    /// the `sole` field).
    pub(crate) fn sole_owner(mut self, sole: bool) -> Self {
        self.sole = sole;
        self
    }

    pub(crate) fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// The key held.
    pub fn key(&self) -> &LockKey {
        &self.lease.key
    }

    /// The owner token of this acquisition (pass it to `lock_as` to re-enter).
    pub fn owner(&self) -> &OwnerToken {
        &self.lease.owner
    }

    /// The fencing token, where the backend gives one.
    pub fn fence(&self) -> Option<FencingToken> {
        self.lease.fence
    }

    /// Holds the owner had right after this acquisition (2 or more when re-entered).
    pub fn holds(&self) -> u32 {
        self.lease.holds
    }

    /// The grant as it was made.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The current lease state. A hold whose deadline has passed reads as
    /// lost (`Expired`) at once, even if the watchdog has not run since.
    pub fn state(&self) -> LeaseState {
        self.state.borrow().at(Instant::now())
    }

    /// Until when the lock is guaranteed (moves forward with each renewal);
    /// `None` once lost.
    pub fn deadline(&self) -> Option<Instant> {
        match self.state() {
            LeaseState::Held { deadline } => Some(deadline),
            _ => None,
        }
    }

    /// True once the lost signal has fired.
    pub fn is_lost(&self) -> bool {
        matches!(self.state(), LeaseState::Lost(_))
    }

    /// Completes when the lock is lost; never completes while it is held or
    /// after it was released. The future owns what it needs, so it can be
    /// moved into another task or used in `tokio::select!` beside the work.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.lost_signal().wait()
    }

    /// A signal of this lock's loss that work can carry with it and
    /// check between steps (`signal.is_lost()`), instead of being
    /// cancelled by `select!` at an await point that may not be
    /// cancel-safe. A release is not a loss: the signal never fires after
    /// one. It needs no task and outlives the guard.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// # use lockwright_core::{backend::MemoryBackend, Locker};
    /// # let locker = Locker::new(MemoryBackend::new());
    /// let guard = locker.lock("batch-42").await?;
    /// let lost = guard.lost_signal();
    /// for row in 0..3 {
    ///     if lost.is_lost() {
    ///         break; // someone else may hold the lock now: stop writing
    ///     }
    ///     // ... write row `row` with guard.fence() attached ...
    /// #   let _ = row;
    /// }
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn lost_signal(&self) -> LostSignal {
        LostSignal {
            state: self.state.clone(),
        }
    }

    /// Calls `f` once, from a task, if the lock is lost (never after a
    /// release): for code that does not select on [`lost`](Self::lost).
    /// Keep it short and non-blocking; it cannot stop the loss, only react
    /// (stop the work, alert). Outside a Tokio runtime it is called at
    /// once if the lock is lost already, and otherwise never.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> lockwright_core::Result<()> {
    /// # use lockwright_core::{backend::MemoryBackend, Locker};
    /// # let locker = Locker::new(MemoryBackend::new());
    /// let guard = locker.lock("nightly-report").await?;
    /// guard.on_lost(|reason| eprintln!("nightly-report lock lost ({reason:?}); stopping"));
    /// guard.on_renewal_failure(|f| eprintln!("renewal failed {} times: {}", f.failures(), f.error()));
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn on_lost(&self, f: impl FnOnce(LostReason) + Send + 'static) {
        let mut rx = self.state.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(async move {
                if let Some(reason) = wait_lost(&mut rx).await {
                    f(reason);
                }
            })),
            Err(_) => {
                if let LeaseState::Lost(reason) = self.state() {
                    let call = std::panic::AssertUnwindSafe(|| f(reason));
                    if std::panic::catch_unwind(call).is_err() {
                        tracing::error!(key = %self.lease.key, "a lost-lock callback panicked");
                    }
                }
            }
        }
    }

    /// Calls `f` with each renewal of this lock that fails while it is
    /// still held (the watchdog keeps trying until the deadline): for
    /// alerting before a loss. Called on the watchdog's task: keep it short
    /// and non-blocking. A panic in it is caught and logged.
    pub fn on_renewal_failure(&self, f: impl Fn(&RenewalFailure) + Send + Sync + 'static) {
        self.watchdog.on_failure(self.id, Arc::new(f));
    }

    /// Renews the lease now, outside the watchdog's schedule.
    ///
    /// # Errors
    /// [`ErrorKind::Lost`](crate::ErrorKind::Lost) if the store says the lock is
    /// no longer held (the lost signal fires too); the backend's error otherwise.
    pub async fn renew(&self) -> Result<()> {
        let sent = Instant::now();
        let outcome = renew_one(&*self.backend, self.lease.renewal())
            .await
            .inspect_err(|e| {
                let labels = self.meter.labels();
                labels.renewal("failed");
                labels.store_error(e.kind());
            })?;
        self.watchdog.renewed(self.id, sent, outcome);
        match outcome {
            Renew::Renewed if self.is_lost() => Err(Error::lost(format!(
                "lock {:?} was lost before this renewal landed ({})",
                self.lease.key.as_str(),
                match self.state() {
                    LeaseState::Lost(reason) => reason.words(),
                    _ => LostReason::Expired.words(),
                }
            ))),
            Renew::Renewed => Ok(()),
            Renew::NotHeld => Err(Error::lost(format!(
                "lock {:?} is no longer held by this owner",
                self.lease.key.as_str()
            ))),
        }
    }

    /// Releases this hold and reports what the store said.
    ///
    /// # Errors
    /// [`ErrorKind::Lost`](crate::ErrorKind::Lost) if the store no longer had the
    /// lock for this owner: the lease expired or was taken over, so the
    /// critical section may not have been exclusive.
    /// [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable) if the store
    /// could not confirm the release before the lease's deadline: a release
    /// that met an unreachable store (a connection refused, or one that
    /// broke with a server's restart) is tried again, owner-checked, until
    /// the store answers or the lease runs out, since only an answer can
    /// confirm that the lock was still held. A release whose reply may have
    /// been lost after it was carried out is sent again only when the
    /// `Locker` drew this guard's owner and it held the lock once: with a
    /// re-entrant owner (`lock_as`) a second release would count down a
    /// hold another guard still has.
    /// The lock then frees at its TTL, but whether it was held to the end
    /// is unknown: a store that restarted empty may have granted it to
    /// someone else meanwhile.
    pub async fn release(mut self) -> Result<()> {
        self.armed = false;
        if self.closed() {
            return Ok(());
        }
        match self.kept_for() {
            Some(left) => self.keep_then_release(left).await,
            None => self.release_now().await,
        }
    }

    /// The time a release must still keep the hold for (lock at least
    /// for), if any: never for a hold already lost.
    fn kept_for(&self) -> Option<Duration> {
        let left = self.keep_until?.checked_duration_since(Instant::now())?;
        (!left.is_zero() && !self.is_lost()).then_some(left)
    }

    /// A release that keeps the hold `left` longer. A lease-bound store
    /// is told to end the lease then (the renewal, owner-checked, is for
    /// `left` from now on its clock) and nothing waits; a session-bound
    /// hold is kept by a background task, renewed as before, and released
    /// then, or when its locker closes.
    async fn keep_then_release(self, left: Duration) -> Result<()> {
        let caps = self.backend.capabilities();
        // Shortening the lease in the store shortens it for every hold of
        // the owner: with another guard of this owner alive (`lock_as`),
        // the hold is kept registered and counted down at the end instead.
        let alone = self.sole && !self.shares_owner();
        if caps.binding == Binding::Session || !alone {
            let lost = self.lost_signal();
            let background = self.background.clone();
            let until = Instant::now() + left;
            let spawned = background.spawn(async move {
                // Renewed here only when the hold would run out before
                // `until` otherwise: with renewal off (lock at most for), a
                // session-bound hold is trusted only for a session's
                // timeout, which may be shorter than the time to keep it.
                while let Some(deadline) = self.deadline() {
                    let now = Instant::now();
                    if now >= until {
                        break;
                    }
                    let wake = if deadline >= until {
                        until
                    } else {
                        until.min(now + deadline.saturating_duration_since(now) / 2)
                    };
                    tokio::select! {
                        () = tokio::time::sleep_until(wake.into()) => {}
                        _ = lost.wait() => break,
                    }
                    let short = self.deadline().is_some_and(|d| d < until);
                    // A store out of reach is ridden out as the watchdog
                    // does; only a loss ends the keeping early.
                    if Instant::now() < until
                        && short
                        && matches!(self.renew().await, Err(e) if e.kind() == ErrorKind::Lost)
                    {
                        break;
                    }
                }
                // A close released it already (and said so to its signal).
                if self.closed() {
                    return;
                }
                let key = self.lease.key.clone();
                if let Err(e) = self.release_now().await {
                    hold_event!(key, error = %e.chain(), "release after lock-at-least-for failed");
                }
            });
            if !spawned {
                tracing::warn!("no Tokio runtime to keep a hold for its lock-at-least-for");
            }
            return Ok(());
        }
        // Stop the watchdog first, or a renewal for the full TTL could
        // land after this shorter one.
        self.end_hold();
        // Rounded up: a lease kept a little longer, never shorter.
        let ttl = left.max(caps.min_ttl);
        let renewal = RenewRequest {
            ttl,
            ..self.lease.renewal()
        };
        match renew_one(&*self.backend, renewal).await? {
            Renew::Renewed => {
                tracing::debug!(key = %self.lease.key, left = ?ttl, "released: kept for its lock-at-least-for");
                Ok(())
            }
            Renew::NotHeld => Err(Error::lost(format!(
                "lock {:?} was no longer held at release (lease expired or taken over)",
                self.lease.key.as_str()
            ))),
        }
    }

    /// Whether another registered hold has this one's key and owner.
    fn shares_owner(&self) -> bool {
        self.watchdog
            .shares_beside(self.id, &self.lease.key, &self.lease.owner)
    }

    /// The release itself, at once, whatever lock at least for says (see
    /// [`release`](Self::release)).
    pub(crate) async fn release_now(mut self) -> Result<()> {
        self.armed = false;
        // A deadline passed unseen (a stalled process) is a loss.
        let lost = self.state();
        self.watchdog.unregister(self.id);
        if let LeaseState::Lost(reason) = lost {
            self.meter.lost(reason);
        }
        let span = tracing::info_span!("lockwright.release", name = %self.lease.key,
            store = self.meter.labels().store(), primitive = self.meter.labels().primitive(),
            owner = self.lease.owner.short(), fence = self.lease.fence.map(|f| f.0),
            outcome = tracing::field::Empty);
        let until = match lost {
            LeaseState::Held { deadline } => Some(deadline),
            _ => None,
        };
        let released = tracing::Instrument::instrument(
            release_confirmed(&*self.backend, &self.lease, until, || {
                self.sole && !self.shares_owner()
            }),
            span.clone(),
        )
        .await;
        // No await from here: the rest is logged inside the release's span.
        let _inside = span.enter();
        span.record(
            "outcome",
            match &released {
                Ok(Release::NotHeld) => "not_held",
                Ok(_) => "released",
                Err(_) => "error",
            },
        );
        match &released {
            Err(e) => self.meter.labels().store_error(e.kind()),
            Ok(Release::NotHeld) => self.meter.lost(LostReason::NotHeld),
            Ok(_) => {}
        }
        self.meter.end();
        match released? {
            Release::Freed | Release::StillHeld(_) => {
                tracing::debug!(key = %self.lease.key, "lock released");
                Ok(())
            }
            Release::NotHeld => Err(Error::lost(format!(
                "lock {:?} was no longer held at release (lease expired or taken over)",
                self.lease.key.as_str()
            ))),
        }
    }

    /// Stops renewing and forgets the guard without releasing: the store keeps
    /// the lock until its TTL runs out. Returns the lease, which the locker
    /// can still give back ([`Locker::release_lease`](crate::Locker::release_lease))
    /// or extend ([`Locker::extend_lease`](crate::Locker::extend_lease)).
    pub fn leak(mut self) -> Lease {
        self.armed = false;
        self.end_hold();
        self.lease.clone()
    }
}

impl LockGuard {
    /// Its entry in the watchdog, for tests that feed it a renewal's outcome.
    #[cfg(test)]
    pub(crate) fn watch_id(&self) -> u64 {
        self.id
    }

    /// Stops tracking the hold and ends its meter: as lost if its deadline
    /// passed unseen (a stalled process), as ended otherwise.
    fn end_hold(&self) {
        let state = self.state();
        self.watchdog.unregister(self.id);
        match state {
            LeaseState::Lost(reason) => self.meter.lost(reason),
            _ => self.meter.end(),
        }
    }

    /// [`Locker::close`](crate::Locker::close) released this lock already.
    fn closed(&self) -> bool {
        matches!(*self.state.borrow(), LeaseState::Lost(LostReason::Closed))
    }
}

impl Hold for LockGuard {
    type Target = LockGuard;

    fn target(&mut self) -> &mut LockGuard {
        self
    }

    fn when_lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        self.lost()
    }

    fn name(&self) -> &LockKey {
        self.key()
    }

    fn give_back(self) -> impl Future<Output = Result<()>> + Send {
        self.release()
    }
}

/// The first pause before a release is tried again, and the longest.
const RELEASE_RETRY: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(1));

/// Releases `lease`, trying again while the store cannot be reached and
/// `until` (the lease's deadline) has not passed. Each try is owner-checked,
/// so a retry can neither free someone else's lock nor hide that ours was
/// lost: a store that restarted empty answers the retry `NotHeld`. A try
/// that may have been carried out (its reply lost, not an error marked
/// [`unapplied`](Error::unapplied)) is repeated only while `sole()`: the
/// owner was drawn for this guard, held the lock once, and no other guard
/// has joined it since (`lock_as` with its owner), so a second release
/// counts down no other guard's hold. (For it, a try that freed the lock
/// before its reply was lost makes the next one answer `NotHeld`: reported
/// as lost, the safe side to err on.)
async fn release_confirmed(
    backend: &dyn LockBackend,
    lease: &Lease,
    until: Option<Instant>,
    sole: impl Fn() -> bool,
) -> Result<Release> {
    let mut pause = RELEASE_RETRY.0;
    loop {
        let e = match backend.release(&lease.hold()).await {
            Err(e) if e.kind() == ErrorKind::Unavailable && (e.is_unapplied() || sole()) => e,
            other => return other,
        };
        let left = until.map_or(Duration::ZERO, |d| {
            d.saturating_duration_since(Instant::now())
        });
        if left <= pause {
            return Err(Error::unavailable(format!(
                "the release of lock {:?} could not be confirmed before its lease ran out",
                lease.key.as_str()
            ))
            .with_source(e));
        }
        tracing::debug!(key = %lease.key, error = %e.chain(), retry_in = ?pause,
            "lock release failed; retrying while the lease lasts");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RELEASE_RETRY.1);
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.armed || self.closed() {
            return;
        }
        if let Some(left) = self.kept_for() {
            // Lock at least for holds for a dropped guard too: a twin of
            // this guard is kept and released as `release` would, in a
            // task. The twin is disarmed, so that a task dropped unrun (a
            // runtime shutting down) leaves the lock to its TTL rather
            // than spawning another twin from its drop.
            self.armed = false;
            let twin = LockGuard {
                lease: self.lease.clone(),
                state: self.state.clone(),
                backend: self.backend.clone(),
                watchdog: self.watchdog.clone(),
                background: self.background.clone(),
                id: self.id,
                armed: false,
                meter: self.meter.clone(),
                sole: self.sole,
                keep_until: self.keep_until,
            };
            let spawned = self.background.spawn(async move {
                let key = twin.lease.key.clone();
                if let Err(e) = twin.keep_then_release(left).await {
                    hold_event!(key, error = %e.chain(), "background release failed; the lock frees at its TTL");
                }
            });
            if !spawned {
                self.end_hold();
                tracing::warn!(key = %self.lease.key, "guard dropped outside a Tokio runtime; the lock frees at its TTL");
            }
            return;
        }
        self.end_hold();
        spawn_release(
            &self.background,
            &self.backend,
            self.lease.hold(),
            &self.meter,
        );
    }
}

/// Releases in the background; used where `Drop` cannot await. Outside a
/// Tokio runtime nothing can run, so the lock frees at its TTL instead.
fn spawn_release(
    background: &Background,
    backend: &Arc<dyn LockBackend>,
    hold: HoldId,
    meter: &Arc<HoldMeter>,
) {
    let key = hold.key.clone();
    let backend = backend.clone();
    let meter = meter.clone();
    let spawned = background.spawn(async move {
        if let Err(e) = backend.release(&hold).await {
            meter.labels().store_error(e.kind());
            hold_event!(hold.key, error = %e.chain(), "background release failed; the lock frees at its TTL");
        }
    });
    if !spawned {
        tracing::warn!(key = %key, "guard dropped outside a Tokio runtime; the lock frees at its TTL");
    }
}

/// A lock's loss, as [`LockGuard::lost_signal`] hands it out: cheap to
/// clone, checked without awaiting, or awaited.
#[derive(Debug, Clone)]
pub struct LostSignal {
    state: watch::Receiver<LeaseState>,
}

impl LostSignal {
    /// True once the lock is lost: the watchdog said so, or its deadline
    /// passed unseen. Never after a release.
    pub fn is_lost(&self) -> bool {
        matches!(self.state.borrow().at(Instant::now()), LeaseState::Lost(_))
    }

    /// Completes when the lock is lost; never after a release (as
    /// [`LockGuard::lost`]).
    pub fn wait(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let mut rx = self.state.clone();
        async move {
            match wait_lost(&mut rx).await {
                Some(r) => r,
                None => std::future::pending().await,
            }
        }
    }
}

/// Several locks taken together by [`Locker::lock_all`](crate::Locker::lock_all).
#[must_use = "the locks are released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct MultiGuard {
    pub(crate) guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The individual guards, in the (sorted) order they were taken.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Completes when any of the locks is lost.
    pub fn lost(&self) -> impl Future<Output = LostReason> + Send + 'static {
        let all: Vec<_> = self.guards.iter().map(|g| Box::pin(g.lost())).collect();
        async move {
            if all.is_empty() {
                return std::future::pending().await;
            }
            futures::future::select_all(all).await.0
        }
    }

    /// Releases every lock, in reverse order; reports the first failure after
    /// trying them all.
    ///
    /// # Errors
    /// As [`LockGuard::release`], for the first lock that failed.
    pub async fn release(mut self) -> Result<()> {
        let mut first_err = None;
        while let Some(g) = self.guards.pop() {
            if let Err(e) = g.release().await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}
