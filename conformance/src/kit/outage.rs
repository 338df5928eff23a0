//! A store stopped for a few seconds under a waiter: the scenario each
//! store whose private server the tests may stop runs (`scripts/fault-server`).
//! A caller that said it would wait rides the outage out; one whose wait
//! ends first is told the store's error, not that the lock was held.

use std::time::{Duration, Instant};

use lockwright_core::{ErrorKind, LockOptions, Locker};

use super::fault_server::{self, Stopped};

/// Holds a lock with one client while another waits for it (up to a
/// minute), stops `server` for `down` (at least 2 s), starts it again, and
/// releases: the waiter gets the lock. While the server is down, a third
/// acquire with a 1 s wait reports `Unavailable` after its wait, and a
/// no-wait attempt fails at once. `locker` makes a client of the server.
///
/// # Panics
/// Where the store or the core breaks one of those promises.
pub async fn waiter_rides_out_a_stop(server: &str, down: Duration, locker: impl Fn() -> Locker) {
    fault_server::start(server);
    let (a, b) = (locker(), locker());
    let key = format!("outage-wait/{}", std::process::id());
    let held = a
        .lock_with(
            key.as_str(),
            &LockOptions::new().ttl(Duration::from_secs(5)),
        )
        .await
        .unwrap_or_else(|e| panic!("{server}: lock before the stop: {e}"));
    let waiting = {
        let key = key.clone();
        let long = LockOptions::new().wait_for(Duration::from_secs(60));
        tokio::spawn(async move { b.lock_with(key.as_str(), &long).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!waiting.is_finished(), "{server}: the waiter did not wait");

    let mut stopped = Stopped::new();
    stopped.stop(server);
    let down_since = Instant::now();
    let c = locker();
    let e = c
        .try_lock("outage-wait/other")
        .await
        .expect_err("try_lock on a stopped server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{server}: {e}");
    let start = Instant::now();
    let short = LockOptions::new().wait_for(Duration::from_secs(1));
    let e = c
        .lock_with("outage-wait/other", &short)
        .await
        .expect_err("a short wait on a stopped server");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{server}: {}", e.chain());
    assert!(
        start.elapsed() >= Duration::from_millis(950),
        "{server}: a 1 s wait gave up after {:?}",
        start.elapsed()
    );
    let rest = down
        .max(Duration::from_secs(2))
        .saturating_sub(down_since.elapsed());
    tokio::time::sleep(rest).await;
    assert!(
        !waiting.is_finished(),
        "{server}: the waiter ended during the outage: {:?}",
        waiting.await.map(|r| r.map(|g| g.fence()))
    );
    stopped.start(server);
    let back = Instant::now();
    // Kept across the restart (a database) or forgotten with it (a Redis
    // that keeps nothing on disk): either way, the holder lets go.
    let _ = held.release().await;
    let got = tokio::time::timeout(Duration::from_secs(40), waiting)
        .await
        .unwrap_or_else(|_| panic!("{server}: the waiter was not served after the restart"))
        .expect("waiter task")
        .unwrap_or_else(|e| panic!("{server}: the waiter failed: {}", e.chain()));
    eprintln!(
        "{server}: the waiter got the lock {:?} after the restart",
        back.elapsed()
    );
    got.release().await.expect("release after the restart");
}
