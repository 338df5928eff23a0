//! Faults on the 3-member cluster (`scripts/test` starts it, on the kit's
//! `etcd_cluster_ports`): the leader killed while a lock is held and
//! another client waits, then a majority down (one test, because both
//! steps stop and start the same members); and a holder cut off from every
//! member at a TCP proxy. The tests of this file run one at a time
//! (`.config/nextest.toml`), as the first stops members the second uses.

mod common;

use std::time::{Duration, Instant};

use common::raw_client;
use locksmith_conformance::kit::fault_server::{self, Stopped};
use locksmith_conformance::kit::proxy::{Proxy, CUT, PASS};
use locksmith_conformance::kit::servers::{etcd_cluster_ports, loopback};
use locksmith_core::{ErrorKind, LockOptions, Locker};
use locksmith_etcd::EtcdBackend;

/// Member `n`'s name for `scripts/fault-server` (`etcd1` …).
fn member(n: usize) -> String {
    format!("etcd{n}")
}

fn port(n: usize) -> u16 {
    etcd_cluster_ports()[n - 1]
}

/// Whether member `n` answers, and whether it leads.
async fn role(n: usize) -> Option<bool> {
    let opts = locksmith_etcd::internals::etcd_client::ConnectOptions::new()
        .with_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(1));
    let ep = format!("127.0.0.1:{}", port(n));
    let connect = locksmith_etcd::internals::etcd_client::Client::connect([ep], Some(opts));
    let mut c = tokio::time::timeout(Duration::from_secs(3), connect)
        .await
        .ok()?
        .ok()?;
    let s = tokio::time::timeout(Duration::from_secs(3), c.status())
        .await
        .ok()?
        .ok()?;
    let me = s.header()?.member_id();
    (s.leader() != 0).then_some(s.leader() == me)
}

async fn leader() -> Option<usize> {
    for n in 1..=3 {
        if role(n).await == Some(true) {
            return Some(n);
        }
    }
    None
}

/// Waits until every member answers and one leads.
async fn cluster_serving(within: Duration) {
    let start = Instant::now();
    loop {
        let mut all = true;
        for n in 1..=3 {
            all &= role(n).await.is_some();
        }
        if all && leader().await.is_some() {
            return;
        }
        assert!(
            start.elapsed() < within,
            "the cluster did not come back within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn locker() -> Locker {
    let url = format!(
        "etcd://{}/locksmith-cluster?lease_ttl=8s&connect_timeout=1s&timeout=2s",
        loopback(&etcd_cluster_ports()).join(",")
    );
    Locker::new(EtcdBackend::connect(&url).expect("valid URL"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_loss_keeps_locks_and_a_lost_majority_is_unavailable_until_it_returns() {
    for n in 1..=3 {
        if role(n).await.is_none() {
            fault_server::start(&member(n));
        }
    }
    cluster_serving(Duration::from_secs(60)).await;
    let opts = LockOptions::new().ttl(Duration::from_secs(30));

    // 1. The leader dies while a lock is held and another client waits.
    let (a, b) = (locker(), locker());
    let held = a
        .lock_with("k", &opts)
        .await
        .expect("lock on a healthy cluster");
    let waiting = {
        let b = b.clone();
        let opts = opts.clone().wait_for(Duration::from_secs(40));
        // Its polls meet the election as `Unavailable`, which ends a wait
        // today (riding it out is the fast-paths issue's): it asks again,
        // as an application must until then.
        tokio::spawn(async move {
            let start = Instant::now();
            loop {
                match b.lock_with("k", &opts).await {
                    Err(e)
                        if e.kind() == ErrorKind::Unavailable
                            && start.elapsed() < Duration::from_secs(40) => {}
                    other => break other,
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut stopped = Stopped::new();
    let old = leader().await.expect("the cluster has a leader");
    stopped.stop(&member(old));
    let start = Instant::now();
    while leader().await.is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no new leader elected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Over one lease TTL later, the hold has been confirmed anew.
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
    let first = held.fence().expect("etcd grants carry fences");
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
    stopped.start(&member(old));
    cluster_serving(Duration::from_secs(60)).await;

    // 2. A majority goes down while a lock is held.
    let c = locker();
    let holder = a.lock_with("m", &opts).await.expect("lock");
    let lead = leader().await;
    let down: Vec<usize> = (1..=3).filter(|&n| Some(n) != lead).take(2).collect();
    for &n in &down {
        stopped.stop(&member(n));
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
    // The holder cannot confirm its lease: the lost signal fires within
    // one lease TTL (8 s) of its last confirmation.
    tokio::time::timeout(Duration::from_secs(12), holder.lost())
        .await
        .expect("the holder's lost signal fires while the majority is gone");
    assert!(cut_at.elapsed() < Duration::from_secs(12));
    // As an application would: drop the guard. Its key is deleted once the
    // cluster answers again (or goes with the lease).
    drop(holder);
    for &n in &down {
        stopped.start(&member(n));
    }
    cluster_serving(Duration::from_secs(60)).await;
    let start = Instant::now();
    let again = loop {
        match c.try_lock("m").await {
            Ok(Some(g)) => break g,
            Ok(None) | Err(_) if start.elapsed() < Duration::from_secs(40) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("no lock 40 s after the majority returned: {other:?}"),
        }
    };
    assert!(again.fence() > Some(second), "fences keep rising");
    again.release().await.expect("release after recovery");
    // Nothing of ours is left in the cluster.
    let mut raw = raw_client(&loopback(&etcd_cluster_ports()).join(",")).await;
    let opts = locksmith_etcd::internals::etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    let left = raw
        .get("/locksmith-cluster/", Some(opts))
        .await
        .unwrap()
        .count();
    assert_eq!(left, 0, "keys left under /locksmith-cluster/");
}

/// A holder cut off from every member at a TCP proxy: its lost signal
/// fires within one lease TTL, and no other client takes the lock before
/// the holder reads it as lost; the next grant's fence is higher, and the
/// holder locks again once its links are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_cut_off_is_lost_before_another_takes_the_lock() {
    for n in 1..=3 {
        if role(n).await.is_none() {
            fault_server::start(&member(n));
        }
    }
    cluster_serving(Duration::from_secs(60)).await;
    let mut proxies = Vec::new();
    for n in 1..=3 {
        proxies.push(Proxy::start(format!("127.0.0.1:{}", port(n))).await);
    }
    let through: Vec<String> = proxies.iter().map(|p| p.addr.to_string()).collect();
    let params = "lease_ttl=2s&connect_timeout=500ms&timeout=500ms";
    let holder = Locker::new(
        EtcdBackend::connect(&format!(
            "etcd://{}/locksmith-cut?{params}",
            through.join(",")
        ))
        .expect("valid URL"),
    );
    let other = Locker::new(
        EtcdBackend::connect(&format!(
            "etcd://{}/locksmith-cut?lease_ttl=2s",
            loopback(&etcd_cluster_ports()).join(",")
        ))
        .expect("valid URL"),
    );
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = holder.lock_with("k", &opts).await.expect("lock");
    let first = guard.fence().expect("fence");
    let waiting = tokio::spawn(async move {
        let opts = LockOptions::new().wait_for(Duration::from_secs(30));
        let g = other.lock_with("k", &opts).await;
        (Instant::now(), g)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    for p in &proxies {
        p.set(CUT);
    }
    let cut_at = Instant::now();
    // No renewal lands from now on: the guard reads as lost from this
    // instant on at the latest.
    let deadline = guard.deadline().expect("held at the cut");
    tokio::time::timeout(Duration::from_secs(4), guard.lost())
        .await
        .expect("the lost signal fires within the lease TTL of the cut");
    let fired = Instant::now().min(deadline);
    assert!(cut_at.elapsed() < Duration::from_secs(4));
    let (taken_at, next) = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the other client gets the lock once the lease ran out")
        .expect("waiter task");
    let next = next.expect("the other client's lock");
    assert!(
        taken_at >= fired,
        "taken {:?} before the holder read its lock as lost",
        fired - taken_at
    );
    assert!(next.fence().expect("fence") > first);
    next.release().await.expect("release");
    drop(guard);
    for p in &proxies {
        p.set(PASS);
    }
    let again = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match holder.try_lock("k").await {
                Ok(Some(g)) => break g,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    })
    .await
    .expect("the holder locks again once its links are back");
    again.release().await.expect("release");
}
