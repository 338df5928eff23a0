//! What the peers' memcached locks get wrong, done right: a stale holder's
//! release and renewal change nothing; a quorum holds exactly when a
//! majority of servers is free, leaving nothing of ours anywhere; a server
//! that stops is `Unavailable` and its holder's lost signal fires, and after
//! a restart (which forgets everything) locks work again.

mod common;

use std::time::{Duration, Instant};

use common::{item_keys, quorum_servers, server, OwnServer};
use lockwright_conformance::kit::servers::memcached_fault_port;
use lockwright_conformance::kit::{fault_server, free_port, unique_prefix};
use lockwright_conformance::quorum::{
    acquire_succeeds_iff_a_majority_is_free, late_answers_do_not_count,
};
use lockwright_core::backend::{Acquire, LockBackend, LockBackendExt, Quorum, Release, Renew};
use lockwright_core::{ErrorKind, LockKey, LockOptions, Locker, OwnerToken};
use lockwright_memcached::MemcachedBackend;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The item's value and CAS, read raw (`mg <key> v c`); `None` on a miss.
async fn raw_item(server: &str, key: &str) -> Option<(String, u64)> {
    let mut s = TcpStream::connect(server).await.expect("memcached");
    s.write_all(format!("mg {key} v c\r\n").as_bytes())
        .await
        .unwrap();
    let mut r = BufReader::new(s);
    let mut head = String::new();
    r.read_line(&mut head).await.unwrap();
    if head.starts_with("EN") {
        return None;
    }
    // VA <len> c<cas>
    let parts: Vec<&str> = head.split_whitespace().collect();
    assert_eq!(parts[0], "VA", "{head}");
    let len: usize = parts[1].parse().unwrap();
    let cas: u64 = parts
        .iter()
        .find_map(|p| p.strip_prefix('c'))
        .and_then(|c| c.parse().ok())
        .expect("a CAS");
    let mut value = vec![0u8; len + 2];
    r.read_exact(&mut value).await.unwrap();
    value.truncate(len);
    Some((String::from_utf8(value).unwrap(), cas))
}

fn acquired(a: &Acquire) -> bool {
    matches!(a, Acquire::Acquired(_))
}

/// Release with a plain `delete` and renew with `touch` (ShedLock,
/// sherlock) let a holder whose lease ran out delete or extend the next
/// holder's lock. Here both answer `NotHeld` and the new holder's item is
/// untouched: the same value, the same CAS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_holder_cannot_release_or_renew_the_next_holders_lock() {
    let server = server();
    let prefix = unique_prefix();
    let url = format!("memcache://{server}?prefix={prefix}");
    let (a, b) = (
        MemcachedBackend::connect(&url).unwrap(),
        MemcachedBackend::connect(&url).unwrap(),
    );
    let key = LockKey::new("stale").unwrap();
    let (old, new) = (OwnerToken::generate(), OwnerToken::generate());
    let ttl = Duration::from_secs(2);
    assert!(acquired(&a.try_lock(&key, &old, ttl).await.unwrap()));
    // A 2 s lease is stored for 4 s (memcached may end it two seconds early).
    tokio::time::sleep(Duration::from_millis(4300)).await;
    assert!(acquired(
        &b.try_lock(&key, &new, Duration::from_secs(30))
            .await
            .unwrap()
    ));
    let item = format!("{prefix}stale");
    let before = raw_item(&server, &item)
        .await
        .expect("the new holder's item");
    assert!(before.0.starts_with(new.as_str()), "{before:?}");
    assert_eq!(a.unlock(&key, &old).await.unwrap(), Release::NotHeld);
    assert_eq!(
        a.renew_lock(&key, &old, Duration::from_secs(60))
            .await
            .unwrap(),
        Renew::NotHeld
    );
    let after = raw_item(&server, &item).await.expect("still there");
    assert_eq!(
        before, after,
        "the stale holder changed the new holder's item"
    );
    assert_eq!(b.unlock(&key, &new).await.unwrap(), Release::Freed);
    assert_eq!(raw_item(&server, &item).await, None);
}

/// For every subset of the 3 servers down or held by another owner,
/// acquire succeeds exactly when a quorum (2) is free, and nothing of ours
/// is left on any server afterwards: the test Redlock runs too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_acquire_succeeds_iff_a_majority_is_free() {
    let servers = quorum_servers();
    assert_eq!(servers.len(), 3, "the test wants three servers");
    let prefix = unique_prefix();
    let direct: Vec<MemcachedBackend> = servers
        .iter()
        .map(|s| MemcachedBackend::connect(&format!("memcache://{s}?prefix={prefix}")).unwrap())
        .collect();
    acquire_succeeds_iff_a_majority_is_free(
        &direct,
        |down| {
            let mut hosts = servers.clone();
            for &i in down {
                hosts[i] = format!("127.0.0.1:{}", i + 1);
            }
            MemcachedBackend::connect(&format!(
                "memcache://{}?prefix={prefix}&timeout=250ms&connect_timeout=250ms",
                hosts.join(",")
            ))
            .unwrap()
        },
        "q",
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    // And no item of this run left on any server.
    for s in &servers {
        let left: Vec<String> = item_keys(s)
            .await
            .unwrap()
            .into_iter()
            .filter(|k| k.starts_with(&prefix))
            .collect();
        assert!(left.is_empty(), "{s} kept {left:?}");
    }
}

/// The shared late-answer test over the 3 servers, each a one-server
/// client (which is the node the memcached quorum is made of) behind a
/// gate that holds one request back past the TTL: such a grant or renewal
/// does not count, and the late grants are undone on every server.
/// `MemcachedBackend` takes no nodes from outside, so the quorum is the
/// same generic `Quorum` it builds, built here (its TTL floor, which this
/// test never reaches, aside).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_grants_and_renewals_that_come_back_after_the_ttl_do_not_count() {
    let prefix = unique_prefix();
    let nodes: Vec<std::sync::Arc<dyn LockBackend>> = quorum_servers()
        .iter()
        .map(|s| -> std::sync::Arc<dyn LockBackend> {
            std::sync::Arc::new(
                MemcachedBackend::connect(&format!("memcache://{s}?prefix={prefix}")).unwrap(),
            )
        })
        .collect();
    late_answers_do_not_count(
        nodes,
        |nodes| Quorum::new("memcached", nodes, Duration::from_millis(400)).unwrap(),
        "late",
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_server_is_unavailable_and_a_restarted_one_serves_again() {
    let url = format!(
        "memcache://127.0.0.1:{}?prefix={}&timeout=300ms&connect_timeout=300ms",
        memcached_fault_port(),
        unique_prefix()
    );
    fault_server::start("mc_fault");
    let holder = Locker::new(MemcachedBackend::connect(&url).unwrap());
    let other = Locker::new(MemcachedBackend::connect(&url).unwrap());
    let ttl = Duration::from_secs(3);
    let guard = holder
        .lock_with("outage", &LockOptions::new().ttl(ttl))
        .await
        .expect("lock");
    let mut down = fault_server::Stopped::new();
    down.stop("mc_fault");
    let stopped = Instant::now();
    let e = other
        .try_lock("outage")
        .await
        .expect_err("a stopped server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let deadline = guard.deadline().expect("a live lease");
    tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("the holder's lost signal fires while the server is down");
    assert!(
        Instant::now() <= deadline + Duration::from_millis(250),
        "lost fired after its deadline"
    );
    assert!(stopped.elapsed() <= ttl + Duration::from_millis(250));
    // memcached restarts empty: the lock is free, and new locks work.
    down.start("mc_fault");
    let g = other
        .try_lock("outage")
        .await
        .expect("the restarted server answers")
        .expect("a restarted server forgot the old lock");
    g.release().await.expect("release");
}

/// Eight clients racing for one key, as waiting `Locker`s: every attempt
/// is a grant or "contended", never an error (a lock released between our
/// add and our read is someone else's again a moment later, not a store
/// failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_clients_see_grants_or_contention_never_errors() {
    let url = format!("memcache://{}?prefix={}", server(), unique_prefix());
    let until = Instant::now() + Duration::from_secs(4);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let l = Locker::new(MemcachedBackend::connect(&url).unwrap());
            tokio::spawn(async move {
                let mut grants = 0u32;
                let opts = LockOptions::new().ttl(Duration::from_secs(10));
                while Instant::now() < until {
                    match l.lock_with("race", &opts).await {
                        Ok(g) => {
                            grants += 1;
                            g.release().await.expect("release");
                        }
                        Err(e) => panic!("an acquire under contention failed: {e}"),
                    }
                }
                grants
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert!(total > 0, "nobody got the lock");
}

/// Servers restarted one at a time, never two down at once: the holder's
/// renewals put its vote back on a restarted (empty) server, so a second
/// restart does not leave a majority free for another owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_the_quorum_keeps_the_lock() {
    let mut servers: Vec<OwnServer> = (0..3).map(|_| OwnServer::start(free_port(), 16)).collect();
    let url = format!(
        "memcache://{}?prefix={}&timeout=250ms",
        servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect::<Vec<_>>()
            .join(","),
        unique_prefix()
    );
    let holder = Locker::new(MemcachedBackend::connect(&url).unwrap());
    let other = Locker::new(MemcachedBackend::connect(&url).unwrap());
    // Renewed every second.
    let guard = holder
        .lock_with("rolling", &LockOptions::new().ttl(Duration::from_secs(3)))
        .await
        .expect("lock");
    servers[2].restart();
    // A renewal (within a second) puts the vote back on the empty server.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    servers[1].restart();
    let stolen = other.try_lock("rolling").await.expect("a quorum answers");
    assert!(
        stolen.is_none(),
        "another owner took the lock while its holder still held it"
    );
    assert!(
        !guard.is_lost(),
        "the holder lost a lock a majority still held"
    );
    guard.release().await.expect("release");
}

/// A restarted server counts CAS values from the start again, and may give
/// the next holder's item the very number the old holder remembers from
/// its own write. The old holder's renewal and release, which skip the
/// read when they know their item's version, must not take that number
/// for theirs: `NotHeld`, and the new holder's item untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cas_remembered_from_before_a_restart_changes_nothing() {
    let mut own = OwnServer::start(free_port(), 64);
    let url = format!("memcache://{}?prefix=rs:", own.addr());
    let ttl = Duration::from_secs(30);
    let (renewed, released) = (LockKey::new("k1").unwrap(), LockKey::new("k2").unwrap());
    let (old, new) = (OwnerToken::generate(), OwnerToken::generate());
    let a = MemcachedBackend::connect(&url).unwrap();
    for k in [&renewed, &released] {
        assert!(acquired(&a.try_lock(k, &old, ttl).await.unwrap()));
    }
    let before = [
        raw_item(&own.addr(), "rs:k1").await.unwrap().1,
        raw_item(&own.addr(), "rs:k2").await.unwrap().1,
    ];
    own.restart();
    let b = MemcachedBackend::connect(&url).unwrap();
    for k in [&renewed, &released] {
        assert!(acquired(&b.try_lock(k, &new, ttl).await.unwrap()));
    }
    let after = [
        raw_item(&own.addr(), "rs:k1").await.unwrap(),
        raw_item(&own.addr(), "rs:k2").await.unwrap(),
    ];
    assert_eq!(
        before,
        [after[0].1, after[1].1],
        "the restarted server gave other CAS values: this test shows nothing"
    );
    assert_eq!(
        a.renew_lock(&renewed, &old, ttl).await.unwrap(),
        Renew::NotHeld
    );
    assert_eq!(a.unlock(&released, &old).await.unwrap(), Release::NotHeld);
    let now = [
        raw_item(&own.addr(), "rs:k1").await.unwrap(),
        raw_item(&own.addr(), "rs:k2").await.unwrap(),
    ];
    assert_eq!(now, after, "the old holder changed the new holder's items");
}
