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
//! the crate docs, "Time").
//!
//! The clock is read with the group, in the same round trip: the item
//! `<prefix>#clock` holds the absolute expiry it was stored with, `E`,
//! and `mg` reports its seconds left, `t`, so the server's clock is
//! `E − t`. It is read before the group's item, so it is never ahead of
//! the group's read: a holder whose end has come is gone, and one read as
//! live may have ended less than a second before (never granted over too
//! soon). When the clock item is missing (the first use, a restart, after
//! its day), `stats` gives the server's time once and the item is added
//! again to expire a day later: one small item per prefix, never more.

use std::time::Duration;

use locksmith_core::backend::{
    claim_changed, permits_mismatch, semaphore_or_rwlock, Acquire, Grant, Release, RenewRequest,
    MARK_LIFE,
};
use locksmith_core::{Claim, Error, Holder, LockKey, LockStatus, OwnerToken, Result};

use crate::error::unexpected;
use crate::layout::{encode, store_ttl, Body, Group, Holder as Lock, Item, Member, Tag};
use crate::node::Node;
use crate::wire::{Commands, Reply};

/// How often a group's read-then-swap is tried when the item changed in
/// between: a group is written by every one of its holders, so a busy
/// one changes far more often than a mutex's item.
const GROUP_TRIES: usize = 32;
/// How long the clock item is kept, in seconds.
const CLOCK_LIFE: u64 = 24 * 3600;
/// A server clock below this reads as no Unix time: memcached would take
/// an absolute expiry under 30 days for a relative one.
const EARLIEST_CLOCK: u64 = 60 * 24 * 3600;

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
    if let Some(m) = g.members.iter_mut().find(|m| m.owner == me) {
        let shared = m.tag == Tag::Reader;
        if shared != claim.is_shared() {
            return Err(claim_changed(key, shared));
        }
        if let (Some(asked), Some(kept)) = (claim.exclusive_permits(), g.permits) {
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
            if let Some(kept) = g.permits.filter(|&kept| kept != permits) {
                return Err(permits_mismatch(key, kept, permits));
            }
            if readers.is_some() && permits > 1 {
                return Err(semaphore_or_rwlock(key, permits, true));
            }
            if g.members.is_empty() {
                if permits == 1 {
                    return Ok(Outcome::Free);
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
            match writer.or(marked) {
                Some(until) => Ok(Outcome::Refused {
                    retry_after: wait(until),
                    marked: false,
                }),
                None => join(g, Tag::Reader),
            }
        }
    }
}

/// Queues on `writes` the renewal of `r`'s hold in the group `g` read at
/// `k` with `cas` (pruned at `now`): its end `r.ttl` from now, the item
/// expiring with its last holder. Whether `r`'s owner holds there.
pub(crate) fn renew_in(
    writes: &mut Commands,
    k: &str,
    mut g: Group,
    cas: u64,
    r: &RenewRequest,
    now: u64,
) -> bool {
    g.prune(now);
    let Some(m) = g.members.iter_mut().find(|m| m.owner == r.owner.as_str()) else {
        return false;
    };
    let end = now + secs(store_ttl(r.ttl));
    m.end = end;
    writes.cas_at(k, &g.encode(), g.end().unwrap_or(end), cas);
    true
}

impl Node {
    /// The key of the item that reads the server's clock.
    pub(crate) fn clock_key(&self) -> String {
        format!("{}#clock", self.prefix)
    }

    /// The server's clock from the clock item's `mg` reply; `None` when
    /// the item is missing.
    pub(crate) fn clock_of(&self, reply: Option<Reply>) -> Result<Option<u64>> {
        match reply {
            Some(Reply::Miss) => Ok(None),
            Some(Reply::Value {
                data, ttl: Some(t), ..
            }) => std::str::from_utf8(&data)
                .ok()
                .and_then(|e| e.parse::<u64>().ok())
                .and_then(|e| e.checked_sub(t))
                .map(Some)
                .ok_or_else(|| {
                    Error::backend(format!(
                        "the item {:?} is not locksmith's clock",
                        self.clock_key()
                    ))
                }),
            Some(Reply::Value { .. }) => Err(Error::backend(format!(
                "the item {:?} is not locksmith's clock: it never expires",
                self.clock_key()
            ))),
            Some(other) => Err(unexpected(&other)),
            None => Err(Error::backend("memcached sent too few replies")),
        }
    }

    /// The server's clock by `stats`, and the clock item added (if no one
    /// else just did) to expire a day later.
    pub(crate) async fn set_clock(&self) -> Result<u64> {
        let now = match self.one(Commands::default().stats()).await? {
            Reply::Time(t) => t,
            other => return Err(unexpected(&other)),
        };
        let at = now + CLOCK_LIFE;
        if now < EARLIEST_CLOCK || at > i32::MAX as u64 {
            return Err(Error::backend(format!(
                "memcached's clock reads {now}, which is no Unix time before 2038: a group's \
                 holders could not be given their own expiries"
            )));
        }
        let mut c = Commands::default();
        c.add_at(&self.clock_key(), at.to_string().as_bytes(), at);
        match self.one(&c).await? {
            Reply::Stored | Reply::NotStored => Ok(now),
            Reply::OutOfMemory(m) => Err(self.full_alarm(&m)),
            other => Err(unexpected(&other)),
        }
    }

    /// The server's clock, then the item at `k`, in one round trip.
    pub(crate) async fn read_timed(&self, k: &str) -> Result<(u64, Option<Item>)> {
        for _ in 0..3 {
            let mut c = Commands::default();
            c.get(&self.clock_key()).get(k);
            let mut replies = self.send(&c).await?.into_iter();
            let now = self.clock_of(replies.next())?;
            let item = replies
                .next()
                .ok_or_else(|| Error::backend("memcached sent too few replies"))?;
            match now {
                Some(now) => return Ok((now, self.item(k, item)?)),
                None => {
                    self.set_clock().await?;
                }
            }
        }
        Err(Error::unavailable(format!(
            "memcached dropped the clock item {:?} as soon as it was stored (is it out of memory?)",
            self.clock_key()
        )))
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
                // The clock was read before the item: its seconds left end
                // at most a second later than `now + left`.
                let writer_end = now + left.unwrap_or(0) + 1;
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
