//! A semaphore's lone permit (the first on a free name, nobody queued) is
//! the lock's string form with the semaphore's N after the fence; every
//! other claim on the name meets it as the group it is, and the next one
//! to join turns it into the group's hash without losing its lease or
//! fence.

use std::time::Duration;

use lockwright_conformance::kit::servers::{redis_url, redlock_ports};
use lockwright_core::backend::{
    renew_one, Acquire, AcquireRequest, HoldId, HoldKind, LockBackend, LockBackendExt, Release,
    Renew, RenewRequest,
};
use lockwright_core::{Claim, ErrorKind, FencingToken, LockKey, OwnerToken};
use lockwright_redis::{RedisBackend, RedlockBackend};

mod common;

const TTL: Duration = Duration::from_secs(30);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("lone:{name}:{}", OwnerToken::generate().as_str())).unwrap()
}

/// A new owner's hold of one of `n` permits of `k`.
fn permit(k: &LockKey, n: u32) -> HoldId {
    HoldId::new(
        k.clone(),
        OwnerToken::generate(),
        HoldKind::of_claim(Claim::permits(n).unwrap()),
    )
}

/// An attempt at `hold` for [`TTL`].
fn ask(hold: &HoldId) -> AcquireRequest {
    AcquireRequest::new(hold.clone(), TTL)
}

fn lock_key(k: &LockKey) -> String {
    format!("lockwright:{{{}}}:lock", k.as_str())
}

async fn conn(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

async fn form(c: &mut redis::aio::MultiplexedConnection, k: &LockKey) -> String {
    redis::cmd("TYPE")
        .arg(lock_key(k))
        .query_async(c)
        .await
        .unwrap()
}

async fn fence_of(b: &dyn LockBackend, o: &HoldId) -> FencingToken {
    match b.try_acquire(&ask(o)).await.unwrap() {
        Acquire::Acquired(g) => g.fence.expect("a fence"),
        other => panic!("{} was not granted: {other:?}", o.claim()),
    }
}

/// `hold`'s renewal for the TTL, answered.
async fn renewed(b: &RedisBackend, hold: &HoldId) -> Renew {
    renew_one(b, RenewRequest::new(hold.clone(), TTL))
        .await
        .unwrap()
}

fn refused(what: &str, r: lockwright_core::Result<Acquire>) {
    match r {
        Err(e) if e.kind() == ErrorKind::InvalidOptions => {}
        other => panic!("{what} on a lone permit ended with {other:?}, not InvalidOptions"),
    }
}

#[tokio::test]
async fn a_lone_permit_is_a_string_until_a_second_claim_makes_it_a_group() {
    let b = RedisBackend::connect(&redis_url()).unwrap();
    let mut c = conn(&redis_url()).await;
    let k = key("second");
    let (a, other) = (permit(&k, 3), permit(&k, 3));

    let fa = fence_of(&b, &a).await;
    assert_eq!(form(&mut c, &k).await, "string");
    let v: String = redis::cmd("GET")
        .arg(lock_key(&k))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(v.starts_with(a.owner.as_str()) && v.ends_with(" p3"), "{v}");
    let s = b.inspect(&k).await.unwrap();
    assert_eq!((s.permits, s.holders.len()), (Some(3), 1), "{s:?}");
    assert_eq!(s.holders[0].owner.as_ref(), Some(&a.owner));
    assert_eq!(s.holders[0].fence, Some(fa));
    assert_eq!(renewed(&b, &a).await, Renew::Renewed);
    assert_eq!(renewed(&b, &other).await, Renew::NotHeld);
    assert_eq!(b.release(&other).await.unwrap(), Release::NotHeld);

    // A mutex meets a semaphore of 3, told apart from a lock held, and
    // changes nothing.
    refused(
        "a mutex",
        b.try_lock(&k, &OwnerToken::generate(), TTL).await,
    );
    assert_eq!(form(&mut c, &k).await, "string");

    // The second permit joins: one group of two, the first keeping its
    // fence and lease, the second's fence above it.
    let fo = fence_of(&b, &other).await;
    assert!(fo > fa, "{fo:?} after {fa:?}");
    assert_eq!(form(&mut c, &k).await, "hash");
    let s = b.inspect(&k).await.unwrap();
    assert_eq!((s.permits, s.holders.len()), (Some(3), 2), "{s:?}");
    let first = s
        .holders
        .iter()
        .find(|h| h.owner.as_ref() == Some(&a.owner));
    let first = first.expect("the lone permit's holder is a member");
    assert_eq!(first.fence, Some(fa));
    let left = first.remaining.expect("its lease");
    assert!(
        left > TTL - Duration::from_secs(10) && left <= TTL,
        "{left:?}"
    );
    refused("another N", b.try_acquire(&ask(&permit(&k, 4))).await);
    let reader = HoldId::new(
        k.clone(),
        OwnerToken::generate(),
        HoldKind::of_claim(Claim::Shared),
    );
    refused("a reader", b.try_acquire(&ask(&reader)).await);

    assert_eq!(b.release(&a).await.unwrap(), Release::Freed);
    assert_eq!(renewed(&b, &a).await, Renew::NotHeld);
    assert_eq!(renewed(&b, &other).await, Renew::Renewed);
    assert_eq!(b.release(&other).await.unwrap(), Release::Freed);
    assert_eq!(form(&mut c, &k).await, "none");
}

#[tokio::test]
async fn a_lone_permit_taken_again_by_its_owner_holds_twice() {
    let b = RedisBackend::connect(&redis_url()).unwrap();
    let mut c = conn(&redis_url()).await;
    let k = key("again");
    let a = permit(&k, 2);
    let f = fence_of(&b, &a).await;
    match b.try_acquire(&ask(&a)).await.unwrap() {
        Acquire::Acquired(g) => assert_eq!((g.fence, g.holds), (Some(f), 2)),
        other => panic!("re-entry: {other:?}"),
    }
    assert_eq!(form(&mut c, &k).await, "hash");
    assert_eq!(b.release(&a).await.unwrap(), Release::StillHeld(1));
    // Still one holder of one of 2 permits: another fits beside it.
    let b2 = permit(&k, 2);
    fence_of(&b, &b2).await;
    refused(
        "a third permit's N",
        b.try_acquire(&ask(&permit(&k, 3))).await,
    );
    assert_eq!(b.release(&a).await.unwrap(), Release::Freed);
    assert_eq!(b.release(&b2).await.unwrap(), Release::Freed);
    assert_eq!(form(&mut c, &k).await, "none");
}

#[tokio::test]
async fn a_lone_permit_on_redlock_is_an_unfenced_string_on_each_node() {
    let ports = redlock_ports();
    let b = RedlockBackend::connect(&common::redlock_url(&ports)).unwrap();
    let k = key("redlock");
    let (a, other) = (permit(&k, 2), permit(&k, 2));
    assert!(matches!(
        b.try_acquire(&ask(&a)).await.unwrap(),
        Acquire::Acquired(_)
    ));
    for p in &ports {
        let mut c = conn(&format!("redis://127.0.0.1:{p}")).await;
        let v: String = redis::cmd("GET")
            .arg(lock_key(&k))
            .query_async(&mut c)
            .await
            .unwrap();
        assert_eq!(v, format!("{} 0 0 p2", a.owner.as_str()), "node {p}");
    }
    assert!(matches!(
        b.try_acquire(&ask(&other)).await.unwrap(),
        Acquire::Acquired(_)
    ));
    let s = b.inspect(&k).await.unwrap();
    assert_eq!((s.permits, s.holders.len()), (Some(2), 2), "{s:?}");
    assert!(matches!(
        b.try_acquire(&ask(&permit(&k, 2))).await.unwrap(),
        Acquire::Contended { .. }
    ));
    assert_eq!(b.release(&a).await.unwrap(), Release::Freed);
    assert_eq!(b.release(&other).await.unwrap(), Release::Freed);
    for p in &ports {
        let mut c = conn(&format!("redis://127.0.0.1:{p}")).await;
        assert_eq!(form(&mut c, &k).await, "none", "node {p}");
    }
}
