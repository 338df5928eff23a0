//! Ownership: release and renewal compare the owner in the store, at once;
//! a stale or foreign owner changes nothing and is told `NotHeld`, and a
//! second release reports it too.

use anyhow::{ensure, Result};
use lockwright_core::backend::LockBackendExt;
use lockwright_core::backend::{LockBackend, Release, Renew};
use lockwright_core::OwnerToken;

use super::{acquired, contended, end_hold, key, short_ttl, LONG_TTL};
use crate::Harness;

/// After its lease expired and someone else took the key, the old owner can
/// neither renew nor release the new holder's lock, and is told so.
pub async fn stale_owner_cannot_renew_or_release(h: &dyn Harness) -> Result<()> {
    let k = key("stale_owner_cannot_renew_or_release", "k");
    let (a, b, c) = (h.client().await, h.client().await, h.client().await);
    let caps = a.capabilities();
    let ttl = short_ttl(&caps);
    let stale = OwnerToken::generate();
    acquired(&*a, &k, &stale, ttl).await?;
    end_hold(h, &a, ttl).await?;
    let fresh = OwnerToken::generate();
    acquired(&*b, &k, &fresh, LONG_TTL).await?;
    ensure!(
        a.renew_lock(&k, &stale, LONG_TTL).await? == Renew::NotHeld,
        "stale owner renewed"
    );
    ensure!(
        a.unlock(&k, &stale).await? == Release::NotHeld,
        "stale owner released"
    );
    contended(&*c, &k, "the new holder still has it").await?;
    ensure!(
        b.unlock(&k, &fresh).await? == Release::Freed,
        "new holder could not release"
    );
    Ok(())
}

/// Release is owner-checked and idempotent: a stranger's release changes
/// nothing, a second release reports `NotHeld`.
pub async fn release_checks_owner(h: &dyn Harness) -> Result<()> {
    let k = key("release_checks_owner", "k");
    let (a, b) = (h.client().await, h.client().await);
    let owner = OwnerToken::generate();
    acquired(&*a, &k, &owner, LONG_TTL).await?;
    ensure!(
        b.unlock(&k, &OwnerToken::generate()).await? == Release::NotHeld,
        "a stranger's release was accepted"
    );
    contended(&*b, &k, "only the owner may release").await?;
    ensure!(
        a.unlock(&k, &owner).await? == Release::Freed,
        "owner's release failed"
    );
    ensure!(
        a.unlock(&k, &owner).await? == Release::NotHeld,
        "double release did not report NotHeld"
    );
    ensure!(
        b.unlock(&k, &OwnerToken::generate()).await? == Release::NotHeld,
        "release of a free key did not report NotHeld"
    );
    acquired(&*b, &k, &OwnerToken::generate(), LONG_TTL).await?;
    Ok(())
}
