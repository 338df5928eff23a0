//! The lock contract and the client-side machinery every locksmith backend
//! shares.
//!
//! A store implements the small [`LockBackend`] trait: one owner-checked
//! attempt to acquire, release and renew, plus optional release
//! notifications. Applications hold a [`Locker`], which adds what every store
//! needs the same way: waiting with notification or jittered backoff,
//! [`LockGuard`]s released on drop, a batched renewal watchdog, the lost-lock
//! signal, re-entrancy by owner and all-or-nothing multi-lock.
//!
//! [`MemoryBackend`] is the in-process reference implementation.

mod backend;
mod background;
mod error;
mod guard;
mod key;
mod lease;
mod locker;
mod memory;
mod options;
mod url;
mod watchdog;

pub use backend::{
    Acquire, Binding, Capabilities, FencingToken, Grant, LockBackend, Notice, Release, Renew,
    RenewRequest, Watch,
};
pub use error::{Error, ErrorKind, Result};
pub use guard::{LockGuard, MultiGuard};
pub use key::{IntoLockKey, LockKey, OwnerToken, MAX_KEY_LEN};
pub use lease::{clock_drift, local_deadline, Lease, LeaseState, LostReason};
pub use locker::Locker;
pub use memory::MemoryBackend;
pub use options::{validate_ttl, LockOptions, WaitPolicy, MAX_TTL};
pub use url::{check_userinfo, duration_param, reject_unknown_params, take_params, RedactedUrl};

/// Re-exported so backends implement [`LockBackend`] with the same macro version.
pub use async_trait::async_trait;
