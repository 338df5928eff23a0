//! What the examples share: the store they run on, separate clients of it,
//! and a tag that keeps one run's lock names apart from an earlier run's.

// Each example uses only some of these.
#![allow(dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

use lockwright::Locker;

/// The store when none is given: an SQLite file named after the example in
/// the temp dir (created if missing).
pub(crate) fn default_url(example: &str) -> String {
    let file = std::env::temp_dir().join(format!("lockwright-example-{example}.db"));
    format!("sqlite://{}", file.display())
}

/// The store: the first argument that is not a flag, else [`default_url`].
pub(crate) fn store_url(example: &str) -> String {
    std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .unwrap_or_else(|| default_url(example))
}

/// Separate clients of one store. `memory://` is private to each
/// `connect`, so its clients share one in-process store instead.
pub(crate) async fn clients(url: &str, n: usize) -> lockwright::Result<Vec<Locker>> {
    if url.starts_with("memory:") {
        let shared = lockwright::backend::open(url).await?;
        return Ok((0..n).map(|_| Locker::from_arc(shared.clone())).collect());
    }
    let mut lockers = Vec::with_capacity(n);
    for _ in 0..n {
        lockers.push(lockwright::connect(url).await?);
    }
    Ok(lockers)
}

/// Tells this run's lock names from an earlier run's, whose leases may
/// still be in the store.
pub(crate) fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{}-{nanos}", std::process::id())
}
