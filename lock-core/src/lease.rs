//! What a holder knows about its lease: the grant, and its live state.

use std::time::{Duration, Instant};

use crate::key::FencingToken;
use crate::key::{LockKey, OwnerToken};

/// Why a held lock was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LostReason {
    /// Renewal kept failing until the local deadline; someone else may take
    /// the lock from now on.
    Expired,
    /// The store answered that this owner no longer holds the key.
    NotHeld,
}

/// The live state of a guard's lease, as the watchdog sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// One granted lock: who holds what, with which fencing token, until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The key held.
    pub key: LockKey,
    /// The owner token that proves it.
    pub owner: OwnerToken,
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
