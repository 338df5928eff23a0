//! Multi-lock: several keys are taken in one global order, all or nothing.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use lockwright_core::{ErrorKind, LockKey, Locker};

use super::{key, long};
use crate::Harness;

/// `lock_all` is all or nothing: if one key stays held, every key it took is
/// released before it returns.
pub async fn multi_lock_all_or_nothing(h: &dyn Harness) -> Result<()> {
    let [k1, k2, k3] = ["k1", "k2", "k3"].map(|n| key("multi_lock_all_or_nothing", n));
    let (a, b, c) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    let g2 = a.lock_with(&k2, &long()).await?;
    let e = b
        .lock_all(
            [&k3, &k1, &k2],
            &long().wait_for(Duration::from_millis(400)),
        )
        .await
        .err()
        .context("lock_all got a held key")?;
    ensure!(e.kind() == ErrorKind::Timeout, "expected Timeout, got {e}");
    for k in [&k1, &k3] {
        let g = c
            .try_lock(k)
            .await?
            .with_context(|| format!("{k:?} left held by a failed lock_all"))?;
        g.release().await?;
    }
    g2.release().await?;
    let all = b.lock_all([&k3, &k1, &k2, &k1], &long().no_wait()).await?;
    let got: Vec<&LockKey> = all.guards().iter().map(|g| g.key()).collect();
    ensure!(got == vec![&k1, &k2, &k3], "lock_all order {got:?}");
    ensure!(c.try_lock(&k2).await?.is_none(), "lock_all did not hold k2");
    all.release().await?;
    Ok(())
}

/// Two clients locking the same keys in opposite orders never deadlock.
pub async fn multi_lock_opposite_orders_do_not_deadlock(h: &dyn Harness) -> Result<()> {
    let [ka, kb] = ["a", "b"].map(|n| key("multi_lock_opposite_orders_do_not_deadlock", n));
    let mut tasks = Vec::new();
    for order in [[ka.clone(), kb.clone()], [kb.clone(), ka.clone()]] {
        let l = Locker::from_arc(h.client().await);
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let g = l
                    .lock_all(order.clone(), &long().wait_for(Duration::from_secs(20)))
                    .await?;
                tokio::task::yield_now().await;
                g.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}
