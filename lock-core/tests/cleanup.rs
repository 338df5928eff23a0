//! What an acquire leaves behind when it fails, and waiting for the
//! background clean-ups before a process exits.

use lockwright_core::backend::LockBackendExt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockwright_core::backend::{Acquire, AcquireRequest, LockBackend, MemoryBackend};
use lockwright_core::{Error, ErrorKind, LockKey, LockOptions, Locker, OwnerToken, Result};

/// A store whose acquire is applied but whose reply is lost: the caller sees
/// a timeout, the store holds the lock.
#[derive(Debug, Default)]
struct LostReply {
    inner: MemoryBackend,
    lose_replies: AtomicBool,
    /// Loses this many more replies, then answers again.
    lose_next: AtomicU32,
}

lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for LostReply {
        // A waiting acquire loses its reply the same way.
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
            let outcome = self.inner.try_acquire(request).await;
            let one_more = self
                .lose_next
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if one_more || self.lose_replies.load(Ordering::SeqCst) {
                return Err(Error::unavailable("no reply within the timeout"));
            }
            outcome
        }
    }
}

#[tokio::test]
async fn an_acquire_whose_reply_was_lost_is_undone() {
    let backend = Arc::new(LostReply::default());
    backend.lose_replies.store(true, Ordering::SeqCst);
    let locker = Locker::from_arc(backend.clone());
    let e = locker.try_lock("k").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(locker.settle(Duration::from_secs(2)).await);
    let other = OwnerToken::generate();
    let key = LockKey::new("k").unwrap();
    let outcome = backend
        .inner
        .try_lock(&key, &other, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        matches!(outcome, Acquire::Acquired(_)),
        "the failed acquire left the lock held: {outcome:?}"
    );
}

/// A waiting acquire rides out lost replies, and the holds they may have
/// made are undone: one release frees the key. Retrying under the same
/// owner would count the unseen grant as a second hold, left behind.
#[tokio::test]
async fn a_wait_rides_out_lost_replies_and_undoes_their_grants() {
    let backend = Arc::new(LostReply::default());
    backend.lose_next.store(3, Ordering::SeqCst);
    let locker = Locker::from_arc(backend.clone());
    let opts = LockOptions::new().wait_for(Duration::from_secs(20));
    let guard = locker.lock_with("k", &opts).await.unwrap();
    assert_eq!(backend.lose_next.load(Ordering::SeqCst), 0);
    guard.release().await.unwrap();
    assert!(locker.settle(Duration::from_secs(5)).await);
    let status = locker.status("k").await.unwrap();
    assert!(
        !status.held,
        "a hold made by a lost reply was left: {status:?}"
    );
}

/// A store that is down for a while: a long wait gets the lock once it is
/// back; a short one ends with the store's error, not `Timeout`; an
/// attempt that does not wait fails at once.
#[tokio::test]
async fn a_wait_rides_out_an_outage_and_a_short_one_reports_it() {
    let store = MemoryBackend::new();
    let (a, b) = (Locker::new(store.clone()), Locker::new(store.clone()));
    let held = a.lock("k").await.unwrap();
    let long = LockOptions::new().wait_for(Duration::from_secs(30));
    let waiting = tokio::spawn(async move { b.lock_with("k", &long).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    store.set_available(false);

    let e = a.try_lock("other").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    let start = std::time::Instant::now();
    let short = LockOptions::new().wait_for(Duration::from_millis(600));
    let e = a.lock_with("other", &short).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(
        start.elapsed() >= Duration::from_millis(600),
        "a short wait gave up after {:?}, before it ended",
        start.elapsed()
    );

    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the waiter gave up during the outage"
    );
    store.set_available(true);
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is served after the outage")
        .unwrap()
        .unwrap();
    got.release().await.unwrap();
}

#[tokio::test]
async fn settle_waits_for_a_dropped_guards_release() {
    let backend = Arc::new(MemoryBackend::new());
    let locker = Locker::from_arc(backend.clone());
    let guard = locker.lock("k").await.unwrap();
    drop(guard);
    assert!(locker.settle(Duration::from_secs(2)).await);
    let key = LockKey::new("k").unwrap();
    let outcome = backend
        .try_lock(&key, &OwnerToken::generate(), Duration::from_secs(1))
        .await
        .unwrap();
    assert!(matches!(outcome, Acquire::Acquired(_)), "{outcome:?}");
}
