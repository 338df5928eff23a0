//! `locksmith-bench claims`: a semaphore's permit and read and write holds
//! beside the mutex, uncontended, through a `Locker` on any store's URL.

use locksmith::{LockOptions, Locker};

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
            "semaphore" => sem.try_acquire(&now).await,
            "read" => rw.try_read(&now).await,
            _ => rw.try_write(&now).await,
        };
        let g = g.expect("acquire").expect("uncontended");
        g.release().await.expect("release");
    }
}

/// Each kind's pairs/s on `url`, rounds in rotating order, and each as a
/// fraction of the lock's.
pub(crate) async fn run(url: &str, iterations: u32, rounds: u32) -> Result<(), String> {
    let locker = locksmith::connect(url).await.map_err(|e| e.to_string())?;
    let mut rates: [Vec<f64>; 4] = Default::default();
    let tag = locksmith::OwnerToken::generate();
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
