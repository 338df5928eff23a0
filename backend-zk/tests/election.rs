//! Leader election's values in ZooKeeper, read from the tree itself: a
//! campaign's value is its node's data (lossless, any bytes), a plain
//! lock's node holds none (never its token), proclaim writes only the
//! holder's own node, and a session that ends takes the reign with it.
//! Observers hear each change by ZooKeeper's watches, long before their
//! poll, on a directory that did not exist yet, and again on a new session
//! once theirs ended.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{end_session, raw_client, server_hosts};
use futures::StreamExt;
use lockwright_conformance::kit::observe::{heard_by_notice, leads, until, NEVER, SOON};
use lockwright_core::backend::{
    Acquire, AcquireRequest, Changes, LockBackend, LockBackendExt, Renew,
};
use lockwright_core::{ErrorKind, LockKey, LockOptions, Locker, OwnerToken};
use lockwright_zk::internals::{self, zookeeper_client as zk};
use lockwright_zk::ZkBackend;

fn root(name: &str) -> String {
    format!("/lockwright-election-{name}-{}", std::process::id())
}

fn backend(hosts: &str, root: &str) -> Arc<ZkBackend> {
    Arc::new(ZkBackend::connect(&format!("zk://{hosts}{root}?session_timeout=4s")).unwrap())
}

/// The children of `key`'s directory as (full path, data), in queue order.
async fn nodes(raw: &zk::Client, root: &str, key: &str) -> Vec<(String, Vec<u8>)> {
    let dir = format!("{root}/{}", internals::dir_name(key, false));
    let mut children = match raw.list_children(&dir).await {
        Ok(c) => c,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {dir}: {e}"),
    };
    children.sort_by_key(|c| {
        c.rsplit_once("lock-")
            .map_or(c.clone(), |(_, s)| s.to_owned())
    });
    let mut out = Vec::new();
    for c in children {
        let path = format!("{dir}/{c}");
        if let Ok((data, _)) = raw.get_data(&path).await {
            out.push((path, data));
        }
    }
    out
}

/// One attempt at a mutex hold of `key` by `owner`, carrying `value` for
/// the store to write with the grant.
fn valued(key: &LockKey, owner: &OwnerToken, value: &[u8], ttl: Duration) -> AcquireRequest {
    AcquireRequest::mutex(key, owner, ttl)
        .with_value(value.to_vec())
        .unwrap()
}

/// Polls until `cond` holds of `store`'s status of `key`, for up to 10 s.
async fn status_until(
    store: &ZkBackend,
    key: &LockKey,
    what: &str,
    cond: impl Fn(&lockwright_core::LockStatus) -> bool,
) -> lockwright_core::LockStatus {
    let start = Instant::now();
    loop {
        let s = store.inspect(key).await.expect("inspect");
        if cond(&s) {
            return s;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{what}: {s:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_campaigns_value_is_its_nodes_data_byte_for_byte() {
    let hosts = server_hosts();
    let root = root("values");
    let locker = Locker::from_arc(backend(&hosts, &root));
    let raw = raw_client(&hosts).await;
    let election = locker.election("e").unwrap();
    let values: [Vec<u8>; 4] = [
        b"node-a".to_vec(),
        b"a\0b\nc d\r\n".to_vec(),
        vec![0xff, 0xfe, 0x00, 0x80],
        vec![b'x'; lockwright_core::MAX_VALUE_LEN],
    ];
    for value in values {
        let leadership = election
            .campaign_with(value.clone(), &LockOptions::new())
            .await
            .unwrap();
        let n = nodes(&raw, &root, "e").await;
        assert_eq!(n.len(), 1, "{n:?}");
        assert_eq!(n[0].1, value, "the node's data is not the value");
        let leader = election.leader().await.unwrap().expect("a leader");
        assert_eq!(leader.value, value);
        assert_eq!(leader.term, leadership.term());
        leadership.resign().await.unwrap();
        assert_eq!(election.leader().await.unwrap(), None);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plain_locks_node_holds_no_data_and_shows_no_value() {
    let hosts = server_hosts();
    let root = root("plain");
    let store = backend(&hosts, &root);
    let locker = Locker::from_arc(store.clone());
    let raw = raw_client(&hosts).await;
    let guard = locker.lock("k").await.unwrap();
    let n = nodes(&raw, &root, "k").await;
    assert_eq!(n.len(), 1, "{n:?}");
    assert!(n[0].1.is_empty(), "a plain lock's node holds {:?}", n[0].1);
    let status = store.inspect(&LockKey::new("k").unwrap()).await.unwrap();
    assert!(status.held && status.value.is_none(), "{status:?}");
    assert!(status.owner.is_none(), "inspect showed an owner token");
    assert_eq!(status.fence, guard.fence());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn proclaim_writes_only_the_holders_own_node_and_the_value_goes_with_it() {
    let hosts = server_hosts();
    let root = root("proclaim");
    let (a, b) = (backend(&hosts, &root), backend(&hosts, &root));
    let key = LockKey::new("e").unwrap();
    let ttl = Duration::from_secs(30);
    let (owner_a, owner_b) = (OwnerToken::generate(), OwnerToken::generate());
    let got = a
        .try_acquire(&valued(&key, &owner_a, b"a", ttl))
        .await
        .unwrap();
    assert!(matches!(got, Acquire::Acquired(_)), "{got:?}");
    let got = b
        .try_acquire(&valued(&key, &owner_b, b"b", ttl))
        .await
        .unwrap();
    assert!(matches!(got, Acquire::Contended { .. }), "{got:?}");

    // Not the holder: nothing written, in either client.
    for (store, owner) in [(&b, &owner_b), (&a, &owner_b)] {
        let r = store.proclaim_as(&key, owner, b"usurper").await.unwrap();
        assert_eq!(r, Renew::NotHeld);
    }
    assert_eq!(
        a.inspect(&key).await.unwrap().value.as_deref(),
        Some(&b"a"[..])
    );
    // The holder: written, twice (the version moves with each write).
    for v in [&b"a2"[..], b"a3"] {
        assert_eq!(
            a.proclaim_as(&key, &owner_a, v).await.unwrap(),
            Renew::Renewed
        );
        assert_eq!(a.inspect(&key).await.unwrap().value.as_deref(), Some(v));
    }
    // Released: the value went with the node, and a stale proclaim is refused.
    a.unlock(&key, &owner_a).await.unwrap();
    assert_eq!(
        a.proclaim_as(&key, &owner_a, b"late").await.unwrap(),
        Renew::NotHeld
    );
    assert!(!a.inspect(&key).await.unwrap().held);
    let plain = OwnerToken::generate();
    let got = b.try_lock(&key, &plain, ttl).await.unwrap();
    assert!(matches!(got, Acquire::Acquired(_)), "{got:?}");
    let status = a.inspect(&key).await.unwrap();
    assert!(status.held && status.value.is_none(), "{status:?}");
    b.unlock(&key, &plain).await.unwrap();
}

/// A node another session made at our node's path (an operator's mistake,
/// or CURATOR-604's race) is not ours: proclaim refuses, and leaves its
/// data alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_remade_at_our_path_by_another_session_is_not_written() {
    let hosts = server_hosts();
    let root = root("remade");
    let store = backend(&hosts, &root);
    let other = raw_client(&hosts).await;
    let key = LockKey::new("e").unwrap();
    let owner = OwnerToken::generate();
    let got = store
        .try_acquire(&valued(&key, &owner, b"mine", Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(matches!(got, Acquire::Acquired(_)), "{got:?}");
    let (path, _) = nodes(&other, &root, "e").await.remove(0);
    other.delete(&path, None).await.unwrap();
    let foreign = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
    other
        .create(&path, b"someone else", &foreign)
        .await
        .unwrap();
    let r = store.proclaim_as(&key, &owner, b"overwrite").await.unwrap();
    assert_eq!(r, Renew::NotHeld);
    assert_eq!(other.get_data(&path).await.unwrap().0, b"someone else");
}

/// A node named as Curator names its own, holding what lockwright before
/// values wrote there (a generated owner token), shows no value; one
/// holding a Curator participant's id shows the id.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_older_lockwrights_token_is_never_shown_as_a_value() {
    let hosts = server_hosts();
    let root = root("old-schema");
    let store = backend(&hosts, &root);
    let raw = raw_client(&hosts).await;
    let key = LockKey::new("e").unwrap();
    let dir = format!("{root}/e");
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    raw.mkdir(&dir, &container).await.unwrap();
    let contender = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    for (data, shown) in [
        (OwnerToken::generate().as_str().as_bytes().to_vec(), None),
        (b"java-1".to_vec(), Some(b"java-1".to_vec())),
    ] {
        let prefix = format!("{dir}/_c_{}-lock-", uuid_v4_text());
        let (stat, seq) = raw.create(&prefix, &data, &contender).await.unwrap();
        let status = store.inspect(&key).await.unwrap();
        assert!(status.held, "{status:?}");
        assert_eq!(
            status.value,
            shown,
            "for data {:?}",
            String::from_utf8_lossy(&data)
        );
        assert_eq!(status.fence.map(|f| f.0), u64::try_from(stat.czxid).ok());
        raw.delete(&format!("{prefix}{seq}"), None).await.unwrap();
    }
}

/// A random version 4 UUID in its hyphenated form, as Java's `UUID.randomUUID()`.
fn uuid_v4_text() -> String {
    let hex = OwnerToken::generate().as_str().to_owned();
    format!(
        "{}-{}-4{}-8{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[13..16],
        &hex[17..20],
        &hex[20..32]
    )
}

/// A leader whose session ends leads no more: the next candidate leads (or
/// nobody), and the former leader's proclaim is refused, by the backend as
/// by its `Leadership`, and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_loss_ends_the_reign_and_proclaim_after_it_is_lost() {
    let hosts = server_hosts();
    let root = root("session-loss");
    for with_successor in [false, true] {
        let (a, b) = (backend(&hosts, &root), backend(&hosts, &root));
        let (ea, eb) = (
            Locker::from_arc(a.clone()).election("e").unwrap(),
            Locker::from_arc(b.clone()).election("e").unwrap(),
        );
        let mut leadership = ea.campaign_with("a", &LockOptions::new()).await.unwrap();
        let term = leadership.term();
        let successor = with_successor.then(|| {
            tokio::spawn(async move {
                // Ending a session from outside is a tug of war with its
                // client, which can take tens of seconds on a loaded machine.
                let opts = LockOptions::new().wait_for(Duration::from_secs(120));
                eb.campaign_with("b", &opts).await
            })
        });
        let key = LockKey::new("e").unwrap();
        if with_successor {
            // The successor queues behind the leader before the session ends.
            status_until(&b, &key, "the successor did not queue", |s| {
                s.waiters == Some(1)
            })
            .await;
        }
        let info = internals::session(&a).await.expect("a session");
        let ended = info.id();
        end_session(&hosts, info).await.unwrap();
        // Its client learns that the session ended when it reconnects.
        let start = Instant::now();
        while internals::session(&a)
            .await
            .is_some_and(|s| s.id() == ended)
        {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "a's client never learnt"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        let status = if with_successor {
            status_until(&b, &key, "the successor does not lead", |s| {
                s.value.as_deref() == Some(&b"b"[..])
            })
            .await
        } else {
            status_until(&b, &key, "the reign outlived its session", |s| !s.held).await
        };
        assert_ne!(status.fence, term, "the former term still shows");
        let owner = leadership.guard().owner().clone();
        assert_eq!(
            a.proclaim_as(&key, &owner, b"stale").await.unwrap(),
            Renew::NotHeld
        );
        let e = leadership
            .proclaim("stale")
            .await
            .expect_err("a former leader proclaimed");
        assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
        let after = b.inspect(&key).await.unwrap();
        assert_eq!(after.value, status.value, "the former leader wrote a value");
        if let Some(task) = successor {
            let won = task.await.unwrap().expect("the successor campaigned");
            won.resign().await.unwrap();
        }
        drop(leadership);
    }
}

/// The lock's directory does not exist when the observer starts (a fresh
/// root): its existence watch hears the first campaign.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_observer_hears_each_change_long_before_its_poll() {
    let hosts = server_hosts();
    let root = root("notice");
    let locker = Locker::from_arc(backend(&hosts, &root));
    let delays = heard_by_notice(&locker, "e", &LockOptions::new()).await;
    eprintln!("zookeeper: proclaim, resign, new leader, hand-off seen after {delays:?}");
}

/// A ZooKeeper client that counts the subscriptions to changes it made.
#[derive(Debug)]
struct Counted {
    inner: Arc<ZkBackend>,
    subscribed: AtomicUsize,
}

lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for Counted {
        // Counted, to know when the observer is subscribed again.
        async fn changes(&self, key: &LockKey) -> lockwright_core::Result<Option<Changes>> {
            let made = self.inner.changes(key).await;
            if matches!(made, Ok(Some(_))) {
                self.subscribed.fetch_add(1, Ordering::SeqCst);
            }
            made
        }
    }
}

/// The observer's session ends: its watches go with it, so it reads again
/// and subscribes on a new session, and hears the next change there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_observer_subscribes_again_when_its_session_ends() {
    let hosts = server_hosts();
    let root = root("observer-session");
    let (watching, leading) = (backend(&hosts, &root), backend(&hosts, &root));
    let counted = Arc::new(Counted {
        inner: watching.clone(),
        subscribed: AtomicUsize::new(0),
    });
    let observer = Locker::from_arc(counted.clone()).election("e").unwrap();
    let election = Locker::from_arc(leading).election("e").unwrap();
    // Driven by a task of its own: a stream nobody polls does nothing,
    // subscribing again included. A read that fails while the session
    // ends (one error for that outage) is left out.
    let mut observing = Box::pin(observer.observe_every(NEVER));
    let (tx, mut changes) = futures::channel::mpsc::unbounded();
    tokio::spawn(async move {
        while let Some(item) = observing.next().await {
            if item.is_ok() && tx.unbounded_send(item).is_err() {
                break;
            }
        }
    });
    assert!(changes.next().await.unwrap().unwrap().is_none());
    let opts = LockOptions::new();
    let a = election.campaign_with("a", &opts).await.unwrap();
    until(&mut changes, SOON, "a leads", leads("a")).await;
    assert_eq!(counted.subscribed.load(Ordering::SeqCst), 1);

    end_session(
        &hosts,
        internals::session(&watching).await.expect("a session"),
    )
    .await
    .unwrap();
    a.resign().await.unwrap();
    until(&mut changes, SOON, "a resigns", Option::is_none).await;
    // Ending a session from outside is a tug of war with its client, which
    // can take a while on a loaded machine.
    let start = Instant::now();
    while counted.subscribed.load(Ordering::SeqCst) < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the observer never subscribed again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Subscribed on the new session, the observer polls every minute: the
    // next change is heard.
    let b = election.campaign_with("b", &opts).await.unwrap();
    let heard = until(&mut changes, SOON, "b leads", leads("b")).await;
    eprintln!("zookeeper: on a new session, a new leader seen after {heard:?}");
    b.resign().await.unwrap();
}
