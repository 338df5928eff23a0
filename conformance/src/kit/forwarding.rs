//! Proof that a wrapper forwards what it should: a [`Recorder`] logs every
//! call that reaches it, [`check`] calls every method of
//! [`LockBackend`] through the wrapper, and the wrapper's own table
//! ([`Expect`] per [`Method`]) says where each call must arrive.
//!
//! Nothing here may lean on the trait's defaults, or a method added to the
//! trait would pass unseen: [`Method`] is matched exhaustively wherever it
//! is used (a new variant does not compile until every table has an
//! answer for it), the recorder writes out every method (one it does not
//! know reaches no log, and every check fails), and `lock-core`'s
//! `tests/forwarding.rs` fails when the trait has a method [`Method::ALL`]
//! does not name.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use lockwright_core::backend::{
    Acquire, AcquireRequest, Capabilities, Changes, HoldId, LockBackend, MemoryBackend, Release,
    Renew, RenewRequest, Watch,
};
use lockwright_core::{LockKey, LockStatus, OwnerToken, Result};

/// One method of [`LockBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    /// [`LockBackend::capabilities`].
    Capabilities,
    /// [`LockBackend::verify`].
    Verify,
    /// [`LockBackend::try_acquire`].
    TryAcquire,
    /// [`LockBackend::release`].
    Release,
    /// [`LockBackend::renew`].
    Renew,
    /// [`LockBackend::inspect`].
    Inspect,
    /// [`LockBackend::proclaim`].
    Proclaim,
    /// [`LockBackend::changes`].
    Changes,
    /// [`LockBackend::watch`].
    Watch,
    /// [`LockBackend::abandon`].
    Abandon,
    /// [`LockBackend::alarm`].
    Alarm,
    /// [`LockBackend::force_release`].
    ForceRelease,
    /// [`LockBackend::list`].
    List,
}

impl Method {
    /// Every method, in the trait's order.
    pub const ALL: [Method; 13] = [
        Method::Capabilities,
        Method::Verify,
        Method::TryAcquire,
        Method::Release,
        Method::Renew,
        Method::Inspect,
        Method::Proclaim,
        Method::Changes,
        Method::Watch,
        Method::Abandon,
        Method::Alarm,
        Method::ForceRelease,
        Method::List,
    ];

    /// Its name in the trait.
    pub fn name(self) -> &'static str {
        match self {
            Method::Capabilities => "capabilities",
            Method::Verify => "verify",
            Method::TryAcquire => "try_acquire",
            Method::Release => "release",
            Method::Renew => "renew",
            Method::Inspect => "inspect",
            Method::Proclaim => "proclaim",
            Method::Changes => "changes",
            Method::Watch => "watch",
            Method::Abandon => "abandon",
            Method::Alarm => "alarm",
            Method::ForceRelease => "force_release",
            Method::List => "list",
        }
    }
}

/// Where a call a wrapper receives must arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// At the inner backend, as the same method.
    Forwarded,
    /// At the inner backend as this other method, never as itself (a
    /// broken wrapper's renewal that releases, say).
    As(Method),
    /// Nowhere: the wrapper answers it itself, on purpose, and says why
    /// in its code.
    Answered,
}

/// A memory store that logs every call made to it.
#[derive(Debug, Default)]
pub struct Recorder {
    store: MemoryBackend,
    log: Mutex<Vec<Method>>,
}

impl Recorder {
    /// A fresh store with an empty log.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The calls since the last `take`, in order, and a fresh log.
    pub fn take(&self) -> Vec<Method> {
        std::mem::take(&mut *self.lock())
    }

    fn note(&self, method: Method) {
        self.lock().push(method);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Method>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

// Every method written out, on purpose not with `forward_backend!`: this is
// the inner end that proves the forwarding.
#[async_trait]
impl LockBackend for Recorder {
    fn capabilities(&self) -> Capabilities {
        self.note(Method::Capabilities);
        self.store.capabilities()
    }
    async fn verify(&self) -> Result<()> {
        self.note(Method::Verify);
        self.store.verify().await
    }
    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        self.note(Method::TryAcquire);
        self.store.try_acquire(request).await
    }
    async fn release(&self, hold: &HoldId) -> Result<Release> {
        self.note(Method::Release);
        self.store.release(hold).await
    }
    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        self.note(Method::Renew);
        self.store.renew(requests).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        self.note(Method::Inspect);
        self.store.inspect(key).await
    }
    async fn proclaim(&self, hold: &HoldId, value: &[u8]) -> Result<Renew> {
        self.note(Method::Proclaim);
        self.store.proclaim(hold, value).await
    }
    async fn changes(&self, key: &LockKey) -> Result<Option<Changes>> {
        self.note(Method::Changes);
        self.store.changes(key).await
    }
    async fn watch(&self, key: &LockKey, ticket: &OwnerToken) -> Result<Option<Watch>> {
        self.note(Method::Watch);
        self.store.watch(key, ticket).await
    }
    async fn abandon(&self, hold: &HoldId, ticket: &OwnerToken) -> Result<()> {
        self.note(Method::Abandon);
        self.store.abandon(hold, ticket).await
    }
    fn alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.note(Method::Alarm);
        self.store.alarm()
    }
    async fn force_release(&self, key: &LockKey, holder: &str) -> Result<bool> {
        self.note(Method::ForceRelease);
        self.store.force_release(key, holder).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<LockKey>> {
        self.note(Method::List);
        self.store.list(prefix).await
    }
}

/// Makes one call of `method` on `backend`, whatever it answers.
pub async fn call(backend: &dyn LockBackend, method: Method) {
    let key = LockKey::new("forwarding").expect("a valid key");
    let (owner, ticket) = (OwnerToken::generate(), OwnerToken::generate());
    let hold = HoldId::mutex(key.clone(), owner);
    let ttl = Duration::from_secs(30);
    // Only the arrival counts; what the call answers does not.
    match method {
        Method::Capabilities => {
            let _ = backend.capabilities();
        }
        Method::Verify => {
            let _ = backend.verify().await;
        }
        Method::TryAcquire => {
            // A single attempt and a waiter's: both must arrive.
            let single = AcquireRequest::new(hold.clone(), ttl);
            let _ = backend.try_acquire(&single).await;
            let _ = backend.try_acquire(&single.waiting(&ticket)).await;
        }
        Method::Release => {
            let _ = backend.release(&hold).await;
        }
        Method::Renew => {
            let _ = backend.renew(&[RenewRequest::new(hold, ttl)]).await;
        }
        Method::Inspect => {
            let _ = backend.inspect(&key).await;
        }
        Method::Proclaim => {
            let _ = backend.proclaim(&hold, b"value").await;
        }
        Method::Changes => {
            let _ = backend.changes(&key).await;
        }
        Method::Watch => {
            let _ = backend.watch(&key, &ticket).await;
        }
        Method::Abandon => {
            let _ = backend.abandon(&hold, &ticket).await;
        }
        Method::Alarm => {
            let _ = backend.alarm();
        }
        Method::ForceRelease => {
            let _ = backend.force_release(&key, "o0000000000000000").await;
        }
        Method::List => {
            let _ = backend.list("forwarding").await;
        }
    }
}

/// Calls every method on `wrapper`, one at a time, and checks that each
/// arrives at every one of `inner` (a wrapper's one inner backend, a
/// quorum's nodes) as `expect` says.
///
/// # Errors
/// Every method that arrived otherwise, with what each inner backend saw.
pub async fn check(
    wrapper: &dyn LockBackend,
    inner: &[&Recorder],
    expect: impl Fn(Method) -> Expect,
) -> std::result::Result<(), String> {
    let mut wrong = Vec::new();
    for method in Method::ALL {
        for r in inner {
            r.take();
        }
        call(wrapper, method).await;
        let expected = expect(method);
        for (i, r) in inner.iter().enumerate() {
            let seen = r.take();
            let ok = match expected {
                Expect::Forwarded => seen.contains(&method),
                Expect::As(other) => seen.contains(&other) && !seen.contains(&method),
                Expect::Answered => !seen.contains(&method),
            };
            if !ok {
                wrong.push(format!(
                    "{}: expected {expected:?}, inner backend {i} saw {seen:?}",
                    method.name()
                ));
            }
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("\n"))
    }
}
