//! Safety rules that mutation testing found no other test catching: a
//! renewal answered after the deadline leaves the lock lost, a waiting
//! acquire fails at once on a refusal, `lock_as` never swaps the caller's
//! owner after an unanswered attempt, and an observer never shows an older
//! term after a newer one. Each test names the mutation that makes it fail.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use lockwright_core::backend::{
    local_deadline, Acquire, AcquireRequest, HoldId, LockBackend, MemoryBackend, Renew,
    RenewRequest,
};
use lockwright_core::{
    Error, ErrorKind, FencingToken, LeaseState, LockKey, LockOptions, LockStatus, Locker,
    LostReason, OwnerToken, Result,
};

/// A memory store whose first renewal batch is applied at once but
/// answered only at `answer_at`: the reply comes back after the lease's
/// local deadline. Until then it blocks the runtime's only thread, as a
/// stalled process would, so the reply becomes ready inside the very poll
/// of the watchdog that sent it. Every later batch answers at once.
#[derive(Debug, Default)]
struct AnswersLate {
    inner: MemoryBackend,
    answer_at: Mutex<Option<Instant>>,
    /// When the first batch came in (the watchdog's `sent`, give or take).
    sent: Mutex<Option<Instant>>,
    batches: AtomicUsize,
    answered: AtomicBool,
}

lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for AnswersLate {
        // Only the first renewal is late: the watchdog's (the test's own
        // comes after it).
        async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
            let first = self.batches.fetch_add(1, Ordering::SeqCst) == 0;
            if first {
                *self.sent.lock().unwrap() = Some(Instant::now());
            }
            let results = self.inner.renew(requests).await;
            if first {
                let at = *self.answer_at.lock().unwrap();
                if let Some(at) = at {
                    std::thread::sleep(at.saturating_duration_since(Instant::now()));
                }
                self.answered.store(true, Ordering::SeqCst);
            }
            results
        }
    }
}

/// Rule 3: a renewal sent before the deadline and answered after it does
/// not revive the lock; the guard reads lost (`Expired`) and stays lost.
///
/// Why this ordering reaches the branch every time: the watchdog's
/// `select!` picks among ready branches at random, so a reply merely
/// *ready* after the deadline would race the deadline timer (whose wake
/// runs the expiry sweep, `st.entries.retain(.. e.deadline <= now ..)` in
/// `Watchdog::look`, at the top of `run`'s loop first). Here the reply
/// becomes ready while the watchdog polls it, past the deadline: any
/// branch polled before it was polled before the deadline (not ready), so
/// the reply's branch wins and `Watchdog::apply` sees `e.deadline <= now`
/// with the entry still there.
///
/// To see it fail: in lock-core/src/watchdog.rs, `Watchdog::apply`, delete
/// the arm `Ok(Renew::Renewed) if e.deadline <= Instant::now() => { ... }`
/// (line 351; or change its guard to `if false`). The late reply then
/// moves the deadline to `sent + ttl - drift`, still ahead, and the guard
/// reads held again.
#[tokio::test(flavor = "current_thread")]
async fn a_renewal_answered_after_the_deadline_leaves_the_lock_lost() {
    // Renewed every ttl/3; the reply lands 50 ms after the deadline, about
    // ttl/3 - 50 ms (600 ms) before the deadline a revival would set.
    let ttl = Duration::from_secs(2);
    let backend = Arc::new(AnswersLate::default());
    let locker = Locker::from_arc(backend.clone());
    let guard = locker
        .lock_with("late", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let deadline = guard.deadline().expect("held");
    // Set before this task first yields: the watchdog cannot have renewed.
    *backend.answer_at.lock().unwrap() = Some(deadline + Duration::from_millis(50));
    let start = Instant::now();
    while !backend.answered.load(Ordering::SeqCst) {
        assert!(start.elapsed() < 2 * ttl, "the watchdog never renewed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let now = Instant::now();
    let sent = backend.sent.lock().unwrap().expect("a renewal was sent");
    // The scenario: sent while held, answered after the deadline, and a
    // revival would have set a deadline still ahead.
    assert!(sent < deadline, "the renewal left after the deadline");
    assert!(
        now > deadline,
        "the renewal was answered before the deadline"
    );
    let revived = local_deadline(sent, ttl);
    assert!(
        revived > now,
        "too slow a host to test this: a revival would already have lapsed"
    );

    assert!(
        guard.is_lost(),
        "a renewal answered after the deadline revived the lock: {:?}",
        guard.state()
    );
    assert_eq!(guard.state(), LeaseState::Lost(LostReason::Expired));
    assert_eq!(guard.deadline(), None);
    let reason = tokio::time::timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("the lost signal fired");
    assert_eq!(reason, LostReason::Expired);

    // It stays lost: another renewal (the store still has the hold) does
    // not bring it back, and the watchdog renews it no more.
    let watchdogs = backend.batches.load(Ordering::SeqCst);
    let late = guard.renew().await;
    assert_eq!(
        late.expect_err("a renewal revived a lost lock").kind(),
        ErrorKind::Lost
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(guard.is_lost() && guard.deadline().is_none());
    assert_eq!(guard.state(), LeaseState::Lost(LostReason::Expired));
    assert_eq!(watchdogs, 1, "the watchdog renewed a lost lock again");
    assert_eq!(
        backend.batches.load(Ordering::SeqCst),
        2,
        "a lost lock was renewed again, beside the test's own renewal"
    );
}

/// Rule 4: a refusal that no wait can change (another N for a semaphore,
/// a read hold where a semaphore holds, a semaphore where readers hold)
/// ends a waiting acquire at once with `InvalidOptions`, as it ends one
/// that does not wait; it is not retried until the wait runs out.
///
/// The function that decides retry or fail is `Outage::ride` in
/// lock-core/src/outage.rs (called from lock-core/src/acquire.rs on every
/// attempt's error): only `Unavailable` is ridden out.
///
/// To see it fail: in lock-core/src/outage.rs, `Outage::ride`, replace
/// `let retryable = error.kind() == ErrorKind::Unavailable;` (line 58)
/// with `let retryable = true;`. Each refusal is then retried for the
/// whole 3 s wait before the same error comes back.
#[tokio::test]
async fn a_waiting_acquire_fails_at_once_on_a_refusal() {
    let locker = Locker::new(MemoryBackend::new());
    let no_wait = LockOptions::new().no_wait();
    let wait = LockOptions::new().wait_for(Duration::from_secs(3));
    let quick = Duration::from_secs(1);

    // Two of three permits out; a claim of N = 2 waits for nothing.
    let three = locker.semaphore("pool", 3).unwrap();
    let _p1 = three.acquire_with(&no_wait).await.unwrap();
    let _p2 = three.acquire_with(&no_wait).await.unwrap();
    let two = locker.semaphore("pool", 2).unwrap();
    let start = Instant::now();
    let e = two
        .acquire_with(&wait)
        .await
        .expect_err("another N was granted");
    let took = start.elapsed();
    assert_eq!(e.kind(), ErrorKind::InvalidOptions, "{e}");
    assert!(took < quick, "another N was retried for {took:?}");

    // A read hold asked for, with a wait, where the semaphore holds.
    let rw = locker.rwlock("pool").unwrap();
    let start = Instant::now();
    let e = rw
        .read_with(&wait)
        .await
        .expect_err("a reader was let in beside a semaphore");
    let took = start.elapsed();
    assert_eq!(e.kind(), ErrorKind::InvalidOptions, "{e}");
    assert!(took < quick, "a read hold was retried for {took:?}");

    // And the other way round: a semaphore's permit where readers hold.
    let books = locker.rwlock("books").unwrap();
    let _reader = books.read_with(&no_wait).await.unwrap();
    let sem = locker.semaphore("books", 3).unwrap();
    let start = Instant::now();
    let e = sem
        .acquire_with(&wait)
        .await
        .expect_err("a permit was granted beside readers");
    let took = start.elapsed();
    assert_eq!(e.kind(), ErrorKind::InvalidOptions, "{e}");
    assert!(took < quick, "a permit was retried for {took:?}");
}

/// A memory store whose first acquire is applied but whose reply is lost
/// (`Unavailable`); every later attempt is answered as usual.
#[derive(Debug, Default)]
struct LosesFirstReply {
    inner: MemoryBackend,
    lost_one: AtomicBool,
    /// The attempt whose reply was lost was granted in the store.
    granted_unseen: AtomicBool,
}

lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for LosesFirstReply {
        // A waiting acquire loses its reply the same way.
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
            let outcome = self.inner.try_acquire(request).await;
            if !self.lost_one.swap(true, Ordering::SeqCst) {
                let granted = matches!(outcome, Ok(Acquire::Acquired(_)));
                self.granted_unseen.store(granted, Ordering::SeqCst);
                return Err(Error::unavailable("reply lost"));
            }
            outcome
        }
    }
}

/// Rule 5: `lock_as` whose attempt went unanswered (granted unseen) never
/// goes on under another owner: it ends `Unavailable`, or with a guard of
/// the caller's own owner. (A fresh-owner acquire retires the owner of an
/// unanswered attempt and goes on under a redrawn one; the caller's owner
/// cannot be swapped, since the caller re-enters and releases by it.)
///
/// To see it fail: in lock-core/src/outage.rs, `Outage::ride`, replace
/// `let swappable = attempts.fresh_owner || !uncertain;` (line 60) with
/// `let swappable = true;`. The wait then retires the caller's owner
/// (`Attempts::redraw_owner`), undoes its unseen hold, and returns a guard
/// whose owner is a fresh token.
#[tokio::test]
async fn lock_as_never_swaps_the_callers_owner_after_a_lost_reply() {
    let backend = Arc::new(LosesFirstReply::default());
    let locker = Locker::from_arc(backend.clone());
    let owner = OwnerToken::generate();
    let opts = LockOptions::new().wait_for(Duration::from_secs(3));
    let got = locker.lock_as("mine", &opts, &owner).await;
    assert!(
        backend.granted_unseen.load(Ordering::SeqCst),
        "the scenario: the first attempt was granted and its reply lost"
    );
    match got {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
        Ok(guard) => assert_eq!(
            guard.owner(),
            &owner,
            "lock_as returned a guard of another owner than the caller's"
        ),
    }
}

/// A memory store whose `inspect` answers from a script while it lasts,
/// then says nobody leads.
#[derive(Debug, Default)]
struct ScriptedReads {
    store: MemoryBackend,
    reads: Mutex<VecDeque<LockStatus>>,
}

lockwright_core::forward_backend! {
    (self) => self.store;
    impl LockBackend for ScriptedReads {
        // The script stands for what a lagging replica would answer.
        async fn inspect(&self, _key: &LockKey) -> Result<LockStatus> {
            let next = self.reads.lock().unwrap().pop_front();
            Ok(next.unwrap_or_else(LockStatus::free))
        }
    }
}

fn reign(owner: &OwnerToken, term: u64, value: &str) -> LockStatus {
    LockStatus::held(1)
        .with_fence(Some(FencingToken(term)))
        .with_owner(Some(owner.clone()))
        .with_value(Some(value.as_bytes().to_vec()))
}

/// Rule 6: a late read of an older reign never shown before (`a@5` after
/// `b@6`) is not shown: the observer's terms never go backwards. (A replay
/// of a reign already shown is also caught by the remembered ended reigns,
/// which hid this check; `a` here was never shown, so only the term
/// comparison refuses it.)
///
/// To see it fail: in lock-core/src/election.rs, `Observer::next_change`,
/// drop the term check: `if older || self.ended.contains(reign)` (line
/// 354) becomes `if self.ended.contains(reign)` (or set `let older =
/// false;`, line 352). The observer then yields 6, 5, then nobody.
#[tokio::test]
async fn an_observer_never_shows_an_older_term_after_a_newer_one() {
    let (a, b) = (OwnerToken::generate(), OwnerToken::generate());
    let scripted = ScriptedReads::default();
    scripted
        .reads
        .lock()
        .unwrap()
        .extend([reign(&b, 6, "b"), reign(&a, 5, "a")]);
    let locker = Locker::new(scripted);
    let election = locker.election("e").unwrap();
    let mut changes = Box::pin(election.observe_every(Duration::from_millis(1)));
    let mut shown: Vec<(u64, Vec<u8>)> = Vec::new();
    loop {
        let item = tokio::time::timeout(Duration::from_secs(5), changes.next())
            .await
            .expect("the observer showed nobody leading within 5 s")
            .expect("the stream never ends")
            .expect("every scripted read succeeds");
        match item {
            Some(leader) => {
                let term = leader.term.expect("the script gives terms").0;
                if let Some((last, _)) = shown.last() {
                    assert!(
                        term > *last,
                        "term {term} shown after term {last}: {shown:?}"
                    );
                }
                shown.push((term, leader.value));
            }
            None => break,
        }
    }
    assert_eq!(shown, vec![(6, b"b".to_vec())]);
}

/// A memory store whose next release (once `armed`) is carried out but
/// whose reply is lost (`Unavailable`).
#[derive(Debug, Default)]
struct LosesAReleaseReply {
    inner: MemoryBackend,
    armed: AtomicBool,
    releases: AtomicUsize,
}

lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for LosesAReleaseReply {
        async fn release(&self, hold: &HoldId) -> Result<lockwright_core::backend::Release> {
            self.releases.fetch_add(1, Ordering::SeqCst);
            let outcome = self.inner.release(hold).await;
            if self.armed.swap(false, Ordering::SeqCst) {
                return Err(Error::unavailable("reply lost"));
            }
            outcome
        }
    }
}

/// A release whose reply was lost after it counted a hold down is not sent
/// again while another guard shares the owner (`lock_as` with the first
/// guard's owner): a second release would free the lock under that guard.
/// It ends `Unavailable` (not confirmed), and the other guard's hold stays.
///
/// To see it fail: in lock-core/src/guard.rs, `LockGuard::release`, drop
/// `&& !self.watchdog.shares(..)` from the `sole` closure (the first guard
/// was granted alone, with a fresh owner).
#[tokio::test]
async fn a_lost_release_reply_is_not_sent_again_under_a_shared_owner() {
    let backend = Arc::new(LosesAReleaseReply::default());
    let locker = Locker::from_arc(backend.clone());
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let first = locker.lock_with("shared", &opts).await.unwrap();
    let owner = first.owner().clone();
    let second = locker.lock_as("shared", &opts, &owner).await.unwrap();
    backend.armed.store(true, Ordering::SeqCst);
    let e = first.release().await.expect_err("the reply was lost");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert_eq!(backend.releases.load(Ordering::SeqCst), 1, "sent again");
    let key = LockKey::new("shared").unwrap();
    let status = backend.inner.inspect(&key).await.unwrap();
    assert!(status.held, "the second guard's hold was released");
    assert_eq!(status.holds, 1);
    assert!(!second.is_lost());
    second.release().await.unwrap();
}
