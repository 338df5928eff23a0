//! Leader-election values on Redis and Redlock: a value goes into the
//! store with the grant (the plain path, a queued waiter's hand-off) and
//! comes back from inspect byte for byte; proclaim is owner-checked; the
//! value goes with the lock. Observers hear each change of a lock with a
//! value on its channel, long before their poll; a plain lock is never
//! announced.

mod common;

use std::time::Duration;

use futures::StreamExt;
use lockwright_conformance::kit::observe::{heard_by_notice, leads, until, NEVER, SOON};
use lockwright_conformance::kit::process::redis_server;
use lockwright_conformance::kit::servers::{redis_url, redlock_ports};
use lockwright_conformance::kit::values::awkward;
use lockwright_core::backend::{
    Acquire, AcquireRequest, Changes, HoldId, LockBackend, LockBackendExt, Notice, Release, Renew,
};
use lockwright_core::{ErrorKind, LockKey, LockOptions, Locker, OwnerToken};
use lockwright_redis::{RedisBackend, RedlockBackend};

const TTL: Duration = Duration::from_secs(30);
/// Just above the backend's floor, to watch a lease run out.
const SHORT: Duration = Duration::from_millis(300);

fn backend() -> RedisBackend {
    RedisBackend::connect(&format!("{}?waiter_refresh=500ms", redis_url())).unwrap()
}

fn name(what: &str) -> String {
    format!("election:{what}:{}", OwnerToken::generate().as_str())
}

fn key(name: &str) -> LockKey {
    LockKey::new(name).unwrap()
}

async fn grant(b: &impl LockBackend, k: &LockKey, owner: &OwnerToken, ttl: Duration) -> u64 {
    grant_with(b, &AcquireRequest::mutex(k, owner, ttl)).await
}

async fn grant_with(b: &impl LockBackend, request: &AcquireRequest) -> u64 {
    let k = request.key();
    match b.try_acquire(request).await.unwrap() {
        Acquire::Acquired(g) => g.fence.map_or(0, |f| f.0),
        other => panic!("expected to take {k:?}, got {other:?}"),
    }
}

/// A mutex attempt of `owner` on `k` that advertises `value`.
fn valued(
    k: &LockKey,
    owner: &OwnerToken,
    value: impl Into<Vec<u8>>,
    ttl: Duration,
) -> AcquireRequest {
    AcquireRequest::mutex(k, owner, ttl)
        .with_value(value)
        .unwrap()
}

/// Every key the single server keeps for the lock name `name`.
async fn stored(name: &str) -> Vec<String> {
    common::scan(&redis_url(), &format!("*{{{name}}}*")).await
}

#[tokio::test]
async fn a_value_round_trips_through_grant_and_inspect() {
    let b = backend();
    for value in awkward() {
        let n = name("round-trip");
        let k = key(&n);
        let owner = OwnerToken::generate();
        let fence = grant_with(&b, &valued(&k, &owner, value.clone(), TTL)).await;
        let s = b.inspect(&k).await.unwrap();
        assert!(s.held);
        assert_eq!(s.value.as_deref(), Some(value.as_slice()), "{value:?}");
        assert_eq!(s.owner.as_ref(), Some(&owner));
        assert_eq!(s.fence.map(|f| f.0), Some(fence));
        assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
        assert!(stored(&n).await.is_empty(), "{n}: keys left after release");
    }
}

#[tokio::test]
async fn a_plain_holder_has_no_value_and_a_re_entry_leaves_the_value_alone() {
    let b = backend();
    let k = key(&name("plain"));
    let plain = OwnerToken::generate();
    grant(&b, &k, &plain, TTL).await;
    let s = b.inspect(&k).await.unwrap();
    assert_eq!((s.held, s.value), (true, None));
    assert_eq!(s.owner.as_ref(), Some(&plain));
    assert_eq!(b.unlock(&k, &plain).await.unwrap(), Release::Freed);

    let owner = OwnerToken::generate();
    let fence = grant_with(&b, &valued(&k, &owner, "first", TTL)).await;
    assert_eq!(
        b.proclaim_as(&k, &owner, b"second").await.unwrap(),
        Renew::Renewed
    );
    // The request still carries "first": a re-entry is no new grant.
    assert_eq!(
        grant_with(&b, &valued(&k, &owner, "first", TTL)).await,
        fence
    );
    let s = b.inspect(&k).await.unwrap();
    assert_eq!((s.holds, s.value.as_deref()), (2, Some(&b"second"[..])));
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::StillHeld(1));
    assert_eq!(
        b.inspect(&k).await.unwrap().value.as_deref(),
        Some(&b"second"[..])
    );
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
}

#[tokio::test]
async fn proclaim_by_the_owner_sets_the_value_on_either_form() {
    let b = backend();
    // The plain string form: proclaim moves it to the hash form, keeping
    // its fence and lease.
    let k = key(&name("proclaim"));
    let owner = OwnerToken::generate();
    let fence = grant(&b, &k, &owner, TTL).await;
    for value in awkward() {
        assert_eq!(
            b.proclaim_as(&k, &owner, &value).await.unwrap(),
            Renew::Renewed
        );
        let s = b.inspect(&k).await.unwrap();
        assert_eq!(s.value.as_deref(), Some(value.as_slice()));
        assert_eq!(s.fence.map(|f| f.0), Some(fence), "the fence is kept");
        assert!(s.remaining.unwrap() > TTL - Duration::from_secs(5), "{s:?}");
    }
    assert_eq!(b.renew_lock(&k, &owner, TTL).await.unwrap(), Renew::Renewed);
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
    let s = b.inspect(&k).await.unwrap();
    assert_eq!((s.held, s.value), (false, None));

    // The hash form, held with a value from the grant.
    let owner = OwnerToken::generate();
    grant_with(&b, &valued(&k, &owner, "v1", TTL)).await;
    assert_eq!(
        b.proclaim_as(&k, &owner, b"v2").await.unwrap(),
        Renew::Renewed
    );
    assert_eq!(
        b.inspect(&k).await.unwrap().value.as_deref(),
        Some(&b"v2"[..])
    );
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
}

#[tokio::test]
async fn proclaim_by_a_stranger_or_an_expired_owner_is_not_held_and_writes_nothing() {
    let b = backend();
    let n = name("stranger");
    let k = key(&n);
    // Free: nothing held, nothing written.
    let nobody = OwnerToken::generate();
    assert_eq!(
        b.proclaim_as(&k, &nobody, b"x").await.unwrap(),
        Renew::NotHeld
    );
    assert!(stored(&n).await.is_empty());

    // Held by someone else, in either form.
    for take in [
        AcquireRequest::mutex(&k, &OwnerToken::generate(), TTL),
        valued(&k, &OwnerToken::generate(), "mine", TTL),
    ] {
        let owner = take.owner().clone();
        grant_with(&b, &take).await;
        let before = b.inspect(&k).await.unwrap();
        assert_eq!(
            b.proclaim_as(&k, &nobody, b"x").await.unwrap(),
            Renew::NotHeld
        );
        let after = b.inspect(&k).await.unwrap();
        assert_eq!(after.value, before.value);
        assert_eq!(after.owner, before.owner);
        assert_eq!(after.fence, before.fence);
        assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
    }

    // Expired, then nothing: proclaim does not bring it back.
    let owner = OwnerToken::generate();
    grant_with(&b, &valued(&k, &owner, "old", SHORT)).await;
    tokio::time::sleep(SHORT * 2).await;
    assert_eq!(
        b.proclaim_as(&k, &owner, b"new").await.unwrap(),
        Renew::NotHeld
    );
    assert!(stored(&n).await.is_empty());

    // Expired and taken over: the new holder's value stands.
    let plain = OwnerToken::generate();
    grant(&b, &k, &plain, SHORT).await;
    tokio::time::sleep(SHORT * 2).await;
    let next = OwnerToken::generate();
    grant_with(&b, &valued(&k, &next, "next", TTL)).await;
    assert_eq!(
        b.proclaim_as(&k, &plain, b"stale").await.unwrap(),
        Renew::NotHeld
    );
    assert_eq!(
        b.inspect(&k).await.unwrap().value.as_deref(),
        Some(&b"next"[..])
    );
    assert_eq!(b.unlock(&k, &next).await.unwrap(), Release::Freed);
}

#[tokio::test]
async fn the_value_goes_with_the_lock_on_release_and_expiry() {
    let b = backend();
    let n = name("gone");
    let k = key(&n);
    let owner = OwnerToken::generate();
    grant_with(&b, &valued(&k, &owner, "leader", TTL)).await;
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
    assert!(stored(&n).await.is_empty());
    let plain = OwnerToken::generate();
    grant(&b, &k, &plain, TTL).await;
    assert_eq!(b.inspect(&k).await.unwrap().value, None);
    assert_eq!(b.unlock(&k, &plain).await.unwrap(), Release::Freed);

    let owner = OwnerToken::generate();
    grant_with(&b, &valued(&k, &owner, "leader", SHORT)).await;
    tokio::time::sleep(SHORT * 2).await;
    let s = b.inspect(&k).await.unwrap();
    assert_eq!((s.held, s.value), (false, None));
    assert!(stored(&n).await.is_empty());
    grant(&b, &k, &plain, TTL).await;
    assert_eq!(b.inspect(&k).await.unwrap().value, None);
    assert_eq!(b.unlock(&k, &plain).await.unwrap(), Release::Freed);
}

/// The releaser's script hands the lock over and writes the waiter's value
/// with it, before the waiter has said a word (no proclaim involved).
#[tokio::test]
async fn a_hand_off_writes_the_waiters_value_with_the_grant() {
    let b = backend();
    for value in awkward() {
        let n = name("handoff");
        let k = key(&n);
        let holder = OwnerToken::generate();
        grant_with(&b, &valued(&k, &holder, "holder", TTL)).await;
        let (w, ticket) = (OwnerToken::generate(), OwnerToken::generate());
        let queue = valued(&k, &w, value.clone(), TTL).waiting(&ticket);
        let mut watch = b.watch(&k, &ticket).await.unwrap().expect("Redis notifies");
        let queued = b.try_acquire(&queue).await.unwrap();
        assert!(matches!(queued, Acquire::Contended { .. }), "{queued:?}");
        assert_eq!(b.unlock(&k, &holder).await.unwrap(), Release::Freed);
        let notice = tokio::time::timeout(Duration::from_secs(5), watch.changed())
            .await
            .expect("the grant message arrives");
        assert!(matches!(notice, Notice::Granted(_)), "{notice:?}");
        let s = b.inspect(&k).await.unwrap();
        assert_eq!(s.owner.as_ref(), Some(&w));
        assert_eq!(s.value.as_deref(), Some(value.as_slice()));
        // The waiter's refresh claims the grant; the value stays.
        match b.try_acquire(&queue).await.unwrap() {
            Acquire::Acquired(g) => assert_eq!(g.holds, 1),
            other => panic!("the refresh should find the grant, got {other:?}"),
        }
        assert_eq!(
            b.inspect(&k).await.unwrap().value.as_deref(),
            Some(value.as_slice())
        );
        assert_eq!(b.unlock(&k, &w).await.unwrap(), Release::Freed);
        assert!(stored(&n).await.is_empty(), "{n}: keys left");
    }
}

/// A plain waiter handed a lock whose last holder advertised a value gets
/// none: the value is never reported for a later holder.
#[tokio::test]
async fn a_hand_off_to_a_plain_waiter_carries_no_value() {
    let b = backend();
    let k = key(&name("handoff-plain"));
    let holder = OwnerToken::generate();
    grant_with(&b, &valued(&k, &holder, "holder", TTL)).await;
    let (w, ticket) = (OwnerToken::generate(), OwnerToken::generate());
    let mut watch = b.watch(&k, &ticket).await.unwrap().expect("Redis notifies");
    b.try_lock_waiting(&HoldId::mutex(k.clone(), w.clone()), TTL, &ticket)
        .await
        .unwrap();
    b.unlock(&k, &holder).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), watch.changed())
        .await
        .expect("the grant message arrives");
    let s = b.inspect(&k).await.unwrap();
    assert_eq!((s.owner.as_ref(), s.value), (Some(&w), None));
    b.abandon_lock(&k, &w, &ticket).await.unwrap();
    assert!(!b.inspect(&k).await.unwrap().held);
}

#[tokio::test]
async fn a_campaign_waiting_in_the_fair_queue_leads_with_its_value() {
    let locker = Locker::new(backend());
    let n = name("campaign");
    let election = locker.election(n.as_str()).unwrap();
    let opts = LockOptions::new().ttl(TTL);
    let first = election.campaign_with("node-a", &opts).await.unwrap();
    let term_a = first.term().expect("Redis gives terms");
    let leader = election.leader().await.unwrap().expect("a leads");
    assert_eq!(
        (leader.value.as_slice(), leader.term),
        (&b"node-a"[..], Some(term_a))
    );

    let waiting = election.clone();
    let task = tokio::spawn(async move {
        let opts = LockOptions::new()
            .ttl(TTL)
            .wait_for(Duration::from_secs(20));
        waiting.campaign_with("node-b\0\n", &opts).await
    });
    // Until b is queued, a leads.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(waiters(&locker, &n).await, Some(1));
    first.resign().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("b is handed the lead")
        .unwrap()
        .unwrap();
    let leader = election.leader().await.unwrap().expect("b leads");
    assert_eq!(leader.value, b"node-b\0\n");
    assert_eq!(leader.term, second.term());
    assert!(second.term().unwrap() > term_a);
    second.resign().await.unwrap();
    assert!(election.leader().await.unwrap().is_none());
    assert!(stored(&n).await.is_empty(), "{n}: keys left");
}

async fn waiters(locker: &Locker, name: &str) -> Option<u32> {
    locker.status(name).await.unwrap().waiters
}

#[tokio::test]
async fn a_proclaim_by_a_leader_that_lost_its_lease_is_refused() {
    let locker = Locker::new(backend());
    let election = locker.election(name("lost").as_str()).unwrap();
    let opts = LockOptions::new().ttl(SHORT).auto_renew(false);
    let mut old = election.campaign_with("old", &opts).await.unwrap();
    tokio::time::sleep(SHORT * 2).await;
    let new = election
        .campaign_with("new", &LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let err = old.proclaim("stale").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let leader = election.leader().await.unwrap().expect("new leads");
    assert_eq!(leader.value, b"new");
    new.resign().await.unwrap();
    drop(old);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_campaign_leader_proclaim_and_resign() {
    let ports = redlock_ports();
    assert_eq!(ports.len(), 5, "the test wants five Redlock nodes");
    let url = format!("{}?timeout=250ms", common::redlock_url(&ports));
    let redlock = RedlockBackend::connect(&url).unwrap();
    assert!(redlock.capabilities().values);
    let locker = Locker::new(redlock);
    let n = name("redlock");
    let election = locker.election(n.as_str()).unwrap();
    let opts = LockOptions::new().ttl(TTL);
    let value = awkward().pop().unwrap();
    let mut leading = election.campaign_with(value.clone(), &opts).await.unwrap();
    let leader = election.leader().await.unwrap().expect("someone leads");
    assert_eq!(leader.value, value);
    assert_eq!(leader.term, None, "Redlock gives no terms");
    assert!(leader.lease_left.unwrap() > TTL - Duration::from_secs(5));

    // Another candidate cannot lead meanwhile.
    let short = LockOptions::new()
        .ttl(TTL)
        .wait_for(Duration::from_millis(300));
    assert!(election
        .try_campaign_with("other", &short)
        .await
        .unwrap()
        .is_none());

    leading.proclaim("changed").await.unwrap();
    let leader = election.leader().await.unwrap().expect("still leads");
    assert_eq!(leader.value, b"changed");
    // Every node has the new value.
    for port in &ports {
        let node = RedisBackend::connect(&format!("redis://127.0.0.1:{port}")).unwrap();
        let s = node.inspect(&key(&n)).await.unwrap();
        assert_eq!(s.value.as_deref(), Some(&b"changed"[..]), "node {port}");
    }
    leading.resign().await.unwrap();
    assert!(election.leader().await.unwrap().is_none());

    let next = election.campaign_with("next", &opts).await.unwrap();
    assert_eq!(election.leader().await.unwrap().unwrap().value, b"next");
    next.resign().await.unwrap();
    for port in &ports {
        let url = format!("redis://127.0.0.1:{port}");
        let left = common::scan(&url, &format!("*{{{n}}}*")).await;
        assert!(left.is_empty(), "node {port} kept {left:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_hears_each_change_long_before_its_poll() {
    let locker = Locker::new(backend());
    let opts = LockOptions::new().ttl(TTL);
    let delays = heard_by_notice(&locker, &name("notice"), &opts).await;
    eprintln!("redis: proclaim, resign, new leader, hand-off seen after {delays:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redlock_observer_hears_each_change_long_before_its_poll() {
    let url = format!("{}?timeout=250ms", common::redlock_url(&redlock_ports()));
    let locker = Locker::new(RedlockBackend::connect(&url).unwrap());
    let opts = LockOptions::new().ttl(TTL);
    let delays = heard_by_notice(&locker, &name("redlock-notice"), &opts).await;
    eprintln!("redlock: proclaim, resign, new leader, hand-off seen after {delays:?}");
}

/// Whether `watch` wakes within `within`.
async fn woken(watch: &mut Changes, within: Duration) -> bool {
    // A subscription that ended never wakes (as `Watch::changed`).
    let changed = async {
        if watch.notice().await.is_none() {
            std::future::pending::<()>().await;
        }
    };
    tokio::time::timeout(within, changed).await.is_ok()
}

/// A plain lock's grant, re-entry, renewal and release, in either form,
/// publish nothing; a lock with a value announces its grant, proclaim,
/// release and hand-off.
#[tokio::test]
async fn only_a_lock_with_a_value_is_announced() {
    let b = backend();
    let k = key(&name("announced"));
    let mut watch = b.changes(&k).await.unwrap().expect("Redis announces");
    let quiet = Duration::from_millis(300);
    let plain = OwnerToken::generate();
    grant(&b, &k, &plain, TTL).await;
    grant(&b, &k, &plain, TTL).await;
    assert_eq!(b.renew_lock(&k, &plain, TTL).await.unwrap(), Renew::Renewed);
    b.unlock(&k, &plain).await.unwrap();
    assert_eq!(b.unlock(&k, &plain).await.unwrap(), Release::Freed);
    assert!(
        !woken(&mut watch, quiet).await,
        "a plain lock was announced"
    );

    let owner = OwnerToken::generate();
    grant_with(&b, &valued(&k, &owner, "v", TTL)).await;
    assert!(woken(&mut watch, SOON).await, "a grant with a value");
    b.proclaim_as(&k, &owner, b"v2").await.unwrap();
    assert!(woken(&mut watch, SOON).await, "a proclaim");
    assert_eq!(b.renew_lock(&k, &owner, TTL).await.unwrap(), Renew::Renewed);
    assert!(!woken(&mut watch, quiet).await, "a renewal was announced");
    let (w, ticket) = (OwnerToken::generate(), OwnerToken::generate());
    let _grants = b.watch(&k, &ticket).await.unwrap();
    b.try_acquire(&valued(&k, &w, "w", TTL).waiting(&ticket))
        .await
        .unwrap();
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
    assert!(woken(&mut watch, SOON).await, "a release handing off");
    assert_eq!(b.inspect(&k).await.unwrap().owner.as_ref(), Some(&w));
    b.abandon_lock(&k, &w, &ticket).await.unwrap();
    assert!(woken(&mut watch, SOON).await, "an abandoned hand-off");
    assert!(!b.inspect(&k).await.unwrap().held);
}

/// The pub/sub clients of a server: (id, channels subscribed) each.
async fn pubsub_clients(admin: &mut redis::aio::MultiplexedConnection) -> Vec<(u64, u64)> {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(admin)
        .await
        .unwrap();
    let field = |line: &str, name: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    list.lines()
        .map(|l| (field(l, "id="), field(l, "sub=")))
        .collect()
}

/// Killing the hub's connection ends the observer's subscription: it reads
/// again within a second, subscribes on a new connection, and hears the
/// next change there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_subscribes_again_when_its_connection_is_killed() {
    let (_server, port) = redis_server(&[]);
    let url = format!("redis://127.0.0.1:{port}");
    let locker = Locker::new(RedisBackend::connect(&url).unwrap());
    let election = locker.election("e").unwrap();
    // Driven by a task of its own: a stream nobody polls does nothing,
    // subscribing again included.
    let mut observing = Box::pin(election.observe_every(NEVER));
    let (tx, mut changes) = futures::channel::mpsc::unbounded();
    tokio::spawn(async move {
        while let Some(item) = observing.next().await {
            if tx.unbounded_send(item).is_err() {
                break;
            }
        }
    });
    assert!(changes.next().await.unwrap().unwrap().is_none());
    let opts = LockOptions::new().ttl(TTL);
    let a = election.campaign_with("a", &opts).await.unwrap();
    until(&mut changes, SOON, "a leads", leads("a")).await;

    let admin = redis::Client::open(url.as_str()).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    // The hub's own channel and the lock's.
    let before = pubsub_clients(&mut admin).await;
    assert!(matches!(before[..], [(_, 2)]), "{before:?}");
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(killed, 1, "the locker's one hub");
    // Seen on the dying connection, or read within a second of its end.
    a.resign().await.unwrap();
    until(&mut changes, SOON, "a resigns", Option::is_none).await;
    let start = std::time::Instant::now();
    loop {
        let now = pubsub_clients(&mut admin).await;
        if matches!(now[..], [(id, 2)] if id != before[0].0) {
            break;
        }
        assert!(start.elapsed() < SOON, "not subscribed again: {now:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The next change is heard on the new connection, not polled.
    let b = election.campaign_with("b", &opts).await.unwrap();
    let heard = until(&mut changes, SOON, "b leads", leads("b")).await;
    eprintln!("redis: after a killed hub, a new leader seen after {heard:?}");
    b.resign().await.unwrap();
}

/// An observer that goes takes its subscription to the lock's channel
/// with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_observer_leaves_the_channel() {
    let b = backend();
    let n = name("leave");
    let channel = format!("lockwright:{{{n}}}:lock:changes");
    let admin = redis::Client::open(redis_url()).unwrap();
    let admin = admin.get_multiplexed_async_connection().await.unwrap();
    let subscribers = || {
        let (mut admin, channel) = (admin.clone(), channel.clone());
        async move {
            let (_, n): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut admin)
                .await
                .unwrap();
            n
        }
    };
    let locker = Locker::new(b);
    let election = locker.election(n.as_str()).unwrap();
    let mut changes = Box::pin(election.observe_every(NEVER));
    changes.next().await.unwrap().unwrap();
    let start = std::time::Instant::now();
    while subscribers().await != 1 {
        assert!(start.elapsed() < SOON, "the observer never subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(changes);
    while subscribers().await != 0 {
        assert!(
            start.elapsed() < SOON * 2,
            "a dropped observer stayed subscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A subscription abandoned at any point (its observer dropped while the
/// server confirms it) or completed and then dropped leaves the channel:
/// none stays subscribed on the hub's connection with nobody to hear it.
#[tokio::test]
async fn an_abandoned_subscription_leaves_the_channel() {
    let b = backend();
    let n = name("abandon");
    let key = LockKey::new(n.as_str()).unwrap();
    let channel = format!("lockwright:{{{n}}}:lock:changes");
    let admin = redis::Client::open(redis_url()).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    // The hub's connection first, so that later calls only subscribe.
    drop(b.changes(&key).await.unwrap());
    for polls in 0..300 {
        // Given up after 0 to 300 polls: before the SUBSCRIBE is sent,
        // while the server confirms it, or after.
        let mut call = Box::pin(b.changes(&key));
        for _ in 0..polls {
            if futures::poll!(call.as_mut()).is_ready() {
                break;
            }
            tokio::task::yield_now().await;
        }
        drop(call);
        let start = std::time::Instant::now();
        loop {
            let (_, subscribed): (String, i64) = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channel)
                .query_async(&mut admin)
                .await
                .unwrap();
            if subscribed == 0 {
                break;
            }
            assert!(
                start.elapsed() < SOON,
                "given up after {polls} polls, the subscription stayed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}
