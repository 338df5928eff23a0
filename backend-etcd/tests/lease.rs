//! The lease is the session: what a grant and a renewal promise of it.

mod common;

use std::time::Duration;

use common::{raw_client, server_hosts};
use lockwright_core::backend::{Acquire, LockBackendExt};
use lockwright_core::{LockKey, OwnerToken};
use lockwright_etcd::{internals, EtcdBackend};

/// A grant is trusted no longer than its lease is sure to live. A lease
/// confirmed within the last half of its TTL (the background keep-alive
/// confirms it every third) lends the grant what it has left, which the
/// cluster's own count never falls short of; otherwise the attempt keeps
/// the lease alive itself, as a put on a lease does not renew it.
#[tokio::test]
async fn a_grant_is_trusted_no_longer_than_its_lease_lives() {
    let url = format!(
        "etcd://{}/lockwright-lease-test?lease_ttl=6s",
        server_hosts()
    );
    let b = EtcdBackend::connect(&url).unwrap();
    let k = |n: &str| LockKey::new(format!("{n}-{}", std::process::id())).unwrap();
    let ttl = Duration::from_secs(30);
    let (a, o) = (k("a"), OwnerToken::generate());
    let first = b.try_lock(&a, &o, ttl).await.unwrap();
    assert!(matches!(first, Acquire::Acquired(_)));
    let lease = internals::lease(&b).await.expect("a lease");
    // Less than the background keep-alive's period (2 s) later.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (c, o2) = (k("b"), OwnerToken::generate());
    let Acquire::Acquired(second) = b.try_lock(&c, &o2, ttl).await.unwrap() else {
        panic!("uncontended");
    };
    let mut raw = raw_client(&server_hosts()).await;
    let left = raw.lease_time_to_live(lease, None).await.unwrap().ttl();
    let left = Duration::from_secs(u64::try_from(left).unwrap());
    match second.lease {
        // The cluster counts whole seconds, rounded down.
        Some(lent) => assert!(
            lent <= left + Duration::from_secs(1) && lent >= Duration::from_secs(3),
            "lent {lent:?} of a lease with {left:?} left"
        ),
        None => assert!(
            left >= Duration::from_secs(5),
            "{left:?} left after the grant"
        ),
    }
}
