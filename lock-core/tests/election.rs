//! The election's observer: reigns in order even when a read comes back
//! stale, one error per outage, and a reign's end at its lease whatever
//! the poll interval.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use locksmith_core::backend::{LockBackend, MemoryBackend};
use locksmith_core::{
    Error, ErrorKind, FencingToken, LockKey, LockOptions, LockStatus, Locker, OwnerToken, Result,
};

/// A memory store whose `inspect` answers from a script while it lasts.
#[derive(Debug, Default)]
struct Scripted {
    store: MemoryBackend,
    reads: Mutex<VecDeque<Result<LockStatus>>>,
}

locksmith_core::forward_backend! {
    (self) => self.store;
    impl LockBackend for Scripted {
        // The script stands for what a lagging replica or a flaky network
        // would answer.
        async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
            let next = self.reads.lock().unwrap().pop_front();
            match next {
                Some(read) => read,
                None => self.store.inspect(key).await,
            }
        }
    }
}

fn reign(owner: &OwnerToken, term: u64, value: &str) -> Result<LockStatus> {
    Ok(LockStatus::held(1)
        .with_fence(Some(FencingToken(term)))
        .with_owner(Some(owner.clone()))
        .with_value(Some(value.as_bytes().to_vec())))
}

#[tokio::test]
async fn an_older_reign_read_late_is_never_shown_after_a_newer_one() {
    let (a, b) = (OwnerToken::generate(), OwnerToken::generate());
    let scripted = Scripted::default();
    scripted.reads.lock().unwrap().extend([
        reign(&a, 5, "a"),
        reign(&b, 6, "b"),
        // Stale: the older reign, read from behind.
        reign(&a, 5, "a"),
        reign(&b, 6, "b"),
        Ok(LockStatus::free()),
        // Stale again, after nobody led.
        reign(&b, 6, "b"),
    ]);
    let locker = Locker::new(scripted);
    let election = locker.election("e").unwrap();
    let seen: Vec<Option<(u64, Vec<u8>)>> = election
        .observe_every(Duration::from_millis(1))
        .take(3)
        .map(|r| r.unwrap().map(|l| (l.term.unwrap().0, l.value)))
        .collect()
        .await;
    assert_eq!(
        seen,
        vec![Some((5, b"a".to_vec())), Some((6, b"b".to_vec())), None]
    );
}

#[tokio::test]
async fn an_outage_is_one_error_then_the_leader_again() {
    let scripted = Scripted::default();
    let down = || Err(Error::unavailable("down"));
    scripted
        .reads
        .lock()
        .unwrap()
        .extend([Ok(LockStatus::free()), down(), down(), down()]);
    let locker = Locker::new(scripted);
    let election = locker.election("e").unwrap();
    let leadership = election.campaign("a", &LockOptions::new()).await.unwrap();
    let mut changes = Box::pin(election.observe_every(Duration::from_millis(1)));
    assert!(changes.next().await.unwrap().unwrap().is_none());
    let err = changes.next().await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    let back = changes.next().await.unwrap().unwrap().unwrap();
    assert_eq!(back.value, b"a");
    leadership.resign().await.unwrap();
}

#[tokio::test]
async fn a_reign_ends_at_its_lease_even_between_polls() {
    let store = MemoryBackend::new();
    let key = LockKey::new("e").unwrap();
    let owner = OwnerToken::generate().with_value("a").unwrap();
    let ttl = Duration::from_millis(300);
    let granted = Instant::now();
    store.try_acquire(&key, &owner, ttl).await.unwrap();
    let locker = Locker::new(store);
    let election = locker.election(&key).unwrap();
    // A poll far longer than the lease: the end comes from the lease.
    let mut changes = Box::pin(election.observe_every(Duration::from_secs(30)));
    assert_eq!(changes.next().await.unwrap().unwrap().unwrap().value, b"a");
    assert!(changes.next().await.unwrap().unwrap().is_none());
    let at = granted.elapsed();
    assert!(at >= ttl, "the reign ended {at:?} into a {ttl:?} lease");
    assert!(at < Duration::from_secs(5), "the reign ended {at:?} late");
}

#[tokio::test]
async fn values_are_bounded_and_elections_need_a_store_with_values() {
    let locker = Locker::new(MemoryBackend::new());
    let election = locker.election("e").unwrap();
    let too_big = vec![0u8; locksmith_core::MAX_VALUE_LEN + 1];
    let err = election
        .campaign(too_big, &LockOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidOptions);
    assert!(election.leader().await.unwrap().is_none());

    #[derive(Debug, Default)]
    struct NoValues(MemoryBackend);
    locksmith_core::forward_backend! {
        (self) => self.0;
        impl LockBackend for NoValues {
            // A store that keeps no values says so.
            fn capabilities(&self) -> locksmith_core::backend::Capabilities {
                self.0.capabilities().with_values(false)
            }
        }
    }
    let err = Locker::new(NoValues::default()).election("e").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
}
