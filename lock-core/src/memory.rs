//! An in-process reference backend: correct, fast, and handy in tests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::backend::{
    Acquire, AcquireRequest, Binding, Capabilities, Changes, Grant, HoldId, LockBackend, Release,
    Renew, RenewRequest, Watch, MARK_LIFE,
};
use crate::claims::{judge, Found};
use crate::error::{Error, Result};
use crate::key::{Claim, FencingToken, LockKey, OwnerToken};
use crate::lease::{Holder, LockStatus};

/// One owner's live hold of a name.
#[derive(Debug)]
struct Hold {
    owner: OwnerToken,
    shared: bool,
    holds: u32,
    expires: Instant,
    fence: u64,
    value: Option<Vec<u8>>,
}

#[derive(Debug)]
struct Slot {
    holders: Vec<Hold>,
    /// The permits of the exclusive holds (meaningful while one is live).
    permits: u32,
    /// Writers waiting for readers to leave, by owner, until when: while
    /// one is live no new reader enters.
    writers_waiting: Vec<(OwnerToken, Instant)>,
    released: watch::Sender<u64>,
    /// Bumped on every grant, release and proclaim, for observers.
    changed: watch::Sender<u64>,
}

impl Slot {
    fn free() -> Self {
        Slot {
            holders: Vec::new(),
            permits: 1,
            writers_waiting: Vec::new(),
            released: watch::channel(0).0,
            changed: watch::channel(0).0,
        }
    }
    /// Forgets what expired by `now`; wakes waiters if a hold went.
    fn prune(&mut self, now: Instant) {
        let before = self.holders.len();
        self.holders.retain(|h| h.expires > now);
        self.writers_waiting.retain(|(_, until)| *until > now);
        if self.holders.len() != before {
            self.released.send_modify(|v| *v += 1);
        }
    }
    fn held_by_anyone(&self, now: Instant) -> bool {
        self.holders.iter().any(|h| h.expires > now)
    }
    fn hold_of(&mut self, owner: &OwnerToken, now: Instant) -> Option<&mut Hold> {
        self.holders
            .iter_mut()
            .find(|h| h.expires > now && h.owner == *owner)
    }
    /// Nothing of the slot is needed any more: free, nobody waiting to
    /// write, and nobody watching.
    fn idle(&self, now: Instant) -> bool {
        !self.held_by_anyone(now)
            && self.writers_waiting.iter().all(|(_, until)| *until <= now)
            && self.released.receiver_count() == 0
            && self.changed.receiver_count() == 0
    }
    fn announce(&self) {
        self.changed.send_modify(|v| *v += 1);
    }
    /// How long a new `claim` by `owner`, which the rules admit, waits
    /// at the least (`None`: granted now). An exclusive claim waits for
    /// readers (and marks the name so that no new reader enters) or for
    /// a free permit; a shared one waits for writers, live or waiting,
    /// unless it is a downgrade beside the writer that holds.
    fn blocked(
        &mut self,
        owner: &OwnerToken,
        beside: Option<&OwnerToken>,
        claim: Claim,
        now: Instant,
        ttl: Duration,
    ) -> Option<Duration> {
        match claim {
            Claim::Exclusive { permits } => {
                let readers = self.soonest(now, |h| h.shared);
                if readers.is_some() {
                    // Stop new readers until this writer is served or gives up.
                    self.writers_waiting.retain(|(o, _)| o != owner);
                    self.writers_waiting
                        .push((owner.clone(), now + ttl.min(MARK_LIFE)));
                    readers
                } else if self.holders.len() >= permits as usize {
                    self.soonest(now, |_| true)
                } else {
                    None
                }
            }
            Claim::Shared => {
                let writers = self.soonest(now, |h| !h.shared);
                let beside_writer = beside.is_some_and(|w| {
                    let mut writers = self.holders.iter().filter(|h| !h.shared).peekable();
                    writers.peek().is_some() && writers.all(|h| h.owner == *w)
                });
                if beside_writer {
                    None
                } else if beside.is_some() {
                    // A downgrade whose writer no longer holds: refused,
                    // never a read hold after a gap.
                    Some(Duration::ZERO)
                } else if writers.is_some() {
                    writers
                } else {
                    self.writers_waiting
                        .iter()
                        .map(|(_, until)| until.saturating_duration_since(now))
                        .max()
                }
            }
        }
    }
    /// The soonest a live hold among those matching `which` runs out.
    fn soonest(&self, now: Instant, which: impl Fn(&Hold) -> bool) -> Option<Duration> {
        self.holders
            .iter()
            .filter(|h| which(h))
            .map(|h| h.expires.saturating_duration_since(now))
            .min()
    }
}

/// The slots, and one fencing counter for every key, so a slot can go as
/// soon as its lock is free and nobody watches it.
#[derive(Debug, Default)]
struct Store {
    slots: HashMap<LockKey, Slot>,
    fence: u64,
    /// When idle slots were last dropped.
    swept: Option<Instant>,
}

/// How often expired slots are swept at the least, while the store is used.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

impl Store {
    /// Drops idle slots (expired leases, watches that ended) at most once a
    /// second: released slots go at once, so what waits for this is only
    /// what expired or stopped being watched within the last second.
    fn sweep(&mut self, now: Instant) {
        if matches!(self.swept, Some(t) if now.duration_since(t) < SWEEP_EVERY) {
            return;
        }
        self.slots.retain(|_, slot| !slot.idle(now));
        self.swept = Some(now);
    }
}

#[derive(Debug, Default)]
struct Inner {
    store: Mutex<Store>,
    down: AtomicBool,
}

/// Locks kept in this process's memory. Clones share one store, so each
/// clone stands for a separate client of it. Offers fencing, release
/// notifications and change notices for observers; [`set_available`](Self::set_available) simulates an outage.
/// A key's state goes when its lock is released, or with the sweep an
/// acquire makes at least every second once its lease ran out.
#[derive(Debug, Clone, Default)]
pub struct MemoryBackend {
    inner: Arc<Inner>,
}

impl MemoryBackend {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Switches the simulated store on or off; while off every call fails
    /// with [`ErrorKind::Unavailable`](crate::ErrorKind::Unavailable).
    pub fn set_available(&self, up: bool) {
        self.inner.down.store(!up, Ordering::SeqCst);
    }

    /// How many keys starting with `prefix` the store keeps state for
    /// (held, expired but not yet swept, or watched): what the conformance
    /// suite's bounded-state cases inspect.
    pub fn stored_keys(&self, prefix: &str) -> usize {
        self.lock_store()
            .slots
            .keys()
            .filter(|k| k.as_str().starts_with(prefix))
            .count()
    }

    fn lock_store(&self) -> std::sync::MutexGuard<'_, Store> {
        crate::sync::lock_unpoisoned(&self.inner.store)
    }

    fn store(&self) -> Result<std::sync::MutexGuard<'_, Store>> {
        if self.inner.down.load(Ordering::SeqCst) {
            return Err(Error::unavailable("in-memory store is switched off"));
        }
        Ok(self.lock_store())
    }
}

#[async_trait]
impl LockBackend for MemoryBackend {
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: true,
            min_ttl: Duration::from_millis(1),
            ttl_resolution: Duration::from_nanos(1),
            binding: Binding::Lease,
            notify: true,
            fair: false,
            // Released keys go at once; expired ones with the next sweep.
            retention: SWEEP_EVERY,
            max_lease: None,
            values: true,
            permits: true,
            shared: true,
            listing: true,
            in_line: false,
            max_poll: None,
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockKey>> {
        let store = self.store()?;
        Ok(store
            .slots
            .keys()
            .filter(|k| k.as_str().starts_with(prefix))
            .cloned()
            .collect())
    }

    async fn abandon(&self, hold: &HoldId, _ticket: &OwnerToken) -> Result<()> {
        // A writer that gives up lets readers in again.
        let mut store = self.store()?;
        if let Some(slot) = store.slots.get_mut(&hold.key) {
            let before = slot.writers_waiting.len();
            slot.writers_waiting.retain(|(o, _)| *o != hold.owner);
            if slot.writers_waiting.len() != before {
                slot.released.send_modify(|v| *v += 1);
            }
        }
        Ok(())
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        let (key, owner, ttl) = (request.key(), request.owner(), request.ttl);
        let mut store = self.store()?;
        let now = Instant::now();
        store.sweep(now);
        let Store { slots, fence, .. } = &mut *store;
        let slot = slots.entry(key.clone()).or_insert_with(Slot::free);
        slot.prune(now);
        let claim = request.claim();
        let found = Found {
            own_shared: slot.hold_of(owner, now).map(|h| h.shared),
            kept: slot
                .holders
                .iter()
                .any(|h| !h.shared)
                .then_some(slot.permits),
            readers: slot.holders.iter().any(|h| h.shared),
        };
        judge(key, claim, found)?;
        if let Some(hold) = slot.hold_of(owner, now) {
            hold.holds += 1;
            hold.expires = now + ttl;
            return Ok(Acquire::Acquired(Grant {
                fence: Some(FencingToken(hold.fence)),
                holds: hold.holds,
                lease: None,
            }));
        }
        let blocked = slot.blocked(owner, request.hold.kind.beside(), claim, now, ttl);
        if let Some(left) = blocked {
            return Ok(Acquire::Contended {
                retry_after: Some(left),
            });
        }
        slot.writers_waiting.retain(|(o, _)| o != owner);
        if let Some(permits) = claim.exclusive_permits() {
            slot.permits = permits;
        }
        *fence += 1;
        slot.holders.push(Hold {
            owner: owner.clone(),
            shared: claim.is_shared(),
            holds: 1,
            expires: now + ttl,
            fence: *fence,
            value: request.value().map(<[u8]>::to_vec),
        });
        slot.announce();
        Ok(Acquire::Acquired(Grant {
            fence: Some(FencingToken(*fence)),
            holds: 1,
            lease: None,
        }))
    }

    async fn release(&self, hold: &HoldId) -> Result<Release> {
        let (key, owner) = (&hold.key, &hold.owner);
        let mut store = self.store()?;
        let now = Instant::now();
        let Some(slot) = store.slots.get_mut(key) else {
            return Ok(Release::NotHeld);
        };
        let Some(hold) = slot.hold_of(owner, now) else {
            return Ok(Release::NotHeld);
        };
        hold.holds -= 1;
        if hold.holds > 0 {
            return Ok(Release::StillHeld(hold.holds));
        }
        slot.holders.retain(|h| h.owner != *owner);
        slot.released.send_modify(|v| *v += 1);
        slot.announce();
        if slot.idle(now) {
            store.slots.remove(key);
        }
        Ok(Release::Freed)
    }

    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        let mut store = match self.store() {
            Ok(store) => store,
            Err(e) => return requests.iter().map(|_| Err(e.clone())).collect(),
        };
        let now = Instant::now();
        requests
            .iter()
            .map(|r| {
                let held = store.slots.get_mut(r.key());
                match held.and_then(|s| s.hold_of(r.owner(), now)) {
                    Some(hold) => {
                        hold.expires = now + r.ttl;
                        Ok(Renew::Renewed)
                    }
                    None => Ok(Renew::NotHeld),
                }
            })
            .collect()
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        let store = self.store()?;
        let now = Instant::now();
        let Some(slot) = store.slots.get(key) else {
            return Ok(LockStatus::free());
        };
        let live: Vec<&Hold> = slot.holders.iter().filter(|h| h.expires > now).collect();
        let status = LockStatus::of_holders(
            live.iter()
                .map(|h| {
                    Holder::new(h.shared, h.holds)
                        .with_owner(Some(h.owner.clone()))
                        .with_fence(Some(FencingToken(h.fence)))
                        .with_remaining(Some(h.expires.saturating_duration_since(now)))
                })
                .collect(),
        );
        Ok(match live.as_slice() {
            [] => status,
            [one] => status
                .with_owner(Some(one.owner.clone()))
                .with_value(one.value.clone())
                .with_permits((!one.shared).then_some(slot.permits)),
            more => status.with_permits(more.iter().any(|h| !h.shared).then_some(slot.permits)),
        })
    }

    async fn proclaim(&self, hold: &HoldId, value: &[u8]) -> Result<Renew> {
        let mut store = self.store()?;
        let now = Instant::now();
        let Some(slot) = store.slots.get_mut(&hold.key) else {
            return Ok(Renew::NotHeld);
        };
        match slot.hold_of(&hold.owner, now) {
            Some(hold) => {
                hold.value = Some(value.to_vec());
                slot.announce();
                Ok(Renew::Renewed)
            }
            None => Ok(Renew::NotHeld),
        }
    }

    async fn changes(&self, key: &LockKey) -> Result<Option<Changes>> {
        let mut store = self.store()?;
        let slot = store.slots.entry(key.clone()).or_insert_with(Slot::free);
        Ok(Some(Changes::new(slot.changed.subscribe(), None)))
    }

    async fn watch(&self, key: &LockKey, _ticket: &OwnerToken) -> Result<Option<Watch>> {
        let mut store = self.store()?;
        let slot = store.slots.entry(key.clone()).or_insert_with(Slot::free);
        Ok(Some(Watch::new(slot.released.subscribe(), None)))
    }
}
