//! `lockwright bench`'s run across processes: this process and a peer
//! (`lockwright __bench-peer`, the same binary) contend for one key, so a
//! release reaches the other waiter only the way the store tells another
//! process, never through this process's memory. Each holds the lock for
//! [`HOLD`], long enough for a polling waiter's backoff to grow as it
//! would on a real critical section, and pauses [`THINK`] between its
//! release and its next attempt, as work between critical sections does;
//! without it the releaser's own next attempt would win almost every time.
//!
//! A hand-off is timed from the first release by the other process during
//! a wait to that wait's grant: how long the lock stood free, or was
//! retaken, while this waiter still waited. Both clocks are this machine's
//! wall clock.

use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockwright::{Error, LockOptions, Locker, Result};
use tokio::io::AsyncReadExt;

use crate::args::BenchPeerArgs;

/// How long each process holds the lock each time.
pub(crate) const HOLD: Duration = Duration::from_millis(20);

/// Each process's pause between its release and its next attempt.
pub(crate) const THINK: Duration = Duration::from_millis(5);

/// One critical section: when its wait began, when it was granted, when
/// its release began (ns since the Unix epoch).
#[derive(Debug, Clone, Copy)]
struct Turn {
    waited_from: u128,
    granted: u128,
    released: u128,
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Contends for `key` on `locker` for `d`: its turns.
async fn contend(locker: &Locker, key: &str, d: Duration) -> Result<Vec<Turn>> {
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10).max(locker.capabilities().min_ttl))
        .wait(lockwright::WaitPolicy::Forever);
    let started = Instant::now();
    let mut turns = Vec::new();
    while started.elapsed() < d {
        let waited_from = now_ns();
        let g = locker.lock_with(key, &opts).await?;
        let granted = now_ns();
        tokio::time::sleep(HOLD).await;
        let released = now_ns();
        g.release().await?;
        turns.push(Turn {
            waited_from,
            granted,
            released,
        });
        tokio::time::sleep(THINK).await;
    }
    Ok(turns)
}

/// `lockwright __bench-peer`: contends, then prints its turns, one per line.
pub async fn peer(args: BenchPeerArgs) -> Result<i32> {
    let locker = lockwright::connect(&args.url).await?;
    let turns = contend(&locker, &args.key, args.duration).await?;
    let _ = locker.close().await;
    for t in turns {
        println!("{} {} {}", t.waited_from, t.granted, t.released);
    }
    Ok(0)
}

/// The run's figures: locks/s, sorted hand-offs, each process's share.
pub(crate) struct Figures {
    pub(crate) rate: f64,
    pub(crate) handoffs: Vec<Duration>,
    pub(crate) shares: [f64; 2],
}

/// This process and one peer contend on `key` for `d`.
pub(crate) async fn run(locker: &Locker, url: &str, key: &str, d: Duration) -> Result<Figures> {
    let exe = std::env::current_exe()
        .map_err(|e| Error::backend(format!("cannot find this program to start a peer: {e}")))?;
    let mut child = tokio::process::Command::new(exe)
        .args(["__bench-peer", "--key", key, "--duration"])
        .arg(humantime::format_duration(d).to_string())
        .env("LOCKWRIGHT_URL", url)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::backend(format!("cannot start a peer process: {e}")))?;
    let mut out = child.stdout.take().expect("piped");
    let reading = tokio::spawn(async move {
        let mut text = String::new();
        out.read_to_string(&mut text).await.map(|_| text)
    });
    let started = Instant::now();
    let mine = contend(locker, key, d).await?;
    let status = child
        .wait()
        .await
        .map_err(|e| Error::backend(format!("the peer process: {e}")))?;
    let elapsed = started.elapsed();
    let text = reading
        .await
        .map_err(|e| Error::backend(format!("the peer's output: {e}")))?
        .map_err(|e| Error::backend(format!("the peer's output: {e}")))?;
    if !status.success() {
        return Err(Error::backend(format!("the peer process failed: {status}")));
    }
    let theirs: Vec<Turn> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ').map(str::parse::<u128>);
            Some(Turn {
                waited_from: f.next()?.ok()?,
                granted: f.next()?.ok()?,
                released: f.next()?.ok()?,
            })
        })
        .collect();
    let mut handoffs = gaps(&mine, &theirs);
    handoffs.extend(gaps(&theirs, &mine));
    handoffs.sort();
    let total = (mine.len() + theirs.len()).max(1) as f64;
    Ok(Figures {
        rate: (mine.len() + theirs.len()) as f64 / elapsed.as_secs_f64(),
        handoffs,
        shares: [mine.len() as f64 / total, theirs.len() as f64 / total],
    })
}

/// For each of `waiter`'s grants, the time since the first release by
/// `other` during its wait, if there was one.
fn gaps(waiter: &[Turn], other: &[Turn]) -> Vec<Duration> {
    let mut releases: Vec<u128> = other.iter().map(|t| t.released).collect();
    releases.sort_unstable();
    waiter
        .iter()
        .filter_map(|t| {
            let i = releases.partition_point(|r| *r < t.waited_from);
            let first = *releases.get(i)?;
            (first <= t.granted)
                .then(|| Duration::from_nanos(u64::try_from(t.granted - first).unwrap_or(u64::MAX)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gap_runs_from_the_first_release_by_the_other_during_the_wait() {
        let t = |w, g, r| Turn {
            waited_from: w,
            granted: g,
            released: r,
        };
        let waiter = [t(100, 500, 510), t(600, 700, 710)];
        // Released at 200 and 400 while the first wait ran; nothing
        // during the second.
        let other = [t(0, 50, 200), t(250, 300, 400), t(800, 900, 950)];
        assert_eq!(
            gaps(&waiter, &other),
            [Duration::from_nanos(300)],
            "from 200, not 400"
        );
    }
}
