//! `lockwright bench`'s election run: candidates take turns leading one
//! election, each reign short, while an observer follows it. Two figures:
//! the time from a leader's `resign` to the next leader's `campaign`
//! returning (the resigner then waits for the other to lead before it
//! campaigns again), and the delay from a change of leader (the new leader's
//! campaign returning) to the observer's stream showing it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lockwright::{Error, LockOptions, Locker, Result};

use lockwright_cli_kit::timing::HandOffs;

/// How long each reign lasts: longer than the observer's poll, so that
/// it can see every reign.
const REIGN: Duration = Duration::from_millis(150);

/// What the election run measured, sorted.
pub(crate) struct ElectionFigures {
    /// Resign to the next leader's campaign returning.
    pub(crate) handoffs: Vec<Duration>,
    /// A new leader's campaign returning to the observer showing it.
    pub(crate) observed: Vec<Duration>,
    /// Reigns the observer never showed (shorter than its poll).
    pub(crate) missed: usize,
}

/// Two candidates alternate for `d`; `watcher` observes.
pub(crate) async fn run(
    candidates: &[Locker],
    watcher: &Locker,
    key: &str,
    d: Duration,
) -> Result<ElectionFigures> {
    let handoffs = HandOffs::default();
    let began: Mutex<HashMap<Vec<u8>, Instant>> = Mutex::default();
    let seen: Mutex<HashMap<Vec<u8>, Instant>> = Mutex::default();
    let stop = AtomicBool::new(false);
    let ttl = Duration::from_secs(10).max(candidates[0].capabilities().min_ttl);
    let opts = LockOptions::new().ttl(ttl).wait_for(ttl * 3);
    let started = Instant::now();
    // Who was granted last: a resigner waits for the other candidate to
    // lead before it campaigns again. On a store without a queue (Redlock,
    // memcached) the resigner would otherwise win its own lock back while
    // the other waits out its backoff, and no hand-off would be measured.
    let (last, _) = tokio::sync::watch::channel(usize::MAX);

    let observer = async {
        let election = watcher.election(key)?;
        let mut changes = Box::pin(election.observe());
        while !stop.load(Ordering::Relaxed) {
            let next = tokio::time::timeout(Duration::from_millis(200), changes.next()).await;
            if let Ok(Some(Ok(Some(leader)))) = next {
                let now = Instant::now();
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(leader.value)
                    .or_insert(now);
            }
        }
        Ok::<_, Error>(())
    };
    let runs = candidates.iter().enumerate().map(|(id, l)| {
        let (opts, handoffs, began, stop, last) = (&opts, &handoffs, &began, &stop, &last);
        async move {
            let election = l.election(key)?;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let value = format!("c{id}-{n}");
                n += 1;
                let leadership = election.campaign_with(value.clone(), opts).await?;
                let now = Instant::now();
                handoffs.granted(id);
                last.send_replace(id);
                began
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(value.into_bytes(), now);
                tokio::time::sleep(REIGN).await;
                if started.elapsed() >= d {
                    stop.store(true, Ordering::Relaxed);
                }
                handoffs.releasing(id);
                let mut turn = last.subscribe();
                leadership.resign().await?;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                // Bounded: a candidate that stopped never leads again.
                let _ = tokio::time::timeout(ttl, turn.wait_for(|&l| l != id)).await;
            }
            Ok::<_, Error>(())
        }
    });
    let (observed, ran) = tokio::join!(observer, futures::future::join_all(runs));
    observed?;
    for r in ran {
        r?;
    }
    let began = began.into_inner().unwrap_or_else(|e| e.into_inner());
    let seen = seen.into_inner().unwrap_or_else(|e| e.into_inner());
    let mut observed: Vec<Duration> = began
        .iter()
        .filter_map(|(v, at)| seen.get(v).map(|s| s.saturating_duration_since(*at)))
        .collect();
    observed.sort();
    Ok(ElectionFigures {
        handoffs: handoffs.take(),
        missed: began.len() - observed.len(),
        observed,
    })
}
