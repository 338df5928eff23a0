//! Expiry: a lease not renewed expires after its TTL on the store's clock,
//! and not before: the key is someone else's to take then, and only then.
//! A hold taken to be kept at least a while (lock at least for) stays held
//! that long after a short run, and one to be held at most a while (lock
//! at most for) ends then, however long its work hangs.

use lockwright_core::backend::LockBackendExt;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use lockwright_core::backend::{Acquire, LockBackend};
use lockwright_core::{LockOptions, Locker, OwnerToken};

use super::{acquired, contended, end_hold, key, short_ttl, LONG_TTL};
use crate::Harness;

/// A lease not renewed expires, and another client takes the key then, not before.
pub async fn expired_lease_can_be_taken(h: &dyn Harness) -> Result<()> {
    let k = key("expired_lease_can_be_taken", "k");
    let (a, b) = (h.client().await, h.client().await);
    let ttl = short_ttl(&a.capabilities());
    acquired(&*a, &k, &OwnerToken::generate(), ttl).await?;
    tokio::time::sleep(ttl / 3).await;
    contended(&*b, &k, "lease not yet expired").await?;
    end_hold(h, &a, ttl).await?;
    acquired(&*b, &k, &OwnerToken::generate(), LONG_TTL)
        .await
        .context("expired lease was not taken over")?;
    Ok(())
}

/// Until its lease is about to run out, an unrenewed lock stays exclusive:
/// another client trying all along never gets the key before 90% of the TTL
/// has passed (counted from before the holder's request was sent).
pub async fn still_exclusive_near_expiry(h: &dyn Harness) -> Result<()> {
    let k = key("still_exclusive_near_expiry", "k");
    let a = Locker::from_arc(h.client().await);
    let b = h.client().await;
    let ttl = short_ttl(a.capabilities()).max(Duration::from_secs(1));
    let sent = Instant::now();
    let g = a
        .lock_with(&k, &LockOptions::new().ttl(ttl).auto_renew(false))
        .await?;
    let until = sent + ttl.mul_f64(0.9);
    let mut tries = 0;
    while Instant::now() < until {
        let owner = OwnerToken::generate();
        if let Acquire::Acquired(_) = b.try_lock(&k, &owner, LONG_TTL).await? {
            let early = until.saturating_duration_since(Instant::now());
            b.unlock(&k, &owner).await?;
            bail!(
                "another client took the key {early:?} before 90% of the holder's TTL had passed"
            );
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ensure!(
        tries >= 10,
        "only {tries} attempts were made; the case proves nothing"
    );
    let _ = g.release().await;
    Ok(())
}

/// Lock at least for: a run far shorter than the minimum gives the name
/// back, yet no one else gets it before the minimum has passed since it
/// was taken, and everyone can soon after.
pub async fn at_least_keeps_the_name_after_a_short_run(h: &dyn Harness) -> Result<()> {
    let k = key("at_least_keeps_the_name", "k");
    let (a, b) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    let least = Duration::from_secs(3);
    let opts = LockOptions::new().at_most(LONG_TTL).at_least(least);
    let start = Instant::now();
    a.with_lock_with(&k, &opts, async |_| ()).await?;
    loop {
        match b.try_lock(&k).await? {
            Some(g) => {
                let after = start.elapsed();
                g.release().await?;
                // The store's clock may tick a little apart from ours.
                ensure!(
                    after + Duration::from_millis(100) >= least,
                    "{k:?}, kept at least {least:?}, was free {after:?} after it was taken"
                );
                return Ok(());
            }
            None if start.elapsed() > least + Duration::from_secs(20) => {
                bail!(
                    "{k:?}, kept at least {least:?}, was still held after {:?}",
                    start.elapsed()
                )
            }
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Lock at most for: work that hangs under a hold taken for at most a
/// while is stopped when that while is up, the scoped call says `Lost`,
/// and the name is free for the next owner.
pub async fn at_most_ends_a_hung_runs_hold(h: &dyn Harness) -> Result<()> {
    let k = key("at_most_ends_a_hung_run", "k");
    let (a, b) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    let most = short_ttl(a.capabilities()).max(Duration::from_secs(1));
    let opts = LockOptions::new().at_most(most);
    let hung = a.with_lock_with(&k, &opts, async |_| {
        tokio::time::sleep(Duration::from_secs(600)).await;
    });
    let ended = tokio::time::timeout(most + Duration::from_secs(30), hung)
        .await
        .with_context(|| format!("work under a hold of at most {most:?} ran on for 30 s more"))?;
    match ended {
        Err(e) if e.kind() == lockwright_core::ErrorKind::Lost => {}
        other => bail!("a hung run under lock at most for ended with {other:?}, not Lost"),
    }
    super::eventually_free(
        &b,
        &k,
        Duration::from_secs(5),
        "after lock at most for ended it",
    )
    .await
}
