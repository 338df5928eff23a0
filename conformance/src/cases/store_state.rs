//! Store state: the store keeps state only for live locks, plus the
//! retention its capabilities state; released and abandoned names are
//! collected, so locking millions of names leaks nothing.

use lockwright_core::backend::LockBackendExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use lockwright_core::backend::{LockBackend, Release};
use lockwright_core::OwnerToken;

use super::{acquired, collected, end_hold, key, short_ttl, LONG_TTL};
use crate::Harness;

/// Names locked once each, then released, leave no state behind beyond the
/// store's stated retention; nor do holders whose leases ran out (or whose
/// sessions ended) without a release. Per-entity locking (`order:81723`…)
/// must not make the lock library the store's biggest tenant.
pub async fn store_state_is_bounded(h: &dyn Harness) -> Result<()> {
    const NAMES: usize = 10_000;
    const HELD: usize = 10;
    /// Room for bookkeeping a store keeps beside the locks themselves.
    const SLACK: u64 = 8;
    let case = "store_state_is_bounded";
    let client = h.client().await;
    let caps = client.capabilities();
    let prefix = key(case, "").as_str().to_owned();
    let held_owner = OwnerToken::generate();
    for i in 0..HELD {
        acquired(
            &*client,
            &key(case, &format!("held/{i}")),
            &held_owner,
            LONG_TTL,
        )
        .await?;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let workers = (0..16).map(|_| {
        let (client, next) = (client.clone(), next.clone());
        async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= NAMES {
                    return Ok::<(), anyhow::Error>(());
                }
                let k = key(case, &format!("once/{i}"));
                let owner = OwnerToken::generate();
                acquired(&*client, &k, &owner, LONG_TTL).await?;
                ensure!(
                    client.unlock(&k, &owner).await? == Release::Freed,
                    "release of {k:?} did not free it"
                );
            }
        }
    });
    futures::future::try_join_all(workers).await?;
    let slack = Duration::from_secs(5);
    collected(
        h,
        &*client,
        &prefix,
        HELD as u64 + SLACK,
        caps.retention + slack,
    )
    .await
    .context("after releasing 10,000 names")?;
    for i in 0..HELD {
        client
            .unlock(&key(case, &format!("held/{i}")), &held_owner)
            .await?;
    }

    // Holders that vanish without releasing: leases run out, or sessions end.
    let gone = h.client().await;
    let ttl = short_ttl(&caps);
    let owner = OwnerToken::generate();
    for i in 0..20 {
        acquired(&*gone, &key(case, &format!("abandoned/{i}")), &owner, ttl).await?;
    }
    end_hold(h, &gone, ttl).await?;
    drop(gone);
    collected(h, &*client, &prefix, SLACK, caps.retention + slack)
        .await
        .context("after 20 holders vanished without releasing")?;
    Ok(())
}
