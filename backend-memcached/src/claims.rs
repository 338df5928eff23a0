//! Semaphores and read-write locks on memcached: a name held by several
//! holders at once is one item holding the whole group, and every change
//! to it is a compare-and-swap over the version read, so two clients can
//! never both take the last permit.
//!
//! # The group's item
//!
//! The name's own item (the one a mutex would `add`) holds `#g <kind> 0`
//! (`p<N>` for a semaphore of N permits, `s` for readers, `m` when only
//! writers' marks are left), then one line per holder, `h <owner> <holds>
//! <end> <x|r|w>` (a permit, a reader, or a writer that read beside its
//! hold by a downgrade, still exclusive), and one per waiter in line, in
//! the order they came: `m <owner> <end>` for a writer waiting for the
//! readers to go, `m <owner> <end> r` for a reader waiting for a writer
//! (see `rules.rs`). A mutex's or writer's attempt that finds a group
//! reads it as such: another N is refused, and readers get the writer's
//! mark, which keeps new readers out. Earlier versions read the first
//! line as a hold by an owner that is never theirs.
//!
//! # Each holder's lease, on the server's clock
//!
//! memcached keeps one expiry per item, and a group's holders each need
//! their own. So every holder's `end` is a time on the server's clock, the
//! one it compares absolute expiries with (its start time plus its
//! monotonic seconds), and the item expires, as an absolute time, with
//! its last holder or mark. A holder is gone once the clock reaches its
//! end, exactly when an item stored until then would have expired; ends
//! are set as the mutex's TTLs are, rounded up and two seconds more (see
//! the crate docs, "Time"). The clock is read with the group, in the same
//! round trip (`clock.rs`).

use std::time::Duration;

use lockwright_core::backend::{
    judge, Acquire, AcquireRequest, Found, Grant, HoldId, Release, Renew, RenewRequest, MARK_LIFE,
};
use lockwright_core::{Claim, Error, Holder, LockKey, LockStatus, OwnerToken, Result};

use crate::clock::Fresh;
use crate::error::unexpected;
use crate::layout::{encode, store_ttl, Body, Group, Holder as Lock, Item, Member, Tag, CLOCK_LAG};
use crate::node::Node;
use crate::rules::{decide, secs, Outcome};
use crate::wire::{Commands, Reply};

/// How often a group's read-then-swap is tried when the item changed in
/// between: a group is written by every one of its holders, so a busy
/// one changes far more often than a mutex's item.
pub(crate) const GROUP_TRIES: usize = 32;
/// Where a batch of renewals puts what it found for the groups in it.
pub(crate) struct GroupRenewal<'a> {
    pub(crate) requests: &'a [RenewRequest],
    pub(crate) keys: &'a [String],
    /// The batch's writes: one `cas` per group.
    pub(crate) writes: &'a mut Commands,
    /// For each write, the requests it answers.
    pub(crate) written: &'a mut Vec<Vec<usize>>,
    pub(crate) results: &'a mut [Option<Result<Renew>>],
}

impl Node {
    /// Renews the holds the batch found in groups (`found`: the request,
    /// the group read for it, its CAS): one `cas` per group, however many
    /// of the batch's holders are in it (a `cas` each would undo each
    /// other). The clock is the one read with the batch, or `stats` when
    /// the clock item was missing: read after the groups, it can only
    /// show a hold lapsed, never a lapsed one live.
    pub(crate) async fn renew_groups(
        &self,
        to: GroupRenewal<'_>,
        found: Vec<(usize, Group, u64)>,
        clock: Result<Option<u64>>,
    ) {
        let now = match clock {
            Ok(Some(now)) => Ok(now),
            Ok(None) => self.set_clock().await,
            Err(e) => Err(e),
        };
        let now = match now {
            Ok(now) => now,
            Err(e) => {
                for (i, _, _) in found {
                    to.results[i] = Some(Err(e.clone()));
                }
                return;
            }
        };
        let mut by_key: Vec<(&str, Group, u64, Vec<usize>)> = Vec::new();
        for (i, g, cas) in found {
            let k = to.keys[i].as_str();
            match by_key.iter_mut().find(|(key, ..)| *key == k) {
                Some((.., each)) => each.push(i),
                None => by_key.push((k, g, cas, vec![i])),
            }
        }
        for (k, mut g, cas, each) in by_key {
            g.prune(now);
            let mut renewed = Vec::new();
            for i in each {
                let r = &to.requests[i];
                match g
                    .members
                    .iter_mut()
                    .find(|m| m.owner == r.hold.owner.as_str())
                {
                    Some(m) => {
                        m.end = now + secs(store_ttl(r.ttl));
                        renewed.push(i);
                    }
                    None => to.results[i] = Some(Ok(Renew::NotHeld)),
                }
            }
            if let (false, Some(at)) = (renewed.is_empty(), g.end()) {
                to.writes.cas_at(k, &g.encode(), at, cas);
                to.written.push(renewed);
            }
        }
    }

    /// A claim other than the mutex's, or any claim on a name a group
    /// holds: read with the clock, decided, and written over the version
    /// read.
    pub(crate) async fn group_acquire(&self, request: &AcquireRequest, k: &str) -> Result<Acquire> {
        let (key, owner, ttl) = (request.key(), request.owner(), request.ttl);
        let claim = request.claim();
        let granted = |holds| {
            Ok(Acquire::Acquired(Grant {
                fence: None,
                holds,
                lease: None,
            }))
        };
        let mut read = match self.fresh_group(&request.hold, k, ttl).await? {
            Some(Fresh::Granted) => return granted(1),
            Some(Fresh::Read(now, item)) => Some((now, item)),
            None => None,
        };
        for _ in 0..GROUP_TRIES {
            let (now, item) = match read.take() {
                Some(read) => read,
                None => self.read_timed(k).await?,
            };
            let end = now + secs(store_ttl(ttl));
            let (mut g, cas) = match item {
                None if claim == Claim::MUTEX => {
                    // The group left since the mutex's add found it: as
                    // the mutex's own attempt says then, come back.
                    return Ok(Acquire::Contended { retry_after: None });
                }
                None => (Group::default(), None),
                Some(Item {
                    body: Body::Lock(h),
                    cas,
                    left,
                }) => match self.beside_lock(&request.hold, h, now, left)? {
                    Ok(g) => (g, Some(cas)),
                    Err(refused) => return Ok(refused),
                },
                Some(Item {
                    body: Body::Group(g),
                    cas,
                    ..
                }) => (g, Some(cas)),
            };
            g.prune(now);
            let mark_end = now + secs(ttl.min(MARK_LIFE)) + 1;
            let outcome = decide(&request.hold, &mut g, now, end, mark_end)?;
            let mut c = Commands::default();
            match (&outcome, cas) {
                (
                    Outcome::Refused {
                        retry_after,
                        marked: false,
                    },
                    _,
                ) => {
                    return Ok(Acquire::Contended {
                        retry_after: Some(*retry_after),
                    })
                }
                (Outcome::Free, Some(cas)) => {
                    c.cas(k, &encode(owner, 1, request.value()), store_ttl(ttl), cas)
                }
                (Outcome::Free, None) => {
                    c.add(k, &encode(owner, 1, request.value()), store_ttl(ttl))
                }
                (_, Some(cas)) => c.cas_at(k, &g.encode(), g.end().unwrap_or(end), cas),
                (_, None) => c.add_at(k, &g.encode(), g.end().unwrap_or(end)),
            };
            match self.one(&c).await? {
                Reply::Stored => {
                    return match outcome {
                        Outcome::Granted(holds) => granted(holds),
                        Outcome::Free => granted(1),
                        Outcome::Refused { retry_after, .. } => Ok(Acquire::Contended {
                            retry_after: Some(retry_after),
                        }),
                    }
                }
                Reply::Exists | Reply::NotFound | Reply::NotStored => {}
                Reply::OutOfMemory(m) => return Err(self.full_alarm(&m)),
                other => return Err(unexpected(&other)),
            }
        }
        Err(changing(key))
    }

    /// A claim other than the mutex's on a name a mutex's item holds: a
    /// reader beside its writer (a downgrade) makes the item a group, the
    /// writer a member still exclusive, for the reader to join; any other
    /// is refused.
    fn beside_lock(
        &self,
        hold: &HoldId,
        h: Lock,
        now: u64,
        left: Option<u64>,
    ) -> Result<std::result::Result<Group, Acquire>> {
        let (key, owner) = (&hold.key, &hold.owner);
        let beside = hold.kind.beside().map(OwnerToken::as_str);
        let refused = |secs: u64| {
            Ok(Err(Acquire::Contended {
                retry_after: Some(Duration::from_secs(secs)),
            }))
        };
        // The item is one exclusive hold: another N, or a read by its own
        // owner, is refused.
        let found = Found {
            own_shared: (h.owner == owner.as_str()).then_some(false),
            kept: Some(1),
            readers: false,
        };
        judge(key, hold.claim(), found)?;
        match hold.claim() {
            Claim::Exclusive { .. } => refused(left.unwrap_or(0)),
            // A downgrade, or a reader to wait in line behind this writer
            // (a writer's value, an election's, stays in its item).
            Claim::Shared
                if beside == Some(h.owner.as_str()) || (beside.is_none() && h.value.is_none()) =>
            {
                // The clock was read before the item, and may have jumped
                // by two in between: the hold ends by `now + left + 2`.
                let Some(left) = left else {
                    return refused(0);
                };
                let writer_end = now + left + CLOCK_LAG.as_secs();
                // The reader joins, or waits, by the group's rules.
                let members = vec![Member {
                    owner: h.owner,
                    holds: h.holds,
                    end: writer_end,
                    tag: Tag::Writer,
                }];
                Ok(Ok(Group {
                    permits: None,
                    members,
                    marks: Vec::new(),
                }))
            }
            // A downgrade whose writer no longer holds: never a read hold
            // after a gap.
            Claim::Shared if beside.is_some() => refused(0),
            Claim::Shared => refused(left.unwrap_or(0)),
        }
    }

    /// Releases one of `owner`'s holds in the group at `k`.
    pub(crate) async fn group_release(
        &self,
        key: &LockKey,
        k: &str,
        owner: &OwnerToken,
    ) -> Result<Release> {
        for _ in 0..GROUP_TRIES {
            let (now, item) = self.read_timed(k).await?;
            let Some(Item {
                body: Body::Group(mut g),
                cas,
                ..
            }) = item
            else {
                return Ok(Release::NotHeld);
            };
            g.prune(now);
            let Some(i) = g.members.iter().position(|m| m.owner == owner.as_str()) else {
                return Ok(Release::NotHeld);
            };
            let left = g.members[i].holds - 1;
            if left == 0 {
                g.members.remove(i);
            } else {
                g.members[i].holds = left;
            }
            let mut c = Commands::default();
            match g.end() {
                Some(at) => c.cas_at(k, &g.encode(), at, cas),
                None => c.delete(k, cas),
            };
            match self.one(&c).await? {
                Reply::Stored if left == 0 => return Ok(Release::Freed),
                Reply::Stored => return Ok(Release::StillHeld(left)),
                Reply::NotFound => return Ok(Release::NotHeld),
                Reply::Exists => {}
                Reply::OutOfMemory(m) => return Err(self.full_alarm(&m)),
                other => return Err(unexpected(&other)),
            }
        }
        Err(changing(key))
    }

    /// The live holders of the group at `k`.
    pub(crate) async fn group_status(&self, k: &str) -> Result<LockStatus> {
        let (now, item) = self.read_timed(k).await?;
        let g = match item {
            Some(Item {
                body: Body::Group(mut g),
                ..
            }) => {
                g.prune(now);
                g
            }
            // Changed in between: a status is a glance.
            _ => return Ok(LockStatus::free()),
        };
        let holders = g.members.iter().map(|m| {
            // An end `e` means the lease runs out somewhere in (e − 2, e].
            let left = Duration::from_secs(m.end.saturating_sub(now).saturating_sub(2));
            Holder::new(m.tag == Tag::Reader, m.holds)
                .with_owner(OwnerToken::from_string(m.owner.clone()).ok())
                .with_remaining(Some(left))
        });
        let permits = if g.members.iter().any(|m| m.tag == Tag::Permit) {
            g.permits
        } else if g.members.iter().any(|m| m.tag == Tag::Writer) {
            Some(1)
        } else {
            None
        };
        let status = LockStatus::of_holders(holders.collect()).with_permits(permits);
        Ok(match g.members.as_slice() {
            [one] => status.with_owner(OwnerToken::from_string(one.owner.clone()).ok()),
            _ => status,
        })
    }

    /// Takes away `owner`'s mark on the group at `k`, if it left one.
    pub(crate) async fn unmark(&self, k: &str, owner: &OwnerToken) -> Result<()> {
        for _ in 0..GROUP_TRIES {
            let Some(Item {
                body: Body::Group(mut g),
                cas,
                ..
            }) = self.read(k).await?
            else {
                return Ok(());
            };
            let before = g.marks.len();
            g.marks.retain(|m| m.owner != owner.as_str());
            if g.marks.len() == before {
                return Ok(());
            }
            let mut c = Commands::default();
            match g.end() {
                Some(at) => c.cas_at(k, &g.encode(), at, cas),
                None => c.delete(k, cas),
            };
            match self.one(&c).await? {
                Reply::Stored | Reply::NotFound => return Ok(()),
                Reply::Exists => {}
                Reply::OutOfMemory(m) => return Err(self.full(&m)),
                other => return Err(unexpected(&other)),
            }
        }
        Err(Error::unavailable(format!(
            "the item {k:?} kept changing under {GROUP_TRIES} attempts"
        )))
    }
}

fn changing(key: &LockKey) -> Error {
    Error::unavailable(format!(
        "the lock {key} kept changing under {GROUP_TRIES} attempts"
    ))
}
