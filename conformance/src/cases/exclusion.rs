//! Exclusion: while one owner holds a key, no other owner gets it, across
//! clients on separate connections as across processes.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use lockwright_core::Locker;
use rand::Rng;

use super::{contended, key, long};
use crate::Harness;

/// Exclusion: a second client is refused while the first holds the key, and
/// gets it once released.
pub async fn exclusion_between_clients(h: &dyn Harness) -> Result<()> {
    let k = key("exclusion_between_clients", "k");
    let (a, b) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    let ga = a
        .try_lock(&k)
        .await?
        .context("first try_lock on a free key")?;
    ensure!(
        b.try_lock(&k).await?.is_none(),
        "second client acquired a held key"
    );
    contended(&**b.backend(), &k, "first client holds it").await?;
    ga.release().await?;
    let gb = b
        .try_lock(&k)
        .await?
        .context("key not free after release")?;
    gb.release().await?;
    Ok(())
}

/// Exclusion under load: 8 clients on separate connections increment a
/// shared counter with a non-atomic read-modify-write inside the lock.
pub async fn exclusion_shared_counter(h: &dyn Harness) -> Result<()> {
    const CLIENTS: usize = 8;
    const ROUNDS: u64 = 20;
    let k = key("exclusion_shared_counter", "counter");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlap = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let locker = Locker::from_arc(h.client().await);
        let (k, counter, inside, overlap) =
            (k.clone(), counter.clone(), inside.clone(), overlap.clone());
        tasks.push(tokio::spawn(async move {
            let opts = long().wait_for(Duration::from_secs(60));
            for _ in 0..ROUNDS {
                let g = locker.lock_with(&k, &opts).await?;
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlap.store(true, Ordering::SeqCst);
                }
                let v = counter.load(Ordering::SeqCst);
                let pause = rand::rng().random_range(0..400);
                tokio::time::sleep(Duration::from_micros(pause)).await;
                counter.store(v + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    ensure!(
        !overlap.load(Ordering::SeqCst),
        "two clients were inside the lock at once"
    );
    let total = counter.load(Ordering::SeqCst);
    ensure!(
        total == CLIENTS as u64 * ROUNDS,
        "lost increments: {total} of {}",
        CLIENTS as u64 * ROUNDS
    );
    Ok(())
}
