//! Baselines in Python (kazoo, sherlock), run as subprocesses that print
//! one JSON line, and the tables that put them beside ours.

use std::process::Command;
use std::time::Duration;

use lockwright::backend::LockBackend;
use lockwright::Locker;

use crate::redis_bench::{contended, locker_contender, median, Contention};

/// Runs `script` (a `bench/*.py` file) with `args`; its one JSON line, or
/// why not, with the `pip install` that provides its libraries.
pub(crate) fn python(
    script: &str,
    install: &str,
    args: &[&str],
) -> Result<serde_json::Value, String> {
    let out = Command::new("python3")
        .arg(script)
        .args(args)
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{script} failed ({install}?): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("{script} output: {e}"))
}

/// The uncontended table: median pairs/s of each path, against the floor
/// (`figures[0]`) and the peer (`figures[1]`).
pub(crate) fn uncontended_table(peer: &str, labels: &[&str], figures: &mut [Vec<f64>]) {
    let floor = median(&mut figures[0].clone());
    let theirs = median(&mut figures[1].clone());
    println!(
        "  {:<36} {:>10}  {:>8}  {:>11}  {:>14}",
        "path",
        "pairs/s",
        "vs raw",
        format!("vs {peer}"),
        "min..max"
    );
    for (label, v) in labels.iter().zip(figures.iter_mut()) {
        let r = median(v);
        println!(
            "  {label:<36} {r:>10.0}  {:>8.2}  {:>11.2}  {:>6.0}..{:<6.0}",
            r / floor,
            r / theirs,
            v.first().copied().unwrap_or_default(),
            v.last().copied().unwrap_or_default(),
        );
    }
}

/// Contention on one key: `contenders` `Locker`s (each from `backend()`)
/// and the Python peer, each twice for `seconds`, in alternating order;
/// then the table, the peer's runs one row each.
pub(crate) async fn contention<B: LockBackend>(
    contenders: usize,
    seconds: u64,
    ttl: Duration,
    backend: impl Fn() -> B,
    peer: &str,
    run_peer: impl Fn() -> Result<serde_json::Value, String>,
) -> Result<(), String> {
    println!(
        "  {:<14} {:>9} {:>12} {:>12} {:>22}",
        "library", "locks/s", "hand-off p50", "hand-off p99", "share per client min..max"
    );
    let mut ours = Contention::default();
    let mut rows = Vec::new();
    for round in 0..2 {
        for step in 0..2 {
            if (round + step) % 2 == 0 {
                ours.add(
                    contended(contenders, seconds, |_| {
                        locker_contender(Locker::new(backend()), "contended".to_owned(), ttl)
                    })
                    .await,
                );
            } else {
                rows.push(run_peer()?);
            }
        }
    }
    ours.print("lockwright", seconds * 2);
    for row in rows {
        let counts: Vec<u64> = row["counts"]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
            .unwrap_or_default();
        let total: u64 = counts.iter().sum();
        let share = |c: Option<&u64>| 100.0 * c.copied().unwrap_or(0) as f64 / total.max(1) as f64;
        let ms = |k: &str| {
            row[k]
                .as_f64()
                .map_or("n/a".to_owned(), |us| format!("{:.2} ms", us / 1000.0))
        };
        println!(
            "  {:<14} {:>9.0} {:>12} {:>12} {:>12.1}%..{:.1}%",
            format!("{peer} (1 run)"),
            total as f64 / seconds.max(1) as f64,
            ms("handoff_p50_us"),
            ms("handoff_p99_us"),
            share(counts.iter().min()),
            share(counts.iter().max())
        );
    }
    Ok(())
}
