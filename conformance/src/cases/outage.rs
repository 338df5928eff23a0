//! Outage: a store that cannot be reached is an `Unavailable` error, never
//! "held by someone else" and never a timeout.

use lockwright_core::backend::LockBackendExt;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use lockwright_core::backend::{Binding, LockBackend, Release, Renew};
use lockwright_core::{ErrorKind, Locker, OwnerToken};

use super::{key, long, LONG_TTL};
use crate::Harness;

/// How long the outage cases' waits last: a wait rides an outage out to
/// its end.
pub(crate) const OUTAGE_WAIT: Duration = Duration::from_secs(2);

/// A store that cannot be reached is an `Unavailable` error on every path,
/// never "held by someone else" and never a timeout; a wait tries until it
/// ends, then reports the store's error.
pub async fn unavailable_is_an_error_not_contention(h: &dyn Harness) -> Result<()> {
    let k = key("unavailable_is_an_error_not_contention", "k");
    let down = h.unreachable_client().await;
    let owner = OwnerToken::generate();
    let kind = |r: std::result::Result<(), lockwright_core::Error>| r.err().map(|e| e.kind());
    let want = Some(ErrorKind::Unavailable);
    ensure!(
        kind(down.try_lock(&k, &owner, LONG_TTL).await.map(|_| ())) == want,
        "try_acquire on a down store"
    );
    // A session-bound client knows without asking that it holds nothing, so
    // it may say NotHeld; nobody may claim a release or renewal succeeded.
    let session = down.capabilities().binding == Binding::Session;
    let r = down.unlock(&k, &owner).await;
    ensure!(
        r.as_ref().err().map(|e| e.kind()) == want
            || (session && matches!(r, Ok(Release::NotHeld))),
        "release on a down store: {r:?}"
    );
    let r = down.renew_lock(&k, &owner, LONG_TTL).await;
    ensure!(
        r.as_ref().err().map(|e| e.kind()) == want || (session && matches!(r, Ok(Renew::NotHeld))),
        "renew on a down store: {r:?}"
    );
    let l = Locker::from_arc(down);
    ensure!(
        kind(l.try_lock(&k).await.map(|_| ())) == want,
        "try_lock on a down store"
    );
    // A wait rides the outage out to its end, then says why it failed.
    let start = Instant::now();
    let waited = l
        .lock_with(&k, &long().wait_for(OUTAGE_WAIT))
        .await
        .map(|_| ());
    ensure!(kind(waited) == want, "lock with a wait on a down store");
    ensure!(
        start.elapsed() >= OUTAGE_WAIT - Duration::from_millis(50),
        "lock on a down store gave up after {:?}, before its wait ended",
        start.elapsed()
    );
    ensure!(
        start.elapsed() < Duration::from_secs(15),
        "lock on a down store went on {:?} past its wait",
        start.elapsed() - OUTAGE_WAIT
    );
    Ok(())
}
