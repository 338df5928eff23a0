//! A semaphore that limits concurrent calls to a rate-limited API across processes.
//!
//! The API allows 3 callers at once and refuses the rest (an HTTP 429 in real
//! life). Every caller takes one of the semaphore's 3 permits around its call,
//! waiting for one when all are out, so the fleet never goes over the limit
//! however many callers it has.
//!
//! The demo runs 12 workers, each its own client of the store (a `Locker`, as
//! a separate process would have), against a fake API that takes 100 ms per
//! call and counts its callers at once. It checks that it never saw more than
//! 3 and that all 12 calls completed, and exits 0 only then.
//!
//! ```sh
//! cargo run -p lockwright --example rate_limited_api                # an SQLite file in the temp dir
//! cargo run -p lockwright --example rate_limited_api -- sqlite:///tmp/api.db
//! cargo run -p lockwright --features redis --example rate_limited_api -- redis://127.0.0.1:6379
//! ```

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockwright::backend::RedactedUrl;
use lockwright::{LockOptions, Locker};

/// Callers.
const WORKERS: usize = 12;
/// The API's limit, and the semaphore's permits.
const LIMIT: u32 = 3;
/// How long one call takes.
const CALL_TAKES: Duration = Duration::from_millis(100);

/// A stand-in for the rate-limited API: it counts the callers inside at once.
#[derive(Debug, Default)]
struct FakeApi {
    inside: AtomicUsize,
    most: AtomicUsize,
    served: AtomicUsize,
    refused: AtomicUsize,
}

impl FakeApi {
    /// One call; refused if more than `LIMIT` callers were inside at once.
    async fn call(&self) -> Result<(), String> {
        let inside = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(inside, Ordering::SeqCst);
        tokio::time::sleep(CALL_TAKES).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
        if inside > LIMIT as usize {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(format!("429 Too Many Requests ({inside} callers at once)"));
        }
        self.served.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// One caller: takes a permit (waiting for one), calls, gives it back.
/// Returns how long it waited for the permit.
async fn worker(
    id: usize,
    locker: Locker,
    name: String,
    api: Arc<FakeApi>,
) -> anyhow::Result<Duration> {
    // Every holder of a name must ask for the same number of permits.
    let permits = locker.semaphore(name.as_str(), LIMIT)?;
    // Wait up to 30 s for a permit (the default waits for ever; `no_wait()`
    // would try once). The permit's lease is 10 s, renewed every 10/3 s by
    // the watchdog while the call runs, and frees at most 10 s after a
    // caller that dies without giving it back.
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_for(Duration::from_secs(30));
    let asked = Instant::now();
    let permit = permits.acquire_with(&opts).await?;
    let waited = asked.elapsed();
    // A call that may outlast its permit's lease would select on
    // `permit.lost()` and stop; this one takes 100 ms.
    let answer = api.call().await;
    permit.release().await?;
    answer
        .map_err(|refusal| anyhow::anyhow!("worker {id}: the API refused the call: {refusal}"))?;
    Ok(waited)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = common::store_url("rate_limited_api");
    let name = format!("example-rate-limited-api/{}", common::run_id());
    println!(
        "rate_limited_api: {WORKERS} workers, one call of {CALL_TAKES:?} each, through a semaphore \
         of {LIMIT}; store {}",
        RedactedUrl::new(&url)
    );
    let lockers = common::clients(&url, WORKERS).await?;
    let api = Arc::new(FakeApi::default());

    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for (id, locker) in lockers.iter().enumerate() {
        let (locker, name, api) = (locker.clone(), name.clone(), api.clone());
        workers.spawn(async move { (id, worker(id, locker, name, api).await) });
    }
    let mut failures = Vec::new();
    let mut waits = Vec::new();
    while let Some(joined) = workers.join_next().await {
        match joined? {
            (id, Ok(waited)) => waits.push((id, waited)),
            (id, Err(e)) => failures.push(format!("worker {id}: {e:#}")),
        }
    }
    let took = started.elapsed();
    for locker in &lockers {
        locker.close().await?;
    }

    waits.sort_by_key(|(_, waited)| *waited);
    for (id, waited) in &waits {
        println!(
            "  worker {id:>2} waited {:>4} ms for a permit",
            waited.as_millis()
        );
    }
    let most = api.most.load(Ordering::SeqCst);
    let served = api.served.load(Ordering::SeqCst);
    let refused = api.refused.load(Ordering::SeqCst);
    println!(
        "  {served} calls served, {refused} refused, at most {most} at once (limit {LIMIT}), in {} ms",
        took.as_millis()
    );
    if most < LIMIT as usize {
        println!(
            "  (the store granted fewer permits at once than it could; still within the limit)"
        );
    }
    for failure in &failures {
        eprintln!("  {failure}");
    }
    if most > LIMIT as usize || refused > 0 {
        anyhow::bail!(
            "rate_limited_api: FAILED: {most} callers at once, over the limit of {LIMIT}"
        );
    }
    if served != WORKERS || !failures.is_empty() {
        anyhow::bail!("rate_limited_api: FAILED: {served} of {WORKERS} calls completed");
    }
    println!(
        "rate_limited_api: OK: all {WORKERS} calls completed, never more than {LIMIT} at once"
    );
    Ok(())
}
