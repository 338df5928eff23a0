//! Fault injection around a real client: a network partition between this
//! client and its store, switched on and off by the test.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use locksmith_core::backend::{Acquire, Capabilities, LockBackend, Release, Renew, Watch};
use locksmith_core::{Error, LockKey, OwnerToken, Result};

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

/// Wraps a client whose acquire reaches the store and is applied there, but
/// whose reply is held back until [`open`](Stall::open): the moment a caller
/// may give up on an acquire the store has already granted.
#[derive(Debug)]
pub struct Stall {
    inner: Arc<dyn LockBackend>,
    granted: tokio::sync::Notify,
    gate: tokio::sync::watch::Sender<bool>,
}

impl Stall {
    /// Wraps `inner`, with the gate shut.
    pub fn new(inner: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(Stall {
            inner,
            granted: tokio::sync::Notify::new(),
            gate: tokio::sync::watch::channel(false).0,
        })
    }

    /// Completes once the store has granted an acquire whose reply is held.
    pub async fn granted(&self) {
        self.granted.notified().await;
    }

    /// Lets every held reply, and all later ones, through.
    pub fn open(&self) {
        self.gate.send_replace(true);
    }

    async fn hold(&self, outcome: Result<Acquire>) -> Result<Acquire> {
        if matches!(outcome, Ok(Acquire::Acquired(_))) {
            self.granted.notify_one();
            let mut gate = self.gate.subscribe();
            let _ = gate.wait_for(|open| *open).await;
        }
        outcome
    }
}

#[async_trait]
impl LockBackend for Stall {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        let outcome = self.inner.try_acquire(key, owner, ttl).await;
        self.hold(outcome).await
    }
    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        self.inner.release(key, owner).await
    }
    async fn renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
        self.inner.renew(key, owner, ttl).await
    }
    async fn watch(&self, key: &LockKey, ticket: &OwnerToken) -> Result<Option<Watch>> {
        self.inner.watch(key, ticket).await
    }
    async fn try_acquire_waiting(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        ticket: &OwnerToken,
    ) -> Result<Acquire> {
        let outcome = self
            .inner
            .try_acquire_waiting(key, owner, ttl, ticket)
            .await;
        self.hold(outcome).await
    }
    async fn abandon(&self, key: &LockKey, owner: &OwnerToken, ticket: &OwnerToken) -> Result<()> {
        self.inner.abandon(key, owner, ticket).await
    }
}
