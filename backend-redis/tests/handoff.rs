//! The fair queue of the single-node backend: a release hands the lock to
//! the longest live waiter by a message on its hub; a lost message is found
//! on the waiter's refresh; a waiter that stopped refreshing is skipped; one
//! that gives up after being handed the lock passes it on.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockwright_conformance::kit::servers::redis_url;
use lockwright_core::backend::{
    Acquire, AcquireRequest, HoldId, LockBackend, LockBackendExt, Notice, Release, Watch,
};
use lockwright_core::{LockKey, LockOptions, Locker, OwnerToken, Result};
use lockwright_redis::RedisBackend;
use tokio::sync::{mpsc, watch};

const TTL: Duration = Duration::from_secs(60);

fn backend(refresh: &str) -> RedisBackend {
    RedisBackend::connect(&format!("{}?waiter_refresh={refresh}", redis_url())).unwrap()
}

fn key(name: &str) -> LockKey {
    LockKey::new(format!(
        "handoff:{name}:{}",
        OwnerToken::generate().as_str()
    ))
    .unwrap()
}

async fn take(b: &RedisBackend, k: &LockKey) -> (OwnerToken, u64) {
    let me = OwnerToken::generate();
    match b.try_lock(k, &me, TTL).await.unwrap() {
        Acquire::Acquired(g) => (me, g.fence.unwrap().0),
        other => panic!("expected to take {k:?}, got {other:?}"),
    }
}

fn is_held(outcome: Acquire) -> bool {
    matches!(outcome, Acquire::Contended { .. })
}

/// With the refresh a minute away, only the release message can hand the
/// lock over in time.
#[tokio::test]
async fn the_release_message_hands_over_not_the_refresh() {
    let k = key("message");
    let (holder, waiter) = (Locker::new(backend("60s")), Locker::new(backend("60s")));
    let g = holder
        .lock_with(&k, &LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let fence = g.fence().unwrap();
    let k2 = k.clone();
    let task = tokio::spawn(async move {
        let opts = LockOptions::new()
            .ttl(TTL)
            .wait_for(Duration::from_secs(30));
        let g = waiter.lock_with(&k2, &opts).await.unwrap();
        (g, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    g.release().await.unwrap();
    let (g2, got) = task.await.unwrap();
    let lag = got - released;
    assert!(lag < Duration::from_secs(2), "hand-off took {lag:?}");
    assert!(
        g2.fence().unwrap() > fence,
        "the handed grant carries a new fence"
    );
    assert_eq!(g2.holds(), 1);
    assert!(g2.deadline().expect("held") > Instant::now() + TTL / 2);
    g2.release().await.unwrap();
}

/// A grant whose message never arrived is the waiter's on its next refresh:
/// with its fence and one hold, not as a re-entry on top of it.
#[tokio::test]
async fn a_lost_grant_is_found_on_refresh() {
    let k = key("lost");
    let b = backend("500ms");
    let (a, _) = take(&b, &k).await;
    let (w, ticket) = (OwnerToken::generate(), OwnerToken::generate());
    // Queued without registering the ticket: the hub drops its message.
    assert!(is_held(
        b.try_lock_waiting(&HoldId::mutex(k.clone(), w.clone()), TTL, &ticket)
            .await
            .unwrap()
    ));
    assert_eq!(b.unlock(&k, &a).await.unwrap(), Release::Freed);
    // Handed over: the key is held for the waiter, nobody else gets it.
    assert!(is_held(
        b.try_lock(&k, &OwnerToken::generate(), TTL).await.unwrap()
    ));
    match b
        .try_lock_waiting(&HoldId::mutex(k.clone(), w.clone()), TTL, &ticket)
        .await
        .unwrap()
    {
        Acquire::Acquired(g) => assert_eq!(g.holds, 1, "claimed, not re-entered"),
        other => panic!("the refresh should find the grant, got {other:?}"),
    }
    assert_eq!(b.unlock(&k, &w).await.unwrap(), Release::Freed);
    take(&b, &k).await;
}

/// A waiter handed the lock that then gives up passes it on at once.
#[tokio::test]
async fn giving_up_after_the_hand_off_passes_the_lock_on() {
    let k = key("abandon");
    let b = backend("500ms");
    let (a, fence_a) = take(&b, &k).await;
    let (w, ticket) = (OwnerToken::generate(), OwnerToken::generate());
    let mut watch = b.watch(&k, &ticket).await.unwrap().expect("Redis notifies");
    assert!(is_held(
        b.try_lock_waiting(&HoldId::mutex(k.clone(), w.clone()), TTL, &ticket)
            .await
            .unwrap()
    ));
    b.unlock(&k, &a).await.unwrap();
    let notice = tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("the grant message arrives");
    match notice {
        Notice::Granted(g) => assert!(g.fence.unwrap().0 > fence_a),
        other => panic!("expected a grant, got {other:?}"),
    }
    assert!(is_held(
        b.try_lock(&k, &OwnerToken::generate(), TTL).await.unwrap()
    ));
    b.abandon_lock(&k, &w, &ticket).await.unwrap();
    take(&b, &k).await;
}

/// A waiter that stopped refreshing (its process died) is skipped: the
/// release goes to the live waiter behind it.
#[tokio::test]
async fn a_silent_waiter_is_skipped() {
    let k = key("dead");
    let b = backend("50ms");
    let (a, _) = take(&b, &k).await;
    let (dead, ticket) = (OwnerToken::generate(), OwnerToken::generate());
    assert!(is_held(
        b.try_lock_waiting(&HoldId::mutex(k.clone(), dead.clone()), TTL, &ticket)
            .await
            .unwrap()
    ));
    // Queued behind it, a live waiter whose refreshes keep the queue alive.
    let live = Locker::new(b.clone());
    let k2 = k.clone();
    let task = tokio::spawn(async move {
        let opts = LockOptions::new().ttl(TTL).wait_for(Duration::from_secs(5));
        live.lock_with(&k2, &opts).await
    });
    // The dead waiter's place is kept for four refresh periods (200 ms).
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(b.unlock(&k, &a).await.unwrap(), Release::Freed);
    let g = task
        .await
        .unwrap()
        .expect("the live waiter gets the lock, not the dead one");
    g.release().await.unwrap();
}

/// While a live waiter is queued, a free key goes to it, not to a newcomer.
#[tokio::test]
async fn a_newcomer_cannot_jump_the_queue_after_expiry() {
    let k = key("expiry");
    let b = backend("500ms");
    let a = OwnerToken::generate();
    assert!(!is_held(
        b.try_lock(&k, &a, Duration::from_millis(100))
            .await
            .unwrap()
    ));
    let (w, ticket) = (OwnerToken::generate(), OwnerToken::generate());
    let mut watch = b.watch(&k, &ticket).await.unwrap().unwrap();
    assert!(is_held(
        b.try_lock_waiting(&HoldId::mutex(k.clone(), w.clone()), TTL, &ticket)
            .await
            .unwrap()
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The holder's lease ran out; the newcomer's attempt serves the waiter.
    assert!(is_held(
        b.try_lock(&k, &OwnerToken::generate(), TTL).await.unwrap()
    ));
    let notice = tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("the grant message arrives");
    assert!(matches!(notice, Notice::Granted(_)));
    assert_eq!(b.unlock(&k, &w).await.unwrap(), Release::Freed);
}

/// A hand-off grants the waiter's liveness window (2 s with the default
/// refresh), not the TTL; the new holder's watchdog extends it halfway
/// through, so a lock handed over and held past the window stays held.
#[tokio::test]
async fn a_short_hand_off_lease_is_extended_to_the_ttl() {
    let k = key("short-lease");
    let ttl = Duration::from_secs(20);
    let (holder, waiter) = (Locker::new(backend("500ms")), Locker::new(backend("500ms")));
    let g = holder
        .lock_with(&k, &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let k2 = k.clone();
    let task = tokio::spawn(async move {
        let opts = LockOptions::new()
            .ttl(ttl)
            .wait_for(Duration::from_secs(10));
        waiter.lock_with(&k2, &opts).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    g.release().await.unwrap();
    let handed = task.await.unwrap();
    let client = redis::Client::open(redis_url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let lock = format!("lockwright:{{{}}}:lock", k.as_str());
    let pttl = |c: &mut redis::aio::MultiplexedConnection| {
        let mut c = c.clone();
        let lock = lock.clone();
        async move {
            redis::cmd("PTTL")
                .arg(&lock)
                .query_async::<i64>(&mut c)
                .await
                .unwrap()
        }
    };
    let first = pttl(&mut c).await;
    assert!(
        (1..=2000).contains(&first),
        "the hand-off lease was {first} ms, not the 2 s liveness window"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(
        !handed.is_lost(),
        "the handed lock was lost past its short lease"
    );
    let later = pttl(&mut c).await;
    assert!(
        later > 10_000,
        "the short lease was not extended to the TTL: {later} ms left"
    );
    handed.release().await.unwrap();
}

/// A waiter that queues on a string-form lock in its very last millisecond
/// (PTTL 0) turns it into the hash form; that hash must still expire, or a
/// dead holder's lock would be held for ever. Waiters poll right at the end
/// of a lease, so each round spins queued attempts across the expiry.
#[tokio::test]
async fn a_lock_turned_into_a_hash_at_its_last_millisecond_still_expires() {
    let b = backend("500ms");
    let client = redis::Client::open(redis_url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let mut converted_late = 0;
    for round in 0..200 {
        let k = key(&format!("lastms{round}"));
        let lock = format!("lockwright:{{{}}}:lock", k.as_str());
        let holder = OwnerToken::generate();
        // A dead holder's string-form lock with 3 ms left.
        redis::cmd("SET")
            .arg(&lock)
            .arg(format!("{} 1 2", holder.as_str()))
            .arg("PX")
            .arg(3)
            .query_async::<()>(&mut c)
            .await
            .unwrap();
        let (me, ticket) = (OwnerToken::generate(), OwnerToken::generate());
        let started = Instant::now();
        loop {
            let out = b
                .try_lock_waiting(&HoldId::mutex(k.clone(), me.clone()), TTL, &ticket)
                .await
                .unwrap();
            let kind: String = redis::cmd("TYPE")
                .arg(&lock)
                .query_async(&mut c)
                .await
                .unwrap();
            let pttl: i64 = redis::cmd("PTTL")
                .arg(&lock)
                .query_async(&mut c)
                .await
                .unwrap();
            assert_ne!(pttl, -1, "round {round}: {lock} ({kind}) has no expiry");
            if matches!(out, Acquire::Acquired(_)) {
                break;
            }
            if kind == "hash" {
                converted_late += 1;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "round {round}: the dead holder's lock never expired"
            );
        }
        let _ = b.abandon_lock(&k, &me, &ticket).await;
        let _ = b.unlock(&k, &me).await;
    }
    // The rounds did reach the conversion they are about.
    assert!(
        converted_late > 0,
        "no attempt converted a lock near its expiry"
    );
}

/// A waiter on a runtime of its own, which the test can freeze outright:
/// timers, the hub's reader and the waiting acquire all stop, as in a
/// process under SIGSTOP.
struct Paused {
    go: tokio::sync::mpsc::UnboundedSender<LockKey>,
    freeze: tokio::sync::mpsc::UnboundedSender<Duration>,
    got: tokio::sync::mpsc::UnboundedReceiver<LockKey>,
}

impl Paused {
    fn start() -> Paused {
        let (go, mut go_rx) = tokio::sync::mpsc::unbounded_channel::<LockKey>();
        let (freeze, mut freeze_rx) = tokio::sync::mpsc::unbounded_channel::<Duration>();
        let (got_tx, got) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                tokio::spawn(async move {
                    while let Some(d) = freeze_rx.recv().await {
                        // Blocks the whole runtime: nothing of the waiter runs.
                        std::thread::sleep(d);
                    }
                });
                let waiter = std::sync::Arc::new(Locker::new(backend("100ms")));
                while let Some(k) = go_rx.recv().await {
                    let (waiter, got_tx) = (waiter.clone(), got_tx.clone());
                    tokio::spawn(async move {
                        let opts = LockOptions::new()
                            .ttl(TTL)
                            .wait_for(Duration::from_secs(20));
                        let g = waiter.lock_with(&k, &opts).await.unwrap();
                        let _ = got_tx.send(k);
                        g.release().await.unwrap();
                    });
                }
            });
        });
        Paused { go, freeze, got }
    }
}

/// A waiter frozen while the lock is handed to it misses the short
/// hand-off lease, and the lock goes to the next waiter. Thawed, its timer
/// and the old grant's notice are both due; when the timer wins, its new
/// attempt finds the lock held, and the notice is read after it. That
/// grant is stale: it must not count as a lease starting at the new
/// attempt (`lockwright check` found this; each round below catches the old
/// rule about half the time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_grant_delivered_after_a_later_attempt_is_not_trusted() {
    let mut w = Paused::start();
    let holder = Locker::new(backend("100ms"));
    let next = Locker::new(backend("100ms"));
    let opts = LockOptions::new()
        .ttl(TTL)
        .wait_for(Duration::from_secs(20));
    for round in 0..8 {
        let k = key(&format!("stale-grant-{round}"));
        let g = holder.lock_with(&k, &opts).await.unwrap();
        w.go.send(k.clone()).unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        w.freeze.send(Duration::from_millis(1200)).unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // Handed to the frozen waiter for 400 ms (four refresh periods).
        g.release().await.unwrap();
        let taken = tokio::time::timeout(Duration::from_secs(5), next.lock_with(&k, &opts))
            .await
            .expect("the next waiter gets the lock once the frozen one's hand-off lapses")
            .unwrap();
        // Past the thaw, with time for the thawed waiter to act.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(
            w.got.try_recv().is_err(),
            "round {round}: the thawed waiter took a stale grant while another holds the lock"
        );
        taken.release().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), w.got.recv())
            .await
            .expect("the waiter gets the lock once it is free");
        assert_eq!(got.as_ref(), Some(&k));
    }
}

/// How long a waiter over [`Ordered`] pauses after its first queued
/// attempt: far longer than the hand-off lease (four 100 ms refresh
/// periods) and the next waiter's take-over after it, with room for a
/// loaded CI host (2 s was once too short there).
const PAUSE: Duration = Duration::from_secs(6);

/// A Redis client whose waiter the test puts in a fixed order: a grant
/// notice is held back until the waiter's second queued attempt has come
/// back, and the first queued attempt tells the waiter to come back only
/// after [`PAUSE`]. So the hand-off lapses unseen, another waiter takes the
/// lock, the waiter attempts again (finding it held) and only then reads
/// the old grant: the order `lockwright check` found, without a frozen
/// runtime and its luck.
#[derive(Debug)]
struct Ordered {
    inner: RedisBackend,
    /// Queued attempts begun so far.
    attempts: watch::Sender<usize>,
    /// Queued attempts answered so far.
    answered: watch::Sender<usize>,
    /// When the second queued attempt began.
    second: Mutex<Option<Instant>>,
    /// A grant notice arrived (and is held back).
    arrived: watch::Sender<bool>,
    /// Held grant notices may be delivered.
    deliver: watch::Sender<bool>,
}

impl Ordered {
    fn new(inner: RedisBackend) -> Arc<Self> {
        Arc::new(Ordered {
            inner,
            attempts: watch::channel(0).0,
            answered: watch::channel(0).0,
            second: Mutex::new(None),
            arrived: watch::channel(false).0,
            deliver: watch::channel(false).0,
        })
    }
}

/// Stops a forwarding task with the watch that owns it.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

// Only the queued attempts and their notices are ordered; the rest is
// Redis's own.
lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for Ordered {
        async fn watch(&self, k: &LockKey, ticket: &OwnerToken) -> Result<Option<Watch>> {
            let mut inner = self.inner.watch(k, ticket).await?.expect("Redis notifies");
            let (tx, rx) = mpsc::unbounded_channel();
            let arrived = self.arrived.clone();
            let mut deliver = self.deliver.subscribe();
            let task = tokio::spawn(async move {
                loop {
                    if let Notice::Granted(g) = inner.changed().await {
                        arrived.send_replace(true);
                        let _ = deliver.wait_for(|d| *d).await;
                        if tx.send(g).is_err() {
                            return;
                        }
                    }
                }
            });
            Ok(Some(Watch::grants(
                rx,
                Some(Box::new(AbortOnDrop(task.abort_handle()))),
            )))
        }
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
            if request.ticket.is_none() {
                return self.inner.try_acquire(request).await;
            }
            let mut n = 0;
            // The second attempt's time is set before anyone watching the
            // count can see it.
            self.attempts.send_modify(|a| {
                *a += 1;
                n = *a;
                if n == 2 {
                    *self.second.lock().unwrap() = Some(Instant::now());
                }
            });
            let outcome = self.inner.try_acquire(request).await?;
            self.answered.send_modify(|a| *a += 1);
            Ok(match (n, outcome) {
                (1, Acquire::Contended { .. }) => Acquire::Contended {
                    retry_after: Some(PAUSE),
                },
                (2, outcome) => {
                    // Read after this answer: the waiter's select sees it only
                    // once it has dealt with the answer.
                    self.deliver.send_replace(true);
                    outcome
                }
                (_, outcome) => outcome,
            })
        }
    }
}

/// The stale grant's failure sequence, every time: the waiter queues; the
/// holder releases and the lock is handed to the waiter, whose notice is
/// held back; the hand-off lapses and the next waiter takes the lock; the
/// waiter attempts again and finds it held; then the old grant arrives. It
/// was made before that later attempt, so it must not be trusted from it:
/// the waiter attempts again instead of taking a lock another holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_grant_read_after_a_later_attempt_is_refused_every_time() {
    let k = key("ordered-stale-grant");
    let opts = LockOptions::new()
        .ttl(TTL)
        .wait_for(Duration::from_secs(30));
    let holder = Locker::new(backend("100ms"));
    let next = Locker::new(backend("100ms"));
    let ordered = Ordered::new(backend("100ms"));
    let waiter = Locker::from_arc(ordered.clone());
    let g = holder.lock_with(&k, &opts).await.unwrap();
    let mut attempts = ordered.attempts.subscribe();
    let mut answered = ordered.answered.subscribe();
    let mut task = tokio::spawn({
        let (k, opts) = (k.clone(), opts.clone());
        async move { waiter.lock_with(&k, &opts).await.map(drop) }
    });
    // The first queued attempt came back: the waiter is queued.
    let mut arrived = ordered.arrived.subscribe();
    answered.wait_for(|a| *a >= 1).await.unwrap();
    assert!(!task.is_finished(), "setup: the waiter got a held lock");
    g.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), arrived.wait_for(|a| *a))
        .await
        .expect("the hand-off's notice arrives")
        .unwrap();
    // The waiter is silent until PAUSE is up: its hand-off lapses, and the
    // next waiter gets the lock.
    let taken = next.lock_with(&k, &opts).await.unwrap();
    let taken_at = Instant::now();
    attempts.wait_for(|a| *a >= 2).await.unwrap();
    let second = ordered.second.lock().unwrap().expect("the second attempt");
    assert!(
        taken_at < second,
        "setup: the next waiter took the lock only after the waiter's second attempt \
         ({:?} later; the host may be overloaded)",
        taken_at - second
    );
    // The stale grant is read after the second attempt found the lock held.
    let outcome = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::select! {
            r = &mut task => panic!(
                "the waiter trusted a stale grant while another holds the lock: {r:?}"
            ),
            r = attempts.wait_for(|a| *a >= 3) => { r.unwrap(); }
        }
    })
    .await;
    assert!(
        outcome.is_ok(),
        "the waiter neither took the stale grant nor tried again within 30 s"
    );
    taken.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the waiter gets the lock once it is free")
        .unwrap()
        .unwrap();
}
