//! An in-process reference backend: correct, fast, and handy in tests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::backend::{
    Acquire, Binding, Capabilities, FencingToken, Grant, LockBackend, Release, Renew, Watch,
};
use crate::error::{Error, Result};
use crate::key::{LockKey, OwnerToken};

#[derive(Debug)]
struct Slot {
    owner: Option<OwnerToken>,
    holds: u32,
    expires: Instant,
    fence: u64,
    released: watch::Sender<u64>,
}

impl Slot {
    fn free(now: Instant) -> Self {
        Slot {
            owner: None,
            holds: 0,
            expires: now,
            fence: 0,
            released: watch::channel(0).0,
        }
    }
    fn held_by_anyone(&self, now: Instant) -> bool {
        self.owner.is_some() && self.expires > now
    }
    fn held_by(&self, owner: &OwnerToken, now: Instant) -> bool {
        self.held_by_anyone(now) && self.owner.as_ref() == Some(owner)
    }
}

#[derive(Debug, Default)]
struct Inner {
    slots: Mutex<HashMap<LockKey, Slot>>,
    down: AtomicBool,
}

/// Locks kept in this process's memory. Clones share one store, so each
/// clone stands for a separate client of it. Offers fencing and release
/// notifications; [`set_available`](Self::set_available) simulates an outage.
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

    fn slots(&self) -> Result<std::sync::MutexGuard<'_, HashMap<LockKey, Slot>>> {
        if self.inner.down.load(Ordering::SeqCst) {
            return Err(Error::unavailable("in-memory store is switched off"));
        }
        Ok(self.inner.slots.lock().unwrap_or_else(|e| e.into_inner()))
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
        }
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        let mut slots = self.slots()?;
        let now = Instant::now();
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
            slot.fence += 1;
            slot.expires = now + ttl;
        }
        Ok(Acquire::Acquired(Grant {
            fence: Some(FencingToken(slot.fence)),
            holds: slot.holds,
            lease: None,
        }))
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        let mut slots = self.slots()?;
        let now = Instant::now();
        let Some(slot) = slots.get_mut(key).filter(|s| s.held_by(owner, now)) else {
            return Ok(Release::NotHeld);
        };
        slot.holds -= 1;
        if slot.holds > 0 {
            return Ok(Release::StillHeld(slot.holds));
        }
        slot.owner = None;
        slot.released.send_modify(|v| *v += 1);
        Ok(Release::Freed)
    }

    async fn renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
        let mut slots = self.slots()?;
        let now = Instant::now();
        match slots.get_mut(key).filter(|s| s.held_by(owner, now)) {
            Some(slot) => {
                slot.expires = now + ttl;
                Ok(Renew::Renewed)
            }
            None => Ok(Renew::NotHeld),
        }
    }

    async fn watch(&self, key: &LockKey, _ticket: &OwnerToken) -> Result<Option<Watch>> {
        let mut slots = self.slots()?;
        let now = Instant::now();
        let slot = slots.entry(key.clone()).or_insert_with(|| Slot::free(now));
        Ok(Some(Watch::new(slot.released.subscribe(), None)))
    }
}
