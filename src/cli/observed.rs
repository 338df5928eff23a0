//! One forwarding wrapper for the CLI's tools: a client that lets an
//! observer hold each call back (a frozen process, in tests), note each
//! grant (`check`'s clean-up) or count renewals (`bench`), and otherwise
//! behaves exactly like the client it wraps.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use locksmith::backend::{Acquire, Capabilities, LockBackend, Release, Renew, RenewRequest, Watch};
use locksmith::{LockKey, LockStatus, OwnerToken, Result};

/// What a wrapper reports to, or waits on.
#[async_trait]
pub(crate) trait Observer: Send + Sync + std::fmt::Debug + 'static {
    /// Awaited before every call reaches the store.
    async fn gate(&self) {}
    /// A call granted `owner` the lock on `key`.
    fn granted(&self, _key: &LockKey, _owner: &OwnerToken) {}
    /// One renewal request for `leases` leases is about to be sent.
    fn renewing(&self, _leases: usize) {}
}

/// `inner`, observed.
#[derive(Debug)]
pub(crate) struct Observed<O> {
    inner: Arc<dyn LockBackend>,
    /// The observer.
    pub(crate) observer: O,
}

impl<O: Observer> Observed<O> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: Arc<dyn LockBackend>, observer: O) -> Arc<Self> {
        Arc::new(Observed { inner, observer })
    }

    fn note(&self, key: &LockKey, owner: &OwnerToken, outcome: &Result<Acquire>) {
        if matches!(outcome, Ok(Acquire::Acquired(_))) {
            self.observer.granted(key, owner);
        }
    }
}

#[async_trait]
impl<O: Observer> LockBackend for Observed<O> {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn verify(&self) -> Result<()> {
        self.observer.gate().await;
        self.inner.verify().await
    }
    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        self.observer.gate().await;
        let outcome = self.inner.try_acquire(key, owner, ttl).await;
        self.note(key, owner, &outcome);
        outcome
    }
    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        self.observer.gate().await;
        self.inner.release(key, owner).await
    }
    async fn renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
        self.observer.gate().await;
        self.observer.renewing(1);
        self.inner.renew(key, owner, ttl).await
    }
    async fn renew_many(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        self.observer.gate().await;
        self.observer.renewing(requests.len());
        self.inner.renew_many(requests).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        self.observer.gate().await;
        self.inner.inspect(key).await
    }
    async fn watch(&self, key: &LockKey, ticket: &OwnerToken) -> Result<Option<Watch>> {
        self.observer.gate().await;
        self.inner.watch(key, ticket).await
    }
    async fn try_acquire_waiting(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
        ticket: &OwnerToken,
    ) -> Result<Acquire> {
        self.observer.gate().await;
        let outcome = self
            .inner
            .try_acquire_waiting(key, owner, ttl, ticket)
            .await;
        self.note(key, owner, &outcome);
        outcome
    }
    async fn abandon(&self, key: &LockKey, owner: &OwnerToken, ticket: &OwnerToken) -> Result<()> {
        self.observer.gate().await;
        self.inner.abandon(key, owner, ticket).await
    }
}
