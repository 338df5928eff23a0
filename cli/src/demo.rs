//! `lockwright demo`: contention on one lock, with figures.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockwright::backend::RedactedUrl;
use lockwright::{LockOptions, OwnerToken, Result};
use lockwright_cli_kit::timing::{percentile, HandOffs};

use crate::args::DemoArgs;

/// `lockwright demo`: 0 if mutual exclusion held, 1 if not, or the error that ended it.
pub(crate) async fn demo(args: DemoArgs) -> Result<i32> {
    let workers = args.workers as usize;
    let rounds = u64::from(args.rounds);
    let total = workers as u64 * rounds;
    let shown = RedactedUrl::new(&args.store.url);
    println!("lockwright demo: {workers} workers x {rounds} increments on {shown}");

    // A fresh key per run, so a run killed earlier cannot leave it held.
    let key = format!("lockwright-demo/{}", &OwnerToken::generate().as_str()[..12]);
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let handoffs = Arc::new(HandOffs::default());
    let opts = LockOptions::new().ttl(Duration::from_secs(10));

    // Connect every worker before the clock starts.
    let mut lockers = Vec::with_capacity(workers);
    for _ in 0..workers {
        lockers.push(lockwright::connect(&args.store.url).await?);
    }
    // Creates the table (first use) before the clock starts.
    if let Some(g) = lockers[0].try_lock(&key).await? {
        g.release().await?;
    }

    let stop_progress = Arc::new(AtomicBool::new(false));
    let progress = {
        let (done, stop) = (done.clone(), stop_progress.clone());
        // Redrawn in place only on a terminal: in a log or a pipe, `\r`
        // leaves a run of overwritten lines, so a plain line every 10 s.
        let tty = std::io::stderr().is_terminal();
        tokio::spawn(async move {
            let start = Instant::now();
            let mut last_line = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let n = done.load(Ordering::Relaxed);
                let rate = n as f64 / start.elapsed().as_secs_f64();
                let line = format!("  {n:>7}/{total} locks  {rate:>8.0} locks/s");
                if tty {
                    eprint!("\r{line}");
                    let _ = std::io::stderr().flush();
                } else if last_line.elapsed() >= Duration::from_secs(10) {
                    eprintln!("{line}");
                    last_line = Instant::now();
                }
            }
            if tty {
                eprint!("\r{:60}\r", "");
            }
        })
    };

    let start = Instant::now();
    let mut tasks = Vec::with_capacity(workers);
    for (id, locker) in lockers.into_iter().enumerate() {
        let (key, opts) = (key.clone(), opts.clone());
        let (counter, inside, overlaps, done, handoffs) = (
            counter.clone(),
            inside.clone(),
            overlaps.clone(),
            done.clone(),
            handoffs.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let guard = locker.lock_with(key.as_str(), &opts).await?;
                handoffs.granted(id);
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                // Read, let others run, write back: loses updates unless exclusive.
                let value = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(value + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                handoffs.releasing(id);
                guard.release().await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), lockwright::Error>(())
        }));
    }
    let mut failure = None;
    for t in tasks {
        match t.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(e) => {
                failure = failure.or(Some(lockwright::Error::backend(format!(
                    "worker panicked: {e}"
                ))))
            }
        }
    }
    let elapsed = start.elapsed();
    stop_progress.store(true, Ordering::Relaxed);
    let _ = progress.await;
    if let Some(e) = failure {
        return Err(e);
    }

    let lat = handoffs.take();
    let pct = |p: f64| percentile(&lat, p);
    let final_count = counter.load(Ordering::SeqCst);
    let held = final_count == total && overlaps.load(Ordering::SeqCst) == 0;
    println!("  elapsed            {:.2} s", elapsed.as_secs_f64());
    println!(
        "  throughput         {:.0} locks/s",
        total as f64 / elapsed.as_secs_f64()
    );
    println!(
        "  hand-off latency   p50 {}  p99 {}  ({} hand-offs between workers)",
        pct(0.50),
        pct(0.99),
        lat.len()
    );
    println!("  counter            {final_count} (expected {total})");
    if held {
        println!("  mutual exclusion   held");
        Ok(0)
    } else {
        println!(
            "  mutual exclusion   VIOLATED ({} overlapping sections)",
            overlaps.load(Ordering::SeqCst)
        );
        Ok(1)
    }
}
