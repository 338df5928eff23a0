//! A server that is out of memory (`-M`, full) refuses new locks and
//! renewals, and never hands a held lock to a second owner: the writes this
//! backend sends leave the item alone when they cannot allocate (memcached's
//! meta `ms` unlinks it, which let a contender delete the holder's lock).
//! An out-of-memory answer makes the Locker check every lock it holds at
//! once, since other writers' failed stores may have removed them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{fill_until_full, raw, OwnServer};
use lockwright_conformance::kit::{free_port, unique_prefix};
use lockwright_core::backend::{LockBackend, LockBackendExt};
use lockwright_core::{ErrorKind, LockKey, LockOptions, Locker, LostReason, OwnerToken};
use lockwright_memcached::MemcachedBackend;

/// The smallest memory memcached runs with, so it fills in a moment.
const MEGABYTES: u32 = 8;

/// A key as long as the lock items' keys, so fill items share their slab class.
const NAME: &str = "shared-lock";

struct Full {
    server: OwnServer,
    prefix: String,
}

impl Full {
    fn url(&self) -> String {
        format!(
            "memcache://{}?prefix={}&timeout=2s",
            self.server.addr(),
            self.prefix
        )
    }

    fn item(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The raw value of `name`'s item, or the miss line.
    async fn raw_value(&self, name: &str) -> String {
        raw(
            &self.server.addr(),
            format!("mg {} v\r\n", self.item(name)).as_bytes(),
        )
        .await
        .expect("raw mg")
    }

    /// Fills the server with items the size of `name`'s lock item.
    async fn fill(&self, name: &str) {
        let value = self.raw_value(name).await;
        let value_len = value
            .lines()
            .nth(1)
            .unwrap_or_else(|| panic!("{name} is not held: {value:?}"))
            .len();
        let stored = fill_until_full(&self.server.addr(), self.item(name).len(), value_len)
            .await
            .expect("fill the server");
        // A lock-sized add is refused now: the test is about a full server.
        let probe = raw(
            &self.server.addr(),
            format!(
                "add probe-{} 0 0 {value_len}\r\n{}\r\n",
                self.prefix,
                "p".repeat(value_len)
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        assert!(
            probe.contains("out of memory"),
            "not full after {stored} items: {probe:?}"
        );
    }
}

fn full_server() -> Full {
    Full {
        server: OwnServer::start(free_port(), MEGABYTES),
        prefix: unique_prefix(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_never_hands_a_held_lock_to_another_owner() {
    let s = full_server();
    let backend = MemcachedBackend::connect(&s.url()).unwrap();
    let (key, holder) = (LockKey::new(NAME).unwrap(), OwnerToken::generate());
    let ttl = Duration::from_secs(60);
    assert!(matches!(
        backend.try_lock(&key, &holder, ttl).await,
        Ok(lockwright_core::backend::Acquire::Acquired(_))
    ));
    s.fill(NAME).await;
    let held = s.raw_value(NAME).await;
    assert!(held.contains(holder.as_str()), "{held:?}");

    // A contender on the full server: the lock is held, so "contended",
    // and the holder's item is untouched.
    let other = Locker::new(MemcachedBackend::connect(&s.url()).unwrap());
    for _ in 0..3 {
        let got = other
            .try_lock(NAME)
            .await
            .expect("a held lock on a full server is contended, not an error");
        assert!(got.is_none(), "a second owner got a held lock");
        assert_eq!(
            s.raw_value(NAME).await,
            held,
            "a contender changed the lock"
        );
    }
    let status = other.status(NAME).await.expect("status");
    assert!(status.held, "status says free while it is held");

    // The holder's renewal is refused for want of memory, and leaves the
    // lock in place until its lease ends.
    let e = backend
        .renew_lock(&key, &holder, ttl)
        .await
        .expect_err("a renewal on a full server cannot store");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("out of memory"), "{e}");
    assert_eq!(
        s.raw_value(NAME).await,
        held,
        "a failed renewal removed the lock"
    );
    assert!(other.try_lock(NAME).await.unwrap().is_none());

    // A re-entry needs a write too: refused, and the lock stays.
    let e = backend
        .try_lock(&key, &holder, ttl)
        .await
        .expect_err("a re-entry on a full server cannot store");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert_eq!(s.raw_value(NAME).await, held);

    // A free key cannot be stored: an error that says why, not "contended".
    let e = other
        .try_lock("another-lock")
        .await
        .expect_err("a new lock on a full server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("out of memory"), "{e}");

    // Release needs no memory.
    assert_eq!(
        backend.unlock(&key, &holder).await.unwrap(),
        lockwright_core::backend::Release::Freed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_out_of_memory_answer_makes_the_locker_check_its_locks_at_once() {
    let s = full_server();
    let locker = Locker::new(MemcachedBackend::connect(&s.url()).unwrap());
    // Renewed every 100 s: the check must come long before that, however
    // long filling the server takes on a loaded machine.
    let guard = locker
        .lock_with(NAME, &LockOptions::new().ttl(Duration::from_secs(300)))
        .await
        .expect("lock");
    s.fill(NAME).await;
    // Another writer's failed meta store (an older client, another
    // application) unlinks the lock item: what a full server does.
    let len = s.raw_value(NAME).await.lines().nth(1).unwrap().len();
    let foreign = raw(
        &s.server.addr(),
        format!(
            "ms {} {len} ME T60\r\n{}\r\n",
            s.item(NAME),
            "x".repeat(len)
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    assert!(foreign.contains("out of memory"), "{foreign:?}");
    assert!(
        s.raw_value(NAME).await.starts_with("EN"),
        "the item survived"
    );
    assert!(!guard.is_lost(), "lost before anything could tell");
    // The unlinked item freed a chunk of the lock's size: full again.
    fill_until_full(&s.server.addr(), s.item(NAME).len(), len)
        .await
        .unwrap();

    // This Locker meets the full server on another key: it checks the
    // lock it holds now, finds it gone, and says so. memcached may find a
    // chunk for that key meanwhile (its slab mover gives pages to classes
    // that need them, on its own schedule): then the new lock goes, its
    // size is filled too, and the Locker tries again.
    let mut tries = 0;
    let e = loop {
        let other = s.item("another-lock").len();
        fill_until_full(&s.server.addr(), other, len).await.unwrap();
        match locker.try_lock("another-lock").await {
            Err(e) => break e,
            Ok(g) if tries < 5 => {
                tries += 1;
                drop(g);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(g) => panic!("a new lock on a full server, 6 times: {g:?}"),
        }
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let reason = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the lost signal fires at once, not at the next renewal 100 s later");
    assert_eq!(reason, LostReason::NotHeld);
}

/// The same rule in a quorum: every server full, a held lock stays held,
/// and contenders are told "contended".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_quorum_never_hands_a_held_lock_to_another_owner() {
    let servers: Vec<Full> = (0..3).map(|_| full_server()).collect();
    let prefix = unique_prefix();
    let url = format!(
        "memcache://{}?prefix={prefix}&timeout=1s",
        servers
            .iter()
            .map(|s| s.server.addr())
            .collect::<Vec<_>>()
            .join(",")
    );
    let servers: Vec<Full> = servers
        .into_iter()
        .map(|s| Full {
            server: s.server,
            prefix: prefix.clone(),
        })
        .collect();
    let holder = Locker::new(MemcachedBackend::connect(&url).unwrap());
    let guard = holder
        .lock_with(NAME, &LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .expect("lock");
    for s in &servers {
        s.fill(NAME).await;
    }
    let other: Arc<dyn LockBackend> = Arc::new(MemcachedBackend::connect(&url).unwrap());
    let other = Locker::from_arc(other);
    for _ in 0..3 {
        assert!(
            other.try_lock(NAME).await.expect("contended").is_none(),
            "a second owner got a held lock"
        );
    }
    let vote = format!("{} 1\r\n", guard.owner().as_str());
    for s in &servers {
        assert!(
            s.raw_value(NAME).await.ends_with(&vote),
            "a contender removed a vote"
        );
    }
    // A re-entry by the holder is refused on every server (each must
    // store one more hold); the refusals changed nothing, so nothing is
    // undone: an undo would release the hold the owner had before.
    let again = MemcachedBackend::connect(&url).unwrap();
    let e = again
        .try_lock(
            &LockKey::new(NAME).unwrap(),
            guard.owner(),
            Duration::from_secs(60),
        )
        .await
        .expect_err("a re-entry on full servers cannot store");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    for s in &servers {
        assert!(
            s.raw_value(NAME).await.ends_with(&vote),
            "a failed re-entry took away the owner's hold: {:?}",
            s.raw_value(NAME).await
        );
    }
    assert!(other.try_lock(NAME).await.expect("contended").is_none());
    assert!(!guard.is_lost());
}
