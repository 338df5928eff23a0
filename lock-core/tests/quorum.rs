//! The quorum's undo of a failed acquire, with nodes that fail on cue, and
//! its refusal of grants and renewals that come back after their TTL.

use lockwright_core::backend::LockBackendExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use lockwright_core::backend::{
    Acquire, AcquireRequest, HoldId, HoldKind, LockBackend, MemoryBackend, Quorum, Release, Renew,
    RenewRequest,
};
use lockwright_core::{Error, LockKey, OwnerToken, Result};

/// An in-memory node whose next acquire fails without reaching the store
/// (a refused connection), when told to.
#[derive(Debug, Default)]
struct Flaky {
    store: MemoryBackend,
    fail_next_acquire: AtomicBool,
}

lockwright_core::forward_backend! {
    (self) => self.store;
    impl LockBackend for Flaky {
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
            if self.fail_next_acquire.swap(false, Ordering::SeqCst) {
                return Err(Error::unavailable("refused (on cue)"));
            }
            self.store.try_acquire(request).await
        }
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
        q.try_lock(&key, &me, ttl).await.unwrap(),
        Acquire::Acquired(_)
    ));
    q.nodes()[0].fail_next_acquire.store(true, Ordering::SeqCst);
    q.nodes()[1].fail_next_acquire.store(true, Ordering::SeqCst);
    let e = q
        .try_lock(&key, &me, ttl)
        .await
        .expect_err("a minority answered");
    assert_eq!(e.kind(), lockwright_core::ErrorKind::Unavailable);
    for (i, node) in q.nodes().iter().enumerate() {
        let s = node.inspect(&key).await.unwrap();
        assert!(
            s.held && s.holds == 1,
            "node {i} after the undo: {s:?} (the earlier hold must stay, the new one go)"
        );
    }
    assert_eq!(q.unlock(&key, &me).await.unwrap(), Release::Freed);
}

/// An in-memory node whose requests, once `slow` is set, reach the store
/// only after `LATE`: a grant that comes back after its TTL has run out.
/// Releases are never delayed, so an undo lands while the late grant's
/// lease is still live in the store.
#[derive(Debug, Default)]
struct Slow {
    store: MemoryBackend,
    slow: AtomicBool,
}

/// Longer than the TTL the slow cases ask for.
const LATE: Duration = Duration::from_millis(1200);
/// The TTL of the slow cases: the node's lease outlives the undo by far.
const SLOW_TTL: Duration = Duration::from_millis(1000);

impl Slow {
    async fn lag(&self) {
        if self.slow.load(Ordering::SeqCst) {
            tokio::time::sleep(LATE).await;
        }
    }
}

// Releases and reads are never delayed (see above).
lockwright_core::forward_backend! {
    (self) => self.store;
    impl LockBackend for Slow {
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
            self.lag().await;
            self.store.try_acquire(request).await
        }
        async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
            self.lag().await;
            self.store.renew(requests).await
        }
    }
}

fn slow_quorum() -> Quorum<Slow> {
    Quorum::new(
        "test",
        vec![Slow::default(), Slow::default(), Slow::default()],
        Duration::from_millis(10),
    )
    .unwrap()
}

/// Every node grants, but the grants come back after the TTL has run out:
/// the lock may already be someone else's, so the acquire is not granted,
/// and what the nodes granted is undone (their leases, started late, are
/// still live in the store when the undo lands).
#[tokio::test]
async fn grants_that_arrive_after_the_ttl_do_not_count_and_are_undone() {
    let q = slow_quorum();
    for n in q.nodes() {
        n.slow.store(true, Ordering::SeqCst);
    }
    let (key, me) = (LockKey::new("k").unwrap(), OwnerToken::generate());
    let got = q.try_lock(&key, &me, SLOW_TTL).await.unwrap();
    assert!(
        matches!(got, Acquire::Contended { .. }),
        "grants that came back after the TTL counted: {got:?}"
    );
    for (i, node) in q.nodes().iter().enumerate() {
        let s = node.inspect(&key).await.unwrap();
        assert!(!s.held, "node {i} still holds the late grant: {s:?}");
    }
}

/// A quorum renews, but its answers come back after the renewal's TTL has
/// run out: that renewal proves nothing and must not count as `Renewed`.
#[tokio::test]
async fn renewals_that_arrive_after_the_ttl_do_not_count() {
    let q = slow_quorum();
    let (key, me) = (LockKey::new("k").unwrap(), OwnerToken::generate());
    let got = q
        .try_lock(&key, &me, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(matches!(got, Acquire::Acquired(_)), "{got:?}");
    for n in q.nodes() {
        n.slow.store(true, Ordering::SeqCst);
    }
    let request = RenewRequest::new(
        lockwright_core::backend::HoldId::mutex(key.clone(), me.clone()),
        SLOW_TTL,
    );
    let renewed = q.renew(std::slice::from_ref(&request)).await;
    assert!(
        !matches!(renewed.as_slice(), [Ok(Renew::Renewed)]),
        "a renewal that came back after its TTL counted: {renewed:?}"
    );
    for n in q.nodes() {
        n.slow.store(false, Ordering::SeqCst);
    }
    let _ = q.unlock(&key, &me).await;
}

/// A semaphore over a quorum needs more than a majority: over 3 nodes that
/// grant 2 permits each, holders on A+B and B+C leave A and C a permit
/// each, and a third holder would get a majority of them. A quorum of 2
/// permits needs all 3 nodes (more than 3·2/3), so it refuses the third,
/// and a node down stops new permits rather than risk them.
#[tokio::test]
async fn a_semaphore_over_a_quorum_never_admits_n_plus_one_holders() {
    use lockwright_core::Claim;
    let nodes = vec![
        MemoryBackend::new(),
        MemoryBackend::new(),
        MemoryBackend::new(),
    ];
    let q = Quorum::new("memory", nodes.clone(), Duration::from_millis(10)).unwrap();
    assert_eq!(q.needed(Claim::MUTEX), 2);
    assert_eq!(q.needed(Claim::Shared), 2);
    assert_eq!(q.needed(Claim::permits(2).unwrap()), 3);
    assert_eq!(q.needed(Claim::permits(100).unwrap()), 3);
    let five = Quorum::new(
        "memory",
        vec![MemoryBackend::new(); 5],
        Duration::from_millis(10),
    )
    .unwrap();
    assert_eq!(five.needed(Claim::permits(2).unwrap()), 4);
    assert_eq!(five.needed(Claim::permits(3).unwrap()), 4);
    assert_eq!(five.needed(Claim::permits(4).unwrap()), 5);

    let k = LockKey::new("k").unwrap();
    let ttl = Duration::from_secs(30);
    let claim = Claim::permits(2).unwrap();
    let permit =
        |k: &LockKey| HoldId::new(k.clone(), OwnerToken::generate(), HoldKind::of_claim(claim));
    let attempt = |hold: &HoldId| AcquireRequest::new(hold.clone(), ttl);
    let (h1, h2) = (permit(&k), permit(&k));
    for (node, hold) in [(0, &h1), (1, &h1), (1, &h2), (2, &h2)] {
        let granted = nodes[node].try_acquire(&attempt(hold)).await.unwrap();
        assert!(matches!(granted, Acquire::Acquired(_)));
    }
    let h3 = permit(&k);
    let third = q.try_acquire(&attempt(&h3)).await.unwrap();
    assert!(
        matches!(third, Acquire::Contended { .. }),
        "a third holder of 2 permits was admitted on 2 of 3 nodes: {third:?}"
    );
    for node in &nodes {
        assert_eq!(node.release(&h3).await.unwrap(), Release::NotHeld, "undone");
    }
    let status = q.inspect(&k).await.unwrap();
    assert!(
        !status.held,
        "holders on 2 of 3 nodes hold no permit: {status:?}"
    );

    // All three nodes free: granted, and shown as one of 2 permits.
    let k = LockKey::new("free").unwrap();
    assert!(matches!(
        q.try_acquire(&attempt(&permit(&k))).await.unwrap(),
        Acquire::Acquired(_)
    ));
    let status = q.inspect(&k).await.unwrap();
    assert_eq!((status.holder_count(), status.permits), (1, Some(2)));
    // One node down: a new permit cannot be vouched for.
    let down = MemoryBackend::new();
    down.set_available(false);
    let degraded = Quorum::new(
        "memory",
        vec![nodes[0].clone(), nodes[1].clone(), down],
        Duration::from_millis(10),
    )
    .unwrap();
    let e = degraded
        .try_acquire(&attempt(&permit(&k)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), lockwright_core::ErrorKind::Unavailable, "{e}");
}
