//! Status: another client reads a lock's state (held or free, holds,
//! fence, lease left) without changing it.

use std::time::Duration;

use anyhow::{anyhow, ensure, Result};
use lockwright_core::backend::Binding;
use lockwright_core::{Locker, OwnerToken};

use super::{contended, key, long, LONG_TTL};
use crate::Harness;

/// Another client reads a lock's status without changing it: free, then
/// held with its holds, fence and lease left, then free again.
pub async fn status_reads_without_changing(h: &dyn Harness) -> Result<()> {
    let k = key("status_reads_without_changing", "k");
    let reader = Locker::from_arc(h.client().await);
    let holder = Locker::from_arc(h.client().await);
    let caps = reader.capabilities().clone();
    let s = reader.status(&k).await?;
    ensure!(!s.held && s.holds == 0, "a free key reads as {s:?}");
    let me = OwnerToken::generate();
    let guard = holder.lock_as(&k, &long(), &me).await?;
    let s = reader.status(&k).await?;
    ensure!(s.held && s.holds == 1, "a held key reads as {s:?}");
    if caps.fencing {
        ensure!(
            s.fence == guard.fence(),
            "status fence {:?}, grant {:?}",
            s.fence,
            guard.fence()
        );
    }
    if caps.binding == Binding::Lease {
        let left = s
            .remaining
            .ok_or_else(|| anyhow!("a lease store reports no lease left"))?;
        ensure!(
            left > Duration::ZERO && left <= LONG_TTL,
            "lease left {left:?} of {LONG_TTL:?}"
        );
    }
    if caps.binding == Binding::Lease {
        // Stores with leases count re-entrant holds.
        let again = holder.lock_as(&k, &long().no_wait(), &me).await?;
        let s = reader.status(&k).await?;
        ensure!(s.held && s.holds == 2, "held twice reads as {s:?}");
        again.release().await?;
    }
    // Reading changed nothing: still held, and only the holder frees it.
    contended(&**reader.backend(), &k, "after status reads").await?;
    guard.release().await?;
    let s = reader.status(&k).await?;
    ensure!(!s.held, "a released key reads as {s:?}");
    Ok(())
}
