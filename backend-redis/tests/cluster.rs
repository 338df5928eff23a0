//! Redis Cluster (`redis+cluster://`), on the three primaries with a
//! replica each that `scripts/test` starts: the whole conformance suite,
//! with and without `replicas=1`, a `CLUSTER FAILOVER` under a held lock
//! with a waiter queued, and the slot of a held lock moved to another
//! primary. Every test here runs alone (nextest group `bulk`): a
//! failover or a slot's move would fail the cases running beside it.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::cluster;
use lockwright_conformance::kit::servers::{redis_cluster_ports, redis_cluster_url};
use lockwright_conformance::kit::with_params;
use lockwright_conformance::Harness;
use lockwright_core::backend::LockBackend;
use lockwright_core::{FencingToken, LockKey, LockOptions, Locker};
use lockwright_redis::RedisBackend;

struct Cluster {
    params: &'static str,
}

impl Cluster {
    fn url(&self) -> String {
        if self.params.is_empty() {
            redis_cluster_url()
        } else {
            with_params(&redis_cluster_url(), self.params)
        }
    }
}

#[async_trait]
impl Harness for Cluster {
    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect(&self.url()).unwrap())
    }
    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect("redis+cluster://127.0.0.1:1").unwrap())
    }
    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        let mut all = 0;
        for n in cluster::nodes().await.iter().filter(|n| n.primary) {
            let url = format!("redis://127.0.0.1:{}", n.port);
            let keys = common::scan(&url, &format!("lockwright:{{={prefix}*")).await;
            all += keys.len() as u64;
        }
        Ok(all)
    }
}

mod suite {
    lockwright_conformance::conformance_tests!(super::Cluster { params: "" });
}

mod acked {
    lockwright_conformance::conformance_tests!(super::Cluster {
        params: "replicas=1"
    });
}

fn key(name: &str) -> LockKey {
    LockKey::new(format!("cluster/{name}/{}", std::process::id())).unwrap()
}

/// The slot of `key`'s keys, as the Cluster computes it.
async fn slot_of(key: &LockKey) -> u16 {
    cluster::slot(&format!("lockwright:{{={}}}:lock", key.as_str())).await
}

/// A holder and a waiter queued behind it on one key, through `change`
/// (a failover, a slot's move): the hold survives and renews, the waiter
/// keeps its place and is served once the lock is released, with a higher
/// fence.
async fn hold_through<F, Fut>(params: &str, name: &str, change: F)
where
    F: FnOnce(u16) -> Fut,
    Fut: std::future::Future<Output = (u16, u16)>,
{
    let url = with_params(&redis_cluster_url(), params);
    let ttl = Duration::from_secs(8);
    let key = key(name);
    let holder = Locker::new(RedisBackend::connect(&url).unwrap());
    let waiter = Locker::new(RedisBackend::connect(&url).unwrap());
    cluster::wait_whole().await;

    let guard = holder
        .lock_with(&key, &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let first = guard.fence().expect("Redis gives fences").0;
    let queued = {
        let key = key.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new().ttl(ttl).wait_for(cluster::PATIENCE * 2);
            let g = waiter.lock_with(&key, &opts).await;
            (g, Instant::now())
        })
    };
    let watcher = Locker::new(RedisBackend::connect(&url).unwrap());
    let start = Instant::now();
    while watcher.status(&key).await.unwrap().waiters != Some(1) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (old, new) = change(slot_of(&key).await).await;
    assert_ne!(old, new);
    assert_eq!(cluster::primary_of(slot_of(&key).await).await.port, new);
    // Through several renewals on the new primary.
    tokio::time::sleep(ttl + ttl / 2).await;
    assert!(!guard.is_lost(), "the hold did not survive");
    let status = watcher.status(&key).await.unwrap();
    assert_eq!(status.fence, Some(FencingToken(first)));
    assert_eq!(status.waiters, Some(1), "the waiter kept its place");
    assert!(
        !queued.is_finished(),
        "the waiter was served while the lock was held"
    );

    let released = Instant::now();
    guard.release().await.unwrap();
    let (served, at) = tokio::time::timeout(Duration::from_secs(20), queued)
        .await
        .expect("the waiter was served after the release")
        .unwrap();
    let served = served.expect("the waiter's lock");
    let second = served.fence().unwrap().0;
    assert!(second > first, "{second} after {first}");
    eprintln!(
        "{name}: waiter served {:?} after the release",
        at - released
    );
    served.release().await.unwrap();

    // A fresh grant on the new primary rises above both.
    let g = holder.lock(&key).await.unwrap();
    assert!(g.fence().unwrap().0 > second);
    g.release().await.unwrap();
    cluster::wait_whole().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_and_its_waiter_ride_through_a_failover() {
    hold_through("", "failover", cluster::failover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_acknowledged_by_a_replica_rides_through_a_failover() {
    hold_through("replicas=1", "failover-acked", cluster::failover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_and_its_waiter_ride_through_a_slot_move() {
    hold_through("", "slot-move", cluster::move_slot).await;
}

/// The trust-gaps issue's third defect: waiters asking for `replicas=1`
/// while `CLUSTER FAILOVER FORCE` moves the lock's slot, round after
/// round. A grant whose `WAIT` the failover cut short (`UNBLOCKED`) is
/// undone and `Unavailable`, which a wait rides out: every waiter is
/// served in the end, none ends with an error, and no two hold at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_ride_out_forced_failovers() {
    let url = with_params(&redis_cluster_url(), "replicas=1");
    let key = key("forced-failovers");
    cluster::wait_whole().await;
    let holder = Locker::new(RedisBackend::connect(&url).unwrap());
    let opts = LockOptions::new().ttl(Duration::from_secs(8));
    let guard = holder.lock_with(&key, &opts).await.unwrap();
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut waiters = Vec::new();
    for _ in 0..3 {
        let locker = Locker::new(RedisBackend::connect(&url).unwrap());
        let (key, opts, inside) = (key.clone(), opts.clone(), inside.clone());
        waiters.push(tokio::spawn(async move {
            let opts = opts.wait_for(Duration::from_secs(90));
            let g = locker.lock_with(&key, &opts).await?;
            assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
            tokio::time::sleep(Duration::from_millis(200)).await;
            inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            g.release().await
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The first failover under the held lock, the rest while the waiters
    // are being served. Apart by more than twice the nodes' timeout (2 s):
    // a primary votes for one failover of a shard at most that often, and
    // a forced failover it would not vote for never finishes.
    cluster::force_failover(slot_of(&key).await).await;
    guard.release().await.unwrap();
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        cluster::force_failover(slot_of(&key).await).await;
    }
    for w in waiters {
        let served = tokio::time::timeout(Duration::from_secs(120), w)
            .await
            .expect("a waiter was served")
            .unwrap();
        served.expect("a waiter ended with an error through forced failovers");
    }
    cluster::wait_whole().await;
}

/// A grant made after a failover by a primary whose clock is half an hour
/// behind still gets a higher fence than the grant before it: the script
/// shifts its tokens by its node's config epoch, which the failover made
/// the greatest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_a_failover_to_a_primary_whose_clock_is_behind() {
    let url = redis_cluster_url();
    let key = key("clock-behind");
    let before = Locker::new(RedisBackend::connect(&url).unwrap());
    let g = before.lock(&key).await.unwrap();
    let first = g.fence().unwrap().0;
    g.release().await.unwrap();

    cluster::failover(slot_of(&key).await).await;
    let behind = RedisBackend::connect(&url).unwrap();
    lockwright_redis::internals::skew_clock(&behind, -1800);
    let g = Locker::new(behind).lock(&key).await.unwrap();
    let second = g.fence().unwrap().0;
    g.release().await.unwrap();
    assert!(
        second > first,
        "{second} after {first}: the tokens went back"
    );
    cluster::wait_whole().await;
}

/// Every key of one lock lands in one slot, whatever the name: a name
/// that starts with `}` would make an empty tag under the single-server
/// layout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_s_keys_share_a_slot_whatever_its_name() {
    let locker = Locker::new(RedisBackend::connect(&redis_cluster_url()).unwrap());
    let other = Locker::new(RedisBackend::connect(&redis_cluster_url()).unwrap());
    for name in ["}x", "{}", "a}b{c", "}", "{"] {
        let key = LockKey::new(format!("cluster/tags/{name}/{}", std::process::id())).unwrap();
        let g = locker.lock(&key).await.unwrap();
        let waiting = other
            .lock_with(
                &key,
                &LockOptions::new().wait_for(Duration::from_millis(50)),
            )
            .await;
        assert!(waiting.is_err());
        g.release().await.unwrap();
    }
    assert_eq!(redis_cluster_ports().len(), 6);
}
