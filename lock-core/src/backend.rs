//! For backend authors: the [`LockBackend`] contract every store
//! implements, what its methods return, and the helpers backends share
//! (URL parameters, TTL checks, clock-drift margins). Applications need
//! none of this; they use the crate root.

pub use crate::claims::{gets_the_lock, judge, reentry_refused, refusal, Found};
pub use crate::driver::{Driver, FailOver, Opener};
pub use crate::lease::{clock_drift, local_deadline};
pub use crate::memory::MemoryBackend;
pub use crate::options::validate_ttl;
pub use crate::params::{percent_decode, UrlParams};
pub use crate::quorum::{quorum_servers, Quorum};
pub use crate::redact::RedactedUrl;
pub use crate::sync::{lock_unpoisoned, AbortOnDrop};
pub use crate::tls::{TlsFiles, TlsPem, TlsRefusal};
pub use crate::url::{scheme_of, HostPort, Scheme, ServerUrl};
/// Re-exported so backends implement [`LockBackend`] with the same macro version.
pub use async_trait::async_trait;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::error::{Error, ErrorKind, Result};
use crate::key::{FencingToken, LockKey, OwnerToken};
use crate::lease::LockStatus;

/// How a backend's locks end when the holder disappears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binding {
    /// The lock expires when its TTL runs out without renewal.
    Lease,
    /// The lock lives as long as a session or connection (ZooKeeper, advisory locks).
    Session,
}

/// What a backend can promise; conformance cases adapt their expectations to it.
///
/// Built from [`Default`] (no fencing, lease-bound, 1 ms resolution) with
/// the `with_*` methods, so that a field added later breaks no backend:
///
/// ```
/// use std::time::Duration;
/// use lockwright_core::backend::Capabilities;
/// let caps = Capabilities::default()
///     .with_fencing(true)
///     .with_min_ttl(Duration::from_millis(100));
/// assert!(caps.fencing && !caps.fair);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Grants carry strictly increasing fencing tokens.
    pub fencing: bool,
    /// The smallest TTL the store honours; shorter ones are `InvalidOptions`.
    pub min_ttl: Duration,
    /// The granularity of the store's expiry clock.
    pub ttl_resolution: Duration,
    /// Lease-bound or session-bound.
    pub binding: Binding,
    /// [`LockBackend::watch`] delivers release notifications (no polling needed).
    pub notify: bool,
    /// Waiters are served in arrival order: a release hands the lock to the
    /// longest waiter, and no newcomer (the releaser included) can barge in
    /// ahead of a live waiter.
    pub fair: bool,
    /// The longest a released or expired lock's state stays in the store
    /// before it is collected (zero: it goes with the lock). Fences keep
    /// rising across that collection.
    pub retention: Duration,
    /// The longest a hold can be trusted without a renewal the store
    /// confirmed, whatever TTL was asked for: a session-bound store whose
    /// session expires after this much silence (ZooKeeper's negotiated
    /// session timeout). The `Locker` keeps each guard's local deadline and
    /// renewal period within it, so the lost signal fires before the
    /// session could have expired. `None`: the TTL alone decides.
    pub max_lease: Option<Duration>,
    /// The store keeps a value with each lock ([`LockBackend::proclaim`],
    /// [`LockStatus::value`]), so leader election works on it.
    pub values: bool,
    /// The store grants exclusive claims of more than one permit
    /// ([`Claim::Exclusive`](crate::Claim)), so semaphores work on it.
    pub permits: bool,
    /// The store grants shared claims ([`Claim::Shared`](crate::Claim)),
    /// so read-write locks work on it.
    pub shared: bool,
    /// A store that polls keeps each refused reader's and writer's place
    /// in line, in the order they came, while they keep asking: the
    /// `Locker` then asks again at least every [`IN_LINE_POLL`], since the
    /// name waits for the first in line.
    pub in_line: bool,
    /// A store whose waiters poll and race each release (no queue, no
    /// notification) has them look at least this often, so that each gets
    /// its share of a busy lock; `None`: the caller's
    /// [`max_poll`](crate::LockOptions::max_poll) alone.
    pub max_poll: Option<Duration>,
}

/// How often a waiter with a place in line ([`Capabilities::in_line`])
/// asks again at most: a free name waits for its poll.
pub const IN_LINE_POLL: Duration = Duration::from_millis(10);

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            fencing: false,
            min_ttl: Duration::from_millis(1),
            ttl_resolution: Duration::from_millis(1),
            binding: Binding::Lease,
            notify: false,
            fair: false,
            retention: Duration::ZERO,
            max_lease: None,
            values: false,
            permits: false,
            shared: false,
            in_line: false,
            max_poll: None,
        }
    }
}

impl Capabilities {
    /// Sets [`max_poll`](Self::max_poll).
    #[must_use]
    pub fn with_max_poll(mut self, max_poll: Option<Duration>) -> Self {
        self.max_poll = max_poll;
        self
    }

    /// Sets [`fencing`](Self::fencing): grants carry strictly increasing fencing tokens.
    #[must_use]
    pub fn with_fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    /// Sets [`min_ttl`](Self::min_ttl): the smallest TTL the store honours.
    #[must_use]
    pub fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// Sets [`ttl_resolution`](Self::ttl_resolution): the granularity of the store's expiry clock.
    #[must_use]
    pub fn with_ttl_resolution(mut self, ttl_resolution: Duration) -> Self {
        self.ttl_resolution = ttl_resolution;
        self
    }

    /// Sets [`binding`](Self::binding): lease-bound or session-bound.
    #[must_use]
    pub fn with_binding(mut self, binding: Binding) -> Self {
        self.binding = binding;
        self
    }

    /// Sets [`notify`](Self::notify): release notifications reach waiters without polling.
    #[must_use]
    pub fn with_notify(mut self, notify: bool) -> Self {
        self.notify = notify;
        self
    }

    /// Sets [`in_line`](Self::in_line): refused readers and writers keep
    /// their place in line.
    #[must_use]
    pub fn with_in_line(mut self, in_line: bool) -> Self {
        self.in_line = in_line;
        self
    }

    /// Sets [`fair`](Self::fair): waiters are served in arrival order.
    #[must_use]
    pub fn with_fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Sets [`retention`](Self::retention): how long a free lock's state stays in the store.
    #[must_use]
    pub fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// How long a hold taken for `ttl` can be trusted without a confirmed
    /// renewal: the TTL, or [`max_lease`](Self::max_lease) when shorter.
    pub fn trusted_lease(&self, ttl: Duration) -> Duration {
        self.max_lease.map_or(ttl, |m| m.min(ttl))
    }

    /// Sets [`values`](Self::values): the store keeps a value with each lock.
    #[must_use]
    pub fn with_values(mut self, values: bool) -> Self {
        self.values = values;
        self
    }

    /// Sets [`permits`](Self::permits): semaphores of more than one permit.
    #[must_use]
    pub fn with_permits(mut self, permits: bool) -> Self {
        self.permits = permits;
        self
    }

    /// Sets [`shared`](Self::shared): shared (reader) claims.
    #[must_use]
    pub fn with_shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }

    /// Sets [`max_lease`](Self::max_lease): how long a hold can be trusted without renewal.
    #[must_use]
    pub fn with_max_lease(mut self, max_lease: Option<Duration>) -> Self {
        self.max_lease = max_lease;
        self
    }
}

/// What the store granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The fencing token of this grant, if the backend offers them. A
    /// re-entrant acquire returns the token of the hold it joined.
    pub fence: Option<FencingToken>,
    /// How many holds the owner has on the key now (1 unless re-entered).
    pub holds: u32,
    /// The lease the store granted, from the attempt's start, when it is
    /// shorter than the TTL asked for; `None` means the full TTL. A fair
    /// store's direct hand-off grants a short lease, so a waiter that died
    /// unseen blocks the next one only that long, and a session store may
    /// grant what its session has left; the new holder's watchdog extends
    /// it halfway through.
    pub lease: Option<Duration>,
}

/// The result of one acquisition attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// The lock is ours.
    Acquired(Grant),
    /// Someone else holds it. `retry_after` is the holder's remaining lease
    /// when the store reports it cheaply: the latest moment to look again.
    Contended {
        /// Remaining lease of the current holder, if known.
        retry_after: Option<Duration>,
    },
}

/// The result of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The last hold was released; the key is free.
    Freed,
    /// One re-entrant hold was released; this many remain.
    StillHeld(u32),
    /// The owner did not hold the key (already released, expired, or taken
    /// over). Nothing was changed in the store.
    NotHeld,
}

/// The result of a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renew {
    /// The lease now runs for the requested TTL from the store's clock.
    Renewed,
    /// The owner no longer holds the key; nothing was changed.
    NotHeld,
}

/// One lease to renew in [`LockBackend::renew_many`].
#[derive(Debug, Clone)]
pub struct RenewRequest {
    /// The key held.
    pub key: LockKey,
    /// Its owner.
    pub owner: OwnerToken,
    /// The new lease length.
    pub ttl: Duration,
}

/// What woke a [`Watch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// The key was released (or may have been): try again.
    Released,
    /// A fair backend handed the lock to this waiter directly: it is held,
    /// by the waiter's owner, since a moment after the waiter's first queued
    /// attempt was sent.
    Granted(Grant),
}

/// A subscription to notifications for one key: its releases, for a
/// waiter ([`LockBackend::watch`]), or every change of who holds it and
/// of its value, for an election's observer ([`LockBackend::changes`]).
///
/// Created by [`LockBackend::watch`] *before* the waiter's next attempt, so a
/// release that happens between a failed attempt and the wait is not missed:
/// [`Watch::changed`] returns at once if anything was published since the
/// watch was made or last woke.
pub struct Watch {
    source: Source,
    _keepalive: Option<Box<dyn Send + Sync>>,
}

enum Source {
    Releases(watch::Receiver<u64>),
    Grants(mpsc::UnboundedReceiver<Grant>),
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

impl Watch {
    /// Wraps a version channel that the backend bumps on every release of
    /// the key (or, for [`LockBackend::changes`], on every change); the
    /// backend drops the sender when the subscription ends (a lost
    /// connection), which [`notice`](Self::notice) reports. `keepalive`
    /// is dropped with the watch (e.g. to unsubscribe).
    pub fn new(rx: watch::Receiver<u64>, keepalive: Option<Box<dyn Send + Sync>>) -> Self {
        let mut rx = rx;
        rx.mark_unchanged();
        Watch {
            source: Source::Releases(rx),
            _keepalive: keepalive,
        }
    }

    /// Wraps the channel on which a fair backend delivers the grant it made
    /// to this waiter (see [`LockBackend::try_acquire_waiting`]).
    pub fn grants(
        rx: mpsc::UnboundedReceiver<Grant>,
        keepalive: Option<Box<dyn Send + Sync>>,
    ) -> Self {
        Watch {
            source: Source::Grants(rx),
            _keepalive: keepalive,
        }
    }

    /// Waits for the next notice. If the publisher is gone the future never
    /// completes, so callers always pair it with a fallback timer.
    pub async fn changed(&mut self) -> Notice {
        match self.notice().await {
            Some(n) => n,
            None => std::future::pending().await,
        }
    }

    /// Waits for the next notice; `None` once the publisher is gone, so
    /// that no notice can come any more (a subscriber then subscribes again).
    pub async fn notice(&mut self) -> Option<Notice> {
        match &mut self.source {
            Source::Releases(rx) => rx.changed().await.ok().map(|()| Notice::Released),
            Source::Grants(rx) => rx.recv().await.map(Notice::Granted),
        }
    }
}

/// How long a writer's mark (left by a one-permit claim refused while
/// readers hold, see [`Claim`](crate::Claim)) keeps new readers out unless
/// the writer's next refused attempt renews it: a store sets it to last
/// the shorter of this and the writer's TTL, and the [`Locker`](crate::Locker)
/// tries again at least every quarter of it while it has a mark out. So a
/// writer that died unseen holds readers up this long, not a whole TTL.
pub const MARK_LIFE: Duration = Duration::from_secs(2);

/// One renewal sent as a batch of one, for a backend whose
/// [`LockBackend::renew_many`] is the real implementation (one script, one
/// quorum round) and whose `renew` is that with a single lease.
///
/// # Errors
/// The batch's error for this lease.
pub async fn renew_one<B: LockBackend + ?Sized>(
    backend: &B,
    key: &LockKey,
    owner: &OwnerToken,
    ttl: Duration,
) -> Result<Renew> {
    let request = RenewRequest {
        key: key.clone(),
        owner: owner.clone(),
        ttl,
    };
    backend
        .renew_many(std::slice::from_ref(&request))
        .await
        .pop()
        .unwrap_or_else(|| Err(Error::backend("no renewal result")))
}

/// A store that can hold locks. Implement this to add a backend; users hold a
/// [`Locker`](crate::Locker), which adds waiting, guards, renewal and
/// multi-lock on top.
///
/// # Contract
///
/// Every implementation must guarantee, and the conformance suite checks:
///
/// * `try_acquire` makes one attempt and returns promptly. A lock held by a
///   different owner is `Ok(Acquire::Contended)`; a store that cannot be
///   reached is `Err` of kind [`Unavailable`](crate::ErrorKind::Unavailable),
///   never `Contended`.
/// * Acquiring a key the same owner already holds (and whose lease has not
///   expired) succeeds, adds one hold and extends the lease; the key is free
///   again only when every hold is released.
/// * `release` and `renew` compare the owner atomically in the store. An owner
///   whose lease expired, or who never held the key, gets `NotHeld` and
///   changes nothing.
/// * A lease not renewed expires after its TTL, measured on the store's clock.
/// * With [`Capabilities::fencing`], each new grant of a key carries a token
///   greater than every earlier grant's, across owners, releases and expiry.
/// * Two different keys never share a lock.
/// * The backend validates nothing the core already validated (keys, TTLs
///   against [`Capabilities::min_ttl`]) but must not panic on any input.
#[async_trait]
pub trait LockBackend: fmt::Debug + Send + Sync + 'static {
    /// What this backend promises.
    fn capabilities(&self) -> Capabilities;

    /// Checks the store now: reachable, credentials accepted, and whatever
    /// schema the backend needs in place. `lockwright::connect` calls it, so
    /// a wrong password shows at start-up, not at the first lock. The
    /// default (for stores with nothing to check) succeeds.
    async fn verify(&self) -> Result<()> {
        Ok(())
    }

    /// One attempt to take `key` for `owner` for `ttl`.
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire>;

    /// Releases one hold of `key` if `owner` holds it.
    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release>;

    /// Extends `owner`'s lease on `key` to `ttl` from now (store clock).
    async fn renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew>;

    /// Renews several leases; backends that can should do it in one round trip.
    /// The result has one entry per request, in order.
    async fn renew_many(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        futures::future::join_all(requests.iter().map(|r| self.renew(&r.key, &r.owner, r.ttl)))
            .await
    }

    /// Reads what the store holds for `key` without changing anything: held
    /// or free, holds, fence, lease left, queued waiters (see
    /// [`LockStatus`]). The default says the store cannot.
    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        let _ = key;
        Err(Error::new(
            ErrorKind::Unsupported,
            "this store cannot report a lock's status",
        ))
    }

    /// Sets the value `owner` advertises with its hold of `key` (a leader's
    /// value), if `owner` holds it: checked and written in one step, so a
    /// former holder can never change what the current one advertises. The
    /// value goes with the lock. A store with
    /// [`values`](Capabilities::values) also writes the value an
    /// [`OwnerToken`] carries ([`OwnerToken::value`]) with each first grant
    /// to it, and [`inspect`](Self::inspect) reports it. The default says
    /// the store keeps no values.
    async fn proclaim(&self, key: &LockKey, owner: &OwnerToken, value: &[u8]) -> Result<Renew> {
        let _ = (key, owner, value);
        Err(Error::new(
            ErrorKind::Unsupported,
            "this store keeps no value with a lock, so it cannot hold an election",
        ))
    }

    /// Subscribes to the changes of who holds `key` and of the value it
    /// advertises, if the store announces them: for an election's
    /// observer, which reads the leader again when the [`Watch`] wakes
    /// ([`Notice::Released`]) instead of at its next poll. The watch wakes
    /// after every grant, release, hand-off and proclaim the store
    /// announces that is made after this call returns, and may wake for
    /// nothing; a lease that merely runs out is not announced (an observer
    /// times that itself). A store may announce only the changes of locks
    /// that carry a value (a plain mutex then pays nothing for them). Its
    /// publisher is dropped when the subscription ends (a lost
    /// connection, an ended session): the observer then subscribes again.
    /// `Ok(None)` (the default): the store announces nothing, and
    /// observers poll.
    async fn changes(&self, key: &LockKey) -> Result<Option<Watch>> {
        let _ = key;
        Ok(None)
    }

    /// Subscribes to release notifications for `key`, if the store has them,
    /// for the waiter that will queue as `ticket`. `Ok(None)` (the default)
    /// means waiters fall back to jittered backoff.
    async fn watch(&self, key: &LockKey, ticket: &OwnerToken) -> Result<Option<Watch>> {
        let _ = (key, ticket);
        Ok(None)
    }

    /// One attempt by a caller prepared to wait, made after [`watch`](Self::watch)
    /// with the same `ticket`. A [fair](Capabilities::fair) backend queues
    /// the ticket when the key is held, and later hands the lock to it by a
    /// [`Notice::Granted`]; repeating the call refreshes the ticket's place
    /// (a ticket not refreshed for a while is dropped from the queue) and
    /// returns a grant whose notice was lost. The default is `try_acquire`.
    async fn try_acquire_waiting(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        ticket: &OwnerToken,
    ) -> Result<Acquire> {
        let _ = ticket;
        self.try_acquire(key, owner, ttl).await
    }

    /// Gives up waiting, undoing everything a refused or queued attempt of
    /// `owner` left in the store: removes `ticket` from the queue and, if
    /// the lock was already handed to it, releases that hold; and removes
    /// the mark a refused writer left to keep new readers out (and, where
    /// the store keeps places in line, a refused reader's place), so that
    /// readers are not held up by a writer that is gone. The `Locker` calls
    /// it when a wait ends unmet, and in the background when an acquire is
    /// dropped. The default does nothing: right only for a store that
    /// neither queues nor marks.
    async fn abandon(&self, key: &LockKey, owner: &OwnerToken, ticket: &OwnerToken) -> Result<()> {
        let _ = (key, owner, ticket);
        Ok(())
    }

    /// A counter the backend bumps whenever an answer showed that the
    /// store may have dropped locks without telling their holders (a
    /// memcached server out of memory). The `Locker` then renews every
    /// lease it keeps renewed at once (at most every 250 ms, or a quarter
    /// of the shortest renewal period), instead of at its next period, so a
    /// lost lock is noticed in a round trip. `None` (the default): the store
    /// never drops a lock silently, or cannot tell.
    fn alarm(&self) -> Option<watch::Receiver<u64>> {
        None
    }
}

/// Writes a wrapper's [`LockBackend`] impl: every method of the trait
/// forwards to an inner backend, except the ones the wrapper writes out.
///
/// This is the one way to write a wrapper. An impl written by hand would
/// inherit the trait's defaults for the methods it forgot (no notification,
/// no queue, "cannot inspect") and hide what the store behind it can do.
/// Here a method left out is forwarded; a method the wrapper answers
/// itself is written out, with a comment saying why. `Arc<T>` and `Box<T>`
/// are written with it too.
///
/// The first line names the inner backend: `(self) => <expression>;`, where
/// the expression is the backend itself, not a reference to it (`self.inner`,
/// `**self`). Then comes the impl, with `#[async_trait]` left out (the macro
/// adds it); the methods in it are written as in any `LockBackend` impl.
/// A name that is not a method of the trait is refused, and so is a
/// wrapper that writes `try_acquire` without `try_acquire_waiting`, or
/// `renew` without `renew_many`: the twin left forwarded would reach the
/// store around the wrapper.
///
/// The conformance crate's `kit::forwarding` checks a wrapper: it calls
/// every method through it and sees where each arrives. This crate's
/// `tests/forwarding.rs` fails when the trait gains a method that check
/// does not know.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::time::Duration;
/// use lockwright_core::backend::{Acquire, LockBackend, MemoryBackend};
/// use lockwright_core::{Error, LockKey, OwnerToken, Result};
///
/// /// A store that refuses new grants while `closed` is set; everything
/// /// else is the memory store's.
/// #[derive(Debug, Default)]
/// struct Closable {
///     store: MemoryBackend,
///     closed: AtomicBool,
/// }
///
/// lockwright_core::forward_backend! {
///     (self) => self.store;
///     impl LockBackend for Closable {
///         async fn try_acquire(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Acquire> {
///             if self.closed.load(Ordering::SeqCst) {
///                 return Err(Error::unavailable("closed"));
///             }
///             self.store.try_acquire(key, owner, ttl).await
///         }
///         // A waiting acquire is refused the same way.
///         async fn try_acquire_waiting(
///             &self, key: &LockKey, owner: &OwnerToken, ttl: Duration, _ticket: &OwnerToken,
///         ) -> Result<Acquire> {
///             LockBackend::try_acquire(self, key, owner, ttl).await
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<()> {
/// let c = Closable::default();
/// let key = LockKey::new("k")?;
/// c.try_acquire(&key, &OwnerToken::generate(), Duration::from_secs(5)).await?;
/// assert!(c.inspect(&key).await?.held, "inspect is the memory store's");
/// # Ok(())
/// # }
/// ```
#[macro_export]
macro_rules! forward_backend {
    // Blanks the slot of a method the wrapper wrote, then looks at the
    // next one. One rule per method of the trait, in the slots' order.
    (@drop capabilities $ctx:tt $more:tt [$_a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [[] $b $c $d $e $f $g $h $i $j $k $l $m]);
    };
    (@drop verify $ctx:tt $more:tt [$a:tt $_b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a [] $c $d $e $f $g $h $i $j $k $l $m]);
    };
    (@drop try_acquire $ctx:tt $more:tt [$a:tt $b:tt $_c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b [] $d $e $f $g $h $i $j $k $l $m]);
    };
    (@drop release $ctx:tt $more:tt [$a:tt $b:tt $c:tt $_d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c [] $e $f $g $h $i $j $k $l $m]);
    };
    (@drop renew $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $_e:tt $f:tt $g:tt $h:tt $i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d [] $f $g $h $i $j $k $l $m]);
    };
    (@drop renew_many $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $_f:tt $g:tt $h:tt $i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e [] $g $h $i $j $k $l $m]);
    };
    (@drop inspect $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $_g:tt $h:tt $i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f [] $h $i $j $k $l $m]);
    };
    (@drop proclaim $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $_h:tt $i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f $g [] $i $j $k $l $m]);
    };
    (@drop changes $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $_i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f $g $h [] $j $k $l $m]);
    };
    (@drop watch $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $_j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f $g $h $i [] $k $l $m]);
    };
    (@drop try_acquire_waiting $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $j:tt $_k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f $g $h $i $j [] $l $m]);
    };
    (@drop abandon $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $j:tt $k:tt $_l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f $g $h $i $j $k [] $m]);
    };
    (@drop alarm $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $j:tt $k:tt $l:tt $_m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f $g $h $i $j $k $l []]);
    };
    (@drop $other:ident $($_rest:tt)*) => {
        ::core::compile_error!(::core::concat!(
            "forward_backend!: `", ::core::stringify!($other), "` is not a method of LockBackend"
        ));
    };

    // A wrapper that changes one path into the store must change its twin:
    // a forwarded `try_acquire_waiting` (or `renew_many`) would reach the
    // inner store without the wrapper's own `try_acquire` (or `renew`).
    (@names $ctx:tt [] [$a:tt $b:tt [] $d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $j:tt [$($k:tt)+] $l:tt $m:tt]) => {
        ::core::compile_error!(
            "forward_backend!: a wrapper that writes `try_acquire` writes `try_acquire_waiting` \
             too (call its own `try_acquire` there, or forward with a comment saying why)"
        );
    };
    (@names $ctx:tt [] [$a:tt $b:tt $c:tt $d:tt [] [$($f:tt)+] $g:tt $h:tt $i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        ::core::compile_error!(
            "forward_backend!: a wrapper that writes `renew` writes `renew_many` too (renew \
             each through its own `renew`, or forward with a comment saying why)"
        );
    };
    // Every method written out has been seen: the impl is the wrapper's
    // methods and the forwarding ones left in the slots.
    (@names [[$($head:tt)*] [$($body:tt)*]] [] [$([$($forward:tt)*])*]) => {
        #[$crate::backend::async_trait]
        $($head)* {
            $($body)*
            $($($forward)*)*
        }
    };
    // The next method the wrapper wrote.
    (@names $ctx:tt [
        $(#[$_attr:meta])* $(async)? fn $name:ident $_args:tt -> $_ret:ty $_block:block
        $($more:tt)*
    ] $slots:tt) => {
        $crate::forward_backend!(@drop $name $ctx [$($more)*] $slots);
    };

    // The impl's header runs up to its body, the last brace group. The
    // slots start with every method forwarding.
    (@split $s:ident $target:tt [$($head:tt)*] { $($body:tt)* }) => {
        $crate::forward_backend!(@names [[$($head)*] [$($body)*]] [$($body)*] [
            [fn capabilities(&$s) -> $crate::backend::Capabilities {
                $crate::backend::LockBackend::capabilities(&$target)
            }]
            [async fn verify(&$s) -> $crate::Result<()> {
                $crate::backend::LockBackend::verify(&$target).await
            }]
            [async fn try_acquire(
                &$s,
                key: &$crate::LockKey,
                owner: &$crate::OwnerToken,
                ttl: ::core::time::Duration,
            ) -> $crate::Result<$crate::backend::Acquire> {
                $crate::backend::LockBackend::try_acquire(&$target, key, owner, ttl).await
            }]
            [async fn release(
                &$s,
                key: &$crate::LockKey,
                owner: &$crate::OwnerToken,
            ) -> $crate::Result<$crate::backend::Release> {
                $crate::backend::LockBackend::release(&$target, key, owner).await
            }]
            [async fn renew(
                &$s,
                key: &$crate::LockKey,
                owner: &$crate::OwnerToken,
                ttl: ::core::time::Duration,
            ) -> $crate::Result<$crate::backend::Renew> {
                $crate::backend::LockBackend::renew(&$target, key, owner, ttl).await
            }]
            [async fn renew_many(
                &$s,
                requests: &[$crate::backend::RenewRequest],
            ) -> ::std::vec::Vec<$crate::Result<$crate::backend::Renew>> {
                $crate::backend::LockBackend::renew_many(&$target, requests).await
            }]
            [async fn inspect(&$s, key: &$crate::LockKey) -> $crate::Result<$crate::LockStatus> {
                $crate::backend::LockBackend::inspect(&$target, key).await
            }]
            [async fn proclaim(
                &$s,
                key: &$crate::LockKey,
                owner: &$crate::OwnerToken,
                value: &[u8],
            ) -> $crate::Result<$crate::backend::Renew> {
                $crate::backend::LockBackend::proclaim(&$target, key, owner, value).await
            }]
            [async fn changes(
                &$s,
                key: &$crate::LockKey,
            ) -> $crate::Result<::core::option::Option<$crate::backend::Watch>> {
                $crate::backend::LockBackend::changes(&$target, key).await
            }]
            [async fn watch(
                &$s,
                key: &$crate::LockKey,
                ticket: &$crate::OwnerToken,
            ) -> $crate::Result<::core::option::Option<$crate::backend::Watch>> {
                $crate::backend::LockBackend::watch(&$target, key, ticket).await
            }]
            [async fn try_acquire_waiting(
                &$s,
                key: &$crate::LockKey,
                owner: &$crate::OwnerToken,
                ttl: ::core::time::Duration,
                ticket: &$crate::OwnerToken,
            ) -> $crate::Result<$crate::backend::Acquire> {
                $crate::backend::LockBackend::try_acquire_waiting(&$target, key, owner, ttl, ticket)
                    .await
            }]
            [async fn abandon(
                &$s,
                key: &$crate::LockKey,
                owner: &$crate::OwnerToken,
                ticket: &$crate::OwnerToken,
            ) -> $crate::Result<()> {
                $crate::backend::LockBackend::abandon(&$target, key, owner, ticket).await
            }]
            [fn alarm(&$s) -> ::core::option::Option<$crate::backend::__watch::Receiver<u64>> {
                $crate::backend::LockBackend::alarm(&$target)
            }]
        ]);
    };
    (@split $s:ident $target:tt [$($head:tt)*] $next:tt $($rest:tt)+) => {
        $crate::forward_backend!(@split $s $target [$($head)* $next] $($rest)+);
    };

    // `(self) => <inner backend>;` then the impl.
    (($s:ident) => $target:expr; impl $($rest:tt)+) => {
        $crate::forward_backend!(@split $s ($target) [impl] $($rest)+);
    };
}

/// For [`forward_backend!`]: the alarm's channel, whatever the caller imports.
#[doc(hidden)]
pub use tokio::sync::watch as __watch;

forward_backend! {
    (self) => **self;
    impl<T: LockBackend + ?Sized> LockBackend for Arc<T> {}
}

forward_backend! {
    (self) => **self;
    impl<T: LockBackend + ?Sized> LockBackend for Box<T> {}
}
