//! What an acquire leaves behind when it fails, and waiting for the
//! background clean-ups before a process exits.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use locksmith_core::backend::{Acquire, LockBackend, MemoryBackend};
use locksmith_core::{Error, ErrorKind, LockKey, Locker, OwnerToken, Result};

/// A store whose acquire is applied but whose reply is lost: the caller sees
/// a timeout, the store holds the lock.
#[derive(Debug, Default)]
struct LostReply {
    inner: MemoryBackend,
    lose_replies: AtomicBool,
}

locksmith_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for LostReply {
        async fn try_acquire(&self, k: &LockKey, o: &OwnerToken, ttl: Duration) -> Result<Acquire> {
            let outcome = self.inner.try_acquire(k, o, ttl).await;
            if self.lose_replies.load(Ordering::SeqCst) {
                return Err(Error::unavailable("no reply within the timeout"));
            }
            outcome
        }
        // A waiting acquire loses its reply the same way.
        async fn try_acquire_waiting(
            &self,
            k: &LockKey,
            o: &OwnerToken,
            ttl: Duration,
            _ticket: &OwnerToken,
        ) -> Result<Acquire> {
            LockBackend::try_acquire(self, k, o, ttl).await
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
        .try_acquire(&key, &other, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        matches!(outcome, Acquire::Acquired(_)),
        "the failed acquire left the lock held: {outcome:?}"
    );
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
        .try_acquire(&key, &OwnerToken::generate(), Duration::from_secs(1))
        .await
        .unwrap();
    assert!(matches!(outcome, Acquire::Acquired(_)), "{outcome:?}");
}
