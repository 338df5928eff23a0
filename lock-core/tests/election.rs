//! The election's observer: reigns in order even when a read comes back
//! stale, one error per outage, a reign's end at its lease whatever the
//! poll interval, and each change heard by the store's notice long before
//! the poll (or by the poll, on a store without notices).

use lockwright_core::backend::LockBackendExt;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use lockwright_core::backend::{AcquireRequest, Changes, LockBackend, MemoryBackend, Quorum};
use lockwright_core::{
    Error, ErrorKind, FencingToken, Leader, LockKey, LockOptions, LockStatus, Locker, OwnerToken,
    Result,
};

/// A memory store whose `inspect` answers from a script while it lasts.
#[derive(Debug, Default)]
struct Scripted {
    store: MemoryBackend,
    reads: Mutex<VecDeque<Result<LockStatus>>>,
}

lockwright_core::forward_backend! {
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
    let leadership = election
        .campaign_with("a", &LockOptions::new())
        .await
        .unwrap();
    let mut changes = Box::pin(election.observe_every(Duration::from_millis(1)));
    assert!(changes.next().await.unwrap().unwrap().is_none());
    let err = changes.next().await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    let back = changes.next().await.unwrap().unwrap().unwrap();
    assert_eq!(back.value, b"a");
    leadership.resign().await.unwrap();
}

/// A reign that lasts through an outage is shown once: the outage is the
/// one error, and the same leader read after it is no change (`leader
/// --watch` once printed the same term twice after an etcd restart).
#[tokio::test]
async fn a_reign_that_outlasts_an_outage_is_shown_once() {
    let a = OwnerToken::generate();
    let scripted = Scripted::default();
    let down = || Err(Error::unavailable("down"));
    scripted.reads.lock().unwrap().extend([
        reign(&a, 68, "a"),
        down(),
        down(),
        reign(&a, 68, "a"),
        reign(&a, 68, "a"),
        Ok(LockStatus::free()),
    ]);
    let locker = Locker::new(scripted);
    let election = locker.election("e").unwrap();
    let seen: Vec<std::result::Result<Option<u64>, ErrorKind>> = election
        .observe_every(Duration::from_millis(1))
        .take(3)
        .map(|r| {
            r.map(|l| l.map(|l| l.term.unwrap().0))
                .map_err(|e| e.kind())
        })
        .collect()
        .await;
    assert_eq!(
        seen,
        vec![Ok(Some(68)), Err(ErrorKind::Unavailable), Ok(None)]
    );
}

#[tokio::test]
async fn a_reign_ends_at_its_lease_even_between_polls() {
    let store = MemoryBackend::new();
    let key = LockKey::new("e").unwrap();
    let owner = OwnerToken::generate();
    let ttl = Duration::from_millis(300);
    let granted = Instant::now();
    let request = AcquireRequest::mutex(&key, &owner, ttl)
        .with_value("a")
        .unwrap();
    store.try_acquire(&request).await.unwrap();
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
    let too_big = vec![0u8; lockwright_core::MAX_VALUE_LEN + 1];
    let err = election
        .campaign_with(too_big, &LockOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidOptions);
    assert!(election.leader().await.unwrap().is_none());

    #[derive(Debug, Default)]
    struct NoValues(MemoryBackend);
    lockwright_core::forward_backend! {
        (self) => self.0;
        impl LockBackend for NoValues {
            // A store that keeps no values says so.
            fn capabilities(&self) -> lockwright_core::backend::Capabilities {
                self.0.capabilities().with_values(false)
            }
        }
    }
    let err = Locker::new(NoValues::default()).election("e").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
}

/// A poll far longer than any test: a change seen within [`SOON`] was
/// heard by notice.
const NEVER: Duration = Duration::from_secs(60);
/// How soon a notice must show, generous for a loaded host.
const SOON: Duration = Duration::from_secs(5);

/// Reads `changes` until an item satisfies `want`, for up to `within`;
/// how long that took.
async fn until<S>(
    changes: &mut S,
    within: Duration,
    what: &str,
    want: impl Fn(&Option<Leader>) -> bool,
) -> Duration
where
    S: Stream<Item = Result<Option<Leader>>> + Unpin,
{
    let start = Instant::now();
    loop {
        let left = within.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, changes.next()).await {
            Ok(Some(Ok(item))) if want(&item) => return start.elapsed(),
            Ok(Some(Ok(_))) => {}
            other => panic!("{what}: not observed within {within:?}: {other:?}"),
        }
    }
}

fn leads(value: &'static str) -> impl Fn(&Option<Leader>) -> bool {
    move |l| l.as_ref().is_some_and(|l| l.value == value.as_bytes())
}

/// A campaign, a proclaim, a resignation, a new leader, and a hand-off
/// to a waiting candidate as its leader resigns, each seen within
/// [`SOON`] by an observer that polls every [`NEVER`]: how long after
/// the proclaim, the resignation, the second campaign and the second
/// resignation returned each showed.
async fn heard_by_notice(locker: &Locker, name: &str, opts: &LockOptions) -> [Duration; 4] {
    let election = locker.election(name).unwrap();
    let mut changes = Box::pin(election.observe_every(NEVER));
    assert!(changes.next().await.unwrap().unwrap().is_none());
    let mut a = election.campaign_with("a", opts).await.unwrap();
    until(&mut changes, SOON, "a leads", leads("a")).await;
    a.proclaim("a-2").await.unwrap();
    let proclaimed = until(&mut changes, SOON, "a proclaims", leads("a-2")).await;
    a.resign().await.unwrap();
    let resigned = until(&mut changes, SOON, "a resigns", Option::is_none).await;
    let b = election.campaign_with("b", opts).await.unwrap();
    let led = until(&mut changes, SOON, "b leads", leads("b")).await;
    let waiting = election.clone();
    let wait = opts.clone().wait_for(SOON * 2);
    let c = tokio::spawn(async move { waiting.campaign_with("c", &wait).await });
    // c is waiting (or about to): b still leads meanwhile.
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.resign().await.unwrap();
    // Straight to c, or through "nobody" first.
    let handed = until(&mut changes, SOON, "c leads after b", leads("c")).await;
    c.await.unwrap().unwrap().resign().await.unwrap();
    [proclaimed, resigned, led, handed]
}

#[tokio::test]
async fn an_observer_hears_each_change_long_before_its_poll() {
    let locker = Locker::new(MemoryBackend::new());
    let delays = heard_by_notice(&locker, "e", &LockOptions::new()).await;
    eprintln!("memory: proclaim, resign, new leader, hand-off seen after {delays:?}");
}

/// The memory store with its notices hidden, as a store without them.
#[derive(Debug, Default)]
struct Unannounced(MemoryBackend);

lockwright_core::forward_backend! {
    (self) => self.0;
    impl LockBackend for Unannounced {
        // The point of the wrapper: a store that announces nothing.
        async fn changes(&self, _key: &LockKey) -> Result<Option<Changes>> {
            Ok(None)
        }
    }
}

/// Without notices, the poll alone shows each change, and no sooner: the
/// speed above is the notices'.
#[tokio::test]
async fn a_store_without_notices_is_polled() {
    let store = Arc::new(Unannounced::default());
    let locker = Locker::from_arc(store.clone());
    let election = locker.election("e").unwrap();
    let mut slow = Box::pin(election.observe_every(NEVER));
    let mut polled = Box::pin(election.observe_every(Duration::from_millis(50)));
    assert!(slow.next().await.unwrap().unwrap().is_none());
    assert!(polled.next().await.unwrap().unwrap().is_none());
    let mut a = election
        .campaign_with("a", &LockOptions::new())
        .await
        .unwrap();
    until(&mut polled, SOON, "a leads", leads("a")).await;
    a.proclaim("a-2").await.unwrap();
    until(&mut polled, SOON, "a proclaims", leads("a-2")).await;
    a.resign().await.unwrap();
    until(&mut polled, SOON, "a resigns", Option::is_none).await;
    let quiet = tokio::time::timeout(Duration::from_secs(1), slow.next()).await;
    assert!(
        quiet.is_err(),
        "a store without notices was heard: {quiet:?}"
    );

    // A quorum of memory stores announces nothing either; its poll works.
    let nodes = vec![
        MemoryBackend::new(),
        MemoryBackend::new(),
        MemoryBackend::new(),
    ];
    let quorum = Quorum::new("memory", nodes, Duration::from_millis(10)).unwrap();
    assert!(quorum
        .changes(&LockKey::new("e").unwrap())
        .await
        .unwrap()
        .is_none());
    let locker = Locker::new(quorum);
    let election = locker.election("e").unwrap();
    let mut polled = Box::pin(election.observe_every(Duration::from_millis(50)));
    assert!(polled.next().await.unwrap().unwrap().is_none());
    let mut a = election
        .campaign_with("a", &LockOptions::new())
        .await
        .unwrap();
    until(&mut polled, SOON, "a leads on the quorum", leads("a")).await;
    a.proclaim("a-2").await.unwrap();
    until(&mut polled, SOON, "a proclaims on the quorum", leads("a-2")).await;
    a.resign().await.unwrap();
    until(
        &mut polled,
        SOON,
        "a resigns on the quorum",
        Option::is_none,
    )
    .await;
}

/// A memory store whose subscriptions the test can end, as a lost
/// connection ends a real store's.
#[derive(Debug, Default)]
struct Cuttable {
    store: MemoryBackend,
    feeds: Mutex<Vec<tokio::task::AbortHandle>>,
    subscribed: AtomicUsize,
    /// How many subscriptions to refuse before making one.
    refusals: AtomicUsize,
}

impl Cuttable {
    /// Ends every subscription made so far.
    fn cut(&self) {
        for feed in self.feeds.lock().unwrap().drain(..) {
            feed.abort();
        }
    }
}

lockwright_core::forward_backend! {
    (self) => self.store;
    impl LockBackend for Cuttable {
        // The store's notices, relayed by a task the test can end.
        async fn changes(&self, key: &LockKey) -> Result<Option<Changes>> {
            let refuse = |n: usize| n.checked_sub(1);
            if self.refusals.fetch_update(Ordering::SeqCst, Ordering::SeqCst, refuse).is_ok() {
                return Err(Error::unavailable("cannot subscribe (injected fault)"));
            }
            self.subscribed.fetch_add(1, Ordering::SeqCst);
            let Some(mut inner) = self.store.changes(key).await? else {
                return Ok(None);
            };
            let (tx, rx) = tokio::sync::watch::channel(0u64);
            let feed = tokio::spawn(async move {
                while inner.notice().await.is_some() {
                    tx.send_modify(|v| *v += 1);
                }
            });
            self.feeds.lock().unwrap().push(feed.abort_handle());
            Ok(Some(Changes::new(rx, None)))
        }
    }
}

/// A subscription that ends is made again, within a second whatever the
/// poll, and the next change is heard by notice.
#[tokio::test]
async fn an_ended_subscription_is_made_again() {
    let store = Arc::new(Cuttable::default());
    let locker = Locker::from_arc(store.clone());
    let election = locker.election("e").unwrap();
    let mut changes = Box::pin(election.observe_every(NEVER));
    assert!(changes.next().await.unwrap().unwrap().is_none());
    let a = election
        .campaign_with("a", &LockOptions::new())
        .await
        .unwrap();
    until(&mut changes, SOON, "a leads", leads("a")).await;
    assert_eq!(store.subscribed.load(Ordering::SeqCst), 1);
    store.cut();
    a.resign().await.unwrap();
    // The change made while no subscription lived is read when the
    // observer subscribes again.
    until(&mut changes, SOON, "a resigns", Option::is_none).await;
    let b = election
        .campaign_with("b", &LockOptions::new())
        .await
        .unwrap();
    until(&mut changes, SOON, "b leads", leads("b")).await;
    assert_eq!(store.subscribed.load(Ordering::SeqCst), 2);
    b.resign().await.unwrap();
}

/// A subscription that cannot be made is tried again; meanwhile the store
/// is read every second, however long the poll, since the long poll relied
/// on notices.
#[tokio::test]
async fn a_refused_subscription_is_tried_again_and_polled_meanwhile() {
    let store = Arc::new(Cuttable::default());
    store.refusals.store(2, Ordering::SeqCst);
    let locker = Locker::from_arc(store.clone());
    let election = locker.election("e").unwrap();
    let mut changes = Box::pin(election.observe_every(NEVER));
    assert!(changes.next().await.unwrap().unwrap().is_none());
    let mut a = election
        .campaign_with("a", &LockOptions::new())
        .await
        .unwrap();
    let polled = until(&mut changes, SOON, "a leads", leads("a")).await;
    assert!(polled < Duration::from_secs(2), "a took {polled:?}");
    // Refused twice, a second apart: subscribed by the third try.
    let start = Instant::now();
    while store.subscribed.load(Ordering::SeqCst) == 0 {
        assert!(start.elapsed() < SOON, "never subscribed again");
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The stream works only while polled.
        let _ = tokio::time::timeout(Duration::from_millis(1), changes.next()).await;
    }
    a.proclaim("a-2").await.unwrap();
    until(&mut changes, SOON, "a proclaims", leads("a-2")).await;
    a.resign().await.unwrap();
}

/// A proclaim that reached part of a bare quorum of the holder's nodes
/// leaves the quorum with no value a majority agrees on: the leader is
/// still shown with one it advertised, never with none.
#[tokio::test]
async fn a_partial_proclaim_on_a_bare_quorum_shows_a_value_the_leader_advertised() {
    let nodes: Vec<Arc<MemoryBackend>> = (0..3).map(|_| Arc::new(MemoryBackend::new())).collect();
    let quorum = Quorum::new("memory", nodes.clone(), Duration::from_millis(10)).unwrap();
    let k = LockKey::new("partial-proclaim").unwrap();
    let owner = OwnerToken::generate();
    let request = AcquireRequest::mutex(&k, &owner, Duration::from_secs(30))
        .with_value("old")
        .unwrap();
    for node in &nodes[..2] {
        let granted = node.try_acquire(&request).await.unwrap();
        assert!(matches!(
            granted,
            lockwright_core::backend::Acquire::Acquired(_)
        ));
    }
    nodes[0].proclaim_as(&k, &owner, b"new").await.unwrap();
    let status = quorum.inspect(&k).await.unwrap();
    assert!(status.held, "{status:?}");
    let value = status.value.expect("a value the leader advertised");
    assert!(value == b"old" || value == b"new", "{value:?}");
}
