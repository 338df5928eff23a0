//! What a holder knows about its lease: the grant, and its live state.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::identity::HolderInfo;
use crate::key::FencingToken;
use crate::key::{LockKey, OwnerToken};
use crate::request::{HoldId, HoldKind, RenewRequest};

/// Why a held lock was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// Renewal kept failing until the local deadline; someone else may take
    /// the lock from now on.
    Expired,
    /// The store answered that this owner no longer holds the key.
    NotHeld,
    /// [`Locker::close`](crate::Locker::close) released it while the guard
    /// was still alive.
    Closed,
}

impl LostReason {
    /// The reason in words, for the messages of errors that report a loss.
    pub(crate) fn words(self) -> &'static str {
        match self {
            LostReason::Expired => "not renewed before its deadline",
            LostReason::NotHeld => "the store said it was not held",
            LostReason::Closed => "its locker was closed",
        }
    }
}

/// The live state of a guard's lease, as the watchdog sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseState {
    /// Held; safe to act until `deadline` (a conservative local instant).
    Held {
        /// Before this instant no one else can hold the lock.
        deadline: Instant,
    },
    /// Lost; stop acting on the protected resource.
    Lost(LostReason),
    /// Released by its holder.
    Released,
}

impl LeaseState {
    /// The state as of `now`: a hold whose deadline has passed is lost
    /// (`Expired`) even before the watchdog says so, so that a process
    /// starved of CPU never sees a lock as held past its deadline.
    pub fn at(self, now: Instant) -> LeaseState {
        match self {
            LeaseState::Held { deadline } if deadline <= now => {
                LeaseState::Lost(LostReason::Expired)
            }
            s => s,
        }
    }
}

/// Waits until the lease watched by `rx` is lost, by the watchdog's word
/// or by its deadline passing, whichever comes first; `None` once it was
/// released (it can no longer be lost).
pub(crate) async fn wait_lost(
    rx: &mut tokio::sync::watch::Receiver<LeaseState>,
) -> Option<LostReason> {
    loop {
        let state = *rx.borrow_and_update();
        match state.at(Instant::now()) {
            LeaseState::Lost(r) => return Some(r),
            LeaseState::Released => return None,
            LeaseState::Held { deadline } => {
                tokio::select! {
                    changed = rx.changed() => {
                        if changed.is_err() {
                            // The watchdog let go of it: what it last said
                            // stands, and a hold still ends at its deadline.
                            let last = *rx.borrow();
                            return match last {
                                LeaseState::Held { deadline } => {
                                    tokio::time::sleep_until(deadline.into()).await;
                                    Some(LostReason::Expired)
                                }
                                LeaseState::Lost(r) => Some(r),
                                LeaseState::Released => None,
                            };
                        }
                    }
                    () = tokio::time::sleep_until(deadline.into()) => {}
                }
            }
        }
    }
}

/// One granted lock: who holds what, with which fencing token, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// The key held.
    pub key: LockKey,
    /// The owner token that proves it.
    pub owner: OwnerToken,
    /// What kind of hold it is.
    pub kind: HoldKind,
    /// The value it was granted with (a candidate's), for renewals that
    /// grant it again where a node lost it.
    pub(crate) value: Option<Arc<[u8]>>,
    /// The fencing token, where the backend gives one.
    pub fence: Option<FencingToken>,
    /// Holds this owner had on the key right after the grant.
    pub holds: u32,
    /// The lease length asked for.
    pub ttl: Duration,
    /// The conservative local deadline at grant time: taken *before* the
    /// request was sent, minus [`clock_drift`].
    pub deadline: Instant,
}

impl Lease {
    /// The hold this lease is of: its key, owner and kind.
    pub fn hold(&self) -> HoldId {
        HoldId::new(self.key.clone(), self.owner.clone(), self.kind.clone())
    }

    /// The renewal of this lease for its TTL, with the value it was granted
    /// with (set `ttl` on it for another length).
    pub fn renewal(&self) -> RenewRequest {
        RenewRequest::new(self.hold(), self.ttl).granted_with(self.value.clone())
    }
}

/// What the store says about a key right now, read without changing it
/// ([`Locker::status`](crate::Locker::status), `lockwright status`). It is a
/// snapshot: the lock may change hands as soon as it is read, so never
/// decide to act on a resource from it; take the lock instead.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    /// Someone holds the key now.
    pub held: bool,
    /// How many re-entrant holds its owner has (0 when free; at least 1
    /// when held, where the store cannot count them).
    pub holds: u32,
    /// The current grant's fencing token, where the store gives them.
    pub fence: Option<FencingToken>,
    /// How long the current lease has left on the store's clock, where the
    /// store has leases.
    pub remaining: Option<Duration>,
    /// Waiters queued for the key, where the store queues them (an upper
    /// bound: a waiter that died is counted until it is dropped).
    pub waiters: Option<u32>,
    /// The holder's owner token, where the store reads it with the rest:
    /// a [`Quorum`](crate::backend::Quorum) counts only nodes held by one
    /// owner. Never show it: whoever has it can release the lock
    /// ([`Locker::status`](crate::Locker::status) clears it).
    pub owner: Option<OwnerToken>,
    /// The value the holder advertises (an election's leader value), where
    /// the store keeps one and the holder set it.
    pub value: Option<Vec<u8>>,
    /// Every live holder, where the store lists them (a store that offers
    /// semaphores or shared holds does; a mutex-only store may leave it
    /// empty). With several holders, `holds` is their total, `fence` the
    /// highest and `remaining` the longest lease left.
    pub holders: Vec<Holder>,
    /// The permits the store keeps for the name while exclusive holds are
    /// live (1 for a mutex or a writer, N for a semaphore), where it says.
    pub permits: Option<u32>,
    /// The name to break the holder by, as [`Holder::id`], where one owner
    /// holds (the store's id, or filled from `owner` by
    /// [`without_owners`](Self::without_owners)).
    pub id: Option<String>,
    /// The tag of the lone holder's identity record, where the store
    /// keeps it apart from an owner (as [`Holder::tag`]).
    pub tag: Option<String>,
    /// Who the lone holder is, as it recorded itself, where it did
    /// ([`Locker::with_identity`](crate::Locker::with_identity)); filled by
    /// [`Locker::status`](crate::Locker::status), never by a store.
    pub who: Option<HolderInfo>,
}

/// One live holder of a name, in [`LockStatus::holders`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// A reader's shared hold; otherwise exclusive (a permit, a writer, a mutex).
    pub shared: bool,
    /// Its re-entrant holds.
    pub holds: u32,
    /// Its grant's fencing token, where the store gives them.
    pub fence: Option<FencingToken>,
    /// Its lease left on the store's clock, where the store can say.
    pub remaining: Option<Duration>,
    /// Its owner token, where the store reads it: a
    /// [`Quorum`](crate::backend::Quorum) counts each owner's nodes. Never
    /// shown, as [`LockStatus::owner`] ([`Locker::status`](crate::Locker::status) clears it).
    pub owner: Option<OwnerToken>,
    /// The name an operator gives [`Locker::force_release`](crate::Locker::force_release)
    /// to break this hold: the store's own name for it (ZooKeeper's node,
    /// etcd's key after the name's prefix) or [`holder_id`] of its owner.
    /// Not a secret as the owner token is: it cannot renew, release or
    /// proclaim as the owner; it only names the hold for a forced release.
    pub id: Option<String>,
    /// The tag naming the holder's identity record, where the store
    /// keeps it apart from the owner token (ZooKeeper's node name, etcd's
    /// session); otherwise it is read from the owner
    /// ([`OwnerToken::tag`]).
    pub tag: Option<String>,
    /// Who holds, as it recorded itself, where it did; filled by
    /// [`Locker::status`](crate::Locker::status), never by a store.
    pub who: Option<HolderInfo>,
}

impl Holder {
    /// A holder: shared or not, with `holds` holds.
    pub fn new(shared: bool, holds: u32) -> Self {
        Holder {
            shared,
            holds,
            fence: None,
            remaining: None,
            owner: None,
            id: None,
            tag: None,
            who: None,
        }
    }

    /// Sets the tag of its identity record.
    #[must_use]
    pub fn with_tag(mut self, tag: Option<String>) -> Self {
        self.tag = tag;
        self
    }

    /// Sets the name an operator breaks it by.
    #[must_use]
    pub fn with_id(mut self, id: Option<String>) -> Self {
        self.id = id;
        self
    }

    /// Sets its owner token.
    #[must_use]
    pub fn with_owner(mut self, owner: Option<OwnerToken>) -> Self {
        self.owner = owner;
        self
    }

    /// Sets its fencing token.
    #[must_use]
    pub fn with_fence(mut self, fence: Option<FencingToken>) -> Self {
        self.fence = fence;
        self
    }

    /// Sets its lease left.
    #[must_use]
    pub fn with_remaining(mut self, remaining: Option<Duration>) -> Self {
        self.remaining = remaining;
        self
    }
}

impl LockStatus {
    /// Nobody holds the key.
    pub fn free() -> Self {
        LockStatus {
            held: false,
            holds: 0,
            fence: None,
            remaining: None,
            waiters: None,
            owner: None,
            value: None,
            holders: Vec::new(),
            permits: None,
            id: None,
            tag: None,
            who: None,
        }
    }

    /// The status of a name with these live `holders` (none: free), with
    /// the totals filled in from them.
    pub fn of_holders(holders: Vec<Holder>) -> Self {
        if holders.is_empty() {
            return Self::free();
        }
        LockStatus {
            held: true,
            holds: holders
                .iter()
                .fold(0u32, |n, h| n.saturating_add(h.holds))
                .max(1),
            fence: holders.iter().filter_map(|h| h.fence).max(),
            remaining: holders.iter().filter_map(|h| h.remaining).max(),
            holders,
            ..Self::free()
        }
    }

    /// How many owners hold the name: the listed holders, or 1 for a held
    /// name whose store does not list them.
    pub fn holder_count(&self) -> usize {
        match (self.held, self.holders.len()) {
            (false, _) => 0,
            (true, 0) => 1,
            (true, n) => n,
        }
    }

    /// The name is held by readers (shared holds), not exclusively.
    pub fn is_shared(&self) -> bool {
        self.held && !self.holders.is_empty() && self.holders.iter().all(|h| h.shared)
    }

    /// Sets the permits the store keeps for the name.
    #[must_use]
    pub fn with_permits(mut self, permits: Option<u32>) -> Self {
        self.permits = permits;
        self
    }

    /// Someone holds the key, with `holds` holds.
    pub fn held(holds: u32) -> Self {
        LockStatus {
            held: true,
            holds: holds.max(1),
            ..Self::free()
        }
    }

    /// Sets the current grant's fencing token.
    #[must_use]
    pub fn with_fence(mut self, fence: Option<FencingToken>) -> Self {
        self.fence = fence;
        self
    }

    /// Sets the lease time left.
    #[must_use]
    pub fn with_remaining(mut self, remaining: Option<Duration>) -> Self {
        self.remaining = remaining;
        self
    }

    /// Sets the number of queued waiters.
    #[must_use]
    pub fn with_waiters(mut self, waiters: Option<u32>) -> Self {
        self.waiters = waiters;
        self
    }

    /// Sets the value the holder advertises.
    #[must_use]
    pub fn with_value(mut self, value: Option<Vec<u8>>) -> Self {
        self.value = value;
        self
    }

    /// Sets the holder's owner token.
    #[must_use]
    pub fn with_owner(mut self, owner: Option<OwnerToken>) -> Self {
        self.owner = owner;
        self
    }

    /// Sets the lone holder's name to break it by.
    #[must_use]
    pub fn with_id(mut self, id: Option<String>) -> Self {
        self.id = id;
        self
    }

    /// Sets the tag of the lone holder's identity record.
    #[must_use]
    pub fn with_tag(mut self, tag: Option<String>) -> Self {
        self.tag = tag;
        self
    }

    /// The tags of every holder's identity record: the store's, else the
    /// owner token's.
    pub(crate) fn tags(&self) -> Vec<String> {
        let mut tags: Vec<String> = self
            .each_holder()
            .iter()
            .filter_map(Holder::record_tag)
            .collect();
        tags.sort();
        tags.dedup();
        tags
    }

    /// Fills in who each holder is from `known` (tag to identity).
    pub(crate) fn with_who(mut self, known: &dyn Fn(&str) -> Option<HolderInfo>) -> Self {
        let lone = Holder::new(false, self.holds)
            .with_owner(self.owner.clone())
            .with_tag(self.tag.clone());
        self.who = lone.record_tag().and_then(|t| known(&t));
        for h in &mut self.holders {
            h.who = h.record_tag().and_then(|t| known(&t));
        }
        if self.who.is_none() && self.holders.len() == 1 {
            self.who = self.holders[0].who.clone();
        }
        self
    }

    /// The same status without any owner token, as applications see it:
    /// each holder named instead by its [`id`](Holder::id), which a store
    /// that names none gets from [`holder_id`] of the owner.
    #[must_use]
    pub fn without_owners(mut self) -> Self {
        if self.id.is_none() {
            self.id = self.owner.as_ref().map(holder_id);
        }
        self.owner = None;
        for h in &mut self.holders {
            if h.id.is_none() {
                h.id = h.owner.as_ref().map(holder_id);
            }
            h.owner = None;
        }
        self
    }

    /// The holder whose [`id`](Holder::id) is `id`, as [`each_holder`](Self::each_holder) lists it.
    pub fn holder(&self, id: &str) -> Option<Holder> {
        self.each_holder()
            .into_iter()
            .find(|h| h.id.as_deref() == Some(id))
    }

    /// Every holder, one entry each: the listed ones, or for a held name
    /// whose store lists none, one built from the totals.
    pub fn each_holder(&self) -> Vec<Holder> {
        if !self.held {
            return Vec::new();
        }
        if !self.holders.is_empty() {
            return self.holders.clone();
        }
        vec![Holder::new(false, self.holds)
            .with_fence(self.fence)
            .with_remaining(self.remaining)
            .with_owner(self.owner.clone())
            .with_id(self.id.clone())
            .with_tag(self.tag.clone())
            .with_who(self.who.clone())]
    }
}

impl Holder {
    /// The tag of its identity record: the store's, else its owner's.
    pub(crate) fn record_tag(&self) -> Option<String> {
        self.tag
            .clone()
            .or_else(|| self.owner.as_ref().and_then(|o| o.tag()).map(str::to_owned))
    }

    /// Sets who holds.
    #[must_use]
    pub fn with_who(mut self, who: Option<HolderInfo>) -> Self {
        self.who = who;
        self
    }
}

/// The name a hold by `owner` is shown and broken by where the store has
/// no name of its own for it: `o` and 16 hex digits of the token's
/// SHA-256. A digest, because the token itself releases the lock.
pub fn holder_id(owner: &OwnerToken) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(owner.as_str().as_bytes());
    format!("o{}", hex::encode(&digest[..8]))
}

/// The margin subtracted from every local deadline for clock-rate drift
/// between this host and the store, and for timer lateness: 1% of the TTL
/// plus 2 ms (the allowance the Redlock analysis uses).
pub fn clock_drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The local deadline for a lease of `ttl` whose request left at `sent`.
pub fn local_deadline(sent: Instant, ttl: Duration) -> Instant {
    sent + ttl.saturating_sub(clock_drift(ttl))
}
