//! An in-process reference backend: correct, fast, and handy in tests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::backend::{Acquire, Binding, Capabilities, Grant, LockBackend, Release, Renew, Watch};
use crate::error::{Error, Result};
use crate::key::{FencingToken, LockKey, OwnerToken};
use crate::lease::LockStatus;

#[derive(Debug)]
struct Slot {
    owner: Option<OwnerToken>,
    holds: u32,
    expires: Instant,
    fence: u64,
    value: Option<Vec<u8>>,
    released: watch::Sender<u64>,
    /// Bumped on every grant, release and proclaim, for observers.
    changed: watch::Sender<u64>,
}

impl Slot {
    fn free(now: Instant) -> Self {
        Slot {
            owner: None,
            holds: 0,
            expires: now,
            fence: 0,
            value: None,
            released: watch::channel(0).0,
            changed: watch::channel(0).0,
        }
    }
    fn held_by_anyone(&self, now: Instant) -> bool {
        self.owner.is_some() && self.expires > now
    }
    fn held_by(&self, owner: &OwnerToken, now: Instant) -> bool {
        self.held_by_anyone(now) && self.owner.as_ref() == Some(owner)
    }
    /// Nothing of the slot is needed any more: free, and nobody watching.
    fn idle(&self, now: Instant) -> bool {
        !self.held_by_anyone(now)
            && self.released.receiver_count() == 0
            && self.changed.receiver_count() == 0
    }
    fn announce(&self) {
        self.changed.send_modify(|v| *v += 1);
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
        self.inner.store.lock().unwrap_or_else(|e| e.into_inner())
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
        }
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        let mut store = self.store()?;
        let now = Instant::now();
        store.sweep(now);
        let Store { slots, fence, .. } = &mut *store;
        let slot = slots.entry(key.clone()).or_insert_with(|| Slot::free(now));
        if slot.held_by(owner, now) {
            slot.holds += 1;
            slot.expires = now + ttl;
        } else if slot.held_by_anyone(now) {
            return Ok(Acquire::Contended {
                retry_after: Some(slot.expires - now),
            });
        } else {
            slot.owner = Some(owner.clone());
            slot.holds = 1;
            *fence += 1;
            slot.fence = *fence;
            slot.expires = now + ttl;
            slot.value = owner.value().map(<[u8]>::to_vec);
            slot.announce();
        }
        Ok(Acquire::Acquired(Grant {
            fence: Some(FencingToken(slot.fence)),
            holds: slot.holds,
            lease: None,
        }))
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        let mut store = self.store()?;
        let now = Instant::now();
        let Some(slot) = store.slots.get_mut(key).filter(|s| s.held_by(owner, now)) else {
            return Ok(Release::NotHeld);
        };
        slot.holds -= 1;
        if slot.holds > 0 {
            return Ok(Release::StillHeld(slot.holds));
        }
        slot.owner = None;
        slot.released.send_modify(|v| *v += 1);
        slot.announce();
        if slot.idle(now) {
            store.slots.remove(key);
        }
        Ok(Release::Freed)
    }

    async fn renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
        let mut store = self.store()?;
        let now = Instant::now();
        match store.slots.get_mut(key).filter(|s| s.held_by(owner, now)) {
            Some(slot) => {
                slot.expires = now + ttl;
                Ok(Renew::Renewed)
            }
            None => Ok(Renew::NotHeld),
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        let store = self.store()?;
        let now = Instant::now();
        Ok(
            match store.slots.get(key).filter(|s| s.held_by_anyone(now)) {
                Some(slot) => LockStatus::held(slot.holds)
                    .with_fence(Some(FencingToken(slot.fence)))
                    .with_remaining(Some(slot.expires.saturating_duration_since(now)))
                    .with_owner(slot.owner.clone())
                    .with_value(slot.value.clone()),
                None => LockStatus::free(),
            },
        )
    }

    async fn proclaim(&self, key: &LockKey, owner: &OwnerToken, value: &[u8]) -> Result<Renew> {
        let mut store = self.store()?;
        let now = Instant::now();
        match store.slots.get_mut(key).filter(|s| s.held_by(owner, now)) {
            Some(slot) => {
                slot.value = Some(value.to_vec());
                slot.announce();
                Ok(Renew::Renewed)
            }
            None => Ok(Renew::NotHeld),
        }
    }

    async fn changes(&self, key: &LockKey) -> Result<Option<Watch>> {
        let mut store = self.store()?;
        let now = Instant::now();
        let slot = store
            .slots
            .entry(key.clone())
            .or_insert_with(|| Slot::free(now));
        Ok(Some(Watch::new(slot.changed.subscribe(), None)))
    }

    async fn watch(&self, key: &LockKey, _ticket: &OwnerToken) -> Result<Option<Watch>> {
        let mut store = self.store()?;
        let now = Instant::now();
        let slot = store
            .slots
            .entry(key.clone())
            .or_insert_with(|| Slot::free(now));
        Ok(Some(Watch::new(slot.released.subscribe(), None)))
    }
}
