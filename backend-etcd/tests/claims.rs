//! Semaphores and read-write locks in the name's one line (see the
//! crate docs): the kinds in the keys' values, and a downgrade that keeps
//! the writer's place in line.

mod common;

use std::time::Duration;

use common::{raw_client, server_hosts};
use lockwright_core::{LockOptions, Locker};
use lockwright_etcd::internals::etcd_client::{GetOptions, SortOrder, SortTarget};
use lockwright_etcd::EtcdBackend;

fn root() -> String {
    format!("/lockwright-claims-{}", std::process::id())
}

fn locker(root: &str) -> Locker {
    let url = format!("etcd://{}{root}?lease_ttl=3s", server_hosts());
    Locker::new(EtcdBackend::connect(&url).unwrap())
}

/// The values of the keys under `prefix`, in line order.
async fn line(prefix: &str) -> Vec<String> {
    let mut raw = raw_client(&server_hosts()).await;
    let opts = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let got = raw.get(prefix, Some(opts)).await.unwrap();
    got.kvs()
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_key_says_its_kind_in_its_value() {
    let root = root();
    let l = locker(&root);
    let no_wait = LockOptions::new().no_wait();
    let sem = l.semaphore("backups", 3).unwrap();
    let (p1, p2) = (
        sem.acquire_with(&no_wait).await.unwrap(),
        sem.acquire_with(&no_wait).await.unwrap(),
    );
    assert_eq!(
        line(&format!("{root}/backups/")).await,
        ["lockwright:permits=3", "lockwright:permits=3"]
    );
    let rw = l.rwlock("catalogue").unwrap();
    let r = rw.read_with(&no_wait).await.unwrap();
    assert_eq!(
        line(&format!("{root}/catalogue/")).await,
        ["lockwright:shared"]
    );
    let status = sem.status().await.unwrap();
    assert_eq!(
        (status.holder_count(), status.permits),
        (2, Some(3)),
        "{status:?}"
    );
    let lease_left =
        |h: &lockwright_core::Holder| h.remaining.is_some_and(|r| r <= Duration::from_secs(3));
    assert!(status.holders.iter().all(lease_left), "{status:?}");
    for g in [p1, p2, r] {
        g.release().await.unwrap();
    }
    assert!(
        line(&format!("{root}/")).await.is_empty(),
        "keys left behind"
    );
}

/// A writer that downgrades keeps its place: a writer queued behind it
/// waits until the reader leaves, and the writer's key becomes the
/// reader's in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_keeps_the_writer_s_place_in_line() {
    let root = root();
    let (a, b) = (locker(&root), locker(&root));
    let (rwa, rwb) = (a.rwlock("doc").unwrap(), b.rwlock("doc").unwrap());
    let w = rwa.write_with(&LockOptions::new().no_wait()).await.unwrap();
    let wait = LockOptions::new().wait_for(Duration::from_secs(30));
    let waiting = tokio::spawn(async move { rwb.write_with(&wait).await });
    let prefix = format!("{root}/doc/");
    let start = std::time::Instant::now();
    while line(&prefix).await.len() < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the writer never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fence_w = w.fence();
    let r = rwa.downgrade(w).await.unwrap();
    assert_eq!(line(&prefix).await, ["lockwright:shared", ""]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "the queued writer took the lock from the downgraded reader"
    );
    let fence_r = r.fence();
    r.release().await.unwrap();
    let w2 = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the queued writer holds once the reader left")
        .unwrap()
        .unwrap();
    // Writers' fences rise. The queued writer keeps its place, made
    // before the downgrade, and so its fence is below the read hold's
    // (the crate docs say so): fence writes with writers' fences.
    assert!(w2.fence() > fence_w);
    assert!(fence_r > w2.fence());
    w2.release().await.unwrap();
}

/// Only holders keep a name's kind: a key of another N waiting in line
/// (or left by a refused attempt not yet deleted) does not turn away a
/// claim that agrees with the holders. A refused claim, waiting or not,
/// has deleted its key by the time it reports the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_holders_keep_the_kind_and_a_refusal_leaves_no_key() {
    let root = root();
    let (a, b) = (locker(&root), locker(&root));
    let prefix = format!("{root}/pool/");
    let no_wait = LockOptions::new().no_wait();
    let held = a
        .semaphore("pool", 3)
        .unwrap()
        .acquire_with(&no_wait)
        .await
        .unwrap();
    // A stray key of another N behind the holder, on a lease of its own.
    let mut raw = raw_client(&server_hosts()).await;
    let lease = raw.lease_grant(30, None).await.unwrap().id();
    let stray = format!("{prefix}{lease:x}");
    let put = lockwright_etcd::internals::etcd_client::PutOptions::new().with_lease(lease);
    raw.put(stray.as_str(), "lockwright:permits=2", Some(put))
        .await
        .unwrap();
    let second = b
        .semaphore("pool", 3)
        .unwrap()
        .try_acquire_with(&no_wait)
        .await;
    let second = second
        .expect("refused for a waiting key's N")
        .expect("a free permit");
    raw.lease_revoke(lease).await.unwrap();
    for opts in [
        no_wait.clone(),
        LockOptions::new().wait_for(Duration::from_secs(5)),
    ] {
        let refused = b
            .semaphore("pool", 2)
            .unwrap()
            .acquire_with(&opts)
            .await
            .unwrap_err();
        assert_eq!(
            refused.kind(),
            lockwright_core::ErrorKind::InvalidOptions,
            "{refused}"
        );
        assert_eq!(
            line(&prefix).await.len(),
            2,
            "the refused claim's key is still there"
        );
    }
    held.release().await.unwrap();
    second.release().await.unwrap();
}
