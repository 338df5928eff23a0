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
pub use crate::request::{AcquireRequest, HoldId, HoldKind, RenewRequest};
pub use crate::sync::{lock_unpoisoned, AbortOnDrop};
pub use crate::tls::{TlsFiles, TlsPem, TlsRefusal};
pub use crate::url::{scheme_of, HostPort, Scheme, ServerUrl};
/// For [`forward_backend!`]: the `async_trait` macro the trait was written
/// with, whatever the caller imports. Backends use `async-trait` themselves.
#[doc(hidden)]
pub use async_trait::async_trait as __async_trait;

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
    /// The store can enumerate the names it holds
    /// ([`LockBackend::list`]); without it, `list` is `Unsupported`.
    pub listing: bool,
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
            listing: false,
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

    /// Sets [`listing`](Self::listing): the store lists its names.
    #[must_use]
    pub fn with_listing(mut self, listing: bool) -> Self {
        self.listing = listing;
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

/// A waiter's subscription to one key's releases ([`LockBackend::watch`]),
/// or, on a fair store, to the grant it hands the waiter.
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
    /// the key; the backend drops the sender when the subscription ends (a lost
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
    /// to this waiter (see [`AcquireRequest::ticket`]).
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

/// An election observer's subscription to every change of who holds one
/// key and of the value it advertises ([`LockBackend::changes`]): each
/// notice means "read the key again".
pub struct Changes {
    watch: Watch,
}

impl fmt::Debug for Changes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Changes").finish_non_exhaustive()
    }
}

impl Changes {
    /// Wraps a version channel that the backend bumps on every change of
    /// the key; the backend drops the sender when the subscription ends (a
    /// lost connection), which [`notice`](Self::notice) reports.
    /// `keepalive` is dropped with the subscription (e.g. to unsubscribe).
    pub fn new(rx: watch::Receiver<u64>, keepalive: Option<Box<dyn Send + Sync>>) -> Self {
        Changes {
            watch: Watch::new(rx, keepalive),
        }
    }

    /// Waits for the next change; `None` once the publisher is gone, so
    /// that no notice can come any more (the observer subscribes again).
    pub async fn notice(&mut self) -> Option<()> {
        self.watch.notice().await.map(|_| ())
    }
}

impl From<Watch> for Changes {
    /// The changes announced on a channel a backend already wraps as a
    /// [`Watch`] (one subscription machinery for both).
    fn from(watch: Watch) -> Self {
        Changes { watch }
    }
}

/// How long a writer's mark (left by a one-permit claim refused while
/// readers hold, see [`Claim`](crate::Claim)) keeps new readers out unless
/// the writer's next refused attempt renews it: a store sets it to last
/// the shorter of this and the writer's TTL, and the [`Locker`](crate::Locker)
/// tries again at least every quarter of it while it has a mark out. So a
/// writer that died unseen holds readers up this long, not a whole TTL.
pub const MARK_LIFE: Duration = Duration::from_secs(2);

/// One renewal sent as a batch of one, and its answer. A lease's own
/// renewal, value included, is [`Lease::renewal`](crate::Lease::renewal).
///
/// # Errors
/// The batch's error for this lease.
pub async fn renew_one<B: LockBackend + ?Sized>(
    backend: &B,
    request: RenewRequest,
) -> Result<Renew> {
    backend
        .renew(std::slice::from_ref(&request))
        .await
        .pop()
        .unwrap_or_else(|| Err(Error::backend("no renewal result")))
}

/// A store that can hold locks. Implement this to add a backend; users hold a
/// [`Locker`](crate::Locker), which adds waiting, guards, renewal and
/// multi-lock on top.
///
/// Every input of a request is in its signature: the hold ([`HoldId`]:
/// key, owner, kind), the lease, the value to write and the waiter's
/// ticket ([`AcquireRequest`]). An [`OwnerToken`] is only an identity.
///
/// # Contract
///
/// Every implementation must guarantee, and the conformance suite checks:
///
/// * `try_acquire` makes one attempt and returns promptly. A hold another
///   owner's claim excludes is `Ok(Acquire::Contended)`; a store that
///   cannot be reached is `Err` of kind
///   [`Unavailable`](crate::ErrorKind::Unavailable), never `Contended`.
/// * Claims are granted by the rules of [`judge`]: a name keeps one N while
///   any exclusive hold on it is live, a semaphore or a read-write lock on a
///   name but never both, no upgrade of a reader, no reader by a writer's
///   own owner. (A downgrade's reader is a new owner standing beside the
///   writer, [`HoldKind::Reader`] with `beside`.) A claim that breaks one is
///   refused with `judge`'s error, unapplied, and leaves nothing behind.
/// * Acquiring a key the same owner already holds with the same claim
///   (a mutex and a writer are one exclusive claim), and whose lease has
///   not expired, succeeds, adds one hold and extends the
///   lease; the key is free again only when every hold is released.
/// * `release`, `renew` and `proclaim` compare the owner atomically in the
///   store. An owner whose lease expired, or who never held the key, gets
///   `NotHeld` and changes nothing.
/// * A lease not renewed expires after its TTL, measured on the store's clock.
/// * With [`Capabilities::fencing`], each new grant of a key carries a token
///   greater than every earlier grant's, across owners, releases and expiry.
/// * Two different keys never share a lock.
/// * The backend validates nothing the core already validated (keys, TTLs
///   against [`Capabilities::min_ttl`], claims against the capabilities)
///   but must not panic on any input.
#[async_trait::async_trait]
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

    /// One attempt to take `request.hold` for `request.ttl`.
    ///
    /// With a [`value`](AcquireRequest::value), a store with
    /// [`values`](Capabilities::values) writes it with the first grant to
    /// the owner, in the same step, and [`inspect`](Self::inspect) reports
    /// it. With a [`ticket`](AcquireRequest::ticket) (a caller prepared to
    /// wait, after [`watch`](Self::watch) with the same ticket) a
    /// [fair](Capabilities::fair) store queues the ticket when the key is
    /// held and later hands the lock to it by a [`Notice::Granted`];
    /// repeating the attempt refreshes the ticket's place (a ticket not
    /// refreshed for a while is dropped from the queue) and returns a
    /// grant whose notice was lost. A store that does not queue ignores
    /// the ticket.
    ///
    /// A writer's claim refused while readers hold leaves a mark that keeps
    /// new readers out for [`MARK_LIFE`] (or the TTL, if shorter), renewed
    /// by its next attempt; where the store keeps places in line
    /// ([`Capabilities::in_line`]), a refused reader's claim keeps its place
    /// too. [`abandon`](Self::abandon) removes both.
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire>;

    /// Releases one hold of `hold.key` if `hold.owner` holds it. The kind
    /// says where a store that keeps kinds apart looks for it (a lone
    /// permit's row, a mutex's item); an owner that holds nothing there
    /// gets `NotHeld`.
    async fn release(&self, hold: &HoldId) -> Result<Release>;

    /// Extends each request's lease to its TTL from now (store clock);
    /// one round trip where the store can. The result has one entry per
    /// request, in order. ([`renew_one`] renews a single lease.)
    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>>;

    /// Reads what the store holds for `key` without changing anything: held
    /// or free, holds, fence, lease left, queued waiters (see
    /// [`LockStatus`]). A store that cannot says so with
    /// [`Unsupported`](crate::ErrorKind::Unsupported).
    async fn inspect(&self, key: &LockKey) -> Result<LockStatus>;

    /// Sets the value `hold.owner` advertises with its hold (a leader's
    /// value), if it holds it: checked and written in one step, so a
    /// former holder can never change what the current one advertises. The
    /// value goes with the lock. The default says the store keeps no
    /// values.
    async fn proclaim(&self, hold: &HoldId, value: &[u8]) -> Result<Renew> {
        let _ = (hold, value);
        Err(Error::new(
            ErrorKind::Unsupported,
            "this store keeps no value with a lock, so it cannot hold an election",
        ))
    }

    /// Subscribes to the changes of who holds `key` and of the value it
    /// advertises, if the store announces them: for an election's
    /// observer, which reads the leader again at each notice instead of
    /// at its next poll. The subscription wakes after every grant, release,
    /// hand-off and proclaim the store announces that is made after this
    /// call returns, and may wake for nothing; a lease that merely runs out
    /// is not announced (an observer times that itself). A store may
    /// announce only the changes of locks that carry a value (a plain mutex
    /// then pays nothing for them). Its publisher is dropped when the
    /// subscription ends (a lost connection, an ended session): the
    /// observer then subscribes again. `Ok(None)` (the default): the store
    /// announces nothing, and observers poll.
    async fn changes(&self, key: &LockKey) -> Result<Option<Changes>> {
        let _ = key;
        Ok(None)
    }

    /// Subscribes to release notifications for `key`, if the store has them,
    /// for the waiter that will attempt with `ticket`
    /// ([`AcquireRequest::ticket`]). `Ok(None)` (the default) means
    /// waiters fall back to jittered backoff.
    async fn watch(&self, key: &LockKey, ticket: &OwnerToken) -> Result<Option<Watch>> {
        let _ = (key, ticket);
        Ok(None)
    }

    /// Gives up waiting, undoing everything a refused or queued attempt of
    /// `hold` left in the store, and nothing else:
    /// * removes `ticket` from the queue and, if the lock was already
    ///   handed to it, releases that hold;
    /// * removes the mark a refused writer left to keep new readers out,
    ///   so that readers are not held up by a writer that is gone;
    /// * where the store keeps places in line, removes a refused reader's
    ///   place.
    ///
    /// The `Locker` calls it when a wait ends unmet, and in the background
    /// when an acquire is dropped. A store that neither queues nor marks
    /// returns `Ok(())`.
    async fn abandon(&self, hold: &HoldId, ticket: &OwnerToken) -> Result<()>;

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

    /// Breaks the hold of `key` whose [`id`](crate::Holder::id) is
    /// `holder`, whoever its owner is: an operator's way out of a stuck
    /// lock. Every hold of that holder goes (re-entered ones too), and no
    /// other holder's. `Ok(false)`: no live holder has that id.
    ///
    /// It must keep the promises a release keeps: the holder's next
    /// renewal is `NotHeld` (so it learns it lost the lock), and with
    /// [`Capabilities::fencing`] the next grant of the key carries a fence
    /// above the broken holder's (so a resource that checks fences refuses
    /// its late writes). One exception, as with a release: a downgrade's
    /// read hold on a store whose fences are creation orders (ZooKeeper,
    /// etcd) has the fence of its downgrade, above a writer queued before
    /// it, which may hold next. The default releases as the owner
    /// [`inspect`](Self::inspect) names ([`release_by_owner`]); a store
    /// that does not name owners answers
    /// [`Unsupported`](crate::ErrorKind::Unsupported) or writes its own.
    async fn force_release(&self, key: &LockKey, holder: &str) -> Result<bool> {
        release_by_owner(self, key, holder).await
    }

    /// The names starting with `prefix` that the store keeps state for
    /// now, for an operator's listing: every name held, of every kind, and
    /// perhaps some that are not (a released row, a queue), which the
    /// caller reads with [`inspect`](Self::inspect) and drops. Reads only;
    /// in no order. A name the store keeps only in a form it cannot turn
    /// back into the name (a digest) is left out, as the store's docs say.
    /// The default: [`Unsupported`](crate::ErrorKind::Unsupported), for a
    /// store that cannot enumerate its keys.
    async fn list(&self, prefix: &str) -> Result<Vec<LockKey>> {
        let _ = prefix;
        Err(Error::new(
            ErrorKind::Unsupported,
            "this store cannot list its locks: ask about one key with status",
        ))
    }
}

/// [`LockBackend::force_release`] for a store whose `inspect` names each
/// holder's owner: finds the owner whose [`holder_id`](crate::holder_id)
/// (or store-given id) is `holder`, and releases its holds as that owner,
/// so the store's own release keeps the fences rising.
///
/// # Errors
/// `Unsupported` when the store does not say who holds; the store's errors.
pub async fn release_by_owner<B: LockBackend + ?Sized>(
    backend: &B,
    key: &LockKey,
    holder: &str,
) -> Result<bool> {
    let status = backend.inspect(key).await?;
    let holders = status.each_holder();
    let named = |h: &crate::lease::Holder| {
        h.id.as_deref() == Some(holder)
            || h.owner.as_ref().map(crate::lease::holder_id).as_deref() == Some(holder)
    };
    let unnamed = || {
        Error::new(
            ErrorKind::Unsupported,
            "this store does not say which owner holds a lock, so no one holder can be broken",
        )
    };
    let Some(found) = holders.iter().find(|h| named(h)) else {
        // A holder the store cannot name may be the one asked for.
        if holders.iter().any(|h| h.id.is_none() && h.owner.is_none()) {
            return Err(unnamed());
        }
        return Ok(false);
    };
    let Some(owner) = found.owner.clone() else {
        return Err(unnamed());
    };
    // Where a store keeps kinds apart, a release looks where its kind
    // says; a release of the wrong kind is `NotHeld` and changes nothing,
    // so each kind the holder could hold by is tried in turn.
    let kinds = if found.shared {
        vec![HoldKind::Reader { beside: None }]
    } else {
        match status.permits {
            Some(permits) if permits > 1 => vec![HoldKind::Permit { permits }],
            _ => vec![
                HoldKind::Mutex,
                HoldKind::Writer,
                HoldKind::Permit { permits: 1 },
            ],
        }
    };
    // A holder that re-enters while it is broken adds holds: the bound
    // keeps that race from looping for ever, and says it was not broken.
    let bound = found.holds.saturating_add(16);
    for kind in kinds {
        let hold = HoldId::new(key.clone(), owner.clone(), kind);
        let mut broke = false;
        for _ in 0..bound {
            match backend.release(&hold).await? {
                Release::StillHeld(_) => broke = true,
                Release::Freed => return Ok(true),
                Release::NotHeld if broke => return Ok(true),
                Release::NotHeld => break,
            }
        }
        if broke {
            return Err(Error::backend(format!(
                "holder {holder} of {key} kept taking holds as they were released; it still holds"
            )));
        }
    }
    Ok(false)
}

/// Shorthands over [`LockBackend`] for tests and tools that speak to a
/// store directly: the mutex's requests, built from a key and an owner.
#[async_trait::async_trait]
pub trait LockBackendExt: LockBackend {
    /// One attempt at a mutex hold of `key` by `owner`.
    async fn try_lock(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Acquire> {
        self.try_acquire(&AcquireRequest::mutex(key, owner, ttl))
            .await
    }

    /// One attempt at `hold`, waiting as `ticket`.
    async fn try_lock_waiting(
        &self,
        hold: &HoldId,
        ttl: Duration,
        ticket: &OwnerToken,
    ) -> Result<Acquire> {
        self.try_acquire(&AcquireRequest::new(hold.clone(), ttl).waiting(ticket))
            .await
    }

    /// Releases one mutex hold of `key` by `owner`.
    async fn unlock(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        self.release(&HoldId::mutex(key.clone(), owner.clone()))
            .await
    }

    /// Renews `owner`'s mutex hold of `key` for `ttl`.
    async fn renew_lock(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
        renew_one(
            self,
            RenewRequest::new(HoldId::mutex(key.clone(), owner.clone()), ttl),
        )
        .await
    }

    /// Sets the value `owner`'s mutex hold of `key` advertises.
    async fn proclaim_as(&self, key: &LockKey, owner: &OwnerToken, value: &[u8]) -> Result<Renew> {
        self.proclaim(&HoldId::mutex(key.clone(), owner.clone()), value)
            .await
    }

    /// Gives up a mutex wait of `owner` on `key` queued as `ticket`.
    async fn abandon_lock(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ticket: &OwnerToken,
    ) -> Result<()> {
        self.abandon(&HoldId::mutex(key.clone(), owner.clone()), ticket)
            .await
    }
}

impl<B: LockBackend + ?Sized> LockBackendExt for B {}

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
/// A name that is not a method of the trait is refused.
///
/// The conformance crate's `kit::forwarding` checks a wrapper: it calls
/// every method through it and sees where each arrives. This crate's
/// `tests/forwarding.rs` fails when the trait gains a method that check
/// does not know.
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::time::Duration;
/// use lockwright_core::backend::{Acquire, AcquireRequest, LockBackend, LockBackendExt, MemoryBackend};
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
///         async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
///             if self.closed.load(Ordering::SeqCst) {
///                 return Err(Error::unavailable("closed"));
///             }
///             self.store.try_acquire(request).await
///         }
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<()> {
/// let c = Closable::default();
/// let key = LockKey::new("k")?;
/// c.try_lock(&key, &OwnerToken::generate(), Duration::from_secs(5)).await?;
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
    (@drop inspect $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $_f:tt $g:tt $h:tt $i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e [] $g $h $i $j $k $l $m]);
    };
    (@drop proclaim $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $_g:tt $h:tt $i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f [] $h $i $j $k $l $m]);
    };
    (@drop changes $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $_h:tt $i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f $g [] $i $j $k $l $m]);
    };
    (@drop watch $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $_i:tt $j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f $g $h [] $j $k $l $m]);
    };
    (@drop abandon $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $_j:tt $k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f $g $h $i [] $k $l $m]);
    };
    (@drop alarm $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $j:tt $_k:tt $l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f $g $h $i $j [] $l $m]);
    };
    (@drop force_release $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $j:tt $k:tt $_l:tt $m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f $g $h $i $j $k [] $m]);
    };
    (@drop list $ctx:tt $more:tt [$a:tt $b:tt $c:tt $d:tt $e:tt $f:tt $g:tt $h:tt $i:tt $j:tt $k:tt $l:tt $_m:tt]) => {
        $crate::forward_backend!(@names $ctx $more [$a $b $c $d $e $f $g $h $i $j $k $l []]);
    };
    (@drop $other:ident $($_rest:tt)*) => {
        ::core::compile_error!(::core::concat!(
            "forward_backend!: `", ::core::stringify!($other), "` is not a method of LockBackend"
        ));
    };

    // Every method written out has been seen: the impl is the wrapper's
    // methods and the forwarding ones left in the slots.
    (@names [[$($head:tt)*] [$($body:tt)*]] [] [$([$($forward:tt)*])*]) => {
        #[$crate::backend::__async_trait]
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
                request: &$crate::backend::AcquireRequest,
            ) -> $crate::Result<$crate::backend::Acquire> {
                $crate::backend::LockBackend::try_acquire(&$target, request).await
            }]
            [async fn release(
                &$s,
                hold: &$crate::backend::HoldId,
            ) -> $crate::Result<$crate::backend::Release> {
                $crate::backend::LockBackend::release(&$target, hold).await
            }]
            [async fn renew(
                &$s,
                requests: &[$crate::backend::RenewRequest],
            ) -> ::std::vec::Vec<$crate::Result<$crate::backend::Renew>> {
                $crate::backend::LockBackend::renew(&$target, requests).await
            }]
            [async fn inspect(&$s, key: &$crate::LockKey) -> $crate::Result<$crate::LockStatus> {
                $crate::backend::LockBackend::inspect(&$target, key).await
            }]
            [async fn proclaim(
                &$s,
                hold: &$crate::backend::HoldId,
                value: &[u8],
            ) -> $crate::Result<$crate::backend::Renew> {
                $crate::backend::LockBackend::proclaim(&$target, hold, value).await
            }]
            [async fn changes(
                &$s,
                key: &$crate::LockKey,
            ) -> $crate::Result<::core::option::Option<$crate::backend::Changes>> {
                $crate::backend::LockBackend::changes(&$target, key).await
            }]
            [async fn watch(
                &$s,
                key: &$crate::LockKey,
                ticket: &$crate::OwnerToken,
            ) -> $crate::Result<::core::option::Option<$crate::backend::Watch>> {
                $crate::backend::LockBackend::watch(&$target, key, ticket).await
            }]
            [async fn abandon(
                &$s,
                hold: &$crate::backend::HoldId,
                ticket: &$crate::OwnerToken,
            ) -> $crate::Result<()> {
                $crate::backend::LockBackend::abandon(&$target, hold, ticket).await
            }]
            [fn alarm(&$s) -> ::core::option::Option<$crate::backend::__watch::Receiver<u64>> {
                $crate::backend::LockBackend::alarm(&$target)
            }]
            [async fn force_release(
                &$s,
                key: &$crate::LockKey,
                holder: &str,
            ) -> $crate::Result<bool> {
                $crate::backend::LockBackend::force_release(&$target, key, holder).await
            }]
            [async fn list(
                &$s,
                prefix: &str,
            ) -> $crate::Result<::std::vec::Vec<$crate::LockKey>> {
                $crate::backend::LockBackend::list(&$target, prefix).await
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
