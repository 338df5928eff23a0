//! The waiting line under an operator's hand: a waiter whose key was
//! deleted from outside (`etcdctl del`) holds nothing by it, and takes a
//! new place in line rather than a lock no key says is its own.

mod common;

use std::time::Duration;

use common::{raw_client, server_hosts};
use lockwright_core::{LockOptions, Locker};
use lockwright_etcd::internals::etcd_client::{GetOptions, SortOrder, SortTarget};
use lockwright_etcd::EtcdBackend;

fn locker(root: &str) -> Locker {
    let url = format!("etcd://{}{root}?lease_ttl=3s", server_hosts());
    Locker::new(EtcdBackend::connect(&url).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_was_deleted_holds_nothing_by_it() {
    let root = format!("/lockwright-queue-{}", std::process::id());
    let prefix = format!("{root}/k/");
    let (a, b, c) = (locker(&root), locker(&root), locker(&root));
    let held = a.lock("k").await.unwrap();
    let waiting = tokio::spawn(async move {
        let opts = LockOptions::new().wait_for(Duration::from_secs(20));
        b.lock_with("k", &opts).await
    });
    let mut raw = raw_client(&server_hosts()).await;
    let line = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let start = std::time::Instant::now();
    let waiter_key = loop {
        let got = raw.get(prefix.as_str(), Some(line.clone())).await.unwrap();
        if let Some(kv) = got.kvs().get(1) {
            break kv.key().to_vec();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The operator deletes the waiter's key; then the holder lets go.
    raw.delete(waiter_key, None).await.unwrap();
    held.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter is served")
        .unwrap()
        .unwrap();
    // It holds by a key of its own, first in line: nobody else can.
    assert!(
        c.try_lock("k").await.unwrap().is_none(),
        "two holders: the waiter took the lock without a key"
    );
    let got = raw.get(prefix.as_str(), Some(line)).await.unwrap();
    assert_eq!(got.kvs().len(), 1, "one key: the holder's");
    second.release().await.unwrap();
}
