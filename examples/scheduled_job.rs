//! A scheduled job that runs at most once per period across a fleet, ShedLock-style.
//!
//! Every node fires the same schedule; `run_at_most_once` lets one of them run
//! each occurrence, with two durations:
//!
//! - **lock at most for** (`LockOptions::at_most`): the lease's TTL, never
//!   renewed, so a node that crashes mid-run frees it after this long, and a
//!   run that hangs is stopped then. Pick it well above the longest run.
//! - **lock at least for** (`LockOptions::at_least`): the lock stays held at
//!   least this long after it was taken, even when the run is short, so a
//!   node whose clock is a little behind, and so fires the same occurrence a
//!   moment later, finds it still held instead of running the job a second
//!   time. Pick it longer than the clock skew between nodes and shorter than
//!   the period minus that skew.
//!
//! The demo runs three nodes (three `Locker`s on one store, as tasks) whose
//! clocks are 0, 150 and 300 ms behind, each firing every second for five
//! periods; the job counts its runs per period, by the period its node's clock
//! says. It checks that no period ran more than once and that at least four
//! ran, then shows for contrast what the same fleet does without "at least
//! for". It exits 0 only if the property held.
//!
//! ```sh
//! cargo run -p lockwright --example scheduled_job                # an SQLite file in the temp dir
//! cargo run -p lockwright --example scheduled_job -- sqlite:///tmp/jobs.db
//! cargo run -p lockwright --features redis --example scheduled_job -- redis://127.0.0.1:6379
//! ```

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockwright::backend::RedactedUrl;
use lockwright::{ErrorKind, LockOptions, Locker};

/// How far behind each node's clock is.
const BEHIND_MS: [u64; 3] = [0, 150, 300];
/// The schedule: every node fires once per period.
const PERIOD: Duration = Duration::from_secs(1);
/// Lock at least for: longer than the skew, shorter than the period minus it.
const AT_LEAST: Duration = Duration::from_millis(800);
/// Lock at most for: the lease a crashed run leaves behind.
const AT_MOST: Duration = Duration::from_secs(5);
/// Periods in the demo.
const PERIODS: u32 = 5;
/// How long one run of the job takes.
const JOB_TAKES: Duration = Duration::from_millis(50);

/// Runs `job` unless another node holds `name`: `Ok(Some(output))` when this
/// node ran it, `Ok(None)` when another node holds the lock (this occurrence
/// is theirs) or the run outlived `at_most` (it was stopped). The lock is
/// held for at least `at_least` from when it was taken, and at most
/// `at_most` if this node dies or the run hangs.
///
/// # Errors
/// `InvalidOptions` if `at_least` exceeds `at_most`; the store's errors
/// (`Unavailable`, ...) from the attempt to take the lock, never reported as
/// "someone else runs it".
async fn run_at_most_once<T>(
    locker: &Locker,
    name: &str,
    at_least: Duration,
    at_most: Duration,
    job: impl AsyncFnOnce() -> T,
) -> lockwright::Result<Option<T>> {
    // No waiting: if another node holds the lock, this occurrence is theirs.
    let opts = LockOptions::new()
        .at_most(at_most)
        .at_least(at_least)
        .no_wait();
    match locker
        .with_lock_with(name, &opts, async |_| job().await)
        .await
    {
        Ok(output) => Ok(Some(output)),
        Err(e) if e.kind() == ErrorKind::Busy => Ok(None),
        Err(e) if e.kind() == ErrorKind::Lost => {
            eprintln!("warning: job {name:?} outlived its lock-at-most-for and was stopped: {e}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Who ran the job in which period: period (by the node's own clock) to the
/// nodes that ran it.
type Runs = BTreeMap<u32, Vec<usize>>;

/// Runs the fleet for `periods` periods with the given lock-at-least-for.
async fn fleet(
    lockers: &[Locker],
    name: &str,
    at_least: Duration,
    periods: u32,
) -> anyhow::Result<Runs> {
    let runs: Arc<Mutex<Runs>> = Arc::default();
    let start = Instant::now() + Duration::from_millis(100);
    let mut nodes = tokio::task::JoinSet::new();
    for (node, locker) in lockers.iter().enumerate() {
        let (locker, runs, name) = (locker.clone(), runs.clone(), name.to_owned());
        let behind = Duration::from_millis(BEHIND_MS[node]);
        nodes.spawn(async move {
            for period in 0..periods {
                // This node's clock reads the start of `period` `behind` late.
                tokio::time::sleep_until((start + PERIOD * period + behind).into()).await;
                let on_my_clock = period_on_clock(start, behind);
                let runs = runs.clone();
                let job = async || {
                    tokio::time::sleep(JOB_TAKES).await; // the job's work
                    let mut runs = runs.lock().unwrap_or_else(|e| e.into_inner());
                    runs.entry(on_my_clock).or_default().push(node);
                };
                run_at_most_once(&locker, &name, at_least, AT_MOST, job).await?;
            }
            Ok::<(), lockwright::Error>(())
        });
    }
    while let Some(node) = nodes.join_next().await {
        node??;
    }
    let runs = std::mem::take(&mut *runs.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(runs)
}

/// The period a node's clock says it is: time since `start`, less how far
/// behind the node's clock is.
fn period_on_clock(start: Instant, behind: Duration) -> u32 {
    let on_clock = start.elapsed().saturating_sub(behind);
    u32::try_from(on_clock.as_millis() / PERIOD.as_millis()).unwrap_or(u32::MAX)
}

/// Prints one line per period.
fn show(runs: &Runs, periods: u32) {
    for period in 0..periods {
        match runs.get(&period) {
            Some(nodes) if nodes.len() == 1 => {
                println!("    period {period}: ran once (node {})", nodes[0]);
            }
            Some(nodes) => println!(
                "    period {period}: ran {} times (nodes {nodes:?})",
                nodes.len()
            ),
            None => println!("    period {period}: did not run"),
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = common::store_url("scheduled_job");
    let run = common::run_id();
    println!(
        "scheduled_job: {} nodes with clocks {BEHIND_MS:?} ms behind fire every {PERIOD:?}; \
         lock at least for {AT_LEAST:?}, at most for {AT_MOST:?}; store {}",
        BEHIND_MS.len(),
        RedactedUrl::new(&url)
    );
    let lockers = common::clients(&url, BEHIND_MS.len()).await?;

    let runs = fleet(
        &lockers,
        &format!("example-scheduled-job/{run}"),
        AT_LEAST,
        PERIODS,
    )
    .await?;
    println!("  with lock at least for {AT_LEAST:?}:");
    show(&runs, PERIODS);

    // The same fleet, releasing as soon as a run ends: the nodes whose clocks
    // are behind find the lock free and run the same period again.
    let contrast_periods = 2;
    let contrast = fleet(
        &lockers,
        &format!("example-scheduled-job/{run}/no-at-least"),
        Duration::ZERO,
        contrast_periods,
    )
    .await?;
    println!("  for contrast, released as soon as each run ends (no lock at least for):");
    show(&contrast, contrast_periods);

    for locker in &lockers {
        locker.close().await?;
    }

    let repeated: Vec<u32> = runs
        .iter()
        .filter(|(_, nodes)| nodes.len() > 1)
        .map(|(period, _)| *period)
        .collect();
    let ran = runs.keys().filter(|p| **p < PERIODS).count();
    if !repeated.is_empty() {
        anyhow::bail!("scheduled_job: FAILED: periods {repeated:?} ran more than once");
    }
    if ran < 4 {
        anyhow::bail!(
            "scheduled_job: FAILED: only {ran} of {PERIODS} periods ran (expected at least 4)"
        );
    }
    println!("scheduled_job: OK: {ran} of {PERIODS} periods ran, none more than once");
    Ok(())
}
