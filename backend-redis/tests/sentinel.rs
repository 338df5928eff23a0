//! Redis under Sentinel (`redis+sentinel://`), on the primary, two replicas
//! and three sentinels `scripts/test` starts: the whole conformance suite,
//! with and without `replicas=1`, and failovers under a held lock with a
//! waiter queued. Every test here runs alone (nextest group
//! `bulk`): a failover would fail the cases running beside it.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::sentinel::{self, wait_whole};
use lockwright_conformance::kit::servers::redis_sentinel_url;
use lockwright_conformance::kit::with_params;
use lockwright_conformance::Harness;
use lockwright_core::backend::LockBackend;
use std::process::Command;

use lockwright_conformance::kit::free_port;
use lockwright_conformance::kit::process::{redis_server, ServerProcess};
use lockwright_conformance::kit::proxy::{Proxy, MUTE};
use lockwright_core::{ErrorKind, LockKey, LockOptions, Locker, LostReason};
use lockwright_redis::RedisBackend;

struct Sentinel {
    params: &'static str,
}

impl Sentinel {
    fn url(&self) -> String {
        if self.params.is_empty() {
            redis_sentinel_url()
        } else {
            with_params(&redis_sentinel_url(), self.params)
        }
    }
}

#[async_trait]
impl Harness for Sentinel {
    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect(&self.url()).unwrap())
    }
    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect("redis+sentinel://127.0.0.1:1/lockwright").unwrap())
    }
    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        let primary = wait_whole().await;
        let url = format!("redis://127.0.0.1:{primary}");
        let keys = common::scan(&url, &common::names_pattern(prefix)).await;
        Ok(keys.len() as u64)
    }
}

mod suite {
    lockwright_conformance::conformance_tests!(super::Sentinel { params: "" });
}

mod acked {
    lockwright_conformance::conformance_tests!(super::Sentinel {
        params: "replicas=1"
    });
}

fn key(name: &str) -> LockKey {
    LockKey::new(format!("sentinel/{name}/{}", std::process::id())).unwrap()
}

/// A holder with a waiter queued behind it, through a `SENTINEL FAILOVER`:
/// the hold survives and renews on the new primary, and the waiter is
/// served once it is released, with a higher fence.
async fn hold_through_failover(params: &str) {
    let url = with_params(&redis_sentinel_url(), params);
    let ttl = Duration::from_secs(8);
    let key = key(&format!("failover-{}", params.len()));
    let holder = Locker::new(RedisBackend::connect(&url).unwrap());
    let waiter = Locker::new(RedisBackend::connect(&url).unwrap());
    wait_whole().await;

    let guard = holder
        .lock_with(&key, &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let first = guard.fence().expect("Redis gives fences").0;
    let queued = {
        let key = key.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new().ttl(ttl).wait_for(sentinel::PATIENCE * 2);
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

    let lost = guard.lost();
    let lost_at = tokio::spawn(async move { (lost.await, Instant::now()) });
    let failing_over = Instant::now();
    let (old, new) = sentinel::failover().await;
    assert_ne!(old, new);
    // Through several renewals on the new primary.
    tokio::time::sleep(ttl + ttl / 2).await;
    if guard.is_lost() {
        let (why, at) = lost_at.await.unwrap();
        panic!(
            "the hold did not survive the failover: {why:?} {:?} after it began",
            at - failing_over
        );
    }
    let status = watcher.status(&key).await.unwrap();
    assert_eq!(status.fence, Some(lockwright_core::FencingToken(first)));
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
    eprintln!("waiter served {:?} after the release", at - released);
    served.release().await.unwrap();
    wait_whole().await;
}

/// A grant made after a failover by a primary whose clock is half an hour
/// behind the old one's still gets a higher fence than the grant before
/// the failover: the new config epoch shifts the tokens by an hour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_across_a_failover_to_a_primary_whose_clock_is_behind() {
    let url = redis_sentinel_url();
    let key = key("clock-behind");
    let before = Locker::new(RedisBackend::connect(&url).unwrap());
    let g = before.lock(&key).await.unwrap();
    let first = g.fence().unwrap().0;
    g.release().await.unwrap();

    sentinel::failover().await;
    let behind = RedisBackend::connect(&url).unwrap();
    lockwright_redis::internals::skew_clock(&behind, -1800);
    let g = Locker::new(behind).lock(&key).await.unwrap();
    let second = g.fence().unwrap().0;
    g.release().await.unwrap();
    assert!(
        second > first,
        "{second} after {first}: the tokens went back"
    );
    // The skew took effect: the epoch's hour alone lifted it.
    assert!(
        second < first + 3_600_000_000,
        "{second} after {first}: the clock was not behind"
    );
    wait_whole().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_and_its_waiter_ride_through_a_failover() {
    hold_through_failover("").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_acknowledged_by_a_replica_rides_through_a_failover() {
    hold_through_failover("replicas=1").await;
}

/// With no replica able to acknowledge (both frozen), `replicas=1` refuses
/// the grant as `Unavailable` and leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_no_replica_acknowledged_is_undone() {
    let primary = wait_whole().await;
    let url = with_params(&redis_sentinel_url(), "replicas=1&replicas_timeout=300ms");
    let locker = Locker::new(RedisBackend::connect(&url).unwrap());
    let key = key("unacked");
    // Connected (and the scripts loaded) before the replicas freeze.
    let g = locker.lock(&key).await.unwrap();
    g.release().await.unwrap();

    let replicas: Vec<u16> = lockwright_conformance::kit::servers::redis_sentinel_data_ports()
        .into_iter()
        .filter(|p| *p != primary)
        .collect();
    let mut frozen = Vec::new();
    for p in &replicas {
        frozen.push(Frozen::new(sentinel::pid(*p).await));
    }
    let e = locker
        .try_lock(&key)
        .await
        .expect_err("a grant no replica acknowledged");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("replicas"), "{e}");
    drop(frozen);
    let left = common::scan(
        &format!("redis://127.0.0.1:{primary}"),
        &format!("*{}*", key.as_str()),
    )
    .await;
    assert!(left.is_empty(), "the refused grant left {left:?}");
    wait_whole().await;
}

/// A process stopped with SIGSTOP until dropped.
struct Frozen(u32);

impl Frozen {
    fn new(pid: u32) -> Self {
        signal(pid, "-STOP");
        Frozen(pid)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}

/// A Redis under Sentinel of the test's own, on free ports: a primary, two
/// replicas that replicate through proxies the test can mute (so a write
/// can reach the primary and no replica), and three sentinels watching
/// the master `own`. A sentinel "fixes" a replica that replicates from
/// another address than the primary's (the proxy) once `failover-timeout`
/// has passed since it met it: a minute here, longer than the test.
struct Private {
    primary: ServerProcess,
    _replicas: Vec<ServerProcess>,
    _sentinels: Vec<ServerProcess>,
    links: Vec<Proxy>,
    url: String,
    _dir: tempfile::TempDir,
}

impl Private {
    async fn start() -> Private {
        let dir = tempfile::tempdir().unwrap();
        let (primary, port) = redis_server(&[]);
        let mut links = Vec::new();
        let mut replicas = Vec::new();
        for _ in 0..2 {
            let link = Proxy::start(format!("127.0.0.1:{port}")).await;
            let link_port = link.addr.port().to_string();
            let (replica, _) = redis_server(&["--replicaof", "127.0.0.1", &link_port]);
            links.push(link);
            replicas.push(replica);
        }
        let mut sentinels = Vec::new();
        let mut addrs = Vec::new();
        for i in 0..3 {
            let sp = free_port();
            let conf = dir.path().join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {sp}\nbind 127.0.0.1\nsentinel announce-ip 127.0.0.1\n\
                     sentinel monitor own 127.0.0.1 {port} 2\n\
                     sentinel down-after-milliseconds own 1000\n\
                     sentinel failover-timeout own 60000\n"
                ),
            )
            .unwrap();
            let conf = conf.to_string_lossy().into_owned();
            sentinels.push(ServerProcess::start(
                Command::new("redis-server").args([&conf, "--sentinel"]),
                sp,
            ));
            addrs.push(format!("127.0.0.1:{sp}"));
        }
        // Ready once both replicas are online and every sentinel knows
        // them and the other sentinels.
        let start = Instant::now();
        'ready: loop {
            assert!(
                start.elapsed() < sentinel::PATIENCE,
                "the private sentinels never met"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            let info: String = sentinel::query(port, redis::cmd("INFO").arg("replication"))
                .await
                .unwrap_or_default();
            if info.matches("state=online").count() != 2 {
                continue;
            }
            for a in &addrs {
                let port = a.rsplit(':').next().unwrap().parse().unwrap();
                let fields: Vec<String> =
                    match sentinel::query(port, redis::cmd("SENTINEL").arg("MASTER").arg("own"))
                        .await
                    {
                        Ok(f) => f,
                        Err(_) => continue 'ready,
                    };
                let get = |name: &str| {
                    fields
                        .chunks(2)
                        .find(|kv| kv[0] == name)
                        .map(|kv| kv[1].clone())
                };
                if get("num-slaves").as_deref() != Some("2")
                    || get("num-other-sentinels").as_deref() != Some("2")
                {
                    continue 'ready;
                }
            }
            break;
        }
        Private {
            primary,
            _replicas: replicas,
            _sentinels: sentinels,
            links,
            url: format!("redis+sentinel://{}/own", addrs.join(",")),
            _dir: dir,
        }
    }
}

/// Without `replicas`, a grant the primary never passed on to a replica
/// dies with it: the sentinels promote a replica that never saw it, and
/// the holder hears at its next renewal there that the lock is lost (its
/// lost signal, `NotHeld`), before its deadline and before anyone else can
/// hold it. The crate docs say so. With `replicas=1` the same grant is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_lost_in_a_failover_fires_the_holders_lost_signal() {
    let setup = Private::start().await;
    let ttl = Duration::from_secs(20);
    let key = key("lost-grant");
    let holder = Locker::new(RedisBackend::connect(&setup.url).unwrap());
    holder.lock(&key).await.unwrap().release().await.unwrap();
    let acked = Locker::new(
        RedisBackend::connect(&with_params(
            &setup.url,
            "replicas=1&replicas_timeout=300ms",
        ))
        .unwrap(),
    );
    acked.lock(&key).await.unwrap().release().await.unwrap();

    for link in &setup.links {
        link.set(MUTE);
    }
    let e = acked.try_lock(&key).await.expect_err("no replica has it");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let guard = holder
        .lock_with(&key, &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let first = guard.fence().unwrap().0;
    let deadline = guard.deadline().unwrap();
    let lost = guard.lost();
    let lost_at = tokio::spawn(async move { (lost.await, Instant::now()) });
    let killed = Instant::now();
    let mut primary = setup.primary;
    primary.kill();

    let (why, at) = tokio::time::timeout(sentinel::PATIENCE, lost_at)
        .await
        .expect("the holder heard its lock was lost")
        .unwrap();
    eprintln!("lost ({why:?}) {:?} after the primary died", at - killed);
    assert_eq!(why, LostReason::NotHeld);
    assert!(
        at < deadline,
        "heard at the next renewal, not at the deadline"
    );
    // Now another may take it, with a higher fence (the new epoch's).
    let other = Locker::new(RedisBackend::connect(&setup.url).unwrap());
    let g = other.lock(&key).await.unwrap();
    assert!(g.fence().unwrap().0 > first);
    g.release().await.unwrap();
}
