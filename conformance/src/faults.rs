//! Fault injection around a real client: a network partition between this
//! client and its store, switched on and off by the test; a reply held
//! back; and the one forwarding wrapper, [`Observed`], that these and the
//! CLI's tools (`lockwright check`, `lockwright bench`) are built on.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use lockwright_core::backend::{
    Acquire, AcquireRequest, Changes, HoldId, LockBackend, Release, Renew, RenewRequest, Watch,
};
use lockwright_core::{Error, LockKey, LockStatus, OwnerToken, Result};

/// What an [`Observed`] client reports to, or waits on.
#[async_trait]
pub trait Observer: Send + Sync + std::fmt::Debug + 'static {
    /// Awaited before every call reaches the store; an error ends the call
    /// there, as if the store had answered it.
    async fn gate(&self) -> Result<()> {
        Ok(())
    }
    /// A call granted `hold`.
    fn granted(&self, _hold: &HoldId) {}
    /// One renewal request for `leases` leases is about to be sent.
    fn renewing(&self, _leases: usize) {}
}

/// A real client with an observer in front of every call: one forwarding
/// wrapper for fault injection ([`Partition`], a frozen process), grant
/// tracking and counting, which otherwise behaves exactly like the client
/// it wraps.
#[derive(Debug)]
pub struct Observed<O> {
    inner: Arc<dyn LockBackend>,
    /// The observer.
    pub observer: O,
}

impl<O: Observer> Observed<O> {
    /// Wraps `inner`.
    pub fn wrap(inner: Arc<dyn LockBackend>, observer: O) -> Arc<Self> {
        Arc::new(Observed { inner, observer })
    }

    fn note(&self, hold: &HoldId, outcome: &Result<Acquire>) {
        if matches!(outcome, Ok(Acquire::Acquired(_))) {
            self.observer.granted(hold);
        }
    }
}

// Every call that reaches the store passes the gate; `capabilities` and
// `alarm` ask the client, not the store, and are forwarded as they are.
lockwright_core::forward_backend! {
    (self) => self.inner;
    impl<O: Observer> LockBackend for Observed<O> {
        async fn verify(&self) -> Result<()> {
            self.observer.gate().await?;
            self.inner.verify().await
        }
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
            self.observer.gate().await?;
            let outcome = self.inner.try_acquire(request).await;
            self.note(&request.hold, &outcome);
            outcome
        }
        async fn release(&self, hold: &HoldId) -> Result<Release> {
            self.observer.gate().await?;
            self.inner.release(hold).await
        }
        async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
            if let Err(e) = self.observer.gate().await {
                return requests.iter().map(|_| Err(e.clone())).collect();
            }
            self.observer.renewing(requests.len());
            self.inner.renew(requests).await
        }
        async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
            self.observer.gate().await?;
            self.inner.inspect(key).await
        }
        async fn changes(&self, key: &LockKey) -> Result<Option<Changes>> {
            self.observer.gate().await?;
            self.inner.changes(key).await
        }
        async fn watch(&self, key: &LockKey, ticket: &OwnerToken) -> Result<Option<Watch>> {
            self.observer.gate().await?;
            self.inner.watch(key, ticket).await
        }
        async fn abandon(&self, hold: &HoldId, ticket: &OwnerToken) -> Result<()> {
            self.observer.gate().await?;
            self.inner.abandon(hold, ticket).await
        }
    }
}

/// The switch of a [`Partition`].
#[derive(Debug, Default)]
pub struct Cut(AtomicBool);

#[async_trait]
impl Observer for Cut {
    async fn gate(&self) -> Result<()> {
        if self.0.load(Ordering::SeqCst) {
            Err(Error::unavailable(
                "partitioned from the store (injected fault)",
            ))
        } else {
            Ok(())
        }
    }
}

/// A client that, once [`cut`](Partition::cut), fails every call with
/// `Unavailable` without reaching the store, as if the network had gone.
pub type Partition = Observed<Cut>;

impl Partition {
    /// Wraps `inner`, connected.
    pub fn new(inner: Arc<dyn LockBackend>) -> Arc<Self> {
        Observed::wrap(inner, Cut::default())
    }

    /// Cuts this client off from the store.
    pub fn cut(&self) {
        self.observer.0.store(true, Ordering::SeqCst);
    }

    /// Reconnects.
    pub fn heal(&self) {
        self.observer.0.store(false, Ordering::SeqCst);
    }
}

/// Wraps a client whose acquire reaches the store and is applied there, but
/// whose reply is held back until [`open`](Stall::open): the moment a caller
/// may give up on an acquire the store has already granted.
/// ([`refusing`](Stall::refusing): the refusals are held back instead.)
#[derive(Debug)]
pub struct Stall {
    inner: Arc<dyn LockBackend>,
    granted: tokio::sync::Notify,
    gate: tokio::sync::watch::Sender<bool>,
    /// Holds back refusals ("held by someone else") instead of grants.
    refusals: bool,
}

impl Stall {
    /// Wraps `inner`, with the gate shut.
    pub fn new(inner: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(Stall {
            inner,
            granted: tokio::sync::Notify::new(),
            gate: tokio::sync::watch::channel(false).0,
            refusals: false,
        })
    }

    /// Wraps `inner`, with the gate shut, holding back the replies of
    /// acquires the store refused (whatever the refusal left in the store,
    /// a writer's mark, is there): the moment a caller may give up on an
    /// acquire before it heard "no".
    pub fn refusing(inner: Arc<dyn LockBackend>) -> Arc<Self> {
        Arc::new(Stall {
            inner,
            granted: tokio::sync::Notify::new(),
            gate: tokio::sync::watch::channel(false).0,
            refusals: true,
        })
    }

    /// Completes once the store has answered an acquire whose reply is
    /// held (granted it; refused it, for [`refusing`](Stall::refusing)).
    pub async fn granted(&self) {
        self.granted.notified().await;
    }

    /// Lets every held reply, and all later ones, through.
    pub fn open(&self) {
        self.gate.send_replace(true);
    }

    async fn hold(&self, outcome: Result<Acquire>) -> Result<Acquire> {
        let held = match &outcome {
            Ok(Acquire::Acquired(_)) => !self.refusals,
            Ok(Acquire::Contended { .. }) => self.refusals,
            Err(_) => false,
        };
        if held {
            self.granted.notify_one();
            let mut gate = self.gate.subscribe();
            let _ = gate.wait_for(|open| *open).await;
        }
        outcome
    }
}

// Only the answers to acquires are held back, waiting or not; everything
// else is the client's own.
lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for Stall {
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
            let outcome = self.inner.try_acquire(request).await;
            self.hold(outcome).await
        }
    }
}
