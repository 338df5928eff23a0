//! Loss and abandonment: a holder that vanishes frees the key at its TTL
//! (or with its session); a guard dropped unreleased frees it in the
//! background; a holder cut off from its store hears that its lock is
//! lost before anyone else can take it.

use lockwright_core::backend::LockBackendExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Result};
use lockwright_core::backend::{Acquire, Binding, LockBackend};
use lockwright_core::{LockKey, LockOptions, Locker, OwnerToken};

use super::{eventually_free, key, long, past_expiry, short_ttl, LONG_TTL};
use crate::faults::Partition;
use crate::Harness;

/// A holder that vanishes (client dropped, nothing released) frees the key at TTL.
pub async fn abandoned_lock_frees_at_ttl(h: &dyn Harness) -> Result<()> {
    let k = key("abandoned_lock_frees_at_ttl", "k");
    let caps;
    let ttl;
    {
        let a = Locker::from_arc(h.client().await);
        caps = a.capabilities().clone();
        ttl = short_ttl(&caps);
        let g = a.lock_with(&k, &LockOptions::new().ttl(ttl)).await?;
        // Simulates a process killed mid-section: no release, no renewal.
        let _ = g.leak();
    }
    let b = Locker::from_arc(h.client().await);
    if caps.binding == Binding::Lease {
        // A session-bound lock may go at once: its session closed with the client.
        ensure!(
            b.try_lock(&k).await?.is_none(),
            "abandoned lock freed before its TTL"
        );
        tokio::time::sleep(past_expiry(&caps, ttl)).await;
    }
    eventually_free(
        &b,
        &k,
        Duration::from_secs(2),
        "abandoned lock not freed at TTL",
    )
    .await
}

/// A guard dropped without release frees the lock in the background, long
/// before its TTL.
pub async fn dropped_guard_releases_in_background(h: &dyn Harness) -> Result<()> {
    let k = key("dropped_guard_releases_in_background", "k");
    let (a, b) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    let g = a.lock_with(&k, &long()).await?;
    drop(g);
    eventually_free(
        &b,
        &k,
        Duration::from_secs(5),
        "a dropped guard did not release",
    )
    .await
}

/// Cut off from the store, a holder's lost signal fires by its local
/// deadline, and before anyone else can take the key.
pub async fn lost_signal_fires_before_takeover(h: &dyn Harness) -> Result<()> {
    let k = key("lost_signal_fires_before_takeover", "k");
    let client = h.client().await;
    if client.capabilities().binding == Binding::Session {
        return lost_signal_fires_when_session_ends(h, client, &k).await;
    }
    let link = Partition::new(client);
    let a = Locker::from_arc(link.clone());
    let b = h.client().await;
    let ttl = short_ttl(a.capabilities()).max(Duration::from_secs(1));
    let g = a.lock_with(&k, &LockOptions::new().ttl(ttl)).await?;
    link.cut();
    // The instant the guard reads as lost at the latest (`LeaseState::at`)
    // is its deadline, however late the watchdog or this task get the CPU;
    // a renewal already in flight at the cut may still move it later, so
    // it is followed until the signal fires.
    let mut deadline = g
        .deadline()
        .ok_or_else(|| anyhow!("lost at once, before the cut"))?;
    let started = Instant::now();
    // Another client keeps trying; record when it first succeeds.
    let kb = k.clone();
    let taken_at = tokio::spawn(async move {
        loop {
            match b.try_lock(&kb, &OwnerToken::generate(), LONG_TTL).await {
                Ok(Acquire::Acquired(_)) => return Some(Instant::now()),
                _ if started.elapsed() > ttl * 4 => return None,
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    });
    let lost = g.lost();
    tokio::pin!(lost);
    let reason = loop {
        tokio::select! {
            reason = &mut lost => break reason,
            () = tokio::time::sleep(Duration::from_millis(1)) => {
                if let Some(d) = g.deadline() {
                    deadline = deadline.max(d);
                }
                if started.elapsed() > ttl * 3 {
                    bail!("lost signal did not fire within 3 TTLs of losing the store");
                }
            }
        }
    };
    let fired = Instant::now();
    ensure!(
        g.is_lost(),
        "lost fired ({reason:?}) but the guard does not say so"
    );
    ensure!(
        fired <= deadline + Duration::from_millis(250),
        "lost fired {:?} after the local deadline",
        fired - deadline
    );
    if let Some(t) = taken_at.await? {
        let lost_at = fired.min(deadline);
        ensure!(
            t >= lost_at,
            "another client took the key {:?} before the lost signal fired",
            lost_at - t
        );
    } else {
        bail!("the key was never freed after its holder was cut off");
    }
    Ok(())
}

/// Session-bound: the server frees the lock the moment the session ends, so
/// the promise is that the holder hears of it within one renewal period.
async fn lost_signal_fires_when_session_ends(
    h: &dyn Harness,
    client: Arc<dyn LockBackend>,
    k: &LockKey,
) -> Result<()> {
    let a = Locker::from_arc(client.clone());
    let ttl = Duration::from_secs(1);
    let g = a.lock_with(k, &LockOptions::new().ttl(ttl)).await?;
    h.end_sessions(&client).await?;
    let ended = Instant::now();
    let reason = tokio::time::timeout(ttl, g.lost())
        .await
        .map_err(|_| anyhow!("lost signal did not fire within a TTL of the session ending"))?;
    ensure!(
        g.is_lost(),
        "lost fired ({reason:?}) but the guard does not say so"
    );
    let lag = ended.elapsed();
    ensure!(
        lag <= ttl / 3 + Duration::from_millis(300),
        "lost fired {lag:?} after the session ended"
    );
    let b = Locker::from_arc(h.client().await);
    eventually_free(
        &b,
        k,
        Duration::from_secs(5),
        "the ended session's lock was not freed",
    )
    .await
}
