//! A holder's link to ZooKeeper cut or silenced at a TCP proxy between
//! client and server: the lost signal fires before the server could end the
//! session, the client does not hammer the server while cut off, an ended
//! session's node is never taken for ours, and a create whose reply was
//! lost leaves no node behind to block the queue.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{raw_client, server_hosts};
use lockwright_conformance::kit::proxy::{Proxy, CUT, MUTE, PASS};
use lockwright_core::{ErrorKind, LockOptions, Locker};
use lockwright_zk::internals::zookeeper_client as zk;
use lockwright_zk::ZkBackend;

fn locker(hosts: &str, root: &str, params: &str) -> Locker {
    Locker::new(ZkBackend::connect(&format!("zk://{hosts}{root}?{params}")).expect("valid URL"))
}

fn root(name: &str) -> String {
    format!("/lockwright-partition-{name}-{}", std::process::id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_off_holder_is_lost_before_anyone_else_can_take_the_lock() {
    let hosts = server_hosts();
    let proxy = Proxy::start(hosts.clone()).await;
    let root = root("cut");
    let session = Duration::from_secs(2);
    let holder = locker(
        &proxy.addr.to_string(),
        &root,
        "session_timeout=2s&connect_timeout=500ms&timeout=500ms",
    );
    let other = locker(&hosts, &root, "session_timeout=2s");
    let ttl = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = holder.lock_with("k", &ttl).await.expect("lock");
    let first = guard.fence().expect("fence");

    proxy.set(CUT);
    let cut_at = Instant::now();
    let deadline = guard.deadline().expect("a live hold has a deadline");
    let accepted_before = proxy.accepted.load(Ordering::SeqCst);
    let taker = tokio::spawn(async move {
        loop {
            if let Ok(Some(g)) = other.try_lock_with("k", &ttl).await {
                return (Instant::now(), g, other);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let reason = tokio::time::timeout(session * 3, guard.lost())
        .await
        .expect("the lost signal fires while the holder is cut off");
    let fired_at = Instant::now();
    let (taken_at, taken, other) = tokio::time::timeout(session * 5, taker)
        .await
        .expect("the server ends the cut-off session and the lock is taken")
        .unwrap();
    assert!(
        fired_at <= taken_at,
        "another client took the lock {:?} before the holder's lost signal ({reason:?})",
        fired_at - taken_at
    );
    assert!(
        fired_at <= deadline + Duration::from_millis(250),
        "lost fired {:?} after its deadline",
        fired_at - deadline
    );
    assert!(
        deadline <= cut_at + session,
        "the deadline is past the session timeout"
    );
    // Cut off for seconds, the client reconnected with backoff, not in a loop.
    let attempts = proxy.accepted.load(Ordering::SeqCst) - accepted_before;
    let cut_for = cut_at.elapsed();
    assert!(
        attempts <= 5 + 10 * cut_for.as_secs() as usize,
        "{attempts} connection attempts in {cut_for:?} while cut off"
    );
    let second = taken.fence().expect("fence");
    assert!(second > first, "fences {first:?} then {second:?}");

    // Back on the network, its session ended: nothing of the old session is
    // taken for a hold, even by the same owner.
    proxy.set(PASS);
    let again = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match holder.try_lock("k").await {
                Err(e) if e.kind() == ErrorKind::Unavailable => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                other => return other,
            }
        }
    })
    .await
    .expect("the holder reaches the server again");
    assert!(
        again.expect("try_lock").is_none(),
        "the old holder was granted a lock someone else holds"
    );
    taken.release().await.expect("release");
    let third = holder.try_lock("k").await.expect("try_lock").expect("free");
    assert!(third.fence().expect("fence") > second);
    third.release().await.unwrap();
    drop(other);
}

/// The connection drops (EOF) after the create was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_whose_reply_is_lost_leaves_no_node_behind() {
    orphan_case("drop", false).await;
}

/// The server goes silent after the create was sent, until the client
/// gives the connection up itself (an I/O error, not a clean loss).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_create_answered_into_silence_leaves_no_node_behind() {
    orphan_case("silence", true).await;
}

async fn orphan_case(name: &str, silence: bool) {
    let hosts = server_hosts();
    let proxy = Proxy::start(hosts.clone()).await;
    let root = root(name);
    let client = locker(
        &proxy.addr.to_string(),
        &root,
        "session_timeout=6s&connect_timeout=500ms&timeout=300ms",
    );
    // A first lock makes the session and the directory.
    client
        .try_lock("k")
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();

    // The create reaches the server; its reply does not come back.
    proxy.set(MUTE);
    let e = client.try_lock("k").await.expect_err("no reply");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let raw = raw_client(&hosts).await;
    let dir = format!("{root}/k");
    let orphans = raw.list_children(&dir).await.expect("list");
    assert_eq!(orphans.len(), 1, "the server made the node: {orphans:?}");
    if silence {
        // Pings still reach the server (the session lives); no reply comes
        // back, so the client declares the connection dead by itself.
        tokio::time::sleep(Duration::from_secs(5)).await;
    } else {
        proxy.set(CUT);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The client reconnects to the same session.
    proxy.set(PASS);
    // The node is found by its UUID and deleted, within a few seconds: not
    // when the session (which lives on) ends.
    let start = Instant::now();
    loop {
        match raw.list_children(&dir).await {
            Ok(c) if c.is_empty() => break,
            Err(zk::Error::NoNode) => break,
            Ok(c) => assert!(
                start.elapsed() < Duration::from_secs(4),
                "the orphan node {c:?} is still there"
            ),
            Err(e) => panic!("list: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let next = locker(&hosts, &root, "session_timeout=6s");
    let g = next.try_lock("k").await.unwrap();
    assert!(g.is_some(), "the lock is free once the orphan is gone");
    drop(client);
}
