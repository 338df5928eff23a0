//! A store written outside this repository joins `connect(url)` with one
//! registration call: this file is such a crate's whole backend, a
//! wrapper over the in-process store that counts the attempts it sees,
//! under a scheme of its own.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use lockwright::backend::{
    forward_backend, Acquire, AcquireRequest, Driver, LockBackend, MemoryBackend, Scheme,
};
use lockwright::{ErrorKind, Result};

/// Attempts the outside store has answered, across every backend it opened.
static ATTEMPTS: AtomicU32 = AtomicU32::new(0);

/// The outside store: the memory store, counted.
#[derive(Debug, Default)]
struct Counted {
    inner: MemoryBackend,
}

forward_backend! {
    (self) => self.inner;
    impl LockBackend for Counted {
        // Counted, so the test sees that this backend answered (a
        // waiter's attempts as well).
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
            ATTEMPTS.fetch_add(1, Ordering::SeqCst);
            self.inner.try_acquire(request).await
        }
    }
}

/// What the outside crate declares, as every crate of this repository does.
const DRIVER: Driver = Driver::new(&[Scheme::new("myscheme", "my store", None)], |_url| {
    Ok(Arc::new(Counted::default()))
});

#[tokio::test]
async fn a_registered_store_is_reached_through_connect() {
    let before = lockwright::connect("myscheme://anything")
        .await
        .unwrap_err();
    assert_eq!(before.kind(), ErrorKind::Config);
    assert!(before.to_string().contains("unknown scheme"), "{before}");

    lockwright::backend::register(DRIVER).unwrap();

    let locker = lockwright::connect("myscheme://anything").await.unwrap();
    let guard = locker.lock("outside").await.unwrap();
    assert_eq!(ATTEMPTS.load(Ordering::SeqCst), 1);
    assert_eq!(
        lockwright::backend::scheme("myscheme://x").unwrap().store,
        "my store"
    );
    guard.release().await.unwrap();
    locker.close().await.unwrap();

    // Its scheme is now taken.
    assert!(lockwright::backend::register(DRIVER).is_err());
}
