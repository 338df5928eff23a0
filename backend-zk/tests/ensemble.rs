//! Faults on a 3-node ensemble (`scripts/test` starts it, on the kit's
//! `zk_ensemble_ports`): the leader killed while locks are held, then a
//! majority down. One test, because both steps stop and start the same
//! servers.

mod common;

use std::time::{Duration, Instant};

use common::ensemble_hosts;
use locksmith_conformance::kit::fault_server::{self, Stopped};
use locksmith_conformance::kit::servers::zk_ensemble_ports;
use locksmith_core::{ErrorKind, LockOptions, Locker};
use locksmith_zk::ZkBackend;

/// Node `n`'s name for `scripts/fault-server` (`zk1` …).
fn zk(n: usize) -> String {
    format!("zk{n}")
}

/// Node `n`'s client port (1-based, as the nodes are named).
fn port(n: usize) -> u16 {
    zk_ensemble_ports()[n - 1]
}

/// What the node on `port` says it is (`leader`, `follower`, `standalone`),
/// or `None` if it does not serve.
fn mode(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"srvr").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(str::to_owned)
}

fn leader() -> Option<usize> {
    (1..=3).find(|&n| mode(port(n)).as_deref() == Some("leader"))
}

/// Waits until every node is up and one leads.
async fn ensemble_serving(within: Duration) {
    let start = Instant::now();
    while !(1..=3).all(|n| matches!(mode(port(n)).as_deref(), Some("leader" | "follower"))) {
        assert!(
            start.elapsed() < within,
            "the ensemble did not come back within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn locker() -> Locker {
    let url = format!(
        "zk://{}/locksmith-ensemble?session_timeout=8s&connect_timeout=1s&timeout=2s",
        ensemble_hosts()
    );
    Locker::new(ZkBackend::connect(&url).expect("valid URL"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_loss_keeps_locks_and_a_lost_majority_is_unavailable_until_it_returns() {
    for n in 1..=3 {
        if mode(port(n)).is_none() {
            fault_server::start(&zk(n));
        }
    }
    ensemble_serving(Duration::from_secs(60)).await;
    let opts = LockOptions::new().ttl(Duration::from_secs(30));

    // 1. The leader dies while a lock is held and another waits.
    let (a, b) = (locker(), locker());
    let held = a
        .lock_with("k", &opts)
        .await
        .expect("lock on a healthy ensemble");
    let waiting = {
        let b = b.clone();
        let opts = opts.clone().wait_for(Duration::from_secs(30));
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
    let old = leader().expect("the ensemble has a leader");
    stopped.stop(&zk(old));
    let start = Instant::now();
    while leader().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no new leader elected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Over one session timeout later, the hold has been confirmed anew.
    tokio::time::sleep(Duration::from_secs(9)).await;
    assert!(!held.is_lost(), "the hold was lost when the leader died");
    held.renew()
        .await
        .expect("the hold renews on the new leader");
    assert!(
        !waiting.is_finished(),
        "the waiter got the lock while it was held"
    );
    let first = held.fence().expect("ZooKeeper grants carry fences");
    held.release().await.expect("release on the new leader");
    let next = tokio::time::timeout(Duration::from_secs(10), waiting)
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
    stopped.start(&zk(old));
    ensemble_serving(Duration::from_secs(60)).await;

    // 2. A majority goes down while a lock is held.
    let c = locker();
    let holder = a.lock_with("m", &opts).await.expect("lock");
    let down: Vec<usize> = (1..=3).filter(|&n| Some(n) != leader()).take(2).collect();
    for &n in &down {
        stopped.stop(&zk(n));
    }
    let cut_at = Instant::now();
    let attempt = tokio::time::timeout(Duration::from_secs(15), c.try_lock("m"))
        .await
        .expect("an attempt on a lost quorum returns");
    match attempt {
        Err(e) => assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}"),
        Ok(got) => panic!(
            "a lost quorum answered {} instead of Unavailable",
            if got.is_some() {
                "acquired"
            } else {
                "contended"
            }
        ),
    }
    // The holder cannot confirm its session: the lost signal fires within
    // one session timeout (8 s) of its last confirmation.
    tokio::time::timeout(Duration::from_secs(12), holder.lost())
        .await
        .expect("the holder's lost signal fires while the quorum is gone");
    assert!(cut_at.elapsed() < Duration::from_secs(12));
    // As an application would: stop using the lock and drop its guard. The
    // release cannot reach the ensemble now; the node is deleted once it
    // can be (or goes with the session).
    drop(holder);
    for &n in &down {
        stopped.start(&zk(n));
    }
    ensemble_serving(Duration::from_secs(60)).await;
    let start = Instant::now();
    let again = loop {
        match c.try_lock("m").await {
            Ok(Some(g)) => break g,
            // The old holder's session expires one session timeout after the
            // quorum returns at the latest.
            Ok(None) | Err(_) if start.elapsed() < Duration::from_secs(40) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => panic!("no lock 40 s after the quorum returned: {other:?}"),
        }
    };
    again.release().await.expect("release after recovery");
}
