//! The lease is the session: what a grant and a renewal promise of it.

mod common;

use std::time::Duration;

use common::{raw_client, server_hosts};
use locksmith_core::backend::{Acquire, LockBackend};
use locksmith_core::{LockKey, OwnerToken};
use locksmith_etcd::{internals, EtcdBackend};

/// A grant is trusted for a lease TTL from the attempt, so the attempt
/// itself keeps the lease alive: a put on a lease does not renew it.
#[tokio::test]
async fn an_acquire_renews_the_lease_it_puts_its_key_on() {
    let url = format!(
        "etcd://{}/locksmith-lease-test?lease_ttl=6s",
        server_hosts()
    );
    let b = EtcdBackend::connect(&url).unwrap();
    let k = |n: &str| LockKey::new(format!("{n}-{}", std::process::id())).unwrap();
    let ttl = Duration::from_secs(6);
    let (a, o) = (k("a"), OwnerToken::generate());
    let first = b.try_acquire(&a, &o, ttl).await.unwrap();
    assert!(matches!(first, Acquire::Acquired(_)));
    let lease = internals::lease(&b).await.expect("a lease");
    // Less than the background keep-alive's period (2 s) later.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (c, o2) = (k("b"), OwnerToken::generate());
    let second = b.try_acquire(&c, &o2, ttl).await.unwrap();
    assert!(matches!(second, Acquire::Acquired(_)));
    let mut raw = raw_client(&server_hosts()).await;
    let left = raw.lease_time_to_live(lease, None).await.unwrap().ttl();
    assert!(
        left >= 5,
        "the lease has {left} s left after the second grant"
    );
}
