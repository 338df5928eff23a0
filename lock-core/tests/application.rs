//! The application door: `try_lock_with`, the loss token, `Locker::close`,
//! and the exit status of every error kind.

use lockwright_core::backend::LockBackendExt;
use std::sync::Arc;
use std::time::Duration;

use lockwright_core::backend::MemoryBackend;
use lockwright_core::{ErrorKind, LeaseState, LockOptions, Locker, LostReason};

fn opts() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_for(Duration::from_millis(50))
}

#[tokio::test]
async fn try_lock_with_waits_then_reports_a_held_lock_as_none() {
    let store = Arc::new(MemoryBackend::new());
    let a = Locker::from_arc(store.clone());
    let b = Locker::from_arc(store);
    let held = a.lock_with("k", &opts()).await.unwrap();
    let started = std::time::Instant::now();
    assert!(b.try_lock_with("k", &opts()).await.unwrap().is_none());
    // It waited as the options said before giving up, unlike try_lock.
    assert!(started.elapsed() >= Duration::from_millis(50));
    // Where lock_with says Timeout for the same thing.
    let e = b.lock_with("k", &opts()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    held.release().await.unwrap();
    let got = b.try_lock_with("k", &opts()).await.unwrap();
    assert!(got.is_some(), "a free lock is granted");
    // Bad input is still an error, not None.
    let e = b.try_lock_with("", &opts()).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidKey);
}

#[tokio::test]
async fn the_loss_token_is_cancelled_on_loss_and_never_by_release() {
    let locker = Locker::new(MemoryBackend::new());
    // Not renewed: the lease runs out locally after 300 ms.
    let short = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .auto_renew(false);
    let guard = locker.lock_with("lost", &short).await.unwrap();
    let signal = guard.lost_signal();
    assert!(!signal.is_lost());
    tokio::time::timeout(Duration::from_secs(5), signal.wait())
        .await
        .expect("the signal fires when the lease is lost");
    assert!(signal.is_lost());
    assert!(guard.is_lost());
    drop(guard);

    let guard = locker.lock_with("kept", &opts()).await.unwrap();
    let signal = guard.lost_signal();
    guard.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!signal.is_lost(), "a release is not a loss");
}

#[tokio::test]
async fn close_releases_every_held_lock_and_refuses_new_ones() {
    let store = Arc::new(MemoryBackend::new());
    let a = Locker::from_arc(store.clone());
    let b = Locker::from_arc(store.clone());
    let clone = a.clone();
    let g1 = a.lock_with("one", &opts()).await.unwrap();
    let g2 = clone.lock_with("two", &opts()).await.unwrap();
    let many = a.lock_all(["three", "four"], &opts()).await.unwrap();
    a.close().await.unwrap();
    // Free in the store as soon as close returns: nothing is left to a
    // background task that a shutting-down runtime might not run.
    let mut taken = Vec::new();
    for k in ["one", "two", "three", "four"] {
        let g = b.try_lock(k).await.unwrap();
        assert!(g.is_some(), "{k} is free after close");
        taken.extend(g);
    }
    // Guards outlive the close: their lost signal fired (the lock is gone),
    // and their release is a no-op.
    assert_eq!(g1.state(), LeaseState::Lost(LostReason::Closed));
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(1), g2.lost()).await,
        Ok(LostReason::Closed)
    );
    let signal = g1.lost_signal();
    assert!(
        signal.is_lost(),
        "the lost signal of a guard closed under it"
    );
    g1.release().await.unwrap();
    drop(g2);
    many.release().await.unwrap();
    // Releasing or dropping them after close did not free what b took since.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let c = Locker::from_arc(store.clone());
    for k in ["one", "two", "three", "four"] {
        assert!(c.try_lock(k).await.unwrap().is_none(), "{k} is still b's");
    }
    drop(taken);
    // A closed locker (and its clones) takes no new locks.
    for l in [&a, &clone] {
        let e = l.lock_with("five", &opts()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Closed);
        let e = l.try_lock("five").await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Closed);
    }
    // Closing twice is fine.
    a.close().await.unwrap();
}

#[tokio::test]
async fn close_reports_a_release_that_failed() {
    let store = Arc::new(MemoryBackend::new());
    let a = Locker::from_arc(store.clone());
    let _g = a.lock_with("k", &opts()).await.unwrap();
    store.set_available(false);
    let e = a.close().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert!(e.to_string().contains("1 of 1"), "{e}");
    store.set_available(true);
}

#[tokio::test]
async fn close_stops_acquires_still_waiting() {
    let store = Arc::new(MemoryBackend::new());
    let holder = Locker::from_arc(store.clone());
    let waiter = Locker::from_arc(store.clone());
    let _held = holder.lock_with("busy", &opts()).await.unwrap();
    let w = waiter.clone();
    let waiting = tokio::spawn(async move {
        let forever = LockOptions::new().ttl(Duration::from_secs(30));
        w.lock_with("busy", &forever).await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    waiter.close().await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("a waiting acquire ends when its locker closes")
        .unwrap()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Closed);
}

/// A store whose sessions expire after 300 ms of silence, however long the
/// TTL asked for: the memory store with `max_lease` set.
#[derive(Debug, Default)]
struct ShortSessions(MemoryBackend);

lockwright_core::forward_backend! {
    (self) => self.0;
    impl lockwright_core::backend::LockBackend for ShortSessions {
        fn capabilities(&self) -> lockwright_core::backend::Capabilities {
            self.0
                .capabilities()
                .with_max_lease(Some(Duration::from_millis(300)))
        }
    }
}

/// The lost signal fires within the store's `max_lease` of the last
/// confirmed renewal, not the (much longer) TTL, and renewals come often
/// enough to keep such a hold.
#[tokio::test]
async fn a_capped_lease_is_renewed_and_lost_within_the_cap() {
    let store = Arc::new(ShortSessions::default());
    let locker = Locker::from_arc(store.clone());
    let ttl = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = locker.lock_with("capped", &ttl).await.unwrap();
    let left = guard
        .deadline()
        .unwrap()
        .saturating_duration_since(std::time::Instant::now());
    assert!(left <= Duration::from_millis(300), "deadline {left:?} away");
    // Renewed every 100 ms: still held well past the cap.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!guard.is_lost(), "a renewed capped lease was lost");
    // The store stops answering: lost within the cap, not the 30 s TTL.
    store.0.set_available(false);
    let lost = tokio::time::timeout(Duration::from_millis(600), guard.lost()).await;
    assert_eq!(lost, Ok(LostReason::Expired));
    store.0.set_available(true);
}

/// A fair store with 300 ms sessions that hands the lock over by notice:
/// the memory store, with the grant delivered by the test.
#[derive(Debug, Default)]
struct ShortSessionHandOff {
    store: MemoryBackend,
    waiter: std::sync::Mutex<
        Option<(
            lockwright_core::OwnerToken,
            tokio::sync::mpsc::UnboundedSender<lockwright_core::backend::Grant>,
        )>,
    >,
    queued: std::sync::Mutex<Option<lockwright_core::OwnerToken>>,
    renewals: std::sync::atomic::AtomicUsize,
    attempts: std::sync::atomic::AtomicUsize,
}

lockwright_core::forward_backend! {
    (self) => self.store;
    impl lockwright_core::backend::LockBackend for ShortSessionHandOff {
        fn capabilities(&self) -> lockwright_core::backend::Capabilities {
            self.store
                .capabilities()
                .with_fair(true)
                .with_notify(true)
                .with_max_lease(Some(Duration::from_millis(300)))
        }
        async fn try_acquire(
            &self,
            request: &lockwright_core::backend::AcquireRequest,
        ) -> lockwright_core::Result<lockwright_core::backend::Acquire> {
            // A single attempt is the memory store's; a waiter's is queued.
            if request.ticket.is_none() {
                return self.store.try_acquire(request).await;
            }
            let (k, o) = (request.key(), request.owner());
            *self.queued.lock().unwrap() = Some(o.clone());
            self.attempts
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // The lock already handed to this waiter: the grant, not a second hold.
            let status = self.store.inspect(k).await?;
            if status.held && status.owner.as_ref() == Some(o) {
                return Ok(lockwright_core::backend::Acquire::Acquired(
                    lockwright_core::backend::Grant {
                        fence: status.fence,
                        holds: status.holds,
                        lease: None,
                    },
                ));
            }
            let single = lockwright_core::backend::AcquireRequest {
                ticket: None,
                ..request.clone()
            };
            match self.store.try_acquire(&single).await? {
                lockwright_core::backend::Acquire::Contended { .. } => {
                    Ok(lockwright_core::backend::Acquire::Contended {
                        retry_after: Some(Duration::from_secs(10)),
                    })
                }
                got => Ok(got),
            }
        }
        async fn watch(
            &self,
            _k: &lockwright_core::LockKey,
            ticket: &lockwright_core::OwnerToken,
        ) -> lockwright_core::Result<Option<lockwright_core::backend::Watch>> {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            *self.waiter.lock().unwrap() = Some((ticket.clone(), tx));
            Ok(Some(lockwright_core::backend::Watch::grants(rx, None)))
        }
        /// Every lease renewed is counted.
        async fn renew(
            &self,
            requests: &[lockwright_core::backend::RenewRequest],
        ) -> Vec<lockwright_core::Result<lockwright_core::backend::Renew>> {
            self.renewals
                .fetch_add(requests.len(), std::sync::atomic::Ordering::SeqCst);
            self.store.renew(requests).await
        }
    }
}

/// A lock handed to a waiter that queued longer ago than the store's
/// `max_lease` is confirmed before the guard is made: the guard starts
/// with a deadline ahead of it, not one that passed while it waited.
#[tokio::test]
async fn a_hand_off_after_a_long_wait_is_confirmed_within_the_cap() {
    use lockwright_core::backend::Acquire;
    let store = Arc::new(ShortSessionHandOff::default());
    let key = lockwright_core::LockKey::new("handed").unwrap();
    let holder = lockwright_core::OwnerToken::generate();
    let long = Duration::from_secs(30);
    assert!(matches!(
        store.store.try_lock(&key, &holder, long).await.unwrap(),
        Acquire::Acquired(_)
    ));
    let locker = Locker::from_arc(store.clone());
    let waiting = tokio::spawn(async move {
        let opts = LockOptions::new()
            .ttl(long)
            .wait_for(Duration::from_secs(10));
        locker.lock_with("handed", &opts).await
    });
    // Queued for longer than a session could live unconfirmed.
    tokio::time::sleep(Duration::from_millis(700)).await;
    store.store.unlock(&key, &holder).await.unwrap();
    let owner = store
        .queued
        .lock()
        .unwrap()
        .clone()
        .expect("the waiter queued");
    let grant = match store.store.try_lock(&key, &owner, long).await.unwrap() {
        Acquire::Acquired(g) => g,
        other => panic!("{other:?}"),
    };
    let asked = store.renewals.load(std::sync::atomic::Ordering::SeqCst)
        + store.attempts.load(std::sync::atomic::Ordering::SeqCst);
    let tx = store
        .waiter
        .lock()
        .unwrap()
        .take()
        .expect("the waiter watches")
        .1;
    tx.send(grant).unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the hand-off reaches the waiter")
        .unwrap()
        .unwrap();
    let left = guard
        .deadline()
        .map(|d| d.saturating_duration_since(std::time::Instant::now()));
    assert!(
        left.is_some_and(|l| l >= Duration::from_millis(150)),
        "the handed guard starts with {left:?} left of a 300 ms cap"
    );
    assert!(
        store.renewals.load(std::sync::atomic::Ordering::SeqCst)
            + store.attempts.load(std::sync::atomic::Ordering::SeqCst)
            > asked,
        "the hand-off was not confirmed with the store"
    );
    assert_eq!(guard.holds(), 1, "the confirmation added a hold");
    assert!(!guard.is_lost());
}

/// Lock at least for holds for a guard that is dropped, too, and a lease
/// kept past its guard is released or extended by the locker.
#[tokio::test]
async fn at_least_holds_for_a_dropped_guard_and_leases_come_back() {
    let store = Arc::new(MemoryBackend::new());
    let (a, b) = (
        Locker::from_arc(store.clone()),
        Locker::from_arc(store.clone()),
    );
    let keep = LockOptions::new().at_least(Duration::from_millis(400));
    drop(a.lock_with("kept", &keep).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        b.try_lock("kept").await.unwrap().is_none(),
        "freed before its minimum"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        b.try_lock("kept").await.unwrap().is_some(),
        "kept past its minimum"
    );

    let lease = a.lock("leaked").await.unwrap().leak();
    a.extend_lease(&lease, Duration::from_millis(200))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let e = a.release_lease(&lease).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    let e = a
        .extend_lease(&lease, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
}

/// A guard kept for its lock-at-least-for and dropped where no task can
/// run (outside a runtime) leaves the lock to its TTL, once: the kept
/// twin it would hand to a task is disarmed, so dropping that unrun task
/// makes no twin of its own (which recursed without end).
#[test]
fn a_kept_guard_dropped_outside_a_runtime_leaves_the_lock_to_its_ttl() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = Arc::new(MemoryBackend::new());
    let locker = Locker::from_arc(store.clone());
    let keep = LockOptions::new().at_least(Duration::from_secs(10));
    let guard = runtime.block_on(locker.lock_with("kept", &keep)).unwrap();
    drop(runtime);
    drop(guard);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let other = Locker::from_arc(store);
    assert!(runtime.block_on(other.try_lock("kept")).unwrap().is_none());
}

/// Lock at least for never shortens a lease that another hold of the
/// same owner has (`lock_as`): the released hold is counted down when
/// its minimum is up, and the other hold keeps the lock.
#[tokio::test]
async fn at_least_never_shortens_the_lease_of_the_owners_other_hold() {
    let store = Arc::new(MemoryBackend::new());
    let (a, b) = (
        Locker::from_arc(store.clone()),
        Locker::from_arc(store.clone()),
    );
    let keep = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .at_least(Duration::from_millis(100));
    let first = a.lock_with("k", &keep).await.unwrap();
    let owner = first.owner().clone();
    let second = a
        .lock_as(
            "k",
            &LockOptions::new().ttl(Duration::from_secs(30)),
            &owner,
        )
        .await
        .unwrap();
    first.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        b.try_lock("k").await.unwrap().is_none(),
        "the owner's other hold lost the lock"
    );
    second.release().await.unwrap();
    assert!(b.try_lock("k").await.unwrap().is_some());
}
