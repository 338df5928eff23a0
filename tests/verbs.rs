//! One naming scheme: every handle's verbs mean the same thing. `V()`
//! waits as the locker's defaults say, `try_V()` makes one attempt,
//! `V_with(opts)` and `try_V_with(opts)` wait as `opts` say (an error,
//! or `None`, when someone else still holds it), `V_as` and `try_V_as`
//! re-enter an owner's hold, and `with_V` runs work under the hold.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockwright::backend::{LockBackend, MemoryBackend};
use lockwright::{ErrorKind, LockOptions, Locker};

/// The defaults every test's second locker has: a short wait, so that
/// `V()` is seen to wait for it and then give up.
const DEFAULT_WAIT: Duration = Duration::from_millis(150);

fn lockers() -> (Locker, Locker) {
    let store: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    let holder = Locker::from_arc(store.clone());
    let asker = Locker::from_arc(store)
        .with_options(LockOptions::new().wait_for(DEFAULT_WAIT))
        .unwrap();
    (holder, asker)
}

/// Checks one handle's verbs against a name `held` holds: `$h` is the
/// asker's handle, `$V` and the rest its verbs.
macro_rules! check_verbs {
    ($h:expr, $V:ident, $try_V:ident, $V_with:ident, $try_V_with:ident, $V_as:ident,
     $try_V_as:ident, $with_V:ident) => {{
        let h = $h;
        let what = stringify!($V);
        let start = Instant::now();
        let e = h.$V().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{what}(): {e}");
        assert!(
            start.elapsed() >= DEFAULT_WAIT,
            "{what}() did not wait as the defaults say"
        );
        let start = Instant::now();
        assert!(h.$try_V().await.unwrap().is_none(), "{what}: try_ took it");
        assert!(start.elapsed() < DEFAULT_WAIT, "{what}: try_ waited");
        let no_wait = LockOptions::new().no_wait();
        let e = h.$V_with(&no_wait).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy, "{what}_with(no_wait): {e}");
        let brief = LockOptions::new().wait_for(Duration::from_millis(60));
        let start = Instant::now();
        assert!(
            h.$try_V_with(&brief).await.unwrap().is_none(),
            "{what}: try_with took it"
        );
        assert!(
            start.elapsed() >= Duration::from_millis(60),
            "{what}: try_with did not wait"
        );
        let stranger = lockwright::OwnerToken::generate();
        let e = h.$V_as(&no_wait, &stranger).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy, "{what}_as: {e}");
        assert!(
            h.$try_V_as(&no_wait, &stranger).await.unwrap().is_none(),
            "{what}: try_as"
        );
        let e = h.$with_V(async |_| ()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "with_{what}: {e}");
    }};
}

#[tokio::test]
async fn every_handle_has_the_same_verbs_with_the_same_meaning() {
    let (holder, asker) = lockers();
    let _held = holder.lock("mutex").await.unwrap();
    check_verbs!(
        asker.mutex("mutex").unwrap(),
        lock,
        try_lock,
        lock_with,
        try_lock_with,
        lock_as,
        try_lock_as,
        with_lock
    );
    let _permit = holder.semaphore("sem", 1).unwrap().acquire().await.unwrap();
    check_verbs!(
        asker.semaphore("sem", 1).unwrap(),
        acquire,
        try_acquire,
        acquire_with,
        try_acquire_with,
        acquire_as,
        try_acquire_as,
        with_permit
    );
    let _writer = holder.rwlock("rw").unwrap().write().await.unwrap();
    check_verbs!(
        asker.rwlock("rw").unwrap(),
        read,
        try_read,
        read_with,
        try_read_with,
        read_as,
        try_read_as,
        with_read
    );
    check_verbs!(
        asker.rwlock("rw").unwrap(),
        write,
        try_write,
        write_with,
        try_write_with,
        write_as,
        try_write_as,
        with_write
    );
}

/// An election has the same forms, less `_as` (each campaign draws its
/// own owner).
#[tokio::test]
async fn an_election_has_the_same_verbs() {
    let (holder, asker) = lockers();
    let _leading = holder.election("e").unwrap().campaign("a").await.unwrap();
    let e = asker.election("e").unwrap();
    let start = Instant::now();
    let err = e.campaign("b").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(start.elapsed() >= DEFAULT_WAIT);
    assert!(e.try_campaign("b").await.unwrap().is_none());
    let err = e
        .campaign_with("b", &LockOptions::new().no_wait())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    let brief = LockOptions::new().wait_for(Duration::from_millis(60));
    assert!(e.try_campaign_with("b", &brief).await.unwrap().is_none());
    let err = e.while_leading("b", async |_| ()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
}

/// Free names: each form takes them, and the Locker's own `lock` and a
/// mutex handle's are one lock.
#[tokio::test]
async fn a_mutex_handle_is_the_lockers_lock_of_that_name() {
    let (holder, asker) = lockers();
    let by_handle = holder.mutex("same").unwrap().lock().await.unwrap();
    assert!(asker.try_lock("same").await.unwrap().is_none());
    by_handle.release().await.unwrap();
    let owner = lockwright::OwnerToken::generate();
    let opts = LockOptions::new();
    let m = asker.mutex("same").unwrap();
    let first = m.lock_as(&opts, &owner).await.unwrap();
    let again = m.try_lock_as(&opts, &owner).await.unwrap().unwrap();
    assert_eq!(again.holds(), 2, "try_lock_as re-entered");
    again.release().await.unwrap();
    first.release().await.unwrap();
    assert!(m.with_lock(async |g| g.holds()).await.unwrap() == 1);
}
