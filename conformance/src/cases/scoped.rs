//! Scoped work: work run under a hold by the scoped forms
//! ([`Locker::with_lock`] and the like) gives the name back before the
//! call returns, however the work ends (its output, its own error, a
//! panic), so the next claimant gets it at once and not at the TTL; and
//! work whose hold is broken by an operator is stopped and told `Lost`.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use anyhow::{bail, ensure, Result};
use futures::FutureExt;
use lockwright_core::{ErrorKind, LockKey, LockOptions, Locker};

use super::{key, long, short_ttl};
use crate::Harness;

/// Whether `by` gets `k` at its first attempt; it gives it back at once.
async fn free_at_once(by: &Locker, k: &LockKey) -> Result<bool> {
    match by.try_lock(k).await? {
        Some(g) => {
            g.release().await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// The name is held while the work runs and free the moment the scoped
/// call returns: after an output, after the work's own error, and after
/// a panic; for a mutex, and for a permit and a write hold where the
/// store has them.
pub async fn scoped_work_frees_the_name_before_it_returns(h: &dyn Harness) -> Result<()> {
    let k = key("scoped_work_frees_the_name", "k");
    let (a, b) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    let inside = a
        .with_lock_with(&k, &long(), async |_| free_at_once(&b, &k).await)
        .await??;
    ensure!(
        !inside,
        "another client took {k:?} while scoped work held it"
    );
    ensure!(
        free_at_once(&b, &k).await?,
        "{k:?} was still held right after with_lock returned"
    );
    let failed: Result<()> = a
        .with_lock_with(&k, &long(), async |_| bail!("the work failed"))
        .await?;
    ensure!(failed.is_err(), "the work's own error did not come back");
    ensure!(
        free_at_once(&b, &k).await?,
        "{k:?} was still held right after work that returned an error"
    );
    let panicked = AssertUnwindSafe(
        a.with_lock_with(&k, &long(), async |_| -> () { panic!("the work panicked") }),
    )
    .catch_unwind()
    .await;
    ensure!(panicked.is_err(), "the work's panic did not go on");
    ensure!(
        free_at_once(&b, &k).await?,
        "{k:?} was still held right after work that panicked"
    );
    let caps = a.capabilities().clone();
    if caps.permits {
        let p = key("scoped_work_frees_the_name", "permit");
        let one = a.semaphore(&p, 1)?;
        one.with_permit_with(&long(), async |_| ()).await?;
        let next = b
            .semaphore(&p, 1)?
            .try_acquire_with(&long().no_wait())
            .await?;
        let Some(next) = next else {
            bail!("{p:?}'s one permit was still held right after with_permit returned");
        };
        next.release().await?;
    }
    if caps.shared {
        let w = key("scoped_work_frees_the_name", "rw");
        a.rwlock(&w)?.with_write_with(&long(), async |_| ()).await?;
        let next = b.rwlock(&w)?.try_write_with(&long().no_wait()).await?;
        let Some(next) = next else {
            bail!("{w:?} was still written right after with_write returned");
        };
        next.release().await?;
    }
    Ok(())
}

/// Work whose lock an operator breaks is stopped, without being waited
/// out, and the scoped call answers `Lost`; a store that cannot break a
/// holder says `Unsupported` and the work runs to its end.
pub async fn scoped_work_is_stopped_when_its_hold_is_broken(h: &dyn Harness) -> Result<()> {
    let k = key("scoped_work_is_stopped", "k");
    let (a, operator) = (Locker::from_arc(h.client().await), h.client().await);
    let ttl = short_ttl(a.capabilities()).max(Duration::from_secs(3));
    let opts = LockOptions::new().ttl(ttl);
    let ran = a.with_lock_with(&k, &opts, async |_| -> Result<bool> {
        let holders = operator.inspect(&k).await?.without_owners().each_holder();
        let Some(id) = holders.first().and_then(|h| h.id.clone()) else {
            match operator.force_release(&k, "o0000000000000000").await {
                Err(e) if e.kind() == ErrorKind::Unsupported => return Ok(false),
                other => bail!("a holder shown with no id, yet a break answered {other:?}"),
            }
        };
        ensure!(
            operator.force_release(&k, &id).await?,
            "breaking the holder {id} of {k:?} found no holder"
        );
        // Longer than the case may run: only being stopped ends it.
        tokio::time::sleep(Duration::from_secs(600)).await;
        Ok(true)
    });
    let Ok(ran) = tokio::time::timeout(Duration::from_secs(60), ran).await else {
        bail!("scoped work went on for 60 s after its lock was broken");
    };
    match ran {
        Ok(Ok(false)) => Ok(()),
        Ok(Ok(true)) => bail!("scoped work ran to its end after its lock was broken"),
        Ok(Err(e)) => Err(e),
        Err(e) if e.kind() == ErrorKind::Lost => {
            let next = Locker::from_arc(operator);
            ensure!(
                free_at_once(&next, &k).await?,
                "{k:?} was still held after its holder was broken and told so"
            );
            Ok(())
        }
        Err(e) => bail!("scoped work under a broken lock answered {e:#}, not Lost"),
    }
}
