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
//! hold by a downgrade, still exclusive), and one per writer waiting for
//! the readers to go, `m <owner> <end>`. A mutex's or writer's attempt
//! that finds a group reads it as such: another N is refused, and readers
//! get the writer's mark, which keeps new readers out. Earlier versions
//! read the first line as a hold by an owner that is never theirs.
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

use locksmith_core::backend::{
    claim_changed, permits_mismatch, semaphore_or_rwlock, Acquire, Grant, Release, Renew,
    RenewRequest, MARK_LIFE,
};
use locksmith_core::{Claim, Error, Holder, LockKey, LockStatus, OwnerToken, Result};

use crate::error::unexpected;
use crate::layout::{encode, store_ttl, Body, Group, Holder as Lock, Item, Member, Tag, CLOCK_LAG};
use crate::node::Node;
use crate::wire::{Commands, Reply};

/// How often a group's read-then-swap is tried when the item changed in
/// between: a group is written by every one of its holders, so a busy
/// one changes far more often than a mutex's item.
pub(crate) const GROUP_TRIES: usize = 32;
/// The most holders one group keeps: memcached's items hold 1 MB, and a
/// holder's line up to about 150 bytes. A semaphore has fewer permits
/// ([`locksmith_core::MAX_PERMITS`]); a reader past this waits.
const MAX_MEMBERS: usize = 4096;
/// Whole seconds, rounded up.
fn secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// What a claim on a group comes to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Granted: the owner's holds now (the group changed).
    Granted(u32),
    /// Nobody holds the name (marks aside): a mutex's or writer's claim
    /// takes it as a mutex's item.
    Free,
    /// Refused until about `retry_after`; `marked`: the group changed (a
    /// writer's mark) and must be written.
    Refused { retry_after: Duration, marked: bool },
}

/// The rules of [`Claim`] applied to a group whose lapsed holders and
/// marks were pruned at `now`: `end` is a new hold's end, `mark_end` a
/// writer's mark's.
pub(crate) fn decide(
    key: &LockKey,
    owner: &OwnerToken,
    g: &mut Group,
    now: u64,
    end: u64,
    mark_end: u64,
) -> Result<Outcome> {
    let me = owner.as_str();
    let claim = owner.claim();
    let wait = |until: u64| Duration::from_secs(until.saturating_sub(now));
    // The permits kept: a semaphore's N, or 1 while a downgraded writer
    // (exclusive) holds.
    let kept = g
        .permits
        .or_else(|| g.members.iter().any(|m| m.tag == Tag::Writer).then_some(1));
    if let Some(m) = g.members.iter_mut().find(|m| m.owner == me) {
        let shared = m.tag == Tag::Reader;
        if shared != claim.is_shared() {
            return Err(claim_changed(key, shared));
        }
        if let (Some(asked), Some(kept)) = (claim.exclusive_permits(), kept) {
            if asked != kept {
                return Err(permits_mismatch(key, kept, asked));
            }
        }
        m.holds = m.holds.saturating_add(1);
        m.end = m.end.max(end);
        return Ok(Outcome::Granted(m.holds));
    }
    let soonest =
        |f: &dyn Fn(&Member) -> bool| g.members.iter().filter(|m| f(m)).map(|m| m.end).min();
    let readers = soonest(&|m| m.tag == Tag::Reader);
    let join = |g: &mut Group, tag| {
        g.members.push(Member {
            owner: me.to_owned(),
            holds: 1,
            end,
            tag,
        });
        Ok(Outcome::Granted(1))
    };
    match claim {
        Claim::Exclusive { permits } => {
            if let Some(kept) = kept.filter(|&kept| kept != permits) {
                return Err(permits_mismatch(key, kept, permits));
            }
            if readers.is_some() && permits > 1 {
                return Err(semaphore_or_rwlock(key, permits, true));
            }
            if g.members.is_empty() {
                if permits == 1 && g.marks.iter().all(|(o, _)| o == me) {
                    return Ok(Outcome::Free);
                }
                if permits == 1 {
                    // Other writers wait for readers: holding as a member,
                    // not a mutex's item, keeps their marks, so readers
                    // still wait when this writer goes.
                    g.marks.retain(|(o, _)| o != me);
                    return join(g, Tag::Writer);
                }
                // A semaphore has no use for a writer's marks.
                g.marks.clear();
                g.permits = Some(permits);
                return join(g, Tag::Permit);
            }
            if let Some(until) = readers {
                // Stop new readers until this writer is served or gives up.
                g.marks.retain(|(o, _)| o != me);
                g.marks.push((me.to_owned(), mark_end));
                return Ok(Outcome::Refused {
                    retry_after: wait(until),
                    marked: true,
                });
            }
            if g.members.len() < permits as usize {
                return join(g, Tag::Permit);
            }
            Ok(Outcome::Refused {
                retry_after: wait(soonest(&|_| true).unwrap_or(now)),
                marked: false,
            })
        }
        Claim::Shared => {
            if let Some(kept) = g.permits {
                return Err(semaphore_or_rwlock(key, kept, false));
            }
            let writer = soonest(&|m| m.tag == Tag::Writer);
            if let Some(w) = owner.writer() {
                let writers = g.members.iter().filter(|m| m.tag == Tag::Writer);
                if writer.is_some() && writers.clone().all(|m| m.owner == w) {
                    return join(g, Tag::Reader);
                }
                // A downgrade whose writer no longer holds: refused, never
                // a read hold after a gap.
                return Ok(Outcome::Refused {
                    retry_after: Duration::ZERO,
                    marked: false,
                });
            }
            let marked = g.marks.iter().map(|m| m.1).max();
            let crowded = (g.members.len() >= MAX_MEMBERS).then(|| soonest(&|_| true));
            match writer.or(marked).or(crowded.flatten()) {
                Some(until) => Ok(Outcome::Refused {
                    retry_after: wait(until),
                    marked: false,
                }),
                None => join(g, Tag::Reader),
            }
        }
    }
}

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
                match g.members.iter_mut().find(|m| m.owner == r.owner.as_str()) {
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
    pub(crate) async fn group_acquire(
        &self,
        key: &LockKey,
        k: &str,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        let claim = owner.claim();
        let granted = |holds| {
            Ok(Acquire::Acquired(Grant {
                fence: None,
                holds,
                lease: None,
            }))
        };
        for _ in 0..GROUP_TRIES {
            let (now, item) = self.read_timed(k).await?;
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
                }) => match self.beside_lock(key, owner, h, now, left)? {
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
            let outcome = decide(key, owner, &mut g, now, end, mark_end)?;
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
                    c.cas(k, &encode(owner, 1, owner.value()), store_ttl(ttl), cas)
                }
                (Outcome::Free, None) => c.add(k, &encode(owner, 1, owner.value()), store_ttl(ttl)),
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
        key: &LockKey,
        owner: &OwnerToken,
        h: Lock,
        now: u64,
        left: Option<u64>,
    ) -> Result<std::result::Result<Group, Acquire>> {
        let refused = |secs: u64| {
            Ok(Err(Acquire::Contended {
                retry_after: Some(Duration::from_secs(secs)),
            }))
        };
        match owner.claim() {
            Claim::Exclusive { permits: 1 } => refused(left.unwrap_or(0)),
            Claim::Exclusive { permits } => Err(permits_mismatch(key, 1, permits)),
            Claim::Shared if h.owner == owner.as_str() => Err(claim_changed(key, false)),
            Claim::Shared if owner.writer() == Some(h.owner.as_str()) => {
                // The clock was read before the item, and may have jumped
                // by two in between: the hold ends by `now + left + 2`.
                let Some(left) = left else {
                    return refused(0);
                };
                let writer_end = now + left + CLOCK_LAG.as_secs();
                // The reader joins by the group's rules.
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
            Claim::Shared if owner.writer().is_some() => refused(0),
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
            g.marks.retain(|(o, _)| o != owner.as_str());
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
