//! The claim rules, written once: whether a claim may share a name with
//! the holds a store finds there ([`judge`]), who holds in an ordered line
//! of claims ([`gets_the_lock`], Curator's predicate), and the errors a
//! refused claim gets. Every store whose rule runs in Rust calls `judge`
//! (etcd's line also `gets_the_lock`; ZooKeeper's queue keeps Curator's
//! own layout of it); a store whose rule runs inside the server (a Lua
//! script, an SQL statement) keeps its own expression of it and turns
//! what the server found into the same error with [`refusal`].
//!
//! The rules, on any name:
//! - every exclusive holder agrees on N (a mutex or writer is 1, a
//!   semaphore N), or a semaphore would over-grant;
//! - a name is a semaphore or a read-write lock, never both: no permits
//!   of N > 1 beside readers, no reader beside such permits;
//! - an owner's second claim is of its first claim's kind: a reader never
//!   upgrades (two upgrading readers would wait on each other for ever),
//!   and a writer reads by a downgrade, not with its own owner.
//!
//! The memory store ([`MemoryBackend`](crate::backend::MemoryBackend)) is
//! the executable model of these rules; the conformance suite plays
//! random claims against it and against each store.

use crate::error::{Error, Result};
use crate::key::{Claim, LockKey};

/// What a store found on a name, read together with a claim's attempt:
/// the facts [`judge`] needs about the live holds there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Found {
    /// Whether the asking owner's own live hold is shared, if it holds
    /// the name already (its claim re-enters).
    pub own_shared: Option<bool>,
    /// The permits the live exclusive holds keep (1 for a mutex's or a
    /// writer's), if any exclusive hold is live; 0 for a semaphore whose
    /// N the store cannot tell (a peer's that did not write it).
    pub kept: Option<u32>,
    /// Whether a live reader holds the name.
    pub readers: bool,
}

impl Found {
    /// Nothing live on the name.
    pub const NOTHING: Found = Found {
        own_shared: None,
        kept: None,
        readers: false,
    };

    /// Live holds of a semaphore keeping `n` permits; an `n` under 2
    /// (none written, as a peer's semaphore may leave it) is read as an N
    /// the store cannot tell.
    pub fn semaphore(n: u32) -> Found {
        Found {
            kept: Some(if n > 1 { n } else { 0 }),
            ..Found::NOTHING
        }
    }

    /// The asking owner's own live hold, made by `claim`, and nothing else.
    pub fn own(claim: Claim) -> Found {
        Found {
            own_shared: Some(claim.is_shared()),
            kept: claim.exclusive_permits(),
            readers: claim.is_shared(),
        }
    }
}

/// Whether `claim` on `key` may share the name with what the store
/// `found`: `Ok` when it may (as a new hold, or a re-entry when
/// `found.own_shared` is set; whether it waits is the store's to say),
/// or the refusal, an `InvalidOptions` error marked
/// [unapplied](Error::unapplied), as the store must refuse it before
/// changing anything.
///
/// # Errors
/// - the owner holds the name with a claim of the other kind (a reader
///   asking to write, or a writer to read with its own owner);
/// - an exclusive claim of N while the holds keep another N;
/// - permits of N > 1 while readers hold, or a read while a semaphore's
///   permits are held (`kept` other than 1).
pub fn judge(key: &LockKey, claim: Claim, found: Found) -> Result<()> {
    if let Some(own_shared) = found.own_shared {
        if own_shared != claim.is_shared() {
            return Err(claim_changed(key, own_shared));
        }
    }
    match claim {
        Claim::Exclusive { permits } => {
            if let Some(kept) = found.kept.filter(|&kept| kept != permits) {
                return Err(permits_mismatch(key, kept, permits));
            }
            if found.readers && permits > 1 {
                return Err(semaphore_or_rwlock(key, permits, true));
            }
        }
        Claim::Shared => {
            if let Some(kept) = found.kept.filter(|&kept| kept != 1) {
                return Err(semaphore_or_rwlock(key, kept, false));
            }
        }
    }
    Ok(())
}

/// The refusal of `claim` on `key` by a store whose own rule (a script, a
/// statement) refused it on what it `found`: [`judge`]'s error, so every
/// store words a refusal alike. If the rules would have admitted the
/// claim, the store and the rules disagree: a `Backend` error says so.
pub fn refusal(key: &LockKey, claim: Claim, found: Found) -> Error {
    match judge(key, claim, found) {
        Err(e) => e,
        Ok(()) => Error::backend(format!(
            "the store refused a {claim} claim on {:?} that the claim rules admit \
             (it found {found:?})",
            key.as_str()
        )),
    }
}

/// The refusal of an owner's second claim on `key` that the store cannot
/// count with the hold it keeps for that owner (`held_shared`: whether
/// that hold is shared): the rules' refusal of a reader asking to write,
/// or of a writer asking to read with its own owner. A store that keeps a
/// hold in a form it cannot re-enter (SQL's downgraded writer, among its
/// readers) refuses its owner's write with the writer's words.
pub fn reentry_refused(key: &LockKey, held_shared: bool) -> Error {
    claim_changed(key, held_shared)
}

/// Whether a claim whose place in an ordered line of claims on one name
/// comes after the claims `ahead` (in line order) holds now: an exclusive
/// claim of N when fewer than N claims are ahead of it, a shared one when
/// only shared claims are (Curator's `getsTheLock`, and etcd's, for the
/// mutex and the read-write lock, with the semaphore's N beside).
pub fn gets_the_lock(claim: Claim, ahead: impl IntoIterator<Item = Claim>) -> bool {
    let mut ahead = ahead.into_iter();
    match claim {
        Claim::Exclusive { permits } => ahead.take(permits as usize).count() < permits as usize,
        Claim::Shared => ahead.all(Claim::is_shared),
    }
}

/// The error for a claim whose permits differ from the ones the store
/// keeps for `key` while it is held.
fn permits_mismatch(key: &LockKey, kept: u32, asked: u32) -> Error {
    Error::invalid_options(format!(
        "{:?} is held with {} and this claim asks for {}: every holder of a name must agree on \
         its permits",
        key.as_str(),
        permits(kept),
        permits(asked)
    ))
    .unapplied()
}

/// `n` permits in words, with the kind of lock they make.
fn permits(n: u32) -> String {
    match n {
        0 => "permits of an N it did not write (a semaphore)".to_owned(),
        1 => "1 permit (a mutex or a write lock)".to_owned(),
        n => format!("{n} permits (a semaphore)"),
    }
}

/// The error for a read claim on a name held as a semaphore of `n`
/// (`reading: false`), or a semaphore's claim of `n` on a name that
/// readers hold (`reading: true`).
fn semaphore_or_rwlock(key: &LockKey, n: u32, reading: bool) -> Error {
    let k = key.as_str();
    Error::invalid_options(if reading {
        format!(
            "{k:?} is held by readers (a read-write lock) and this claim asks for {}: a name is \
             one or the other",
            permits(n)
        )
    } else {
        format!(
            "{k:?} is held with {} and this claim asks for a read hold (a read-write lock): a \
             name is one or the other",
            permits(n)
        )
    })
    .unapplied()
}

/// The error for an owner that holds `key` and asks for it again with
/// another kind of claim.
fn claim_changed(key: &LockKey, held_shared: bool) -> Error {
    let k = key.as_str();
    Error::invalid_options(if held_shared {
        format!(
            "{k:?}: this owner holds a read lock, which cannot be upgraded to a write lock \
             (release it, then take the write lock)"
        )
    } else {
        format!(
            "{k:?}: this owner holds it exclusively; a writer takes a read lock by a downgrade \
             (ReadWriteLock::downgrade), not with the same owner"
        )
    })
    .unapplied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn key() -> LockKey {
        LockKey::new("k").unwrap()
    }

    fn refused(claim: Claim, found: Found) -> String {
        let e = judge(&key(), claim, found).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidOptions);
        assert!(e.is_unapplied());
        e.to_string()
    }

    #[test]
    fn every_rule_refuses_with_its_own_words() {
        let three = Claim::Exclusive { permits: 3 };
        let held = |kept| Found {
            kept: Some(kept),
            ..Found::NOTHING
        };
        let read = Found {
            readers: true,
            ..Found::NOTHING
        };
        assert!(refused(three, held(2)).contains("held with 2 permits"));
        assert!(refused(Claim::MUTEX, held(3)).contains("asks for 1 permit"));
        assert!(refused(three, read).contains("held by readers"));
        assert!(refused(Claim::Shared, held(3)).contains("asks for a read hold"));
        assert!(refused(Claim::Shared, held(0)).contains("an N it did not write"));
        let reader = Found {
            own_shared: Some(true),
            ..read
        };
        assert!(refused(Claim::MUTEX, reader).contains("cannot be upgraded"));
        let writer = Found {
            own_shared: Some(false),
            ..held(1)
        };
        assert!(refused(Claim::Shared, writer).contains("by a downgrade"));
    }

    #[test]
    fn agreeing_claims_are_admitted() {
        let k = key();
        for claim in [Claim::MUTEX, Claim::Shared, Claim::Exclusive { permits: 4 }] {
            judge(&k, claim, Found::NOTHING).unwrap();
        }
        let mutex = Found {
            kept: Some(1),
            ..Found::NOTHING
        };
        judge(&k, Claim::MUTEX, mutex).unwrap();
        // A reader waits behind a writer; it is not refused.
        judge(&k, Claim::Shared, mutex).unwrap();
        let readers = Found {
            readers: true,
            ..Found::NOTHING
        };
        judge(&k, Claim::MUTEX, readers).unwrap();
        judge(&k, Claim::Shared, readers).unwrap();
        let own = Found {
            own_shared: Some(true),
            ..readers
        };
        judge(&k, Claim::Shared, own).unwrap();
    }

    #[test]
    fn a_refusal_the_rules_admit_is_a_backend_error() {
        let e = refusal(&key(), Claim::MUTEX, Found::NOTHING);
        assert_eq!(e.kind(), ErrorKind::Backend);
    }

    #[test]
    fn the_line_predicate() {
        let (m, r) = (Claim::MUTEX, Claim::Shared);
        let three = Claim::Exclusive { permits: 3 };
        assert!(gets_the_lock(m, []));
        assert!(!gets_the_lock(m, [m]));
        assert!(!gets_the_lock(m, [r]));
        assert!(gets_the_lock(r, [r, r]));
        assert!(!gets_the_lock(r, [r, m]));
        assert!(gets_the_lock(three, [three, three]));
        assert!(!gets_the_lock(three, [three, three, three]));
    }
}
