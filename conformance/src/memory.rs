//! The harnesses for the in-memory reference backend, alone and as the
//! nodes of a quorum.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use locksmith_core::backend::{LockBackend, MemoryBackend, Quorum};

use crate::Harness;

/// Clients of one shared [`MemoryBackend`]; the unreachable client is a store
/// switched off.
#[derive(Debug, Default)]
pub struct MemoryHarness {
    store: MemoryBackend,
}

impl MemoryHarness {
    /// A harness over a fresh store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Harness for MemoryHarness {
    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(self.store.clone())
    }

    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        let down = MemoryBackend::new();
        down.set_available(false);
        Arc::new(down)
    }

    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        Ok(self.store.stored_keys(prefix) as u64)
    }
}

/// Clients of a [`Quorum`] over five shared in-memory stores, one of them
/// down for good: the generic quorum rules pass the suite with a minority
/// lost. Five, not three: a semaphore of N permits needs more than
/// 5·N/(N+1) nodes (4 for the suite's N of 2 and 3), where over three
/// nodes it needs all three, and one down stops new permits
/// ([`Quorum::needed`]). The unreachable client is a quorum of stores
/// switched off.
#[derive(Debug)]
pub struct QuorumHarness {
    stores: [MemoryBackend; 5],
}

impl QuorumHarness {
    /// Five fresh stores, the last one down.
    pub fn new() -> Self {
        let stores: [MemoryBackend; 5] = Default::default();
        stores[4].set_available(false);
        QuorumHarness { stores }
    }

    fn quorum(stores: Vec<MemoryBackend>) -> Arc<dyn LockBackend> {
        Arc::new(
            Quorum::new("in-memory quorum", stores, Duration::from_millis(10)).expect("five nodes"),
        )
    }
}

impl Default for QuorumHarness {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Harness for QuorumHarness {
    async fn client(&self) -> Arc<dyn LockBackend> {
        Self::quorum(self.stores.to_vec())
    }

    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        let down: Vec<MemoryBackend> = (0..5).map(|_| MemoryBackend::new()).collect();
        for s in &down {
            s.set_available(false);
        }
        Self::quorum(down)
    }

    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        Ok(self
            .stores
            .iter()
            .map(|s| s.stored_keys(prefix) as u64)
            .max()
            .unwrap_or(0))
    }
}
