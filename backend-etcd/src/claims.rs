//! Semaphores and read-write locks in the mutex's one line: each
//! contender's key says its kind in its value, and the line's order by
//! create revision decides who holds.
//!
//! - A mutex's or writer's key (an exclusive claim of one) holds when it
//!   is first, as Go's `concurrency.Mutex` decides; its value is empty
//!   (or an election's proposal), as Go's. So a Go mutex or `etcdctl
//!   lock` on the name is a writer of our read-write lock.
//! - A semaphore's permit has the value `lockwright:permits=N`, and holds
//!   while fewer than N keys are before it: the first N hold, and every
//!   key before ours, waiting or not, is ahead of us (arrival order).
//! - A reader's key has the value `lockwright:shared`, and holds while
//!   every key before it is a reader's. A writer in line is before every
//!   later reader, so a waiting writer stops new readers.
//! - A writer's downgrade: the reader's hold is the writer's own key, so
//!   it keeps the writer's place in line; when the writer lets go and the
//!   reader stays, the key is rewritten in place as a reader's (its create
//!   revision, and so its place, unchanged), and a writer that queued
//!   behind ours stays behind it.
//!
//! Every holder of a name must agree on N (a semaphore's permits, 1 for
//! a mutex or writer), and a name is a semaphore or a read-write lock: a
//! claim that meets holders of another kind is refused, its key deleted
//! before the refusal is reported. Keys waiting in line do not count: a
//! claim that agrees with the holders is not turned away by a waiter's
//! (though a refused key that finds itself first, as the holders leave
//! in the moment before it is deleted, is taken for the holder then).

use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};
use lockwright_core::backend::{
    gets_the_lock, judge, lock_unpoisoned, Acquire, AcquireRequest, Found, HoldId, Release,
};
use lockwright_core::{Claim, LockKey, OwnerToken, Result};

use crate::layout::first_created;
use crate::state::{fence, Hold, Inner};

/// A reader's key's value.
pub(crate) const SHARED: &[u8] = b"lockwright:shared";
/// A semaphore permit's key's value, before its N.
const PERMITS: &str = "lockwright:permits=";

/// The claim a key in the line makes, read from its value.
pub(crate) fn claim_of(value: &[u8]) -> Claim {
    if value == SHARED {
        return Claim::Shared;
    }
    let permits = std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.strip_prefix(PERMITS))
        .and_then(|n| n.parse::<u32>().ok())
        .filter(|n| *n > 1);
    Claim::Exclusive {
        permits: permits.unwrap_or(1),
    }
}

/// The value the key of `request`'s owner carries: its kind, or for a
/// mutex or writer its advertised value (Go's: empty, or an election's
/// proposal).
///
/// # Errors
/// `InvalidOptions` for an advertised value in this module's own form
/// (see [`check_value`]).
pub(crate) fn value_of(request: &AcquireRequest) -> Result<Vec<u8>> {
    Ok(match request.claim() {
        Claim::Shared => SHARED.to_vec(),
        Claim::Exclusive { permits: 1 } => {
            check_value(request.value().unwrap_or_default())?.to_vec()
        }
        Claim::Exclusive { permits } => format!("{PERMITS}{permits}").into_bytes(),
    })
}

/// Refuses an advertised value (a leader's) that starts with
/// `lockwright:`: it would read as a reader's or a semaphore's key, and
/// let readers in beside the leader or turn away the name's claims.
///
/// # Errors
/// `InvalidOptions`, [unapplied](lockwright_core::Error::unapplied).
pub(crate) fn check_value(value: &[u8]) -> Result<&[u8]> {
    if value.starts_with(b"lockwright:") {
        return Err(lockwright_core::Error::invalid_options(
            "on etcd a leader's value may not start with \"lockwright:\": keys with such values \
             are semaphore permits and readers",
        )
        .unapplied());
    }
    Ok(value)
}

/// What an attempt reads of the line with its put: the first key for a
/// mutex or writer (Go's `Mutex.Lock` transaction, to the letter), the
/// whole line for the others.
pub(crate) fn line_read(claim: Claim) -> GetOptions {
    if claim == Claim::MUTEX {
        first_created()
    } else {
        GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
    }
}

/// Whether our key, made at `mine`, holds a `claim` on `key`, given the
/// `line` read with [`line_read`] (ours in it, by create revision).
///
/// # Errors
/// `InvalidOptions` ([unapplied](lockwright_core::Error::unapplied)) when
/// another key of the line makes a claim ours cannot share the name with.
pub(crate) fn holds(key: &LockKey, claim: Claim, mine: i64, line: &[KeyValue]) -> Result<bool> {
    // Only holders keep the name's kind and N: a key waiting in line, or
    // one of an attempt just refused and not yet deleted, must not turn
    // away a claim that agrees with the holders.
    let others: Vec<KeyValue> = line
        .iter()
        .filter(|kv| kv.create_revision() != mine)
        .cloned()
        .collect();
    let held: Vec<Claim> = holders(&others)
        .iter()
        .map(|kv| claim_of(kv.value()))
        .collect();
    let found = Found {
        own_shared: None,
        kept: held.iter().find_map(|c| c.exclusive_permits()),
        readers: held.iter().any(|c| c.is_shared()),
    };
    judge(key, claim, found)?;
    // Our key must be there (first, in a read of the first key alone): a
    // key deleted from outside (`etcdctl del`) holds nothing, though no
    // key is before it any more.
    if !line.iter().any(|kv| kv.create_revision() == mine) {
        return Ok(false);
    }
    let ahead = line
        .iter()
        .filter(|kv| kv.create_revision() < mine)
        .map(|kv| claim_of(kv.value()));
    Ok(gets_the_lock(claim, ahead))
}

/// The keys of `line` (by create revision) that hold now: of the first
/// key's kind, the first N of a semaphore's among the first N places (a
/// key of another kind there is refused, not held), the readers at its
/// head, or its first key alone.
pub(crate) fn holders(line: &[KeyValue]) -> Vec<&KeyValue> {
    let Some(first) = line.first() else {
        return Vec::new();
    };
    let kind = claim_of(first.value());
    let places = match kind {
        Claim::Exclusive { permits } => usize::try_from(permits).unwrap_or(usize::MAX),
        Claim::Shared => line
            .iter()
            .take_while(|kv| claim_of(kv.value()) == Claim::Shared)
            .count(),
    };
    line.iter()
        .take(places)
        .filter(|kv| claim_of(kv.value()) == kind)
        .collect()
}

impl Inner {
    /// A writer's downgrade: a read hold on `writer`'s own key, held at
    /// once in the writer's place in line (see the module docs).
    /// `Contended` if the writer holds no longer. The key is written
    /// again (as it is, compared on its create revision, with its lease
    /// kept alive beside), and the write's revision is the read hold's
    /// fence: above the writer's, as every later grant's is.
    pub(crate) async fn beside(&self, reader: &HoldId, writer: &OwnerToken) -> Result<Acquire> {
        let no_writer = Acquire::Contended { retry_after: None };
        let key = &reader.key;
        let id = (key.clone(), writer.clone());
        let found = lock_unpoisoned(&self.held).get(&id).cloned();
        let Some(w) = found.filter(|h| h.claim == Claim::MUTEX && !h.session.is_dead()) else {
            return Ok(no_writer);
        };
        let (alive, written) = futures::join!(w.session.keep_alive(), w.rewrite(b""));
        let (Some(rev), true) = (written?, alive?) else {
            self.forget(&id, &w);
            return Ok(no_writer);
        };
        let mut grant = self.hold(reader, w.key, w.rev, w.session);
        grant.fence = fence(rev);
        if let Some(h) = lock_unpoisoned(&self.held).get_mut(&(key.clone(), reader.owner.clone())) {
            h.fence = rev;
        }
        Ok(Acquire::Acquired(grant))
    }

    /// A downgraded writer lets go: its key stays for the reader beside
    /// it, rewritten as a reader's (on the same lease, compared on its
    /// create revision, so its place in line is kept).
    pub(crate) async fn leave_to_reader(&self, hold: &Hold) -> Result<Release> {
        Ok(if hold.rewrite(SHARED).await?.is_some() {
            Release::Freed
        } else {
            Release::NotHeld
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lockwright_core::backend::HoldKind;

    use super::*;

    fn request(claim: Claim) -> AcquireRequest {
        let hold = HoldId::new(
            LockKey::new("k").unwrap(),
            OwnerToken::generate(),
            HoldKind::of_claim(claim),
        );
        AcquireRequest::new(hold, Duration::from_secs(5))
    }

    #[test]
    fn values_say_the_claim_and_go_s_are_a_writer_s() {
        for claim in [Claim::MUTEX, Claim::Shared, Claim::permits(3).unwrap()] {
            assert_eq!(claim_of(&value_of(&request(claim)).unwrap()), claim);
        }
        let posing = request(Claim::MUTEX)
            .with_value("lockwright:shared")
            .unwrap();
        assert!(
            value_of(&posing).is_err(),
            "a leader's value posing as a reader's"
        );
        assert_eq!(claim_of(b""), Claim::MUTEX);
        assert_eq!(claim_of(b"an election's proposal"), Claim::MUTEX);
        assert_eq!(claim_of(b"lockwright:permits=x"), Claim::MUTEX);
    }
}
