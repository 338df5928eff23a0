//! The watchdog renews every lease of a Locker in batches, not one timer per
//! lock, and stops renewing a guard once it is released or dropped.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use locksmith_core::{
    async_trait, Acquire, Capabilities, LockBackend, LockKey, LockOptions, Locker, MemoryBackend,
    OwnerToken, Release, Renew, RenewRequest, Result, Watch,
};

/// Records the size of every `renew_many` call made to a memory store.
#[derive(Debug, Default)]
struct Recording {
    inner: MemoryBackend,
    batches: Mutex<Vec<usize>>,
}

#[async_trait]
impl LockBackend for Recording {
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(&self, k: &LockKey, o: &OwnerToken, ttl: Duration) -> Result<Acquire> {
        self.inner.try_acquire(k, o, ttl).await
    }
    async fn release(&self, k: &LockKey, o: &OwnerToken) -> Result<Release> {
        self.inner.release(k, o).await
    }
    async fn renew(&self, k: &LockKey, o: &OwnerToken, ttl: Duration) -> Result<Renew> {
        self.inner.renew(k, o, ttl).await
    }
    async fn renew_many(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        self.batches.lock().unwrap().push(requests.len());
        self.inner.renew_many(requests).await
    }
    async fn watch(&self, k: &LockKey, t: &OwnerToken) -> Result<Option<Watch>> {
        self.inner.watch(k, t).await
    }
}

#[tokio::test]
async fn many_leases_are_renewed_in_few_batches() {
    let backend = Arc::new(Recording::default());
    let locker = Locker::from_arc(backend.clone());
    let opts = LockOptions::new().ttl(Duration::from_millis(600));
    let mut guards = Vec::new();
    for i in 0..20 {
        guards.push(locker.lock_with(format!("k{i}"), &opts).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let batches = backend.batches.lock().unwrap().clone();
    let renewed: usize = batches.iter().sum();
    // 1.5 s at a 200 ms period is about 7 rounds of 20 leases.
    assert!(renewed >= 20 * 5, "too few renewals: {batches:?}");
    assert!(
        batches.len() * 4 <= renewed,
        "renewals were not batched: {} calls for {renewed} leases",
        batches.len()
    );
    assert!(guards.iter().all(|g| !g.is_lost()));

    for g in guards.drain(..) {
        g.release().await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after_release = backend.batches.lock().unwrap().len();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        backend.batches.lock().unwrap().len(),
        after_release,
        "released leases are still being renewed"
    );
}

#[tokio::test]
async fn the_watchdog_lets_go_of_the_backend_when_nothing_is_held() {
    let backend = Arc::new(Recording::default());
    let locker = Locker::from_arc(backend.clone());
    let g = locker.lock("k").await.unwrap();
    // Let the watchdog task start and go to sleep until the next renewal.
    tokio::time::sleep(Duration::from_millis(50)).await;
    g.release().await.unwrap();
    drop(locker);
    // Session-bound backends close their connections when dropped; a
    // watchdog task sleeping on a clone would keep them open.
    for _ in 0..50 {
        if Arc::strong_count(&backend) == 1 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "something still holds the backend: {} handles",
        Arc::strong_count(&backend)
    );
}
