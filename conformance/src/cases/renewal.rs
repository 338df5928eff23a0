//! Renewal: the owner's renewal extends its lease, as a second client
//! sees, and the watchdog keeps a guard's lease alive by itself.

use std::time::Duration;

use anyhow::{ensure, Result};
use locksmith_core::backend::{LockBackend, Release, Renew};
use locksmith_core::{LockOptions, Locker, OwnerToken};

use super::{acquired, contended, key, past_expiry, short_ttl, LONG_TTL};
use crate::Harness;

/// Renewal extends the lease, as a second client sees; renewal by the owner only.
pub async fn renew_extends_lease(h: &dyn Harness) -> Result<()> {
    let k = key("renew_extends_lease", "k");
    let (a, b) = (h.client().await, h.client().await);
    let caps = a.capabilities();
    let ttl = short_ttl(&caps);
    let owner = OwnerToken::generate();
    acquired(&*a, &k, &owner, ttl).await?;
    tokio::time::sleep(ttl / 3).await;
    ensure!(
        a.renew(&k, &owner, ttl * 4).await? == Renew::Renewed,
        "owner could not renew"
    );
    ensure!(
        b.renew(&k, &OwnerToken::generate(), LONG_TTL).await? == Renew::NotHeld,
        "a stranger renewed someone else's lock"
    );
    tokio::time::sleep(past_expiry(&caps, ttl)).await;
    contended(&*b, &k, "renewed past its first TTL").await?;
    ensure!(
        a.release(&k, &owner).await? == Release::Freed,
        "renewed lock did not release"
    );
    acquired(&*b, &k, &OwnerToken::generate(), LONG_TTL).await?;
    Ok(())
}

/// The watchdog keeps a short lease alive for several TTLs.
pub async fn renewal_watchdog_keeps_lock(h: &dyn Harness) -> Result<()> {
    let k = key("renewal_watchdog_keeps_lock", "k");
    let a = Locker::from_arc(h.client().await);
    let b = h.client().await;
    let ttl = short_ttl(a.capabilities()).max(Duration::from_millis(900));
    let g = a.lock_with(&k, &LockOptions::new().ttl(ttl)).await?;
    for _ in 0..6 {
        tokio::time::sleep(ttl / 2).await;
        contended(&*b, &k, "the watchdog renews it").await?;
    }
    ensure!(!g.is_lost(), "guard reported lost while renewals succeeded");
    g.release().await?;
    Ok(())
}
