//! The queue's own rules, checked against the real server: a node is ours
//! only while the session that made it owns it, whatever its path; and a
//! waiter watches the node just before its own, not the holder's.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{raw_client, server_hosts};
use lockwright_core::backend::{
    Acquire, AcquireRequest, HoldId, HoldKind, LockBackend, LockBackendExt,
};
use lockwright_core::{ErrorKind, LockKey, LockOptions, Locker, LostReason, OwnerToken};
use lockwright_zk::internals::{self, zookeeper_client as zk};
use lockwright_zk::ZkBackend;

fn root(name: &str) -> String {
    format!("/lockwright-queue-{name}-{}", std::process::id())
}

fn backend(hosts: &str, root: &str) -> Arc<ZkBackend> {
    Arc::new(ZkBackend::connect(&format!("zk://{hosts}{root}?session_timeout=6s")).unwrap())
}

/// The queue of `key`'s directory, in queue order (by the sequence after
/// the last `lock-`, as Curator sorts it), as full paths.
async fn queue(raw: &zk::Client, root: &str, key: &str) -> Vec<String> {
    let dir = format!("{root}/{}", internals::dir_name(key, false));
    let mut children = match raw.list_children(&dir).await {
        Ok(c) => c,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {dir}: {e}"),
    };
    let seq = |c: &String| {
        c.rsplit_once("lock-")
            .map_or(c.clone(), |(_, s)| s.to_owned())
    };
    children.sort_by_key(seq);
    children.into_iter().map(|c| format!("{dir}/{c}")).collect()
}

/// Polls `queue` until it is `len` long.
async fn queue_of(raw: &zk::Client, root: &str, key: &str, len: usize) -> Vec<String> {
    let start = Instant::now();
    loop {
        let q = queue(raw, root, key).await;
        if q.len() == len {
            return q;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the queue of {key} is {q:?}, not {len} nodes long"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Deletes our node and, in `other`'s session, makes a node at the very
/// same path: what a holder sees after its session ended and a process
/// with that node name took it (CURATOR-604), or an operator's mistake.
async fn take_over(other: &zk::Client, path: &str) {
    other.delete(path, None).await.unwrap();
    other
        .create(
            path,
            b"someone else",
            &zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();
}

/// A node at our path that another session made is not ours: the
/// renewal answers NotHeld and the lost signal fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_remade_at_our_path_by_another_session_is_not_renewed() {
    let hosts = server_hosts();
    let root = root("remade-renewed");
    let locker = Locker::from_arc(backend(&hosts, &root));
    let other = raw_client(&hosts).await;
    // Renewed only by hand: the answer below is this renewal's.
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .auto_renew(false);
    let guard = locker.lock_with("k", &opts).await.unwrap();
    let ours = queue_of(&other, &root, "k", 1).await.remove(0);
    take_over(&other, &ours).await;
    let e = guard
        .renew()
        .await
        .expect_err("renewed a node another session made");
    assert_eq!(e.kind(), ErrorKind::Lost, "{e}");
    let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the lost signal did not fire");
    assert_eq!(reason, LostReason::NotHeld);
}

/// A node at our path that another session made is not ours: a re-entry
/// does not join it, but queues behind it (and so is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_remade_at_our_path_by_another_session_is_not_reentered() {
    let hosts = server_hosts();
    let root = root("remade-reentered");
    let store = backend(&hosts, &root);
    let other = raw_client(&hosts).await;
    let (key, owner) = (LockKey::new("k").unwrap(), OwnerToken::generate());
    let ttl = Duration::from_secs(30);
    let got = store.try_lock(&key, &owner, ttl).await.unwrap();
    assert!(matches!(got, Acquire::Acquired(_)), "{got:?}");
    let ours = queue_of(&other, &root, "k", 1).await.remove(0);
    take_over(&other, &ours).await;
    let again = store.try_lock(&key, &owner, ttl).await.unwrap();
    assert!(
        matches!(again, Acquire::Contended { .. }),
        "re-entered a node another session made: {again:?}"
    );
}

/// Holder H, then waiters W1 and W2, each its own client and session:
/// each waiter watches the node just before its own (W1 watches H's node,
/// W2 watches W1's), so a release wakes one waiter, not all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_watches_the_node_just_before_its_own() {
    let hosts = server_hosts();
    let root = root("predecessor");
    let raw = raw_client(&hosts).await;
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_for(Duration::from_secs(60));
    let holder = Locker::from_arc(backend(&hosts, &root));
    let h = holder.lock_with("k", &opts).await.unwrap();

    let mut waiters = Vec::new();
    let mut tasks = Vec::new();
    for n in 1..=2 {
        let store = backend(&hosts, &root);
        let locker = Locker::from_arc(store.clone());
        let opts = opts.clone();
        tasks.push(tokio::spawn(async move {
            locker.lock_with("k", &opts).await.map(drop)
        }));
        // Each queues after the one before is in the queue.
        queue_of(&raw, &root, "k", n + 1).await;
        waiters.push(store);
    }
    let q = queue(&raw, &root, "k").await;
    assert_eq!(q.len(), 3, "{q:?}");
    for (n, store) in waiters.iter().enumerate() {
        let start = Instant::now();
        let watched = loop {
            let w = internals::watched(store);
            if !w.is_empty() {
                break w;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "waiter {} set no watch",
                n + 1
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(
            watched,
            vec![q[n].clone()],
            "waiter {} (node {}) watches the wrong node; the queue is {q:?}",
            n + 1,
            q[n + 1]
        );
    }
    h.release().await.unwrap();
    for t in tasks {
        t.abort();
    }
}

/// A hold of one permit of 2 on `key`, by a fresh owner.
fn permit_of_2(key: &LockKey) -> HoldId {
    let kind = HoldKind::of_claim(lockwright_core::Claim::Exclusive { permits: 2 });
    HoldId::new(key.clone(), OwnerToken::generate(), kind)
}

/// A semaphore's permit is taken without the gate only while nobody is at
/// it: with a permit free but a Java waiter at the gate (Curator keeps a
/// waiting lease only there), an attempt goes to the gate, behind it, and
/// its own lease goes at once; it is granted once the gate is clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permit_never_passes_a_waiter_at_the_gate() {
    let hosts = server_hosts();
    let root = root("gate");
    let (first, second) = (backend(&hosts, &root), backend(&hosts, &root));
    let raw = raw_client(&hosts).await;
    let key = LockKey::new("s").unwrap();
    let permit = || permit_of_2(&key);
    let ttl = Duration::from_secs(30);
    let attempt = |hold: &HoldId| AcquireRequest::new(hold.clone(), ttl);
    let holder = permit();
    let got = first.try_acquire(&attempt(&holder)).await.unwrap();
    assert!(matches!(got, Acquire::Acquired(_)), "{got:?}");
    let dir = format!("{root}/{}", internals::dir_name("s", false));
    let leases = format!("{dir}/leases");
    assert_eq!(raw.list_children(&leases).await.unwrap().len(), 1);
    match raw
        .create(
            &format!("{dir}/locks"),
            &[],
            &zk::CreateMode::Container.with_acls(zk::Acls::anyone_all()),
        )
        .await
    {
        Ok(_) | Err(zk::Error::NodeExists) => {}
        Err(e) => panic!("make the gate: {e}"),
    }
    let waiter = format!("{dir}/locks/_c_0b6ea0a4-52f1-4c3e-9d1b-6a4f3c2e1d00-lock-");
    let (_, seq) = raw
        .create(
            &waiter,
            &[],
            &zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all()),
        )
        .await
        .unwrap();

    let late = permit();
    let got = second.try_acquire(&attempt(&late)).await.unwrap();
    assert!(
        matches!(got, Acquire::Contended { .. }),
        "a permit passed the waiter at the gate: {got:?}"
    );
    assert_eq!(
        raw.list_children(&leases).await.unwrap().len(),
        1,
        "the refused attempt's lease stayed"
    );
    raw.delete(&format!("{waiter}{seq}"), None).await.unwrap();
    let got = second.try_acquire(&attempt(&late)).await.unwrap();
    assert!(matches!(got, Acquire::Acquired(_)), "{got:?}");
    assert_eq!(raw.list_children(&leases).await.unwrap().len(), 2);
    second.release(&late).await.unwrap();
    first.release(&holder).await.unwrap();
}

/// A semaphore's grant taken at its gate (a new semaphore's first permit
/// is) leaves the gate empty before it is told: a look right after finds
/// no node there, and another client's `try_acquire` right after is
/// granted a free permit, not turned away by a gate node whose delete is
/// still in flight. Many fresh names, as the race is a short one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grant_at_the_gate_leaves_it_empty_before_it_is_told() {
    let hosts = server_hosts();
    let root = root("gate-empty");
    let (first, second) = (backend(&hosts, &root), backend(&hosts, &root));
    let raw = raw_client(&hosts).await;
    let ttl = Duration::from_secs(30);
    for i in 0..40 {
        let name = format!("s{i}");
        let key = LockKey::new(&name).unwrap();
        let (a, b) = (permit_of_2(&key), permit_of_2(&key));
        let got = first
            .try_acquire(&AcquireRequest::new(a.clone(), ttl))
            .await
            .unwrap();
        assert!(matches!(got, Acquire::Acquired(_)), "{name}: {got:?}");
        let gate = format!("{root}/{}/locks", internals::dir_name(&name, false));
        let at_gate = match raw.list_children(&gate).await {
            Ok(c) => c,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => panic!("list {gate}: {e}"),
        };
        assert_eq!(
            at_gate,
            Vec::<String>::new(),
            "{name}: the gate after a grant"
        );
        let got = second
            .try_acquire(&AcquireRequest::new(b.clone(), ttl))
            .await
            .unwrap();
        assert!(
            matches!(got, Acquire::Acquired(_)),
            "{name}: a try right after another client's grant, one permit of 2 free: {got:?}"
        );
        second.release(&b).await.unwrap();
        first.release(&a).await.unwrap();
    }
}

/// `status` of a semaphore: its first N leases hold, and a client waiting
/// at the gate (its lease one past them, in Curator's layout) is a waiter,
/// never one more holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphores_waiter_is_queued_not_a_holder() {
    let hosts = server_hosts();
    let root = root("semaphore-status");
    let lockers: Vec<Locker> = (0..3)
        .map(|_| Locker::from_arc(backend(&hosts, &root)))
        .collect();
    let opts = LockOptions::new().wait_for(Duration::from_secs(30));
    let a = lockers[0]
        .semaphore("k", 2)
        .unwrap()
        .acquire_with(&opts)
        .await
        .unwrap();
    let b = lockers[1]
        .semaphore("k", 2)
        .unwrap()
        .acquire_with(&opts)
        .await
        .unwrap();
    let third = lockers[2].semaphore("k", 2).unwrap();
    let waiting = tokio::spawn(async move { third.acquire_with(&opts).await });
    let start = Instant::now();
    let s = loop {
        let s = lockers[0].status("k").await.unwrap();
        if s.waiters == Some(1) {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never queued: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((s.permits, s.holders.len()), (Some(2), 2), "{s:?}");
    let fences: Vec<_> = s.holders.iter().map(|h| h.fence).collect();
    assert_eq!(fences, vec![a.fence(), b.fence()], "{s:?}");

    a.release().await.unwrap();
    let c = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served once a permit came back")
        .unwrap()
        .unwrap();
    let s = lockers[0].status("k").await.unwrap();
    assert_eq!((s.holders.len(), s.waiters), (2, Some(0)), "{s:?}");
    let fences: Vec<_> = s.holders.iter().map(|h| h.fence).collect();
    assert_eq!(fences, vec![b.fence(), c.fence()], "{s:?}");
    b.release().await.unwrap();
    c.release().await.unwrap();
}
