//! A Redis server that dies while a lock is held, and comes back empty (no
//! persistence): clients see Unavailable, the holder's lost signal fires by
//! its deadline, work resumes, and fencing tokens keep rising. And a
//! server that drops every pub/sub connection while waiters are queued.

use std::process::Command;
use std::time::{Duration, Instant};

use lockwright_conformance::kit::free_port;
use lockwright_conformance::kit::process::ServerProcess;
use lockwright_core::backend::{Acquire, LockBackend, LockBackendExt};
use lockwright_core::{ErrorKind, LockKey, LockOptions, Locker, OwnerToken};
use lockwright_redis::RedisBackend;

/// A server of the test's own on `port`, without persistence: what a
/// crash takes, a restart does not bring back.
fn start_on(port: u16) -> ServerProcess {
    ServerProcess::start(
        Command::new("redis-server").args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]),
        port,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_loses_nothing_that_matters() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}?timeout=300ms&connect_timeout=300ms");
    let server = start_on(port);
    let key = LockKey::new("restart/k").unwrap();
    let a = Locker::new(RedisBackend::connect(&url).unwrap());
    let b = RedisBackend::connect(&url).unwrap();

    let ttl = Duration::from_secs(2);
    let guard = a
        .lock_with(&key, &LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let before = guard.fence().expect("Redis gives fences").0;
    let deadline = guard.deadline().unwrap();
    let lost = guard.lost();
    let lost_at = tokio::spawn(async move { (lost.await, Instant::now()) });

    drop(server);
    let e = b
        .try_lock(&key, &OwnerToken::generate(), ttl)
        .await
        .expect_err("acquire on a dead server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");

    let (_, fired) = tokio::time::timeout(ttl * 2, lost_at)
        .await
        .expect("lost fired")
        .unwrap();
    assert!(
        fired <= deadline + Duration::from_millis(300),
        "lost fired {:?} late",
        fired - deadline
    );

    let _server = start_on(port);
    // The server came back empty; clients reconnect by themselves.
    let start = Instant::now();
    let grant = loop {
        match b.try_lock(&key, &OwnerToken::generate(), ttl).await {
            Ok(Acquire::Acquired(g)) => break g,
            other => {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "no recovery: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let after = grant.fence.expect("fence").0;
    assert!(
        after > before,
        "fencing token went back after the restart: {before} then {after}"
    );
}

/// Every pub/sub connection is killed while two waiters are queued, so the
/// grant message of the release is lost: the first waiter still gets the
/// lock on its next refresh, its hub reconnects, and the second follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_waiters_survive_a_killed_hub() {
    let hub_port = free_port();
    let url = format!("redis://127.0.0.1:{hub_port}?waiter_refresh=100ms");
    let _server = start_on(hub_port);
    let key = LockKey::new("restart/hub").unwrap();
    let ttl = Duration::from_secs(60);
    let a = Locker::new(RedisBackend::connect(&url).unwrap());
    let guard = a
        .lock_with(&key, &LockOptions::new().ttl(ttl))
        .await
        .unwrap();

    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for id in 0..2 {
        let l = Locker::new(RedisBackend::connect(&url).unwrap());
        let (key, order) = (key.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(ttl)
                .wait_for(Duration::from_secs(10));
            let g = l.lock_with(&key, &opts).await.unwrap();
            order.lock().unwrap().push((id, Instant::now()));
            tokio::time::sleep(Duration::from_millis(50)).await;
            g.release().await.unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let admin = redis::Client::open(format!("redis://127.0.0.1:{hub_port}")).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    // The holder's hub too: it listened while it might have had to wait.
    assert_eq!(killed, 3, "each locker's hub was connected");

    let released = Instant::now();
    guard.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    let ids: Vec<i32> = order.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [0, 1], "served in arrival order");
    let lag = order[0].1 - released;
    assert!(lag < Duration::from_secs(2), "first waiter took {lag:?}");
}

/// The ids of the server's pub/sub clients (the backends' hubs).
async fn pubsub_clients(mut admin: redis::aio::MultiplexedConnection) -> Vec<String> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    list.lines()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}

/// A backend that is dropped takes its pub/sub connection with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_backend_closes_its_hub() {
    let hub_port = free_port();
    let url = format!("redis://127.0.0.1:{hub_port}");
    let _server = start_on(hub_port);
    let admin = redis::Client::open(url.as_str()).unwrap();
    let admin = admin.get_multiplexed_async_connection().await.unwrap();
    let hubs = || {
        let admin = admin.clone();
        async move { pubsub_clients(admin).await.len() }
    };
    let key = LockKey::new("restart/drop").unwrap();
    for _ in 0..3 {
        let b = RedisBackend::connect(&url).unwrap();
        let _watch = b.watch(&key, &OwnerToken::generate()).await.unwrap();
        assert!(hubs().await >= 1, "the backend's hub is connected");
    }
    let start = Instant::now();
    while hubs().await > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "dropped backends left {} pub/sub connections open",
            hubs().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The private server (`redis_fault`) stopped for a few seconds under a
/// waiter with a long wait: it gets the lock after the restart; a short
/// wait ends with `Unavailable`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_rides_out_a_restart() {
    let url = format!(
        "{}?timeout=500ms&connect_timeout=500ms",
        lockwright_conformance::kit::servers::redis_fault_url()
    );
    lockwright_conformance::kit::outage::waiter_rides_out_a_stop(
        "redis_fault",
        Duration::from_secs(3),
        || Locker::new(RedisBackend::connect(&url).unwrap()),
    )
    .await;
}

/// A holder that never waited keeps a pub/sub connection to its server
/// from its first grant on, and makes it again when the server drops it:
/// a server that goes away (and may come back empty) is heard at once, and
/// every lease re-verified when the connection is back, rather than at the
/// next renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_keeps_its_hub_and_makes_it_again() {
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let _server = start_on(port);
    let admin = redis::Client::open(url.as_str()).unwrap();
    let admin = admin.get_multiplexed_async_connection().await.unwrap();
    let hubs = || pubsub_clients(admin.clone());
    let a = Locker::new(RedisBackend::connect(&url).unwrap());
    let key = LockKey::new("restart/kept-hub").unwrap();
    let guard = a.try_lock(&key).await.unwrap().expect("nobody holds it");
    let start = Instant::now();
    let first = loop {
        if let [id] = &hubs().await[..] {
            break id.clone();
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "no hub after the grant"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin.clone())
        .await
        .unwrap();
    assert_eq!(killed, 1);
    let start = Instant::now();
    loop {
        if matches!(&hubs().await[..], [id] if *id != first) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the hub was not made again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !guard.is_lost(),
        "the lock is still held: re-verified, not dropped"
    );
    guard.release().await.unwrap();
}
