//! The harnesses for the in-memory reference backend, alone and as the
//! nodes of a quorum.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lockwright_core::backend::{LockBackend, MemoryBackend, Quorum};

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

/// Clients of a [`Quorum`] over shared in-memory stores, the last of them
/// down for good: the generic quorum rules pass the suite with a minority
/// lost. [`new`](Self::new) is three stores, the tightest quorum, whose
/// clients say they grant no permits or shared holds: over three nodes a
/// semaphore needs all three ([`Quorum::needed`]), so with one down it
/// is `Unavailable` by design. [`five`](Self::five) is five stores,
/// where a semaphore of 2 or 3 needs four, with everything the nodes
/// offer. The unreachable client is a quorum of stores switched off.
#[derive(Debug)]
pub struct QuorumHarness {
    stores: Vec<MemoryBackend>,
    claims: bool,
}

/// A quorum's client that grants no permits or shared holds.
#[derive(Debug)]
struct WithoutClaims(Arc<dyn LockBackend>);

lockwright_core::forward_backend! {
    (self) => self.0;
    impl LockBackend for WithoutClaims {
        fn capabilities(&self) -> lockwright_core::backend::Capabilities {
            self.0.capabilities().with_permits(false).with_shared(false)
        }
    }
}

impl QuorumHarness {
    /// Three fresh stores, the last one down; no permits or shared holds.
    pub fn new() -> Self {
        Self::of(3, false)
    }

    /// Five fresh stores, the last one down.
    pub fn five() -> Self {
        Self::of(5, true)
    }

    fn of(n: usize, claims: bool) -> Self {
        let stores: Vec<MemoryBackend> = (0..n).map(|_| MemoryBackend::new()).collect();
        stores[n - 1].set_available(false);
        QuorumHarness { stores, claims }
    }

    fn quorum(&self, stores: Vec<MemoryBackend>) -> Arc<dyn LockBackend> {
        let q: Arc<dyn LockBackend> = Arc::new(
            Quorum::new("in-memory quorum", stores, Duration::from_millis(10))
                .expect("three or five nodes"),
        );
        if self.claims {
            q
        } else {
            Arc::new(WithoutClaims(q))
        }
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
        self.quorum(self.stores.clone())
    }

    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        let down: Vec<MemoryBackend> = self.stores.iter().map(|_| MemoryBackend::new()).collect();
        for s in &down {
            s.set_available(false);
        }
        self.quorum(down)
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
