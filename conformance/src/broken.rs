//! Deliberately broken backends. Each wraps a correct one and breaks one
//! promise of the contract; the suite must fail every one of them (this
//! crate's `tests/broken.rs` proves it does). [`UntimedQuorum`] breaks a
//! quorum rule instead, which the shared quorum tests must catch (also in
//! `tests/broken.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::join_all;
use lockwright_core::backend::{
    refusal, renew_one, Acquire, AcquireRequest, Capabilities, Changes, Found, Grant, HoldId,
    HoldKind, LockBackend, LockBackendExt, Release, Renew, RenewRequest,
};
use lockwright_core::{
    Claim, Error, ErrorKind, FencingToken, LockKey, LockStatus, OwnerToken, Result,
};

use crate::Harness;

/// Which promise to break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defect {
    /// Release frees the key whoever asks.
    ReleaseWithoutOwnerCheck,
    /// Leases never expire (the TTL is ignored).
    NoExpiry,
    /// Renew releases the lock instead of extending it.
    RenewReleases,
    /// Every grant carries the same fencing token.
    RepeatingFence,
    /// A store that cannot be reached is reported as "held by someone else".
    ContendedWhenDown,
    /// Claims to serve waiters in arrival order, but wakes them all to race.
    ClaimsFairness,
    /// Treats a lease with less than a third of its TTL left as free (a
    /// clock-skew allowance applied the wrong way round).
    EarlyTakeover,
    /// Keeps a record of every name it ever granted, for ever.
    LeaksState,
    /// Counts fences per name and forgets the count when the name's state is
    /// collected, so a name locked again after collection starts over.
    FenceForgottenOnCollection,
    /// A candidate (an acquire carrying a value) takes the key from a live holder.
    CampaignIgnoresLeader,
    /// Reports the first value ever advertised on a key, whoever leads now.
    StaleLeaderValue,
    /// Keeps reporting a leader whose lease ran out.
    ExpiredLeaderShown,
    /// A candidate's release says "freed" but leaves the lease to run out (in 8 s).
    ResignKeepsLease,
    /// Proclaims for the current holder, whoever asks.
    ProclaimWithoutOwnerCheck,
    /// Answers a candidate's attempt on a held key "contended", yet keeps
    /// the request and grants it once the key frees (for up to 2 s): a
    /// campaign dropped while waiting then leads, for nobody, until its TTL.
    CampaignGrantLandsLate,
    /// Reads a store that cannot be reached as "nobody holds it".
    NoLeaderWhenDown,
    /// Gives observers a subscription that never wakes (as one to the
    /// wrong channel would), so they see changes only at their poll.
    SilentChanges,
    /// Grants one permit more than a semaphore has (a `<=` for a `<`).
    PermitsOverGrant,
    /// Counts a semaphore's expired permits as held until the next release.
    ExpiredPermitsCounted,
    /// Keeps the first N it saw for a name for ever and applies it to every
    /// later claim, refusing none.
    PermitsNotKept,
    /// A release by an owner that holds no permit frees another holder's.
    PermitReleaseWithoutOwnerCheck,
    /// Lets at most two readers in at once (as a reader count kept in too
    /// small a field would).
    ReadersExclude,
    /// Grants a writer while two or more readers hold.
    WriterIgnoresReaders,
    /// Forgets a waiting writer at once, so new readers keep entering.
    ReadersIgnoreWaitingWriters,
    /// Ignores a downgrade: the reader beside a writer queues like any other.
    DowngradeGap,
    /// Grants a reader's exclusive claim on a name it reads as one more
    /// read hold (as a store that checked the claim's kind against other
    /// owners' holds only, never against the owner's own, would): the
    /// reader believes it writes beside other readers.
    UpgradeAdmitted,
    /// A reader's second read of a name it reads already adds no hold
    /// (as a store keeping a set of readers, not a count, would): the
    /// grant says one hold, and the reader's first release frees it.
    ReaderReentryUncounted,
    /// A semaphore's claim on a name that readers hold waits for them, as
    /// a store that judged it as a mutex's claim would, where the store
    /// must refuse it (a name is a semaphore or a read-write lock).
    PermitsWaitOnReaders,
    /// Ignores a waiter giving up, so a writer's mark stays until its TTL.
    AbandonIgnored,
    /// Keeps a record of every name a semaphore or read-write lock used.
    LeaksClaimedNames,
    /// Answers a renewal batch "renewed" for every name held, by whomever.
    BatchRenewsAnyHolder,
    /// Renews a batch as an `UPDATE` joined on the name alone (its owner
    /// left out) would: every live lease it names is extended to the TTL
    /// asked, whoever holds it, and a batch whose names are all held
    /// counts as many matches as requests, so every answer is "renewed";
    /// a batch with a free name is asked again lease by lease, rightly.
    RenewBatchByNameOnly,
    /// A renewal by an owner that does not hold the name answers
    /// `NotHeld`, yet extends the holder's lease to the TTL it asked for.
    StrangerRenewExtends,
    /// A refused exclusive claim stays in the store for a moment (as one
    /// deleted in the background after its refusal is told would): for
    /// 300 ms a claim of another N on the name is refused as if the
    /// refused claim held it.
    RefusalLingers,
    /// A broken hold's fence is given to the next grant of its name (as a
    /// force-release that deleted the name's state, fence count and all,
    /// would): a resource checking fences takes the broken holder's late
    /// writes as the new holder's.
    BreakKeepsFence,
    /// Breaking one holder of a semaphore or read-write lock breaks every
    /// holder of the name.
    BreakTakesEveryHolder,
    /// Lists only the names a single owner holds (as a listing that read
    /// the mutex's form and skipped the groups' would): a semaphore's or
    /// readers' names are missing.
    ListMissesGroups,
}

/// How long `RefusalLingers` keeps a refused claim.
const LINGER: Duration = Duration::from_millis(300);

/// How long `CampaignGrantLandsLate` keeps a contended request to grant.
const LATE_GRANT_KEPT: Duration = Duration::from_secs(2);

impl Defect {
    /// Every defect.
    pub const ALL: [Defect; 37] = [
        Defect::ReleaseWithoutOwnerCheck,
        Defect::NoExpiry,
        Defect::RenewReleases,
        Defect::RepeatingFence,
        Defect::ContendedWhenDown,
        Defect::ClaimsFairness,
        Defect::EarlyTakeover,
        Defect::LeaksState,
        Defect::FenceForgottenOnCollection,
        Defect::CampaignIgnoresLeader,
        Defect::StaleLeaderValue,
        Defect::ExpiredLeaderShown,
        Defect::ResignKeepsLease,
        Defect::ProclaimWithoutOwnerCheck,
        Defect::CampaignGrantLandsLate,
        Defect::NoLeaderWhenDown,
        Defect::SilentChanges,
        Defect::PermitsOverGrant,
        Defect::ExpiredPermitsCounted,
        Defect::PermitsNotKept,
        Defect::PermitReleaseWithoutOwnerCheck,
        Defect::ReadersExclude,
        Defect::WriterIgnoresReaders,
        Defect::ReadersIgnoreWaitingWriters,
        Defect::DowngradeGap,
        Defect::UpgradeAdmitted,
        Defect::ReaderReentryUncounted,
        Defect::PermitsWaitOnReaders,
        Defect::AbandonIgnored,
        Defect::LeaksClaimedNames,
        Defect::BatchRenewsAnyHolder,
        Defect::RenewBatchByNameOnly,
        Defect::StrangerRenewExtends,
        Defect::RefusalLingers,
        Defect::BreakKeepsFence,
        Defect::BreakTakesEveryHolder,
        Defect::ListMissesGroups,
    ];
}

/// A client with one defect. Clients of one [`BrokenHarness`] share the
/// bookkeeping a defect needs (who holds what), as one store would.
#[derive(Debug)]
pub struct Broken {
    inner: Arc<dyn LockBackend>,
    defect: Defect,
    holders: Arc<Mutex<HashMap<LockKey, HoldId>>>,
    /// When each key's lease was last granted or renewed, and for how long.
    leases: Arc<Mutex<HashMap<LockKey, (Instant, Duration)>>>,
    /// The state this "store" keeps beside the inner one (`LeaksState`,
    /// `FenceForgottenOnCollection`).
    extra: Arc<Extra>,
}

/// Per-name state a broken store keeps of its own.
#[derive(Debug, Default)]
struct Extra {
    leaked: Mutex<HashSet<LockKey>>,
    fences: Mutex<HashMap<LockKey, u64>>,
    /// `StaleLeaderValue`: the first value advertised on each key.
    first_values: Mutex<HashMap<LockKey, Vec<u8>>>,
    /// `ExpiredLeaderShown`: the last held status read of each key.
    last_held: Mutex<HashMap<LockKey, LockStatus>>,
    /// Holds granted beside the store's (`PermitsOverGrant`,
    /// `WriterIgnoresReaders`): one per name, by owner.
    overflow: Mutex<HashMap<LockKey, OwnerToken>>,
    /// `ExpiredPermitsCounted`: the permits granted on each name since its
    /// last release; `PermitReleaseWithoutOwnerCheck`: who holds them.
    permits: Mutex<HashMap<LockKey, Vec<HoldId>>>,
    /// `ResignKeepsLease`: the owners granted a hold with a value (a
    /// candidate's), whose release is the resignation, with the value.
    candidates: Mutex<HashMap<OwnerToken, Arc<[u8]>>>,
    /// `PermitsNotKept`: the first N claimed on each name.
    first_permits: Mutex<HashMap<LockKey, u32>>,
    /// `RefusalLingers`: the N of the last refused exclusive claim on each
    /// name, and when it was refused.
    lingering: Mutex<HashMap<LockKey, (u32, Instant)>>,
    /// `BreakKeepsFence`: the fence of the hold last broken on each name,
    /// for its next grant.
    broken_fences: Mutex<HashMap<LockKey, FencingToken>>,
}

impl Broken {
    /// `EarlyTakeover`: the current lease of `key` is in its last third.
    fn nearly_expired(&self, key: &LockKey) -> bool {
        self.leases
            .lock()
            .unwrap()
            .get(key)
            .is_some_and(|(at, ttl)| at.elapsed() > ttl.mul_f64(2.0 / 3.0))
    }
}

impl Broken {
    /// The hold the defect asks for instead of `hold` (`PermitsNotKept`,
    /// `DowngradeGap`).
    fn rewrite_claim(&self, hold: &HoldId) -> HoldId {
        let kind = match (self.defect, &hold.kind) {
            (Defect::PermitsNotKept, kind) if !kind.claim().is_shared() => {
                let asked = kind.claim().exclusive_permits().unwrap_or(1);
                let first = *self
                    .extra
                    .first_permits
                    .lock()
                    .unwrap()
                    .entry(hold.key.clone())
                    .or_insert(asked);
                HoldKind::of_claim(Claim::Exclusive { permits: first })
            }
            (Defect::DowngradeGap, HoldKind::Reader { beside: Some(_) }) => {
                HoldKind::Reader { beside: None }
            }
            (_, kind) => kind.clone(),
        };
        HoldId {
            kind,
            ..hold.clone()
        }
    }

    /// `UpgradeAdmitted`: an exclusive claim by an owner that reads `key`
    /// now, made as a read claim, which the store grants as a re-entry of
    /// the owner's read hold; any other claim as it is.
    async fn upgrade_as_read(&self, hold: HoldId) -> Result<HoldId> {
        if self.defect != Defect::UpgradeAdmitted || hold.claim().is_shared() {
            return Ok(hold);
        }
        let status = self.inner.inspect(&hold.key).await?;
        let reads = status
            .holders
            .iter()
            .any(|h| h.shared && h.owner.as_ref() == Some(&hold.owner));
        Ok(if reads {
            HoldId {
                kind: HoldKind::Reader { beside: None },
                ..hold
            }
        } else {
            hold
        })
    }

    /// A grant the store refused, made anyway by the defect: one more
    /// permit than N (`PermitsOverGrant`), or a writer beside two readers
    /// (`WriterIgnoresReaders`).
    async fn overflow_grant(&self, hold: &HoldId) -> Result<Option<Grant>> {
        let (key, owner, claim) = (&hold.key, &hold.owner, hold.claim());
        let over = match self.defect {
            Defect::PermitsOverGrant => claim.exclusive_permits() > Some(1),
            Defect::WriterIgnoresReaders if claim == Claim::MUTEX => {
                let status = self.inner.inspect(key).await?;
                status.is_shared() && status.holder_count() >= 2
            }
            _ => false,
        };
        let mut overflow = self.extra.overflow.lock().unwrap();
        if !over || overflow.contains_key(key) {
            return Ok(None);
        }
        overflow.insert(key.clone(), owner.clone());
        Ok(Some(Grant {
            fence: None,
            holds: 1,
            lease: None,
        }))
    }

    /// Extends the lease of `key`'s live holder, when that is not `owner`,
    /// to `ttl` from now where that is longer than it has left
    /// (`StrangerRenewExtends`, `RenewBatchByNameOnly`). Mutexes only.
    async fn extend_other_holder(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<()> {
        let status = self.inner.inspect(key).await?;
        let (held, left) = (status.held, status.remaining);
        let Some(holder) = status.owner else {
            return Ok(());
        };
        if held && holder != *owner && left.is_none_or(|left| ttl > left) {
            self.inner.renew_lock(key, &holder, ttl).await?;
        }
        Ok(())
    }

    /// `RenewBatchByNameOnly`: the batch's `UPDATE`, joined on the name
    /// alone. Every live lease named is extended, whoever holds it; true
    /// when every request's name matched a live lease, which the store
    /// reads as "all renewed".
    async fn renew_by_name(&self, requests: &[RenewRequest]) -> bool {
        let mut all_matched = true;
        for r in requests {
            match self.inner.inspect(r.key()).await {
                Ok(status) if status.held => {
                    let _ = self.extend_other_holder(r.key(), r.owner(), r.ttl).await;
                }
                _ => all_matched = false,
            }
        }
        all_matched
    }

    /// One lease's renewal, with the defects a renewal has
    /// (`RenewReleases`, `NoExpiry`, `StrangerRenewExtends`).
    async fn renew_single(&self, r: &RenewRequest) -> Result<Renew> {
        let (key, owner, ttl) = (r.key(), r.owner(), r.ttl);
        if self.has_overflow(key, owner) {
            return Ok(Renew::Renewed);
        }
        match self.defect {
            Defect::RenewReleases => {
                self.inner.release(&r.hold).await?;
                Ok(Renew::Renewed)
            }
            Defect::NoExpiry => {
                let long = RenewRequest {
                    ttl: ttl.max(Duration::from_secs(3600)),
                    ..r.clone()
                };
                renew_one(&*self.inner, long).await
            }
            _ => {
                let renewed = renew_one(&*self.inner, r.clone()).await?;
                if renewed == Renew::Renewed {
                    self.leases
                        .lock()
                        .unwrap()
                        .insert(key.clone(), (Instant::now(), ttl));
                } else if self.defect == Defect::StrangerRenewExtends
                    && r.hold.claim() == Claim::MUTEX
                {
                    self.extend_other_holder(key, owner, ttl).await?;
                }
                Ok(renewed)
            }
        }
    }

    fn has_overflow(&self, key: &LockKey, owner: &OwnerToken) -> bool {
        self.extra.overflow.lock().unwrap().get(key) == Some(owner)
    }

    fn take_overflow(&self, key: &LockKey, owner: &OwnerToken) -> bool {
        let mut overflow = self.extra.overflow.lock().unwrap();
        let ours = overflow.get(key) == Some(owner);
        if ours {
            overflow.remove(key);
        }
        ours
    }
}

// The defects live in `try_acquire`, `release` and `renew`, every
// attempt (a waiter's too) and every renewal going through them, so that a
// defect shows on every path. Everything else is the correct backend's.
lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for Broken {
        fn capabilities(&self) -> Capabilities {
            let mut caps = self.inner.capabilities();
            if self.defect == Defect::RepeatingFence {
                caps.fencing = true;
            }
            if self.defect == Defect::ClaimsFairness {
                caps.fair = true;
            }
            caps
        }

        /// A plain attempt, waiting or not: nothing is queued (a
        /// `ClaimsFairness` store only claims to).
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
            let ttl = match self.defect {
                Defect::NoExpiry => request.ttl.max(Duration::from_secs(3600)),
                _ => request.ttl,
            };
            let hold = self.rewrite_claim(&request.hold);
            let hold = self.upgrade_as_read(hold).await?;
            let request = AcquireRequest {
                hold,
                ttl,
                value: request.value.clone(),
                ticket: None,
            };
            let (key, owner, hold) = (request.key(), request.owner(), &request.hold);
            let claim = hold.claim();
            let n = claim.exclusive_permits().unwrap_or(0);
            if self.defect == Defect::ExpiredPermitsCounted && n > 1 {
                let counted = self.extra.permits.lock().unwrap().get(key).map_or(0, Vec::len);
                if counted >= n as usize {
                    return Ok(Acquire::Contended { retry_after: None });
                }
            }
            if self.defect == Defect::ReaderReentryUncounted && claim.is_shared() {
                let status = self.inner.inspect(key).await?;
                if status.holders.iter().any(|h| h.shared && h.owner.as_ref() == Some(owner)) {
                    return Ok(Acquire::Acquired(Grant {
                        fence: status.fence,
                        holds: 1,
                        lease: None,
                    }));
                }
            }
            if self.defect == Defect::PermitsWaitOnReaders && n > 1 {
                let status = self.inner.inspect(key).await?;
                if status.holders.iter().any(|h| h.shared) {
                    return Ok(Acquire::Contended { retry_after: None });
                }
            }
            if self.defect == Defect::ReadersExclude && claim.is_shared() {
                let status = self.inner.inspect(key).await?;
                let others = status.holder_count() - usize::from(status.owner.as_ref() == Some(owner));
                if status.held && status.is_shared() && others >= 2 {
                    return Ok(Acquire::Contended { retry_after: None });
                }
            }
            let candidate = request.value().is_some();
            if let Some(v) = request.value().filter(|_| self.defect == Defect::StaleLeaderValue) {
                self.extra
                    .first_values
                    .lock()
                    .unwrap()
                    .entry(key.clone())
                    .or_insert_with(|| v.to_vec());
            }
            if self.defect == Defect::RefusalLingers && n > 0 {
                let left = self.extra.lingering.lock().unwrap().get(key).copied();
                if let Some((kept, _)) = left.filter(|(m, at)| *m != n && at.elapsed() < LINGER) {
                    let found = Found {
                        kept: Some(kept),
                        ..Found::NOTHING
                    };
                    return Err(refusal(key, claim, found));
                }
            }
            let mut outcome = self.inner.try_acquire(&request).await;
            if self.defect == Defect::RefusalLingers && n > 0 {
                if let Err(e) = &outcome {
                    if e.kind() == ErrorKind::InvalidOptions {
                        let at = Instant::now();
                        self.extra.lingering.lock().unwrap().insert(key.clone(), (n, at));
                    }
                }
            }
            let takes_over = (self.defect == Defect::EarlyTakeover && self.nearly_expired(key))
                || (self.defect == Defect::CampaignIgnoresLeader && candidate);
            if takes_over && matches!(outcome, Ok(Acquire::Contended { .. })) {
                let holder = self.holders.lock().unwrap().get(key).cloned();
                if let Some(holder) = holder {
                    self.inner.release(&holder).await?;
                    outcome = self.inner.try_acquire(&request).await;
                }
            }
            if self.defect == Defect::CampaignGrantLandsLate
                && candidate
                && matches!(outcome, Ok(Acquire::Contended { .. }))
            {
                let (inner, request) = (self.inner.clone(), request.clone());
                tokio::spawn(async move {
                    let until = Instant::now() + LATE_GRANT_KEPT;
                    while Instant::now() < until {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        if let Ok(Acquire::Acquired(_)) = inner.try_acquire(&request).await {
                            break;
                        }
                    }
                });
            }
            if matches!(outcome, Ok(Acquire::Contended { .. })) {
                if let Some(grant) = self.overflow_grant(hold).await? {
                    return Ok(Acquire::Acquired(grant));
                }
                if self.defect == Defect::ReadersIgnoreWaitingWriters && !claim.is_shared() {
                    self.inner.abandon(hold, owner).await?;
                }
            }
            let outcome = match outcome {
                Err(e)
                    if self.defect == Defect::ContendedWhenDown
                        && e.kind() == ErrorKind::Unavailable =>
                {
                    return Ok(Acquire::Contended { retry_after: None })
                }
                other => other?,
            };
            if let Acquire::Acquired(grant) = outcome {
                self.holders
                    .lock()
                    .unwrap()
                    .insert(key.clone(), hold.clone());
                if let Some(value) = &request.value {
                    let mut candidates = self.extra.candidates.lock().unwrap();
                    candidates.insert(owner.clone(), value.clone());
                }
                if n > 1 {
                    self.extra
                        .permits
                        .lock()
                        .unwrap()
                        .entry(key.clone())
                        .or_default()
                        .push(hold.clone());
                }
                if self.defect == Defect::LeaksClaimedNames && claim != Claim::MUTEX {
                    self.extra.leaked.lock().unwrap().insert(key.clone());
                }
                self.leases
                    .lock()
                    .unwrap()
                    .insert(key.clone(), (Instant::now(), ttl));
                let reused = self.extra.broken_fences.lock().unwrap().remove(key);
                if let Some(fence) = reused.filter(|_| grant.holds == 1) {
                    return Ok(Acquire::Acquired(Grant {
                        fence: Some(fence),
                        ..grant
                    }));
                }
                if self.defect == Defect::RepeatingFence {
                    return Ok(Acquire::Acquired(Grant {
                        fence: Some(FencingToken(1)),
                        ..grant
                    }));
                }
                if self.defect == Defect::LeaksState {
                    self.extra.leaked.lock().unwrap().insert(key.clone());
                }
                if self.defect == Defect::FenceForgottenOnCollection {
                    let mut fences = self.extra.fences.lock().unwrap();
                    let count = fences.entry(key.clone()).or_insert(0);
                    if grant.holds == 1 {
                        *count += 1;
                    }
                    return Ok(Acquire::Acquired(Grant {
                        fence: Some(FencingToken(*count)),
                        ..grant
                    }));
                }
            }
            Ok(outcome)
        }

        async fn release(&self, hold: &HoldId) -> Result<Release> {
            let (key, owner) = (&hold.key, &hold.owner);
            let value = self.extra.candidates.lock().unwrap().get(owner).cloned();
            if let Some(value) = value.filter(|_| self.defect == Defect::ResignKeepsLease) {
                // Left to run out: 8 s, so the cases that wait for it do not.
                let left = RenewRequest::new(hold.clone(), Duration::from_secs(8));
                let left = left.granted_with(Some(value));
                renew_one(&*self.inner, left).await?;
                return Ok(Release::Freed);
            }
            self.extra.last_held.lock().unwrap().remove(key);
            if self.take_overflow(key, owner) {
                return Ok(Release::Freed);
            }
            let released = self.inner.release(hold).await?;
            if released == Release::Freed {
                // `ExpiredPermitsCounted` counts again from here.
                self.extra.permits.lock().unwrap().remove(key);
            }
            if released == Release::NotHeld
                && self.defect == Defect::PermitReleaseWithoutOwnerCheck
                && hold.claim().exclusive_permits() > Some(1)
            {
                let other = self
                    .extra
                    .permits
                    .lock()
                    .unwrap()
                    .get(key)
                    .and_then(|p| p.iter().find(|o| o.owner != *owner).cloned());
                if let Some(other) = other {
                    return self.inner.release(&other).await;
                }
            }
            if released != Release::NotHeld {
                return Ok(released);
            }
            if self.defect == Defect::ReleaseWithoutOwnerCheck {
                let holder = self.holders.lock().unwrap().get(key).cloned();
                if let Some(holder) = holder {
                    return self.inner.release(&holder).await;
                }
            }
            Ok(released)
        }

        /// Each lease through `renew_single`, defects and all;
        /// a batch of several (the watchdog's) has defects of its own.
        async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
            let batch = requests.len() > 1;
            if batch
                && self.defect == Defect::RenewBatchByNameOnly
                && requests.iter().all(|r| r.hold.claim() == Claim::MUTEX)
                && self.renew_by_name(requests).await
            {
                // As many matches as requests: "all renewed", each owner's
                // own lease renewed as asked.
                return join_all(requests.iter().map(|r| async move {
                    self.renew_single(r).await.map(|_| Renew::Renewed)
                }))
                .await;
            }
            join_all(requests.iter().map(|r| async move {
                let someone_elses = |s: LockStatus| s.held && s.owner.as_ref() != Some(r.owner());
                if batch
                    && self.defect == Defect::BatchRenewsAnyHolder
                    && self.inner.inspect(r.key()).await.is_ok_and(someone_elses)
                {
                    return Ok(Renew::Renewed);
                }
                self.renew_single(r).await
            }))
            .await
        }

        async fn proclaim(&self, hold: &HoldId, value: &[u8]) -> Result<Renew> {
            if self.defect == Defect::ProclaimWithoutOwnerCheck {
                let holder = self.holders.lock().unwrap().get(&hold.key).cloned();
                if let Some(holder) = holder {
                    return self.inner.proclaim(&holder, value).await;
                }
            }
            self.inner.proclaim(hold, value).await
        }

        async fn changes(&self, key: &LockKey) -> Result<Option<Changes>> {
            if self.defect == Defect::SilentChanges {
                // A live subscription that nothing ever bumps.
                let (tx, rx) = tokio::sync::watch::channel(0u64);
                return Ok(Some(Changes::new(rx, Some(Box::new(tx)))));
            }
            self.inner.changes(key).await
        }

        async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
            let status = match self.inner.inspect(key).await {
                Err(e)
                    if self.defect == Defect::NoLeaderWhenDown
                        && e.kind() == ErrorKind::Unavailable =>
                {
                    return Ok(LockStatus::free())
                }
                other => other?,
            };
            if status.held {
                if self.defect == Defect::StaleLeaderValue {
                    if let Some(first) = self.extra.first_values.lock().unwrap().get(key) {
                        return Ok(status.with_value(Some(first.clone())));
                    }
                }
                if status.value.is_some() {
                    self.extra
                        .last_held
                        .lock()
                        .unwrap()
                        .insert(key.clone(), status.clone());
                }
            } else if self.defect == Defect::ExpiredLeaderShown {
                if let Some(last) = self.extra.last_held.lock().unwrap().get(key) {
                    return Ok(last.clone());
                }
            }
            Ok(status)
        }

        /// Breaks the hold, with the defects a break has
        /// (`BreakKeepsFence`, `BreakTakesEveryHolder`).
        async fn force_release(&self, key: &LockKey, holder: &str) -> Result<bool> {
            let status = self.inner.inspect(key).await?.without_owners();
            let fence = status.holder(holder).and_then(|h| h.fence);
            let holders = status.each_holder();
            let broke = self.inner.force_release(key, holder).await?;
            if broke && self.defect == Defect::BreakKeepsFence {
                if let Some(fence) = fence {
                    self.extra.broken_fences.lock().unwrap().insert(key.clone(), fence);
                }
            }
            if broke && self.defect == Defect::BreakTakesEveryHolder {
                for other in holders.iter().filter_map(|h| h.id.as_deref()) {
                    self.inner.force_release(key, other).await?;
                }
            }
            Ok(broke)
        }

        /// The store's names, less the groups' (`ListMissesGroups`).
        async fn list(&self, prefix: &str) -> Result<Vec<LockKey>> {
            let names = self.inner.list(prefix).await?;
            if self.defect != Defect::ListMissesGroups {
                return Ok(names);
            }
            let mut single = Vec::new();
            for name in names {
                let status = self.inner.inspect(&name).await?;
                if !status.is_shared() && status.permits.is_none_or(|n| n == 1) {
                    single.push(name);
                }
            }
            Ok(single)
        }

        /// Nothing was queued (see `try_acquire`), but a writer's mark may
        /// be left to take away.
        async fn abandon(&self, hold: &HoldId, ticket: &OwnerToken) -> Result<()> {
            if self.defect == Defect::AbandonIgnored {
                return Ok(());
            }
            self.inner.abandon(hold, ticket).await
        }
    }
}

/// A harness whose clients all carry `defect`.
pub struct BrokenHarness<H> {
    inner: H,
    defect: Defect,
    holders: Arc<Mutex<HashMap<LockKey, HoldId>>>,
    leases: Arc<Mutex<HashMap<LockKey, (Instant, Duration)>>>,
    extra: Arc<Extra>,
}

impl<H: Harness> BrokenHarness<H> {
    /// Breaks every client `inner` makes.
    pub fn new(inner: H, defect: Defect) -> Self {
        BrokenHarness {
            inner,
            defect,
            holders: Arc::default(),
            leases: Arc::default(),
            extra: Arc::default(),
        }
    }

    fn wrap(&self, inner: Arc<dyn LockBackend>) -> Arc<dyn LockBackend> {
        Arc::new(Broken {
            inner,
            defect: self.defect,
            holders: self.holders.clone(),
            leases: self.leases.clone(),
            extra: self.extra.clone(),
        })
    }
}

#[async_trait]
impl<H: Harness> Harness for BrokenHarness<H> {
    async fn client(&self) -> Arc<dyn LockBackend> {
        self.wrap(self.inner.client().await)
    }
    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        self.wrap(self.inner.unreachable_client().await)
    }
    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        let inner = self.inner.stored_names(prefix).await?;
        // Collected names lose their count: the store "forgot" them.
        self.extra
            .fences
            .lock()
            .unwrap()
            .retain(|k, _| !k.as_str().starts_with(prefix));
        let leaked = self
            .extra
            .leaked
            .lock()
            .unwrap()
            .iter()
            .filter(|k| k.as_str().starts_with(prefix))
            .count();
        Ok(inner + leaked as u64)
    }
}

/// A quorum that keeps every rule of
/// [`Quorum`](lockwright_core::backend::Quorum) but one: it counts a grant
/// or a renewal however late it came back, even after the TTL it was for
/// has run out. Of the shared quorum tests, only
/// [`late_answers_do_not_count`](crate::quorum::late_answers_do_not_count)
/// catches it.
#[derive(Debug)]
pub struct UntimedQuorum {
    nodes: Vec<Arc<dyn LockBackend>>,
}

impl UntimedQuorum {
    /// A quorum over `nodes`.
    pub fn new(nodes: Vec<Arc<dyn LockBackend>>) -> Self {
        UntimedQuorum { nodes }
    }

    fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    fn unreachable(&self, errors: usize) -> Option<Error> {
        (errors > self.nodes.len() - self.quorum()).then(|| {
            Error::unavailable(format!("only {} nodes answered", self.nodes.len() - errors))
        })
    }
}

// Not a wrapper but a combinator, like `Quorum`: `verify`, the
// subscriptions and `alarm` are the trait's defaults (nothing to check, no
// notification, no alarm), a waiter's ticket goes to no node, and it reads
// no status and keeps no marks, which is all a quorum under test needs;
// only acquire, release and renewal count.
#[async_trait]
impl LockBackend for UntimedQuorum {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let single = AcquireRequest {
            ticket: None,
            ..request.clone()
        };
        let answers = join_all(self.nodes.iter().map(|n| n.try_acquire(&single))).await;
        let granted = answers
            .iter()
            .filter(|a| matches!(a, Ok(Acquire::Acquired(_))))
            .count();
        // The defect: no check of how long the answers took.
        if granted >= self.quorum() {
            return Ok(Acquire::Acquired(Grant {
                fence: None,
                holds: 1,
                lease: None,
            }));
        }
        let undo = self
            .nodes
            .iter()
            .zip(&answers)
            .filter(|(_, a)| !matches!(a, Ok(Acquire::Contended { .. })));
        join_all(undo.map(|(n, _)| n.release(&request.hold))).await;
        let errors = answers.iter().filter(|a| a.is_err()).count();
        match self.unreachable(errors) {
            Some(e) => Err(e),
            None => Ok(Acquire::Contended { retry_after: None }),
        }
    }

    async fn release(&self, hold: &HoldId) -> Result<Release> {
        let answers = join_all(self.nodes.iter().map(|n| n.release(hold))).await;
        let held = answers
            .iter()
            .filter(|a| matches!(a, Ok(Release::Freed | Release::StillHeld(_))))
            .count();
        if held >= self.quorum() {
            return Ok(Release::Freed);
        }
        let errors = answers.iter().filter(|a| a.is_err()).count();
        match self.unreachable(errors) {
            Some(e) if held + errors >= self.quorum() => Err(e),
            _ => Ok(Release::NotHeld),
        }
    }

    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        let per_node = join_all(self.nodes.iter().map(|n| n.renew(requests))).await;
        (0..requests.len())
            .map(|i| {
                let renewed = per_node
                    .iter()
                    .filter(|a| matches!(a.get(i), Some(Ok(Renew::Renewed))))
                    .count();
                let errors = per_node
                    .iter()
                    .filter(|a| !matches!(a.get(i), Some(Ok(_))))
                    .count();
                // The defect again: no check of how long the answers took.
                if renewed >= self.quorum() {
                    Ok(Renew::Renewed)
                } else if renewed + errors >= self.quorum() {
                    Err(Error::unavailable("too few nodes answered the renewal"))
                } else {
                    Ok(Renew::NotHeld)
                }
            })
            .collect()
    }

    async fn inspect(&self, _key: &LockKey) -> Result<LockStatus> {
        Err(Error::new(
            ErrorKind::Unsupported,
            "the untimed quorum reads no status",
        ))
    }

    async fn abandon(&self, _hold: &HoldId, _ticket: &OwnerToken) -> Result<()> {
        Ok(())
    }
}
