//! Leader-election values on memcached, one server and a quorum: a value
//! goes into the lock's item with the grant and comes back from inspect
//! byte for byte; re-entries and renewals keep it; proclaim is a CAS over
//! the item as read, owner-checked, that keeps the item's expiry and wins
//! over a racing renewal by reading again; an item written by the previous
//! version reads as a hold without a value.

mod common;

use std::time::{Duration, Instant};

use lockwright_conformance::kit::unique_prefix;
use lockwright_conformance::kit::values::{awkward, every_byte};
use lockwright_core::backend::{
    Acquire, AcquireRequest, LockBackend, LockBackendExt, Release, Renew,
};
use lockwright_core::{ErrorKind, LockKey, LockOptions, Locker, OwnerToken, MAX_VALUE_LEN};
use lockwright_memcached::MemcachedBackend;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const TTL: Duration = Duration::from_secs(30);
/// The backend's shortest TTL: memcached counts whole seconds.
const SHORT: Duration = Duration::from_secs(2);

/// Clients of the shared server under a prefix of this run's own.
struct Single {
    prefix: String,
}

impl Single {
    fn new() -> Self {
        Single {
            prefix: unique_prefix(),
        }
    }

    fn backend(&self) -> MemcachedBackend {
        let url = format!("memcache://{}?prefix={}", common::server(), self.prefix);
        MemcachedBackend::connect(&url).unwrap()
    }

    /// The lock's item: its data and seconds left, or `None` on a miss.
    async fn item(&self, key: &LockKey) -> Option<(Vec<u8>, i64)> {
        item(
            &common::server(),
            &format!("{}{}", self.prefix, key.as_str()),
        )
        .await
    }
}

/// `mg <item> v t`, read as the binary it may be.
async fn item(server: &str, item: &str) -> Option<(Vec<u8>, i64)> {
    let mut s = BufReader::new(TcpStream::connect(server).await.unwrap());
    s.get_mut()
        .write_all(format!("mg {item} v t\r\n").as_bytes())
        .await
        .unwrap();
    let mut line = String::new();
    s.read_line(&mut line).await.unwrap();
    if line == "EN\r\n" {
        return None;
    }
    let mut fields = line.trim_end().split(' ');
    assert_eq!(fields.next(), Some("VA"), "{line:?}");
    let size: usize = fields.next().unwrap().parse().unwrap();
    let left: i64 = fields
        .find_map(|f| f.strip_prefix('t'))
        .unwrap()
        .parse()
        .unwrap();
    let mut data = vec![0; size + 2];
    s.read_exact(&mut data).await.unwrap();
    data.truncate(size);
    Some((data, left))
}

fn key(what: &str) -> LockKey {
    LockKey::new(format!(
        "election/{what}/{}",
        OwnerToken::generate().as_str()
    ))
    .unwrap()
}

/// An item's data as this version writes it.
fn data(owner: &OwnerToken, holds: u32, value: Option<&[u8]>) -> Vec<u8> {
    let mut d = format!("{} {holds}", owner.as_str()).into_bytes();
    if let Some(v) = value {
        d.push(b'\n');
        d.extend_from_slice(v);
    }
    d
}

async fn grant(b: &impl LockBackend, k: &LockKey, owner: &OwnerToken, ttl: Duration) {
    take(b, &AcquireRequest::mutex(k, owner, ttl)).await;
}

/// As [`grant`], carrying `value` for the store to write with the grant.
async fn grant_with(
    b: &impl LockBackend,
    k: &LockKey,
    owner: &OwnerToken,
    value: impl Into<Vec<u8>>,
    ttl: Duration,
) {
    let request = AcquireRequest::mutex(k, owner, ttl)
        .with_value(value)
        .unwrap();
    take(b, &request).await;
}

async fn take(b: &impl LockBackend, request: &AcquireRequest) {
    let k = request.key();
    match b.try_acquire(request).await.unwrap() {
        Acquire::Acquired(_) => {}
        other => panic!("expected to take {k:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_value_round_trips_through_grant_proclaim_and_inspect() {
    let s = Single::new();
    let b = s.backend();
    assert!(b.capabilities().values);
    assert_eq!(every_byte().len(), 1024);
    for value in awkward() {
        let k = key("round-trip");
        let owner = OwnerToken::generate();
        grant_with(&b, &k, &owner, value.clone(), TTL).await;
        let st = b.inspect(&k).await.unwrap();
        assert!(st.held);
        assert_eq!(st.value.as_deref(), Some(value.as_slice()), "{value:?}");
        assert_eq!(st.owner.as_ref(), Some(&owner));
        assert_eq!(s.item(&k).await.unwrap().0, data(&owner, 1, Some(&value)));
        assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
        assert_eq!(s.item(&k).await, None);
        let st = b.inspect(&k).await.unwrap();
        assert_eq!((st.held, st.value), (false, None));
    }

    // A plain holder's item is exactly the previous version's; proclaimed
    // values replace each other, holds kept.
    let k = key("proclaim");
    let owner = OwnerToken::generate();
    grant(&b, &k, &owner, TTL).await;
    assert_eq!(s.item(&k).await.unwrap().0, data(&owner, 1, None));
    assert_eq!(b.inspect(&k).await.unwrap().value, None);
    for value in awkward() {
        assert_eq!(
            b.proclaim_as(&k, &owner, &value).await.unwrap(),
            Renew::Renewed
        );
        let st = b.inspect(&k).await.unwrap();
        assert_eq!(st.value.as_deref(), Some(value.as_slice()));
        assert_eq!((st.holds, st.owner.as_ref()), (1, Some(&owner)));
        assert_eq!(s.item(&k).await.unwrap().0, data(&owner, 1, Some(&value)));
    }
    let over = vec![b'x'; MAX_VALUE_LEN + 1];
    let err = b.proclaim_as(&k, &owner, &over).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidOptions, "{err}");
    assert_eq!(
        s.item(&k).await.unwrap().0,
        data(&owner, 1, Some(&every_byte()))
    );
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
}

#[tokio::test]
async fn re_entries_and_renewals_keep_the_value() {
    let s = Single::new();
    let b = s.backend();
    let k = key("re-entry");
    let owner = OwnerToken::generate();
    grant_with(&b, &k, &owner, "first", TTL).await;
    assert_eq!(
        b.proclaim_as(&k, &owner, b"second").await.unwrap(),
        Renew::Renewed
    );
    // The request still carries "first": a re-entry is no new grant.
    grant_with(&b, &k, &owner, "first", TTL).await;
    let st = b.inspect(&k).await.unwrap();
    assert_eq!((st.holds, st.value.as_deref()), (2, Some(&b"second"[..])));
    assert_eq!(b.renew_lock(&k, &owner, TTL).await.unwrap(), Renew::Renewed);
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::StillHeld(1));
    assert_eq!(
        s.item(&k).await.unwrap().0,
        data(&owner, 1, Some(b"second"))
    );
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
    assert_eq!(s.item(&k).await, None);
}

/// Proclaims never lengthen a lease: one that is not renewed ends when it
/// would have, however often its holder proclaims.
#[tokio::test]
async fn proclaim_keeps_the_expiry() {
    let s = Single::new();
    let b = s.backend();
    let k = key("expiry");
    let owner = OwnerToken::generate();
    grant(&b, &k, &owner, Duration::from_secs(10)).await;
    let (_, before) = s.item(&k).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        b.proclaim_as(&k, &owner, b"v").await.unwrap(),
        Renew::Renewed
    );
    let (_, after) = s.item(&k).await.unwrap();
    assert!(
        after <= before,
        "{before} s left, then {after} s after a proclaim"
    );
    assert!(
        after >= before - 3,
        "{before} s left, then {after} s after a proclaim"
    );

    // A 2 s lease is kept for at most 5 s (2 + the clock lag, rounded up).
    let k = key("ends");
    let start = Instant::now();
    grant(&b, &k, &owner, SHORT).await;
    let mut n = 0;
    while b
        .proclaim_as(&k, &owner, format!("{n}").as_bytes())
        .await
        .unwrap()
        == Renew::Renewed
    {
        n += 1;
        assert!(
            start.elapsed() < Duration::from_secs(7),
            "a 2 s lease lived {:?} on {n} proclaims",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(n > 0);
    assert_eq!(s.item(&k).await, None);
}

/// A renewal landing between proclaim's read and its write makes the CAS
/// fail; proclaim reads again, so the renewal's expiry stands and the
/// value is written anyway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_racing_a_renewal_reads_again_and_keeps_the_renewed_lease() {
    let s = Single::new();
    let (b, renewer) = (s.backend(), s.backend());
    let k = key("race");
    let owner = OwnerToken::generate();
    grant(&b, &k, &owner, Duration::from_secs(5)).await;
    for i in 0..20 {
        assert_eq!(
            renewer
                .renew_lock(&k, &owner, Duration::from_secs(5))
                .await
                .unwrap(),
            Renew::Renewed
        );
        let value = format!("value {i}");
        let (renewed, proclaimed) = tokio::join!(
            renewer.renew_lock(&k, &owner, Duration::from_secs(60)),
            b.proclaim_as(&k, &owner, value.as_bytes())
        );
        assert_eq!(renewed.unwrap(), Renew::Renewed);
        assert_eq!(proclaimed.unwrap(), Renew::Renewed);
        let (d, left) = s.item(&k).await.unwrap();
        assert_eq!(d, data(&owner, 1, Some(value.as_bytes())), "round {i}");
        assert!(
            left >= 58,
            "round {i}: the renewal's lease was lost ({left} s left)"
        );
    }
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
}

#[tokio::test]
async fn strangers_and_former_holders_write_nothing() {
    let s = Single::new();
    let b = s.backend();
    let k = key("stranger");
    let nobody = OwnerToken::generate();
    assert_eq!(
        b.proclaim_as(&k, &nobody, b"x").await.unwrap(),
        Renew::NotHeld
    );
    assert_eq!(
        s.item(&k).await,
        None,
        "a proclaim on a free key stored an item"
    );

    let owner = OwnerToken::generate();
    grant_with(&b, &k, &owner, "mine", SHORT).await;
    let before = s.item(&k).await.unwrap().0;
    assert_eq!(
        b.proclaim_as(&k, &nobody, b"x").await.unwrap(),
        Renew::NotHeld
    );
    assert_eq!(s.item(&k).await.unwrap().0, before);

    // Once the lease is over, its former holder cannot bring it back.
    let start = Instant::now();
    while s.item(&k).await.is_some() {
        assert!(start.elapsed() < Duration::from_secs(6), "never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        b.proclaim_as(&k, &owner, b"late").await.unwrap(),
        Renew::NotHeld
    );
    assert_eq!(s.item(&k).await, None);
    let next = OwnerToken::generate();
    grant(&b, &k, &next, TTL).await;
    assert_eq!(
        b.proclaim_as(&k, &owner, b"late").await.unwrap(),
        Renew::NotHeld
    );
    let st = b.inspect(&k).await.unwrap();
    assert_eq!((st.owner.as_ref(), st.value), (Some(&next), None));
    assert_eq!(b.unlock(&k, &next).await.unwrap(), Release::Freed);
}

/// An item as the previous version wrote it (`<owner> <holds>`, no value):
/// a hold without a value, which its holder can re-enter, proclaim over,
/// renew and release.
#[tokio::test]
async fn an_item_of_the_previous_version_is_a_hold_without_a_value() {
    let s = Single::new();
    let b = s.backend();
    let k = key("old");
    let holder = OwnerToken::generate();
    let old = format!("{} 2", holder.as_str());
    let reply = common::raw(
        &common::server(),
        format!(
            "add {}{} 0 60 {}\r\n{old}\r\n",
            s.prefix,
            k.as_str(),
            old.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(reply, "STORED\r\n");

    let st = b.inspect(&k).await.unwrap();
    assert!(st.held);
    assert_eq!(
        (st.holds, st.owner.as_ref(), st.value),
        (2, Some(&holder), None)
    );
    let stranger = b.try_lock(&k, &OwnerToken::generate(), TTL).await.unwrap();
    assert!(
        matches!(stranger, Acquire::Contended { .. }),
        "{stranger:?}"
    );
    assert_eq!(b.unlock(&k, &holder).await.unwrap(), Release::StillHeld(1));
    assert_eq!(s.item(&k).await.unwrap().0, data(&holder, 1, None));
    assert_eq!(
        b.renew_lock(&k, &holder, TTL).await.unwrap(),
        Renew::Renewed
    );
    assert_eq!(
        b.proclaim_as(&k, &holder, b"now with a value")
            .await
            .unwrap(),
        Renew::Renewed
    );
    let st = b.inspect(&k).await.unwrap();
    assert_eq!(st.value.as_deref(), Some(&b"now with a value"[..]));
    assert_eq!(b.unlock(&k, &holder).await.unwrap(), Release::Freed);
    assert_eq!(s.item(&k).await, None);
}

#[tokio::test]
async fn campaign_leader_proclaim_and_resign() {
    let s = Single::new();
    let locker = Locker::new(s.backend());
    let k = key("campaign");
    let election = locker.election(&k).unwrap();
    let opts = LockOptions::new().ttl(TTL);
    assert!(election.leader().await.unwrap().is_none());
    let mut first = election.campaign_with("node-a", &opts).await.unwrap();
    assert_eq!(first.term(), None, "memcached gives no terms");
    let leader = election.leader().await.unwrap().expect("a leads");
    assert_eq!(
        (leader.value.as_slice(), leader.term),
        (&b"node-a"[..], None)
    );
    assert!(leader.lease_left.unwrap() > TTL - Duration::from_secs(5));

    let other = Locker::new(s.backend()).election(&k).unwrap();
    let brief = LockOptions::new()
        .ttl(TTL)
        .wait_for(Duration::from_millis(300));
    assert!(other
        .try_campaign_with("node-b", &brief)
        .await
        .unwrap()
        .is_none());

    first.proclaim(every_byte()).await.unwrap();
    assert_eq!(
        other.leader().await.unwrap().expect("a leads").value,
        every_byte()
    );
    first.resign().await.unwrap();
    assert!(other.leader().await.unwrap().is_none());
    let second = other.campaign_with("node-b\0\n", &opts).await.unwrap();
    assert_eq!(
        election.leader().await.unwrap().expect("b leads").value,
        b"node-b\0\n"
    );
    second.resign().await.unwrap();
    assert_eq!(s.item(&k).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_campaign_leader_proclaim_and_resign() {
    let servers = common::quorum_servers();
    assert_eq!(servers.len(), 3, "the test wants three memcached servers");
    let prefix = unique_prefix();
    let url = format!(
        "memcache://{}?prefix={prefix}&timeout=250ms",
        servers.join(",")
    );
    let quorum = MemcachedBackend::connect(&url).unwrap();
    assert!(quorum.capabilities().values);
    let locker = Locker::new(quorum);
    let k = key("quorum");
    let election = locker.election(&k).unwrap();
    let opts = LockOptions::new().ttl(TTL);
    let mut leading = election.campaign_with(every_byte(), &opts).await.unwrap();
    let leader = election.leader().await.unwrap().expect("someone leads");
    assert_eq!(leader.value, every_byte());
    assert!(leader.lease_left.unwrap() > TTL - Duration::from_secs(5));

    let short = LockOptions::new()
        .ttl(TTL)
        .wait_for(Duration::from_millis(300));
    assert!(election
        .try_campaign_with("other", &short)
        .await
        .unwrap()
        .is_none());

    leading.proclaim("changed").await.unwrap();
    assert_eq!(
        election.leader().await.unwrap().expect("still leads").value,
        b"changed"
    );
    // Every server has the new value, with the leader's hold.
    let item_key = format!("{prefix}{}", k.as_str());
    for server in &servers {
        let node =
            MemcachedBackend::connect(&format!("memcache://{server}?prefix={prefix}")).unwrap();
        let st = node.inspect(&k).await.unwrap();
        assert_eq!(st.value.as_deref(), Some(&b"changed"[..]), "{server}");
        assert!(item(server, &item_key).await.is_some());
    }
    leading.resign().await.unwrap();
    assert!(election.leader().await.unwrap().is_none());
    for server in &servers {
        assert_eq!(
            item(server, &item_key).await,
            None,
            "{server} kept the lock"
        );
    }
}
