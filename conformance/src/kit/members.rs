//! The fault scenario every replicated store's tests run on its private
//! 3-member group (a ZooKeeper ensemble, an etcd cluster): the leader
//! killed while a lock is held and another client waits, then a majority
//! down while a lock is held.

use std::time::{Duration, Instant};

use lockwright_core::{ErrorKind, FencingToken, LockOptions, Locker};

use super::fault_server::{self, Stopped};

/// A store's 3-member group, as the scenario drives it.
#[async_trait::async_trait]
pub trait ThreeMembers: Sync {
    /// What the store calls the group in messages ("ensemble", "cluster").
    fn group(&self) -> &'static str;
    /// Member `n`'s name for `scripts/fault-server` (1-based).
    fn member(&self, n: usize) -> String;
    /// Whether member `n` answers, and whether it leads.
    async fn role(&self, n: usize) -> Option<bool>;
    /// A `Locker` on the group whose session (or lease) lasts 8 s.
    fn locker(&self) -> Locker;
}

async fn leader(g: &dyn ThreeMembers) -> Option<usize> {
    for n in 1..=3 {
        if g.role(n).await == Some(true) {
            return Some(n);
        }
    }
    None
}

/// Waits until every member answers and one leads.
async fn serving(g: &dyn ThreeMembers, within: Duration) {
    let start = Instant::now();
    loop {
        let mut all = true;
        for n in 1..=3 {
            all &= g.role(n).await.is_some();
        }
        if all && leader(g).await.is_some() {
            return;
        }
        assert!(
            start.elapsed() < within,
            "the {} did not come back within {within:?}",
            g.group()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Starts any member that does not answer, and waits until all serve.
pub async fn all_serving(g: &dyn ThreeMembers) {
    for n in 1..=3 {
        if g.role(n).await.is_none() {
            fault_server::start(&g.member(n));
        }
    }
    serving(g, Duration::from_secs(60)).await;
}

/// The scenario, on names `k` and `m`: a hold survives its leader's death
/// (renewed under the new leader, the queued waiter served after the
/// release, fences rising); a majority lost is `Unavailable`, never
/// "held", the holder's lost signal fires within its 8 s session, and
/// locks work again once the majority returns. Returns the highest fence
/// it saw.
///
/// # Panics
/// Where the store breaks one of those promises.
pub async fn leader_then_majority_lost(g: &dyn ThreeMembers) -> Option<FencingToken> {
    all_serving(g).await;
    let group = g.group();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));

    // 1. The leader dies while a lock is held and another client waits.
    let (a, b) = (g.locker(), g.locker());
    let held = a
        .lock_with("k", &opts)
        .await
        .unwrap_or_else(|e| panic!("lock on a healthy {group}: {e}"));
    let waiting = {
        let b = b.clone();
        let opts = opts.clone().wait_for(Duration::from_secs(40));
        // Its polls may meet the election as `Unavailable`: a wait rides
        // that out.
        tokio::spawn(async move { b.lock_with("k", &opts).await })
    };
    let start = Instant::now();
    while a.status("k").await.expect("status").waiters != Some(1) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut stopped = Stopped::new();
    let old = leader(g).await.expect("a leader");
    stopped.stop(&g.member(old));
    let start = Instant::now();
    while leader(g).await.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no new leader elected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Over one session later, the hold has been confirmed anew.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(!held.is_lost(), "the hold was lost when the leader died");
    held.renew()
        .await
        .expect("the hold renews under the new leader");
    if waiting.is_finished() {
        let ended = waiting.await.expect("waiter task");
        panic!(
            "the waiter ended while the lock was held: {:?}",
            ended.map(|g| g.fence())
        );
    }
    let first = held.fence().expect("grants carry fences");
    held.release().await.expect("release under the new leader");
    let next = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter proceeds after the release")
        .expect("waiter task")
        .expect("the waiter gets the lock");
    let second = next.fence().expect("fence");
    assert!(
        second > first,
        "fences {first:?} then {second:?} across a leader change"
    );
    next.release().await.expect("release");
    stopped.start(&g.member(old));
    serving(g, Duration::from_secs(60)).await;

    // 2. A majority goes down while a lock is held.
    let c = g.locker();
    let holder = a.lock_with("m", &opts).await.expect("lock");
    let lead = leader(g).await;
    let down: Vec<usize> = (1..=3).filter(|&n| Some(n) != lead).take(2).collect();
    for &n in &down {
        stopped.stop(&g.member(n));
    }
    let cut_at = Instant::now();
    let attempt = tokio::time::timeout(Duration::from_secs(15), c.try_lock("m"))
        .await
        .expect("an attempt on a lost majority returns");
    match attempt {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
        Ok(got) => panic!(
            "a lost majority answered {} instead of Unavailable",
            if got.is_some() {
                "acquired"
            } else {
                "contended"
            }
        ),
    }
    // The holder cannot confirm its session: the lost signal fires within
    // one session (8 s) of its last confirmation.
    tokio::time::timeout(Duration::from_secs(12), holder.lost())
        .await
        .expect("the holder's lost signal fires while the majority is gone");
    assert!(cut_at.elapsed() < Duration::from_secs(12));
    // A short wait rides the outage as far as it goes, then says why it
    // failed: not `Timeout`, which would read as "someone holds it".
    let short = LockOptions::new().wait_for(Duration::from_secs(1));
    let e = tokio::time::timeout(Duration::from_secs(15), c.lock_with("m", &short))
        .await
        .expect("a short wait on a lost majority returns")
        .expect_err("a short wait on a lost majority");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
    // As an application would: drop the guard. Its key or node is deleted
    // once the group answers again (or goes with the session).
    drop(holder);
    for &n in &down {
        stopped.start(&g.member(n));
    }
    serving(g, Duration::from_secs(60)).await;
    let start = Instant::now();
    let again = loop {
        match c.try_lock("m").await {
            Ok(Some(g)) => break g,
            // The old holder's session ends one session after the
            // majority returns at the latest.
            Ok(None) | Err(_) if start.elapsed() < Duration::from_secs(40) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("no lock 40 s after the majority returned: {other:?}"),
        }
    };
    assert!(again.fence() > Some(second), "fences keep rising");
    let last = again.fence();
    again.release().await.expect("release after recovery");
    last
}
