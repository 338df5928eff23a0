//! The lock contract and the client-side machinery every lockwright backend
//! shares.
//!
//! A store implements the small [`LockBackend`](backend::LockBackend) trait: one owner-checked
//! attempt to acquire, release and renew, plus optional release
//! notifications. Applications hold a [`Locker`], which adds what every store
//! needs the same way: waiting with notification or jittered backoff,
//! [`LockGuard`]s released on drop, a batched renewal watchdog, the lost-lock
//! signal, re-entrancy by owner and all-or-nothing multi-lock.
//!
//! Two doors: applications use what the crate root exports ([`Locker`],
//! [`LockOptions`], [`LockGuard`], [`Error`], [`FencingToken`], …);
//! backend authors find the contract and their toolkit under [`backend`],
//! with [`MemoryBackend`](backend::MemoryBackend), the in-process
//! reference implementation.

/// Logs a hold's event at WARN, or at DEBUG when the hold is a locker's
/// identity record: the record is bookkeeping, and the lock it stands
/// beside says the same thing in its own line.
macro_rules! hold_event {
    ($key:expr, $($rest:tt)+) => {
        if $crate::identity::is_record_name($key.as_str()) {
            tracing::debug!(key = %$key, $($rest)+)
        } else {
            tracing::warn!(key = %$key, $($rest)+)
        }
    };
}

mod acquire;
mod attempts;
mod audit;
pub mod backend;
mod background;
mod claims;
mod driver;
mod election;
mod error;
mod guard;
pub mod identity;
mod key;
mod lease;
mod locker;
mod memory;
pub mod meter;
mod operate;
mod options;
mod outage;
mod params;
mod permits;
mod quorum;
mod redact;
mod request;
mod scoped;
mod stand;
mod sync;
mod tls;
mod url;
mod watchdog;

pub use election::{Election, Leader, Leadership, OBSERVE_EVERY};
pub use error::{Error, ErrorKind, Result};
pub use guard::{LockGuard, LostSignal, MultiGuard};
pub use identity::HolderInfo;
pub use key::{
    Claim, FencingToken, IntoLockKey, LockKey, OwnerToken, MAX_KEY_LEN, MAX_PERMITS, MAX_VALUE_LEN,
};
pub use lease::{holder_id, Holder, Lease, LeaseState, LockStatus, LostReason};
pub use locker::Locker;
pub use options::{LockOptions, WaitPolicy, MAX_TTL};
pub use permits::{Mutex, Permits, ReadWriteLock, Semaphore};
pub use stand::{LeaderListener, Reign, Stand};
pub use watchdog::RenewalFailure;
