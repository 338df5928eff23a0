//! Our lock and Go's `concurrency.Mutex`, as the real `etcdctl lock`
//! (Debian's etcd client) takes it, exclude each other both ways: a lock
//! `name` on `etcd://…/<root>` is `etcdctl lock <root>/name`.

mod common;

use std::time::{Duration, Instant};

use common::{raw_client, server_hosts};
use lockwright_conformance::kit::etcdctl::EtcdctlLock;
use lockwright_core::{LockOptions, Locker};
use lockwright_etcd::EtcdBackend;

fn root() -> String {
    format!("/lockwright-etcdctl-{}", std::process::id())
}

fn locker(root: &str) -> Locker {
    let url = format!("etcd://{}{root}?lease_ttl=3s", server_hosts());
    Locker::new(EtcdBackend::connect(&url).unwrap())
}

/// `etcdctl lock <name>` on a 3 s session.
fn etcdctl_lock(name: &str) -> EtcdctlLock {
    EtcdctlLock::start(&server_hosts(), name, 3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_waits_for_our_lock() {
    let root = root();
    let ours = locker(&root);
    let g = ours.lock("orders").await.unwrap();
    let theirs = etcdctl_lock(&format!("{root}/orders"));
    let early = tokio::task::block_in_place(|| theirs.held(Duration::from_millis(1500)));
    assert!(early.is_none(), "etcdctl held beside us: {early:?}");
    g.release().await.unwrap();
    let key = tokio::task::block_in_place(|| theirs.held(Duration::from_secs(10)))
        .expect("etcdctl holds once we released");
    assert!(key.starts_with(&format!("{root}/orders/")), "{key}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_wait_for_etcdctl_s_lock() {
    let root = root();
    let theirs = etcdctl_lock(&format!("{root}/jobs"));
    let key = tokio::task::block_in_place(|| theirs.held(Duration::from_secs(10)))
        .expect("etcdctl holds");
    let ours = locker(&root);
    assert!(
        ours.try_lock("jobs").await.unwrap().is_none(),
        "we held beside etcdctl"
    );
    // Its key's create revision is the holder's fence, as ours would be.
    let mut raw = raw_client(&server_hosts()).await;
    let rev = raw.get(key.as_str(), None).await.unwrap().kvs()[0].create_revision();
    let s = ours.status("jobs").await.unwrap();
    assert_eq!(s.fence.map(|f| f.0), u64::try_from(rev).ok(), "{s:?}");
    // And its lease's time left, as the cluster counts it (etcdctl's 3 s).
    assert!(
        s.remaining.is_some_and(|r| r <= Duration::from_secs(3)),
        "{s:?}"
    );

    // Killed, its lease runs out within its 3 s TTL, and we hold.
    drop(theirs);
    let start = Instant::now();
    let opts = LockOptions::new().wait_for(Duration::from_secs(20));
    let g = ours.lock_with("jobs", &opts).await.unwrap();
    assert!(g.fence().map(|f| f.0) > u64::try_from(rev).ok());
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    g.release().await.unwrap();
}

/// One line for both: with our lock held, `etcdctl` queues, then a waiter
/// of ours; the release serves `etcdctl` first, and ours only once it is
/// gone, woken by that delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_and_our_waiters_share_one_line() {
    let root = root();
    let (ours, later) = (locker(&root), locker(&root));
    let g = ours.lock("line").await.unwrap();
    let theirs = etcdctl_lock(&format!("{root}/line"));
    // etcdctl's key is in line before our waiter queues.
    let mut raw = raw_client(&server_hosts()).await;
    let prefix = format!("{root}/line/");
    let opts = lockwright_etcd::internals::etcd_client::GetOptions::new()
        .with_prefix()
        .with_count_only();
    let start = Instant::now();
    while raw
        .get(prefix.as_str(), Some(opts.clone()))
        .await
        .unwrap()
        .count()
        < 2
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "etcdctl never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let waiting = tokio::spawn(async move {
        let opts = LockOptions::new().wait_for(Duration::from_secs(30));
        later.lock_with("line", &opts).await
    });
    let start = Instant::now();
    while ours.status("line").await.unwrap().waiters != Some(2) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "our waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    g.release().await.unwrap();
    let key = tokio::task::block_in_place(|| theirs.held(Duration::from_secs(10)))
        .expect("etcdctl, first in line, holds");
    assert!(key.starts_with(&prefix), "{key}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "our waiter passed etcdctl in line");
    drop(theirs);
    let next = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("ours holds once etcdctl's lease is gone")
        .unwrap()
        .unwrap();
    next.release().await.unwrap();
}

/// `etcdctl lock` (Go's `Mutex`) is a writer of our read-write lock on
/// the same name: it waits for our readers, and while it holds our
/// readers wait, and a semaphore on the name is refused, typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_is_a_writer_of_our_read_write_lock() {
    let root = root();
    let (a, b) = (locker(&root), locker(&root));
    let no_wait = LockOptions::new().no_wait();
    let (ra, rb) = (
        a.rwlock("catalogue").unwrap(),
        b.rwlock("catalogue").unwrap(),
    );
    let r1 = ra.read_with(&no_wait).await.unwrap();
    let r2 = rb.read_with(&no_wait).await.unwrap();
    let theirs = etcdctl_lock(&format!("{root}/catalogue"));
    let early = tokio::task::block_in_place(|| theirs.held(Duration::from_millis(1500)));
    assert!(
        early.is_none(),
        "etcdctl held beside our readers: {early:?}"
    );
    // It waits in line: a reader that comes after it waits too.
    assert!(
        ra.try_read_with(&no_wait).await.unwrap().is_none(),
        "a reader passed a waiting etcdctl"
    );
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    tokio::task::block_in_place(|| theirs.held(Duration::from_secs(10)))
        .expect("etcdctl holds once our readers left");
    assert!(
        rb.try_read_with(&no_wait).await.unwrap().is_none(),
        "read beside etcdctl's lock"
    );
    let sem = a.semaphore("catalogue", 3).unwrap();
    let refused = sem.try_acquire_with(&no_wait).await.unwrap_err();
    assert_eq!(
        refused.kind(),
        lockwright_core::ErrorKind::InvalidOptions,
        "{refused}"
    );
    // Once it is gone (its 3 s lease runs out), we read.
    drop(theirs);
    let opts = LockOptions::new().wait_for(Duration::from_secs(20));
    let r = ra.read_with(&opts).await.unwrap();
    r.release().await.unwrap();
}
