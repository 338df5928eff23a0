//! `lockwright-bench claims`: a semaphore's permit and read and write holds
//! beside the mutex, uncontended, through a `Locker` on any store's URL;
//! then contended, each client's share of the grants.

use lockwright::{LockOptions, Locker};

use crate::redis_bench::{median, pairs_per_sec};

/// What one uncontended pair takes: our lock, a permit of a semaphore of
/// 3, a read hold, a write hold.
pub(crate) const KINDS: [&str; 4] = ["lock", "semaphore", "read", "write"];

/// `iterations` uncontended pairs of `what` through `locker` on `key`.
pub(crate) async fn claim_pairs(locker: &Locker, key: &str, what: &str, iterations: u32) {
    let now = LockOptions::new().no_wait();
    let sem = locker.semaphore(key, 3).expect("semaphore");
    let rw = locker.rwlock(key).expect("rwlock");
    for _ in 0..iterations {
        let g = match what {
            "lock" => locker.try_lock(key).await,
            "semaphore" => sem.try_acquire_with(&now).await,
            "read" => rw.try_read_with(&now).await,
            _ => rw.try_write_with(&now).await,
        };
        let g = g.expect("acquire").expect("uncontended");
        g.release().await.expect("release");
    }
}

/// Each kind's pairs/s on `url`, rounds in rotating order, and each as a
/// fraction of the lock's.
pub(crate) async fn run(url: &str, iterations: u32, rounds: u32) -> Result<(), String> {
    let locker = lockwright::connect(url).await.map_err(|e| e.to_string())?;
    let mut rates: [Vec<f64>; 4] = Default::default();
    let tag = lockwright::OwnerToken::generate();
    for round in 0..rounds {
        for step in 0..4 {
            let i = (step + round as usize) % 4;
            let key = format!("bench-claims-{}-{}", KINDS[i], tag.as_str());
            let r = pairs_per_sec(iterations, || {
                claim_pairs(&locker, &key, KINDS[i], iterations)
            });
            rates[i].push(r.await);
        }
    }
    println!(
        "\n{}: uncontended acquire+release through a Locker, 1 client x {iterations} pairs, \
         median of {rounds} rounds",
        url.split("://").next().unwrap_or("store")
    );
    println!("  {:<12} {:>10}  {:>11}", "", "pairs/s", "vs the lock");
    let lock = median(&mut rates[0]);
    for (i, what) in KINDS.iter().enumerate() {
        let r = median(&mut rates[i]);
        println!("  {:<12} {:>10.0}  {:>11.2}", what, r, r / lock);
    }
    Ok(())
}

/// Clients in each contended run, each with its own `Locker` (connection).
const CLIENTS: usize = 6;

/// How long a contended holder keeps its hold: long enough that the others
/// must wait, short enough for many grants.
const HOLD: std::time::Duration = std::time::Duration::from_millis(2);

/// Six clients for `secs` on a semaphore of 3, then three readers and
/// three writers on a read-write lock: grants per second and each
/// client's share of them (min..max; a fair store gives each about the
/// same).
pub(crate) async fn contended(url: &str, secs: std::time::Duration) -> Result<(), String> {
    println!(
        "\ncontended: {CLIENTS} clients, each its own Locker, holding {HOLD:?} per grant, for {secs:?}"
    );
    println!(
        "  {:<24} {:>10}  {:>24}",
        "", "grants/s", "share per client min..max"
    );
    let tag = lockwright::OwnerToken::generate();
    for sem in [true, false] {
        let key = format!("bench-contended-{sem}-{}", tag.as_str());
        // Every client connected before any starts, and all stop together:
        // none runs alone while the others connect.
        let mut lockers = Vec::new();
        for _ in 0..CLIENTS {
            lockers.push(lockwright::connect(url).await.map_err(|e| e.to_string())?);
        }
        let stop = std::time::Instant::now() + secs;
        let mut tasks = Vec::new();
        for (c, locker) in lockers.into_iter().enumerate() {
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                // Waits end at the run's end: a client starved all through
                // shows as 0%, and no grant after the end is counted.
                let mut n = 0u64;
                while let Some(left) = stop.checked_duration_since(std::time::Instant::now()) {
                    let opts = LockOptions::new().wait_for(left);
                    let g = if sem {
                        locker.semaphore(&key, 3)?.try_acquire_with(&opts).await
                    } else if c % 2 == 0 {
                        locker.rwlock(&key)?.try_read_with(&opts).await
                    } else {
                        locker.rwlock(&key)?.try_write_with(&opts).await
                    }?;
                    let Some(g) = g else { break };
                    tokio::time::sleep(HOLD).await;
                    g.release().await?;
                    n += 1;
                }
                let _ = locker.close().await;
                lockwright::Result::Ok(n)
            }));
        }
        let mut counts = Vec::new();
        for t in tasks {
            counts.push(
                t.await
                    .map_err(|e| e.to_string())?
                    .map_err(|e: lockwright::Error| e.to_string())?,
            );
        }
        let rows: Vec<(&str, Vec<u64>)> = if sem {
            vec![("semaphore of 3", counts.clone())]
        } else {
            vec![
                ("readers", counts.iter().step_by(2).copied().collect()),
                (
                    "writers",
                    counts.iter().skip(1).step_by(2).copied().collect(),
                ),
            ]
        };
        let total: u64 = counts.iter().sum();
        for (name, group) in rows {
            let share = |c: u64| 100.0 * c as f64 / total.max(1) as f64;
            let (min, max) = (
                group.iter().copied().min().unwrap_or(0),
                group.iter().copied().max().unwrap_or(0),
            );
            println!(
                "  {:<24} {:>10.0}  {:>23}",
                name,
                group.iter().sum::<u64>() as f64 / secs.as_secs_f64(),
                format!("{:.1}%..{:.1}%", share(min), share(max))
            );
        }
    }
    Ok(())
}
