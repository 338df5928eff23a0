//! Reentrancy: the owner that holds a key takes it again and adds a hold;
//! the key frees when the last hold goes, and other owners are excluded
//! throughout.

use anyhow::{ensure, Context, Result};
use lockwright_core::{Locker, OwnerToken};

use super::{acquired, contended, key, long, LONG_TTL};
use crate::Harness;

/// The same owner re-enters a key it holds; the key frees only when every
/// hold is released, and other owners are excluded throughout.
pub async fn reentrant_same_owner(h: &dyn Harness) -> Result<()> {
    let k = key("reentrant_same_owner", "k");
    let a = Locker::from_arc(h.client().await);
    let b = h.client().await;
    let me = OwnerToken::generate();
    let outer = a.lock_as(&k, &long(), &me).await?;
    let inner = a
        .lock_as(&k, &long().no_wait(), &me)
        .await
        .context("owner could not re-enter")?;
    ensure!(
        outer.holds() == 1 && inner.holds() == 2,
        "holds {} then {}",
        outer.holds(),
        inner.holds()
    );
    ensure!(
        inner.fence() == outer.fence(),
        "re-entry changed the fencing token"
    );
    contended(&*b, &k, "held twice").await?;
    inner.release().await?;
    contended(&*b, &k, "one hold remains").await?;
    outer.release().await?;
    acquired(&*b, &k, &OwnerToken::generate(), LONG_TTL)
        .await
        .context("free after the last hold")?;
    Ok(())
}
