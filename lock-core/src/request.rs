//! What the core asks a backend, with every input in sight: the hold a
//! request is about ([`HoldId`]: key, owner, kind), and the acquire and
//! renewal requests built on it. An [`OwnerToken`] is only an identity.
//! Beside them, the core's own `LockRequest`: what one acquire of a
//! [`Locker`](crate::Locker) asks for, from which its attempts are made.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::key::{check_value, Claim, LockKey, OwnerToken};

/// What kind of hold a request makes or is about.
///
/// The grant rules are the [`Claim`] each kind makes
/// ([`claim`](Self::claim)); a writer is told apart from a mutex holder
/// only for stores whose peers name them apart (ZooKeeper, in Curator's
/// layouts), and a reader may stand beside a writer's hold (a downgrade).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum HoldKind {
    /// A mutex: one exclusive holder.
    #[default]
    Mutex,
    /// One of a semaphore's `permits` permits. A semaphore of one permit
    /// is a mutex: `Permit { permits: 1 }` makes the mutex's claim, and
    /// [`of_claim`](Self::of_claim) names it `Mutex`.
    Permit {
        /// How many holders the name admits at once.
        permits: u32,
    },
    /// A read-write lock's writer: exclusive, granted by the mutex's rule.
    Writer,
    /// A read-write lock's reader: shares the name with other readers.
    Reader {
        /// The writer whose hold this reader is granted beside (a
        /// downgrade): the store grants it while that writer holds the
        /// name, whoever waits, as the writer could release and read at
        /// once.
        beside: Option<OwnerToken>,
    },
}

impl HoldKind {
    /// The kind that makes `claim`: a mutex for one exclusive permit, a
    /// semaphore's permit for more, a reader (beside no writer) for a
    /// shared claim.
    pub fn of_claim(claim: Claim) -> HoldKind {
        match claim {
            Claim::Exclusive { permits: 1 } => HoldKind::Mutex,
            Claim::Exclusive { permits } => HoldKind::Permit { permits },
            Claim::Shared => HoldKind::Reader { beside: None },
        }
    }

    /// The claim this kind makes in the grant rules.
    pub fn claim(&self) -> Claim {
        match self {
            HoldKind::Mutex | HoldKind::Writer => Claim::MUTEX,
            HoldKind::Permit { permits } => Claim::Exclusive { permits: *permits },
            HoldKind::Reader { .. } => Claim::Shared,
        }
    }

    /// Whether this is a read-write lock's writer.
    pub fn is_writer(&self) -> bool {
        matches!(self, HoldKind::Writer)
    }

    /// The writer a reader is granted beside, if any.
    pub fn beside(&self) -> Option<&OwnerToken> {
        match self {
            HoldKind::Reader { beside } => beside.as_ref(),
            _ => None,
        }
    }
}

/// One hold in the store: the key, the owner that proves it, and its
/// kind. Release, renewal, proclaim and abandon are each about one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HoldId {
    /// The key held.
    pub key: LockKey,
    /// The owner that holds it.
    pub owner: OwnerToken,
    /// What kind of hold it is.
    pub kind: HoldKind,
}

impl HoldId {
    /// The hold of `key` by `owner` of `kind`.
    pub fn new(key: LockKey, owner: OwnerToken, kind: HoldKind) -> Self {
        HoldId { key, owner, kind }
    }

    /// A mutex hold of `key` by `owner`.
    pub fn mutex(key: LockKey, owner: OwnerToken) -> Self {
        HoldId::new(key, owner, HoldKind::Mutex)
    }

    /// The claim the hold makes in the grant rules.
    pub fn claim(&self) -> Claim {
        self.kind.claim()
    }
}

/// One attempt to take a hold ([`LockBackend::try_acquire`](crate::backend::LockBackend::try_acquire)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    /// The hold asked for.
    pub hold: HoldId,
    /// The lease asked for, on the store's clock.
    pub ttl: Duration,
    /// The value a store that keeps values writes with the first grant
    /// to this owner (a candidate's advertised value), so the lock is never
    /// seen held without it.
    pub value: Option<Arc<[u8]>>,
    /// The ticket of a caller prepared to wait, given after
    /// [`watch`](crate::backend::LockBackend::watch) with the same ticket:
    /// a [fair](crate::backend::Capabilities::fair) store queues it when
    /// the key is held. `None`: a single attempt.
    pub ticket: Option<OwnerToken>,
}

impl AcquireRequest {
    /// A single attempt at `hold` for `ttl`, with no value.
    pub fn new(hold: HoldId, ttl: Duration) -> Self {
        AcquireRequest {
            hold,
            ttl,
            value: None,
            ticket: None,
        }
    }

    /// A single attempt at a mutex hold of `key` by `owner`.
    pub fn mutex(key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Self {
        AcquireRequest::new(HoldId::mutex(key.clone(), owner.clone()), ttl)
    }

    /// The same attempt, made by a caller waiting as `ticket`.
    #[must_use]
    pub fn waiting(mut self, ticket: &OwnerToken) -> Self {
        self.ticket = Some(ticket.clone());
        self
    }

    /// The same attempt, carrying `value` for the store to write with
    /// the grant.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`](crate::ErrorKind::InvalidOptions) for a
    /// value over [`MAX_VALUE_LEN`](crate::MAX_VALUE_LEN) bytes.
    pub fn with_value(mut self, value: impl Into<Vec<u8>>) -> Result<Self> {
        self.value = Some(Arc::from(check_value(value.into())?));
        Ok(self)
    }

    /// The key asked for.
    pub fn key(&self) -> &LockKey {
        &self.hold.key
    }

    /// The owner asking.
    pub fn owner(&self) -> &OwnerToken {
        &self.hold.owner
    }

    /// The claim asked for in the grant rules.
    pub fn claim(&self) -> Claim {
        self.hold.claim()
    }

    /// The value to write with the grant, if any.
    pub fn value(&self) -> Option<&[u8]> {
        self.value.as_deref()
    }
}

/// One lease to renew in [`LockBackend::renew`](crate::backend::LockBackend::renew).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewRequest {
    /// The hold to renew.
    pub hold: HoldId,
    /// The new lease length, from now on the store's clock.
    pub ttl: Duration,
    /// The value the hold was granted with, for a store that grants it
    /// again where a node lost it (a [`Quorum`](crate::backend::Quorum)
    /// restoring a vote). Renewal itself never writes it.
    pub value: Option<Arc<[u8]>>,
}

impl RenewRequest {
    /// A renewal of `hold` for `ttl`.
    pub fn new(hold: HoldId, ttl: Duration) -> Self {
        RenewRequest {
            hold,
            ttl,
            value: None,
        }
    }

    /// The same renewal, of a hold granted with `value`.
    #[must_use]
    pub fn granted_with(mut self, value: Option<Arc<[u8]>>) -> Self {
        self.value = value;
        self
    }

    /// The key held.
    pub fn key(&self) -> &LockKey {
        &self.hold.key
    }

    /// Its owner.
    pub fn owner(&self) -> &OwnerToken {
        &self.hold.owner
    }
}

/// What one acquire asks for: the hold (key, owner, kind), the value it
/// carries, and what that owner is.
#[derive(Debug)]
pub(crate) struct LockRequest {
    /// The hold to take.
    pub(crate) hold: HoldId,
    /// The value written with the grant (a candidate's).
    pub(crate) value: Option<Arc<[u8]>>,
    /// The owner holds nothing yet (it was just drawn), so whatever an
    /// abandoned attempt may have been granted is released, where a
    /// caller's own owner may hold holds to keep.
    pub(crate) fresh_owner: bool,
    /// An election's campaign (the `primitive` label of its metrics).
    pub(crate) campaign: bool,
}

impl LockRequest {
    /// A mutex acquire of `key` as the caller's own `owner`, or, for
    /// `None`, as an owner drawn now.
    pub(crate) fn new(key: LockKey, owner: Option<OwnerToken>) -> Self {
        let fresh_owner = owner.is_none();
        let owner = owner.unwrap_or_else(OwnerToken::generate);
        LockRequest {
            hold: HoldId::mutex(key, owner),
            value: None,
            fresh_owner,
            campaign: false,
        }
    }

    /// The same acquire, of a hold of `kind`.
    pub(crate) fn of_kind(mut self, kind: HoldKind) -> Self {
        self.hold.kind = kind;
        self
    }

    /// The same acquire, by an owner the caller just drew for it.
    pub(crate) fn fresh(mut self) -> Self {
        self.fresh_owner = true;
        self
    }

    /// The same acquire, writing `value` with the grant (not a campaign).
    pub(crate) fn with_value(mut self, value: Vec<u8>) -> Self {
        self.value = Some(Arc::from(value));
        self
    }

    /// The same acquire, an election's campaign advertising `value`.
    pub(crate) fn campaigning(mut self, value: Vec<u8>) -> Self {
        self.value = Some(Arc::from(value));
        self.campaign = true;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_make_their_claims() {
        assert_eq!(HoldKind::of_claim(Claim::MUTEX), HoldKind::Mutex);
        assert_eq!(
            HoldKind::of_claim(Claim::Exclusive { permits: 3 }),
            HoldKind::Permit { permits: 3 }
        );
        assert_eq!(HoldKind::of_claim(Claim::Shared).claim(), Claim::Shared);
        assert_eq!(HoldKind::Writer.claim(), Claim::MUTEX);
        assert!(HoldKind::Writer.is_writer() && !HoldKind::Mutex.is_writer());
        let w = OwnerToken::generate();
        let r = HoldKind::Reader {
            beside: Some(w.clone()),
        };
        assert_eq!(r.beside(), Some(&w));
        assert_eq!(HoldKind::Mutex.beside(), None);
    }

    #[test]
    fn owners_compare_by_token_alone() {
        let a = OwnerToken::generate();
        let b = OwnerToken::from_string(a.as_str()).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, OwnerToken::generate());
    }
}
