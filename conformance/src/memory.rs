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

/// Clients of a [`Quorum`] over three shared in-memory stores, one of them
/// down for good: the generic quorum rules pass the suite with a minority
/// lost. The unreachable client is a quorum of stores switched off.
#[derive(Debug)]
pub struct QuorumHarness {
    stores: [MemoryBackend; 3],
}

impl QuorumHarness {
    /// Three fresh stores, the last one down.
    pub fn new() -> Self {
        let stores = [
            MemoryBackend::new(),
            MemoryBackend::new(),
            MemoryBackend::new(),
        ];
        stores[2].set_available(false);
        QuorumHarness { stores }
    }

    fn quorum(stores: Vec<MemoryBackend>) -> Arc<dyn LockBackend> {
        Arc::new(
            Quorum::new("in-memory quorum", stores, Duration::from_millis(10))
                .expect("three nodes"),
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
        let down: Vec<MemoryBackend> = (0..3).map(|_| MemoryBackend::new()).collect();
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
