//! The quorum's undo of a failed acquire, with nodes that fail on cue.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use locksmith_core::backend::{Acquire, LockBackend, MemoryBackend, Quorum, Release, Renew};
use locksmith_core::{Error, LockKey, LockStatus, OwnerToken, Result};

/// An in-memory node whose next acquire fails without reaching the store
/// (a refused connection), when told to.
#[derive(Debug, Default)]
struct Flaky {
    store: MemoryBackend,
    fail_next_acquire: AtomicBool,
}

#[locksmith_core::backend::async_trait]
impl LockBackend for Flaky {
    fn capabilities(&self) -> locksmith_core::backend::Capabilities {
        self.store.capabilities()
    }
    async fn try_acquire(&self, k: &LockKey, o: &OwnerToken, ttl: Duration) -> Result<Acquire> {
        if self.fail_next_acquire.swap(false, Ordering::SeqCst) {
            return Err(Error::unavailable("refused (on cue)"));
        }
        self.store.try_acquire(k, o, ttl).await
    }
    async fn release(&self, k: &LockKey, o: &OwnerToken) -> Result<Release> {
        self.store.release(k, o).await
    }
    async fn renew(&self, k: &LockKey, o: &OwnerToken, ttl: Duration) -> Result<Renew> {
        self.store.renew(k, o, ttl).await
    }
    async fn inspect(&self, k: &LockKey) -> Result<LockStatus> {
        self.store.inspect(k).await
    }
}

/// An owner holds the lock on all three nodes and re-enters it; two nodes
/// refuse that request, so the quorum fails. The undo must not take away
/// the hold the owner had before on the nodes the request never reached.
#[tokio::test]
async fn a_failed_reentry_leaves_the_earlier_hold_alone() {
    let q = Quorum::new(
        "test",
        vec![Flaky::default(), Flaky::default(), Flaky::default()],
        Duration::from_millis(10),
    )
    .unwrap();
    let (key, me) = (LockKey::new("k").unwrap(), OwnerToken::generate());
    let ttl = Duration::from_secs(30);
    assert!(matches!(
        q.try_acquire(&key, &me, ttl).await.unwrap(),
        Acquire::Acquired(_)
    ));
    q.nodes()[0].fail_next_acquire.store(true, Ordering::SeqCst);
    q.nodes()[1].fail_next_acquire.store(true, Ordering::SeqCst);
    let e = q
        .try_acquire(&key, &me, ttl)
        .await
        .expect_err("a minority answered");
    assert_eq!(e.kind(), locksmith_core::ErrorKind::Unavailable);
    for (i, node) in q.nodes().iter().enumerate() {
        let s = node.inspect(&key).await.unwrap();
        assert!(
            s.held && s.holds == 1,
            "node {i} after the undo: {s:?} (the earlier hold must stay, the new one go)"
        );
    }
    assert_eq!(q.release(&key, &me).await.unwrap(), Release::Freed);
}
