//! The watchdog renews every lease of a Locker in batches, not one timer per
//! lock, and stops renewing a guard once it is released or dropped.

use lockwright_core::backend::LockBackendExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockwright_core::backend::{AcquireRequest, LockBackend, MemoryBackend, Renew, RenewRequest};
use lockwright_core::{Error, LockOptions, Locker, LostReason, Result};

/// Records the size of every `renew` call made to a memory store; with
/// `fail_renewals` set, every renewal fails at once as from a dead store.
/// Its alarm is raised on cue, or on every renewal batch with
/// `alarm_on_renew` (as a store might whose renewals keep meeting a full
/// server).
#[derive(Debug)]
struct Recording {
    inner: MemoryBackend,
    batches: Mutex<Vec<usize>>,
    fail_renewals: AtomicBool,
    alarm: tokio::sync::watch::Sender<u64>,
    alarm_on_renew: AtomicBool,
}

impl Default for Recording {
    fn default() -> Self {
        Recording {
            inner: MemoryBackend::new(),
            batches: Mutex::default(),
            fail_renewals: AtomicBool::new(false),
            alarm: tokio::sync::watch::channel(0).0,
            alarm_on_renew: AtomicBool::new(false),
        }
    }
}

impl Recording {
    fn raise(&self) {
        self.alarm.send_modify(|n| *n += 1);
    }

    fn batches(&self) -> usize {
        self.batches.lock().unwrap().len()
    }
}

lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for Recording {
        async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
            self.batches.lock().unwrap().push(requests.len());
            if self.alarm_on_renew.load(Ordering::SeqCst) {
                self.raise();
            }
            if self.fail_renewals.load(Ordering::SeqCst) {
                return requests
                    .iter()
                    .map(|_| Err(Error::unavailable("store down")))
                    .collect();
            }
            self.inner.renew(requests).await
        }
        fn alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
            Some(self.alarm.subscribe())
        }
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

/// A store whose renewals fail at once must not be called in a loop: the
/// watchdog backs off until the deadline, and other tasks on the same
/// thread keep running meanwhile.
#[tokio::test(flavor = "current_thread")]
async fn failing_renewals_back_off_without_starving_other_tasks() {
    let backend = Arc::new(Recording::default());
    let locker = Locker::from_arc(backend.clone());
    let ttl = Duration::from_millis(900);
    let guard = locker
        .lock_with("k", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    backend.fail_renewals.store(true, Ordering::SeqCst);
    let ticks = Arc::new(AtomicUsize::new(0));
    let ticker = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(5)).await;
                ticks.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    let start = Instant::now();
    let reason = tokio::time::timeout(2 * ttl, guard.lost())
        .await
        .expect("the lost signal never fired");
    let elapsed = start.elapsed();
    ticker.abort();
    assert_eq!(reason, LostReason::Expired);
    let calls = backend.batches.lock().unwrap().len();
    // One good renewal at most, then a backoff that halves towards the
    // deadline: a dozen calls or so, not tens of thousands.
    assert!(
        (2..=25).contains(&calls),
        "{calls} renewal calls in one TTL"
    );
    let expected_ticks = elapsed.as_millis() as usize / 5;
    let ticks = ticks.load(Ordering::SeqCst);
    assert!(
        ticks * 2 >= expected_ticks,
        "other tasks were starved: {ticks} ticks of about {expected_ticks} in {elapsed:?}"
    );
}

/// A memory store whose first `renew` is applied at once but answered
/// `delay` late, recording when the call came in; every later renewal
/// never answers (the watchdog times it out, which moves no deadline).
#[derive(Debug)]
struct LateReply {
    inner: MemoryBackend,
    delay: Duration,
    entered: Mutex<Option<Instant>>,
}

// Only the first renewal answers, late; later ones never do.
lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for LateReply {
        async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
            let first = {
                let mut entered = self.entered.lock().unwrap();
                let first = entered.is_none();
                if first {
                    *entered = Some(Instant::now());
                }
                first
            };
            if !first {
                return std::future::pending().await;
            }
            let results = self.inner.renew(requests).await;
            tokio::time::sleep(self.delay).await;
            results
        }
    }
}

/// A renewal's lease counts from when the request left, not from when the
/// reply came back: the store may have applied it at once, so the lease
/// there ends `ttl` after the send. A reply delayed by far more than the
/// drift allowance (yet within the watchdog's `ttl / 2` call timeout)
/// must not push the guard's deadline past call-entry + TTL.
#[tokio::test]
async fn a_renewed_deadline_counts_from_the_send_not_the_reply() {
    // Seconds of slack both ways on a loaded machine: the delay is 80
    // times the drift, and 2.5 s within the 5 s call timeout.
    let ttl = Duration::from_secs(10);
    let delay = Duration::from_millis(2500);
    assert!(delay > 10 * lockwright_core::backend::clock_drift(ttl) && delay < ttl / 2);
    let backend = Arc::new(LateReply {
        inner: MemoryBackend::new(),
        delay,
        entered: Mutex::new(None),
    });
    let locker = Locker::from_arc(backend.clone());
    let guard = locker
        .lock_with("k", &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let first = guard.deadline().expect("held");
    // The one renewal that answers moves the deadline once; later ones
    // never answer, so the next change can only be the loss.
    let renewed = tokio::time::timeout(ttl, async {
        loop {
            match guard.deadline() {
                Some(d) if d != first => return d,
                Some(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                None => panic!("lost before the renewal: {:?}", guard.state()),
            }
        }
    })
    .await
    .expect("the renewal never moved the deadline");
    let entered = backend.entered.lock().unwrap().expect("a renewal was sent");
    assert!(
        renewed <= entered + ttl,
        "the renewed deadline is {:?} past call entry + TTL: counted from the reply",
        renewed - (entered + ttl)
    );
    guard.release().await.unwrap();
}

/// An alarm makes every held lease renewed at once, and a lease the store
/// no longer holds is reported lost then, not at its next period.
#[tokio::test]
async fn an_alarm_renews_every_lease_at_once() {
    let backend = Arc::new(Recording::default());
    let locker = Locker::from_arc(backend.clone());
    // Renewed every 20 s on their own.
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let kept = locker.lock_with("kept", &opts).await.unwrap();
    let dropped = locker.lock_with("dropped", &opts).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(backend.batches(), 0);
    // The store lost one lock without telling anyone.
    backend
        .inner
        .unlock(dropped.key(), dropped.owner())
        .await
        .unwrap();
    backend.raise();
    let reason = tokio::time::timeout(Duration::from_secs(5), dropped.lost())
        .await
        .expect("the alarm made the watchdog look at once");
    assert_eq!(reason, LostReason::NotHeld);
    assert!(!kept.is_lost());
    assert!(backend.batches() >= 1);
}

/// A store that went away and came back empty: the lease's renewals failed
/// while it was away (three in a row, so the next waits 2 to 4 s), and the
/// alarm its reconnect raises brings that renewal forward, once, so the
/// lease is found lost then rather than at the end of the backoff.
#[tokio::test]
async fn an_alarm_asks_again_for_a_lease_whose_renewals_failed() {
    let backend = Arc::new(Recording::default());
    let locker = Locker::from_arc(backend.clone());
    // Renewed every 8 s; failed renewals retried after 0.5-1 s, 1-2 s,
    // then 2-4 s; alarms swept at most every 2 s.
    let opts = LockOptions::new().ttl(Duration::from_secs(24));
    let guard = locker.lock_with("away", &opts).await.unwrap();
    // The watchdog's task starts listening for alarms.
    tokio::time::sleep(Duration::from_millis(100)).await;
    backend.fail_renewals.store(true, Ordering::SeqCst);
    // The connection broke: the alarm makes the watchdog ask, and fail.
    backend.raise();
    let start = Instant::now();
    while backend.batches() < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "renewals stopped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Back, without the lock; its reconnect raises the alarm again.
    backend.fail_renewals.store(false, Ordering::SeqCst);
    backend
        .inner
        .unlock(guard.key(), guard.owner())
        .await
        .unwrap();
    backend.raise();
    let raised = Instant::now();
    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the lease was found lost");
    assert_eq!(reason, LostReason::NotHeld);
    // At most the sweeps' gap (here under 0.5 s) after the alarm; without
    // it, the backoff's 2 s at least.
    let after = raised.elapsed();
    assert!(
        after < Duration::from_millis(1500),
        "found lost {after:?} after the alarm: it waited out the backoff"
    );
}

/// A store that raises its alarm on every renewal batch does not make the
/// watchdog renew in a loop: alarms are swept at most once per gap.
#[tokio::test]
async fn alarms_raised_by_renewals_do_not_make_a_loop() {
    let backend = Arc::new(Recording::default());
    backend.alarm_on_renew.store(true, Ordering::SeqCst);
    let locker = Locker::from_arc(backend.clone());
    // Renewed every 200 ms on their own: about 7 batches in 1.5 s.
    let opts = LockOptions::new().ttl(Duration::from_millis(600));
    let guards: Vec<_> = futures::future::join_all((0..5).map(|i| {
        let (locker, opts) = (&locker, &opts);
        async move { locker.lock_with(format!("k{i}"), opts).await.unwrap() }
    }))
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let calls = backend.batches();
    // Periodic renewals plus a sweep every 250 ms at most.
    assert!(calls <= 40, "{calls} renewal calls in 1.5 s");
    assert!(guards.iter().all(|g| !g.is_lost()));

    // Failing renewals that raise alarms keep their backoff.
    backend.fail_renewals.store(true, Ordering::SeqCst);
    let before = backend.batches();
    let reasons = futures::future::join_all(guards.iter().map(|g| g.lost()));
    let reasons = tokio::time::timeout(Duration::from_secs(3), reasons)
        .await
        .expect("every lease runs out");
    assert!(reasons.iter().all(|r| *r == LostReason::Expired));
    let calls = backend.batches() - before;
    assert!(calls <= 100, "{calls} failing renewal calls in one TTL");
}

/// A store that says yes to every renewal, even of a lease it let go:
/// renewals "succeed" whenever they land.
#[derive(Debug, Default)]
struct RenewsAnything {
    inner: MemoryBackend,
}

lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for RenewsAnything {
        async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
            requests.iter().map(|_| Ok(Renew::Renewed)).collect()
        }
    }
}

/// A process starved of CPU past a lease's deadline (here: its only
/// runtime thread blocked, so neither the watchdog nor any timer runs)
/// still reads the lock as lost at once, and a renewal answered only
/// after the deadline does not bring it back.
#[tokio::test(flavor = "current_thread")]
async fn a_starved_holder_reads_its_lock_as_lost_at_the_deadline() {
    let locker = Locker::new(RenewsAnything::default());
    let ttl = Duration::from_millis(300);
    let g = locker
        .lock_with("starved", &LockOptions::new().ttl(ttl).auto_renew(false))
        .await
        .unwrap();
    let lost = g.lost();
    assert!(!g.is_lost());
    std::thread::sleep(ttl + Duration::from_millis(50));
    assert!(g.is_lost(), "held past its deadline: {:?}", g.state());
    assert_eq!(g.deadline(), None);
    let signal = g.lost_signal();
    let reason = tokio::time::timeout(Duration::from_millis(1), lost)
        .await
        .expect("the lost future waits for the watchdog");
    assert_eq!(reason, LostReason::Expired);
    assert!(
        signal.is_lost(),
        "the lost signal says held past the deadline"
    );
    let late = g.renew().await;
    assert!(
        late.is_err(),
        "a renewal after the deadline revived the lock"
    );
    assert!(g.is_lost() && g.deadline().is_none());
}

/// A store that grants a lease shorter than the TTL on every attempt, as
/// a session store lends what its session has left.
#[derive(Debug, Default)]
struct LendsShort {
    inner: MemoryBackend,
}

lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for LendsShort {
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<lockwright_core::backend::Acquire> {
            let mut got = self.inner.try_acquire(request).await?;
            if let lockwright_core::backend::Acquire::Acquired(g) = &mut got {
                g.lease = Some(Duration::from_millis(400));
            }
            Ok(got)
        }
    }
}

/// A direct grant of a short lease is trusted only that long, and the
/// watchdog extends it halfway through, so the hold lives on.
#[tokio::test]
async fn a_short_direct_grant_is_trusted_that_long_and_extended() {
    let locker = Locker::new(LendsShort::default());
    let start = Instant::now();
    let g = locker
        .lock_with("lent", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let deadline = g.deadline().expect("held");
    assert!(
        deadline <= start + Duration::from_millis(400),
        "trusted {:?} of a 400 ms lease",
        deadline - start
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!g.is_lost(), "the short lease was not extended");
    assert!(g.deadline().expect("held") > start + Duration::from_secs(20));
    g.release().await.unwrap();
    // Without the watchdog, the acquire renews once: the whole TTL.
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .auto_renew(false);
    let g = locker.lock_with("lent", &opts).await.unwrap();
    assert!(g.deadline().expect("held") > Instant::now() + Duration::from_secs(20));
    g.release().await.unwrap();
}
