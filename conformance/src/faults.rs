//! Fault injection around a real client: a network partition between this
//! client and its store, switched on and off by the test.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use locksmith_core::{
    Acquire, Capabilities, Error, LockBackend, LockKey, OwnerToken, Release, Renew, Result, Watch,
};

/// Wraps a client; once [`cut`](Partition::cut), every call fails with
/// `Unavailable` without reaching the store, as if the network had gone.
#[derive(Debug)]
pub struct Partition {
    inner: Arc<dyn LockBackend>,
    cut: AtomicBool,
}

impl Partition {
    /// Wraps `inner`, connected.
    pub fn new(inner: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(Partition {
            inner,
            cut: AtomicBool::new(false),
        })
    }

    /// Cuts this client off from the store.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Reconnects.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }

    fn check(&self) -> Result<()> {
        if self.cut.load(Ordering::SeqCst) {
            Err(Error::unavailable(
                "partitioned from the store (injected fault)",
            ))
        } else {
            Ok(())
        }
    }
}

#[async_trait]
impl LockBackend for Partition {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        self.check()?;
        self.inner.try_acquire(key, owner, ttl).await
    }
    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        self.check()?;
        self.inner.release(key, owner).await
    }
    async fn renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
        self.check()?;
        self.inner.renew(key, owner, ttl).await
    }
    async fn watch(&self, key: &LockKey, ticket: &OwnerToken) -> Result<Option<Watch>> {
        self.check()?;
        self.inner.watch(key, ticket).await
    }
    async fn try_acquire_waiting(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        ticket: &OwnerToken,
    ) -> Result<Acquire> {
        self.check()?;
        self.inner
            .try_acquire_waiting(key, owner, ttl, ticket)
            .await
    }
    async fn abandon(&self, key: &LockKey, owner: &OwnerToken, ticket: &OwnerToken) -> Result<()> {
        self.check()?;
        self.inner.abandon(key, owner, ticket).await
    }
}
