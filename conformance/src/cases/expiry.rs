//! Expiry: a lease not renewed expires after its TTL on the store's clock,
//! and not before: the key is someone else's to take then, and only then.

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
