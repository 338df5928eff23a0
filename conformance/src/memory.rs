//! The harness for the in-memory reference backend.

use std::sync::Arc;

use async_trait::async_trait;
use locksmith_core::backend::{LockBackend, MemoryBackend};

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
