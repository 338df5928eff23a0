//! Election observers for backend tests: a change heard by the store's
//! notice, told apart from one found by the poll.

use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use lockwright_core::{Leader, LockOptions, Locker, Result};

/// A poll far longer than any test: a change seen within [`SOON`] was
/// heard by notice.
pub const NEVER: Duration = Duration::from_secs(60);
/// How soon a notice must show, generous for a loaded host.
pub const SOON: Duration = Duration::from_secs(5);

/// Reads `changes` until an item satisfies `want`, for up to `within`;
/// how long that took.
pub async fn until<S>(
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

/// The leader's value is `value`.
pub fn leads(value: &'static str) -> impl Fn(&Option<Leader>) -> bool {
    move |l| l.as_ref().is_some_and(|l| l.value == value.as_bytes())
}

/// A campaign, a proclaim, a resignation, a new leader, and a hand-off
/// to a waiting candidate as its leader resigns, each seen within
/// [`SOON`] by an observer that polls every [`NEVER`]: how long after
/// the proclaim, the resignation, the second campaign and the second
/// resignation returned each showed.
pub async fn heard_by_notice(locker: &Locker, name: &str, opts: &LockOptions) -> [Duration; 4] {
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
