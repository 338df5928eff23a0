//! [`Node`]'s locks: the lease backend of one memcached server, used
//! alone or as one vote of a quorum. A mutex's item is taken, released,
//! renewed and proclaimed on here; a permit or read hold, or any claim
//! that meets a group, goes to `claims.rs`, and the fast paths over a
//! known CAS to `known.rs`.
//!
//! As a quorum's vote, a node must answer within a bound of its own (the
//! quorum waits for its slowest node, and a pool may have to wait for a
//! connection and redial before it can send), and its `inspect` names the
//! holder's owner token: the quorum counts statuses per owner, and
//! statuses without one would merge different holders into one.

use std::time::Duration;

use async_trait::async_trait;
use lockwright_core::backend::{
    Acquire, AcquireRequest, Capabilities, Grant, HoldId, LockBackend, Release, Renew, RenewRequest,
};
use lockwright_core::{Claim, Error, LockKey, LockStatus, OwnerToken, Result, MAX_VALUE_LEN};
use tokio::sync::watch;

use crate::claims::{GroupRenewal, GROUP_TRIES};
use crate::error::unexpected;
use crate::layout::{encode, store_ttl, Body, Group, Item, CLOCK_LAG};
use crate::node::Node;
use crate::wire::{self, Commands, Reply};

/// The shortest TTL: memcached counts whole seconds.
pub(crate) const MIN_TTL: Duration = Duration::from_secs(2);
/// How often a read-then-compare-and-write is tried again when the item
/// changed in between (a re-entry or renewal racing another of ours).
const CAS_TRIES: usize = 4;
/// How often a waiter looks at most (see `Capabilities::max_poll`).
const MAX_POLL: Duration = Duration::from_millis(10);
/// The most renewals sent in one write.
const MAX_PIPELINE: usize = 256;

/// A grant of a lock's `holds`th hold (no fences here).
fn grant(holds: u32) -> Acquire {
    Acquire::Acquired(Grant {
        fence: None,
        holds,
        lease: None,
    })
}

impl Node {
    /// `ttl` as memcached can store it: past 30 days an expiry is a Unix
    /// time, which the server reads into 32 bits.
    fn check_ttl(ttl: Duration) -> Result<()> {
        if wire::fits(store_ttl(ttl)) {
            Ok(())
        } else {
            Err(Error::invalid_options(format!(
                "memcached cannot keep an item for {ttl:?}: its expiry would pass 2038"
            )))
        }
    }
}

// memcached has no notification and no queue: `watch` keeps the trait's
// default and `try_acquire` ignores a waiter's ticket (waiters poll; an
// attempt is an attempt), alone or as a quorum's node.
#[async_trait]
impl LockBackend for Node {
    fn capabilities(&self) -> Capabilities {
        // No fences: items can be evicted and the CAS counter restarts
        // with the server (see the crate docs).
        Capabilities::default()
            .with_values(true)
            .with_permits(true)
            .with_shared(true)
            .with_in_line(true)
            // Waiters race each release: looking this often, each gets its share.
            .with_max_poll(Some(MAX_POLL))
            .with_min_ttl(MIN_TTL)
            // Whole seconds, on a clock that may skip one.
            .with_ttl_resolution(CLOCK_LAG)
    }

    /// Reachable, and keeping CAS values (see `Node::cas_kept`).
    async fn verify(&self) -> Result<()> {
        self.bounded(async {
            match self.one(Commands::default().noop()).await? {
                Reply::Noop => Ok(()),
                other => Err(unexpected(&other)),
            }
        })
        .await?;
        self.cas_kept(self.timeout).await
    }

    /// `add`, and a read of the item in the same round trip. A lock held by
    /// another owner is `Contended` whatever the server's memory: a full
    /// server refuses new locks, never hands out a held one.
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let (key, owner, ttl) = (request.key(), request.owner(), request.ttl);
        Self::check_ttl(ttl)?;
        let k = self.key(key);
        if request.claim() != Claim::MUTEX {
            return self.bounded(self.group_acquire(request, &k)).await;
        }
        self.bounded(async {
            for _ in 0..CAS_TRIES {
                // The read rides with the `add`: our new item's CAS for a
                // fast release, or the holder, in one round trip.
                let mut c = Commands::default();
                c.add(&k, &encode(owner, 1, request.value()), store_ttl(ttl))
                    .get(&k);
                let (added, read, opened) = self.write_and_read(&c).await?;
                let read = self.item(&k, read);
                let full = match added {
                    // Granted, whatever the read after it says.
                    Reply::Stored => {
                        let read = read.ok().flatten();
                        self.known.note(&k, owner, 1, read.as_ref(), opened);
                        return Ok(grant(1));
                    }
                    Reply::NotStored => None,
                    Reply::OutOfMemory(m) => Some(m),
                    other => return Err(unexpected(&other)),
                };
                let Some(item) = read? else {
                    if let Some(m) = full {
                        return Err(self.full_alarm(&m));
                    }
                    // Released (or expired) since our add found it held:
                    // under contention it is taken again at once, so this
                    // attempt's answer is "held", and the caller comes back.
                    return Ok(Acquire::Contended { retry_after: None });
                };
                let holder = match item.body {
                    Body::Lock(h) => h,
                    // Permits or readers: their rules (a writer's mark).
                    Body::Group(_) => return self.group_acquire(request, &k).await,
                };
                if holder.owner != owner.as_str() {
                    if let Some(m) = full {
                        self.full_alarm(&m);
                    }
                    let retry_after = item.left.map(Duration::from_secs);
                    return Ok(Acquire::Contended { retry_after });
                }
                // Re-entry: one more hold, and the lease extended; the
                // value stays (a re-entry is no new grant).
                let holds = holder.holds.saturating_add(1);
                let mut c = Commands::default();
                let data = encode(owner, holds, holder.value.as_deref());
                c.cas(&k, &data, store_ttl(ttl), item.cas).get(&k);
                let (stored, read, opened) = self.write_and_read(&c).await?;
                match stored {
                    Reply::Stored => {
                        let read = self.item(&k, read).ok().flatten();
                        self.known.note(&k, owner, holds, read.as_ref(), opened);
                        return Ok(grant(holds));
                    }
                    Reply::Exists | Reply::NotFound => {}
                    Reply::OutOfMemory(m) => return Err(self.full_alarm(&m)),
                    other => return Err(unexpected(&other)),
                }
            }
            Err(Error::unavailable(format!(
                "the lock {key} kept changing under {CAS_TRIES} attempts"
            )))
        })
        .await
    }

    async fn release(&self, hold: &HoldId) -> Result<Release> {
        let (key, owner) = (&hold.key, &hold.owner);
        let k = self.key(key);
        if hold.claim() != Claim::MUTEX {
            return self.bounded(self.group_release(key, &k, owner)).await;
        }
        self.bounded(async {
            match self.release_known(&k, owner).await? {
                Some(true) => return Ok(Release::Freed),
                Some(false) => return Ok(Release::NotHeld),
                None => {}
            }
            for _ in 0..CAS_TRIES {
                let Some(item) = self.read(&k).await? else {
                    return Ok(Release::NotHeld);
                };
                let holder = match item.body {
                    Body::Lock(h) => h,
                    // A writer that read beside its hold (a downgrade).
                    Body::Group(_) => return self.group_release(key, &k, owner).await,
                };
                if holder.owner != owner.as_str() {
                    return Ok(Release::NotHeld);
                }
                let last = holder.holds <= 1;
                let mut c = Commands::default();
                if last {
                    c.delete(&k, item.cas);
                } else {
                    // One hold fewer; the lease left is kept, never shortened.
                    let left = Duration::from_secs(item.left.unwrap_or(0));
                    c.cas(
                        &k,
                        &encode(owner, holder.holds - 1, holder.value.as_deref()),
                        store_ttl(left),
                        item.cas,
                    );
                }
                match self.one(&c).await? {
                    Reply::Stored if last => return Ok(Release::Freed),
                    Reply::Stored => return Ok(Release::StillHeld(holder.holds - 1)),
                    Reply::NotFound => return Ok(Release::NotHeld),
                    Reply::Exists => {} // changed in between: look again
                    Reply::OutOfMemory(m) => return Err(self.full_alarm(&m)),
                    other => return Err(unexpected(&other)),
                }
            }
            Err(Error::unavailable(format!(
                "the lock {key} kept changing under {CAS_TRIES} attempts"
            )))
        })
        .await
    }

    /// Every lease in two round trips, whatever their number: one write of
    /// all the `mg` reads, then one of all the `cas` writes (the same value
    /// again, with the new expiry, over the version read). `mg … T` would
    /// touch without looking at the CAS, and could shorten another owner's
    /// lease.
    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        if requests.len() > MAX_PIPELINE {
            // Every command is written before any reply is read: a huge
            // batch would fill both sides' socket buffers and stall.
            let mut out = Vec::with_capacity(requests.len());
            for chunk in requests.chunks(MAX_PIPELINE) {
                out.extend(self.renew(chunk).await);
            }
            return out;
        }
        let keys: Vec<String> = requests.iter().map(|r| self.key(r.key())).collect();
        let mut results: Vec<Option<Result<Renew>>> = requests
            .iter()
            .map(|r| Self::check_ttl(r.ttl).err().map(Err))
            .collect();
        self.renew_known(requests, &keys, &mut results).await;
        let pending: Vec<usize> = (0..requests.len())
            .filter(|&i| results[i].is_none())
            .collect();
        let run = self.renew_rounds(requests, &keys, &mut results, pending);
        // A failed exchange, or no answer in time: every renewal not yet
        // answered gets that error.
        if let Err(e) = self.bounded(run).await {
            for r in results.iter_mut().filter(|r| r.is_none()) {
                *r = Some(Err(e.clone()));
            }
        }
        results
            .into_iter()
            .zip(requests)
            .map(|(r, q)| {
                r.unwrap_or_else(|| {
                    Err(Error::unavailable(format!(
                        "the lock {} kept changing under {CAS_TRIES} attempts",
                        q.key()
                    )))
                })
            })
            .collect()
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        let k = self.key(key);
        self.bounded(async {
            Ok(match self.read(&k).await? {
                None => LockStatus::free(),
                Some(Item {
                    body: Body::Lock(h),
                    left,
                    ..
                }) => {
                    // `t` seconds left means somewhere in (t − 2, t].
                    let left = left.map(|s| Duration::from_secs(s.saturating_sub(2)));
                    LockStatus::held(h.holds)
                        .with_remaining(left)
                        .with_owner(OwnerToken::from_string(h.owner).ok())
                        .with_value(h.value)
                }
                Some(Item {
                    body: Body::Group(_),
                    ..
                }) => self.group_status(&k).await?,
            })
        })
        .await
    }

    /// The item read with its CAS, the owner checked, and the new value
    /// stored over that version with the expiry it had (see
    /// [`Commands::cas_keeping`]): the lease ends when it would have. A
    /// renewal's `cas` landing in between makes ours `EXISTS`, and we read
    /// again.
    async fn proclaim(&self, hold: &HoldId, value: &[u8]) -> Result<Renew> {
        let (key, owner) = (&hold.key, &hold.owner);
        if value.len() > MAX_VALUE_LEN {
            return Err(Error::invalid_options(format!(
                "a leader's value is at most {MAX_VALUE_LEN} bytes, not {}",
                value.len()
            )));
        }
        let k = self.key(key);
        self.bounded(async {
            for _ in 0..CAS_TRIES {
                // A group's members advertise nothing.
                let Some(Item {
                    body: Body::Lock(holder),
                    cas,
                    left,
                }) = self.read(&k).await?
                else {
                    return Ok(Renew::NotHeld);
                };
                if holder.owner != owner.as_str() {
                    return Ok(Renew::NotHeld);
                }
                let data = encode(owner, holder.holds, Some(value));
                match self
                    .one(Commands::default().cas_keeping(&k, &data, left, cas))
                    .await?
                {
                    Reply::Stored => return Ok(Renew::Renewed),
                    // Expired (or released) since the read.
                    Reply::NotFound => return Ok(Renew::NotHeld),
                    Reply::Exists => {} // changed in between: look again
                    // Like a renewal's, it read its lock just before: no alarm.
                    Reply::OutOfMemory(m) => return Err(self.full(&m)),
                    other => return Err(unexpected(&other)),
                }
            }
            Err(Error::unavailable(format!(
                "the lock {key} kept changing under {CAS_TRIES} attempts"
            )))
        })
        .await
    }

    /// Takes away the writer's mark `owner` left on readers, if any.
    async fn abandon(&self, hold: &HoldId, _ticket: &OwnerToken) -> Result<()> {
        let k = self.key(&hold.key);
        self.bounded(self.unmark(&k, &hold.owner)).await
    }

    fn alarm(&self) -> Option<watch::Receiver<u64>> {
        Some(self.alarm.subscribe())
    }
}

/// One round's `cas` writes of a renewal batch: the commands, the
/// requests each answers, and the groups found (the request, the group
/// read for it, its CAS), whose writes `renew_groups` adds.
struct Round {
    writes: Commands,
    written: Vec<Vec<usize>>,
    groups: Vec<(usize, Group, u64)>,
}

/// The steps of `LockBackend::renew` on one server.
impl Node {
    /// Renews the `pending` requests, reading and writing their items
    /// again while they changed in between, a limited number of rounds;
    /// an error is the exchange's, for every renewal not yet answered.
    async fn renew_rounds(
        &self,
        requests: &[RenewRequest],
        keys: &[String],
        results: &mut [Option<Result<Renew>>],
        mut pending: Vec<usize>,
    ) -> Result<()> {
        // A group's item has a writer per holder: tried more often.
        let (mut tries, mut limit) = (0, CAS_TRIES);
        while !pending.is_empty() && tries < limit {
            tries += 1;
            // The server's clock first, for the members of groups.
            let mut reads = Commands::default();
            reads.get(&self.clock_key());
            for &i in &pending {
                reads.get(&keys[i]);
            }
            let mut replies = self.send(&reads).await?.into_iter();
            // A clock item gone wrong fails only the groups' renewals.
            let clock = self.clock_of(replies.next());
            let Round {
                mut writes,
                mut written,
                groups,
            } = self.plan_round(requests, keys, results, &pending, replies);
            if !groups.is_empty() {
                limit = GROUP_TRIES;
                let renewal = GroupRenewal {
                    requests,
                    keys,
                    writes: &mut writes,
                    written: &mut written,
                    results: &mut *results,
                };
                self.renew_groups(renewal, groups, clock).await;
            }
            pending.clear();
            if written.is_empty() {
                break;
            }
            let replies = self.send(&writes).await?;
            self.note_round(written, replies, results, &mut pending);
        }
        Ok(())
    }

    /// The `cas` writes for the items read for `pending` (`replies`, in
    /// its order): a lock's item still ours is written back; a group's is
    /// left to `renew_groups`; any other answers its request now.
    fn plan_round(
        &self,
        requests: &[RenewRequest],
        keys: &[String],
        results: &mut [Option<Result<Renew>>],
        pending: &[usize],
        replies: impl Iterator<Item = Reply>,
    ) -> Round {
        let mut writes = Commands::default();
        let mut written: Vec<Vec<usize>> = Vec::new();
        let mut groups = Vec::new();
        for (&i, reply) in pending.iter().zip(replies) {
            let r = &requests[i];
            match self.item(&keys[i], reply) {
                Ok(Some(Item {
                    body: Body::Lock(h),
                    cas,
                    ..
                })) if h.owner == r.owner().as_str() => {
                    writes.cas(
                        &keys[i],
                        &encode(r.owner(), h.holds, h.value.as_deref()),
                        store_ttl(r.ttl),
                        cas,
                    );
                    written.push(vec![i]);
                }
                Ok(Some(Item {
                    body: Body::Group(g),
                    cas,
                    ..
                })) => groups.push((i, g, cas)),
                Ok(_) => results[i] = Some(Ok(Renew::NotHeld)),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        Round {
            writes,
            written,
            groups,
        }
    }

    /// Answers the requests each write was for (`written`) from its reply;
    /// those whose item changed in between go back to `pending`.
    fn note_round(
        &self,
        written: Vec<Vec<usize>>,
        replies: Vec<Reply>,
        results: &mut [Option<Result<Renew>>],
        pending: &mut Vec<usize>,
    ) {
        let mut full: Option<Error> = None;
        for (each, reply) in written.into_iter().zip(replies) {
            let result = match reply {
                Reply::Stored => Some(Ok(Renew::Renewed)),
                Reply::NotFound => Some(Ok(Renew::NotHeld)),
                // Changed in between: read it again.
                Reply::Exists => {
                    pending.extend(&each);
                    None
                }
                Reply::OutOfMemory(m) => {
                    Some(Err(full.get_or_insert_with(|| self.full(&m)).clone()))
                }
                other => Some(Err(unexpected(&other))),
            };
            for i in each {
                results[i] = result.clone();
            }
        }
    }
}
