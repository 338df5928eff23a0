//! Faults on the 3-member cluster (`scripts/test` starts it, on the kit's
//! `etcd_cluster_ports`): the leader killed while a lock is held and
//! another client waits, then a majority down (the kit's scenario, which
//! every 3-member store runs); and a holder cut off from every
//! member at a TCP proxy. The tests of this file run one at a time
//! (`.config/nextest.toml`), as the first stops members the second uses.

mod common;

use std::time::{Duration, Instant};

use common::raw_client;
use lockwright_conformance::kit::fault_server::Stopped;
use lockwright_conformance::kit::members::{self, ThreeMembers};
use lockwright_conformance::kit::proxy::{Proxy, CUT, PASS};
use lockwright_conformance::kit::servers::{etcd_cluster_ports, loopback};
use lockwright_core::{LockOptions, Locker};
use lockwright_etcd::EtcdBackend;

/// Member `n`'s name for `scripts/fault-server` (`etcd1` …).
fn member(n: usize) -> String {
    format!("etcd{n}")
}

fn port(n: usize) -> u16 {
    etcd_cluster_ports()[n - 1]
}

/// Whether member `n` answers, and whether it leads.
async fn role(n: usize) -> Option<bool> {
    let opts = lockwright_etcd::internals::etcd_client::ConnectOptions::new()
        .with_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(1));
    let ep = format!("127.0.0.1:{}", port(n));
    let connect = lockwright_etcd::internals::etcd_client::Client::connect([ep], Some(opts));
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

/// The cluster, for the kit's 3-member scenario.
struct Cluster;

#[async_trait::async_trait]
impl ThreeMembers for Cluster {
    fn group(&self) -> &'static str {
        "cluster"
    }

    fn member(&self, n: usize) -> String {
        member(n)
    }

    async fn role(&self, n: usize) -> Option<bool> {
        role(n).await
    }

    fn locker(&self) -> Locker {
        let url = format!(
            "etcd://{}/lockwright-cluster?lease_ttl=8s&connect_timeout=1s&timeout=2s",
            loopback(&etcd_cluster_ports()).join(",")
        );
        Locker::new(EtcdBackend::connect(&url).expect("valid URL"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_loss_keeps_locks_and_a_lost_majority_is_unavailable_until_it_returns() {
    members::leader_then_majority_lost(&Cluster).await;
    // Nothing of ours is left in the cluster.
    let mut raw = raw_client(&loopback(&etcd_cluster_ports()).join(",")).await;
    let opts = lockwright_etcd::internals::etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    let left = raw
        .get("/lockwright-cluster/", Some(opts))
        .await
        .unwrap()
        .count();
    assert_eq!(left, 0, "keys left under /lockwright-cluster/");
}

/// A holder cut off from every member at a TCP proxy: its lost signal
/// fires within one lease TTL, and no other client takes the lock before
/// the holder reads it as lost; the next grant's fence is higher, and the
/// holder locks again once its links are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_cut_off_is_lost_before_another_takes_the_lock() {
    members::all_serving(&Cluster).await;
    let mut proxies = Vec::new();
    for n in 1..=3 {
        proxies.push(Proxy::start(format!("127.0.0.1:{}", port(n))).await);
    }
    let through: Vec<String> = proxies.iter().map(|p| p.addr.to_string()).collect();
    let params = "lease_ttl=2s&connect_timeout=500ms&timeout=500ms";
    let holder = Locker::new(
        EtcdBackend::connect(&format!(
            "etcd://{}/lockwright-cut?{params}",
            through.join(",")
        ))
        .expect("valid URL"),
    );
    let other = Locker::new(
        EtcdBackend::connect(&format!(
            "etcd://{}/lockwright-cut?lease_ttl=2s",
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

/// The trust-gaps issue's second defect: the cluster's leader killed under
/// a held lock, round after round, at the default lease (`lease_ttl` 10 s):
/// an election (1 to 2 s with etcd's default election timeout) costs the
/// holder nothing. Its hold is never read as lost, and it renews under
/// each new leader. `LOCKWRIGHT_TEST_LEADER_ROUNDS` runs more rounds than
/// the default 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_deaths_cost_a_holder_nothing_at_the_default_lease() {
    members::all_serving(&Cluster).await;
    let rounds: usize = std::env::var("LOCKWRIGHT_TEST_LEADER_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let url = format!(
        "etcd://{}/lockwright-elections?connect_timeout=1s&timeout=2s",
        loopback(&etcd_cluster_ports()).join(",")
    );
    let locker = Locker::new(EtcdBackend::connect(&url).expect("valid URL"));
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = locker.lock_with("k", &opts).await.expect("lock");
    for round in 1..=rounds {
        let mut old = None;
        for n in 1..=3 {
            if role(n).await == Some(true) {
                old = Some(n);
            }
        }
        let old = old.expect("a leader");
        let mut stopped = Stopped::new();
        stopped.stop(&member(old));
        let killed = Instant::now();
        loop {
            let mut led = false;
            for n in (1..=3).filter(|&n| n != old) {
                led |= role(n).await == Some(true);
            }
            if led {
                break;
            }
            assert!(killed.elapsed() < Duration::from_secs(30), "no new leader");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        eprintln!(
            "round {round}: a new leader {:?} after the kill",
            killed.elapsed()
        );
        // Two renewal periods (a third of the lease each) under the new leader.
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert!(
            !guard.is_lost(),
            "round {round}: the hold was lost when the leader died"
        );
        guard
            .renew()
            .await
            .unwrap_or_else(|e| panic!("round {round}: no renewal under the new leader: {e}"));
        stopped.start(&member(old));
        members::all_serving(&Cluster).await;
    }
    guard.release().await.expect("release");
}
