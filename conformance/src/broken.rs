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
use locksmith_core::backend::{
    Acquire, Capabilities, Grant, LockBackend, Release, Renew, RenewRequest, Watch,
};
use locksmith_core::{Error, ErrorKind, FencingToken, LockKey, LockStatus, OwnerToken, Result};

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
    /// A candidate (an owner carrying a value) takes the key from a live holder.
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
}

/// How long `CampaignGrantLandsLate` keeps a contended request to grant.
const LATE_GRANT_KEPT: Duration = Duration::from_secs(2);

impl Defect {
    /// Every defect.
    pub const ALL: [Defect; 17] = [
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
    ];
}

/// A client with one defect. Clients of one [`BrokenHarness`] share the
/// bookkeeping a defect needs (who holds what), as one store would.
#[derive(Debug)]
pub struct Broken {
    inner: Arc<dyn LockBackend>,
    defect: Defect,
    holders: Arc<Mutex<HashMap<LockKey, OwnerToken>>>,
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

// The defects live in `try_acquire`, `release` and `renew`; the two
// methods that would reach the store around them (`renew_many`,
// `try_acquire_waiting`) go through them instead, so that a defect shows on
// every path. Everything else is the correct backend's.
locksmith_core::forward_backend! {
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

        async fn try_acquire(
            &self,
            key: &LockKey,
            owner: &OwnerToken,
            ttl: Duration,
        ) -> Result<Acquire> {
            let ttl = match self.defect {
                Defect::NoExpiry => ttl.max(Duration::from_secs(3600)),
                _ => ttl,
            };
            let candidate = owner.value().is_some();
            if let Some(v) = owner.value().filter(|_| self.defect == Defect::StaleLeaderValue) {
                self.extra
                    .first_values
                    .lock()
                    .unwrap()
                    .entry(key.clone())
                    .or_insert_with(|| v.to_vec());
            }
            let mut outcome = self.inner.try_acquire(key, owner, ttl).await;
            let takes_over = (self.defect == Defect::EarlyTakeover && self.nearly_expired(key))
                || (self.defect == Defect::CampaignIgnoresLeader && candidate);
            if takes_over && matches!(outcome, Ok(Acquire::Contended { .. })) {
                let holder = self.holders.lock().unwrap().get(key).cloned();
                if let Some(holder) = holder {
                    self.inner.release(key, &holder).await?;
                    outcome = self.inner.try_acquire(key, owner, ttl).await;
                }
            }
            if self.defect == Defect::CampaignGrantLandsLate
                && candidate
                && matches!(outcome, Ok(Acquire::Contended { .. }))
            {
                let (inner, key, owner) = (self.inner.clone(), key.clone(), owner.clone());
                tokio::spawn(async move {
                    let until = Instant::now() + LATE_GRANT_KEPT;
                    while Instant::now() < until {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        if let Ok(Acquire::Acquired(_)) = inner.try_acquire(&key, &owner, ttl).await {
                            break;
                        }
                    }
                });
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
                    .insert(key.clone(), owner.clone());
                self.leases
                    .lock()
                    .unwrap()
                    .insert(key.clone(), (Instant::now(), ttl));
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

        async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
            if self.defect == Defect::ResignKeepsLease && owner.value().is_some() {
                // Left to run out: 8 s, so the cases that wait for it do not.
                self.inner.renew(key, owner, Duration::from_secs(8)).await?;
                return Ok(Release::Freed);
            }
            self.extra.last_held.lock().unwrap().remove(key);
            if self.defect == Defect::ReleaseWithoutOwnerCheck {
                let holder = self.holders.lock().unwrap().get(key).cloned();
                if let Some(holder) = holder {
                    return self.inner.release(key, &holder).await;
                }
            }
            self.inner.release(key, owner).await
        }

        async fn renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
            match self.defect {
                Defect::RenewReleases => {
                    self.inner.release(key, owner).await?;
                    Ok(Renew::Renewed)
                }
                Defect::NoExpiry => {
                    self.inner
                        .renew(key, owner, ttl.max(Duration::from_secs(3600)))
                        .await
                }
                _ => {
                    let renewed = self.inner.renew(key, owner, ttl).await?;
                    if renewed == Renew::Renewed {
                        self.leases
                            .lock()
                            .unwrap()
                            .insert(key.clone(), (Instant::now(), ttl));
                    }
                    Ok(renewed)
                }
            }
        }

        async fn proclaim(&self, key: &LockKey, owner: &OwnerToken, value: &[u8]) -> Result<Renew> {
            if self.defect == Defect::ProclaimWithoutOwnerCheck {
                let holder = self.holders.lock().unwrap().get(key).cloned();
                if let Some(holder) = holder {
                    return self.inner.proclaim(key, &holder, value).await;
                }
            }
            self.inner.proclaim(key, owner, value).await
        }

        async fn changes(&self, key: &LockKey) -> Result<Option<Watch>> {
            if self.defect == Defect::SilentChanges {
                // A live subscription that nothing ever bumps.
                let (tx, rx) = tokio::sync::watch::channel(0u64);
                return Ok(Some(Watch::new(rx, Some(Box::new(tx)))));
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

        /// Each lease through `renew` above, defects and all: the watchdog
        /// renews in batches.
        async fn renew_many(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
            join_all(requests.iter().map(|r| self.renew(&r.key, &r.owner, r.ttl))).await
        }

        /// A plain attempt through `try_acquire` above, defects and all:
        /// nothing is queued (a `ClaimsFairness` store only claims to).
        async fn try_acquire_waiting(
            &self,
            key: &LockKey,
            owner: &OwnerToken,
            ttl: Duration,
            ticket: &OwnerToken,
        ) -> Result<Acquire> {
            let _ = ticket;
            self.try_acquire(key, owner, ttl).await
        }

        /// Nothing was queued (see `try_acquire_waiting`).
        async fn abandon(
            &self,
            key: &LockKey,
            owner: &OwnerToken,
            ticket: &OwnerToken,
        ) -> Result<()> {
            let _ = (key, owner, ticket);
            Ok(())
        }
    }
}

/// A harness whose clients all carry `defect`.
pub struct BrokenHarness<H> {
    inner: H,
    defect: Defect,
    holders: Arc<Mutex<HashMap<LockKey, OwnerToken>>>,
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
/// [`Quorum`](locksmith_core::backend::Quorum) but one: it counts a grant
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

// Not a wrapper but a combinator, like `Quorum`: `verify`, `inspect`, the
// waiting hooks and `alarm` are the trait's defaults (nothing to check, no
// status, no notification or queue, no alarm), which is all a quorum under
// test needs; only acquire, release and renewal count.
#[async_trait]
impl LockBackend for UntimedQuorum {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        let answers = join_all(self.nodes.iter().map(|n| n.try_acquire(key, owner, ttl))).await;
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
        join_all(undo.map(|(n, _)| n.release(key, owner))).await;
        let errors = answers.iter().filter(|a| a.is_err()).count();
        match self.unreachable(errors) {
            Some(e) => Err(e),
            None => Ok(Acquire::Contended { retry_after: None }),
        }
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        let answers = join_all(self.nodes.iter().map(|n| n.release(key, owner))).await;
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

    async fn renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
        locksmith_core::backend::renew_one(self, key, owner, ttl).await
    }

    async fn renew_many(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        let per_node = join_all(self.nodes.iter().map(|n| n.renew_many(requests))).await;
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
}
