//! Breaking: an operator's forced release of one stuck holder
//! ([`LockBackend::force_release`]) keeps a release's promises. Every hold
//! of that holder goes, and no other holder's; the holder's next renewal
//! and release are `NotHeld`, so it learns it lost the lock; and where the
//! store has fences, the next grant's is above the broken holder's, so a
//! resource checking fences refuses its late writes. A store that cannot
//! name its holders to another client (SQL's session locks) says
//! `Unsupported` instead.

use std::sync::Arc;

use anyhow::{bail, ensure, Result};
use lockwright_core::backend::{
    renew_one, Acquire, AcquireRequest, HoldId, HoldKind, LockBackend, LockBackendExt, Release,
    Renew, RenewRequest,
};
use lockwright_core::{ErrorKind, Holder, LockKey, OwnerToken};

use super::{acquired, acquired_as, key, LONG_TTL};
use crate::Harness;

/// The holders of `k` as an operator's client sees them: each with the id
/// it is broken by, and no owner token.
async fn seen(operator: &dyn LockBackend, k: &LockKey) -> Result<Vec<Holder>> {
    Ok(operator.inspect(k).await?.without_owners().each_holder())
}

/// Whether `hold` is still held, by a renewal that answers for it.
async fn still_holds(client: &Arc<dyn LockBackend>, hold: &HoldId) -> Result<bool> {
    let renewal = RenewRequest::new(hold.clone(), LONG_TTL);
    Ok(renew_one(&**client, renewal).await? == Renew::Renewed)
}

/// A holder broken by another client loses every hold (re-entered ones
/// too): its renewal and release are `NotHeld`, the name is free for the
/// next owner, whose fence is above the broken one's where the store has
/// fences, and the broken holder's id no longer names anyone.
pub async fn a_broken_holder_loses_the_lock_and_the_next_fence_is_higher(
    h: &dyn Harness,
) -> Result<()> {
    let k = key("a_broken_holder_loses", "k");
    let (holder, operator) = (h.client().await, h.client().await);
    let owner = OwnerToken::generate();
    let first = acquired(&*holder, &k, &owner, LONG_TTL).await?;
    acquired(&*holder, &k, &owner, LONG_TTL).await?;
    let holders = seen(&*operator, &k).await?;
    let [one] = holders.as_slice() else {
        bail!("one owner holds {k:?}, but its status lists {holders:?}");
    };
    let Some(id) = one.id.clone() else {
        // A store that cannot name a holder to another client must say so.
        match operator.force_release(&k, "o0000000000000000").await {
            Err(e) if e.kind() == ErrorKind::Unsupported => {
                holder.unlock(&k, &owner).await?;
                holder.unlock(&k, &owner).await?;
                return Ok(());
            }
            other => bail!("a holder shown with no id, yet a break answered {other:?}"),
        }
    };
    ensure!(
        operator.force_release(&k, &id).await?,
        "breaking the holder {id} of {k:?} found no holder"
    );
    let hold = HoldId::mutex(k.clone(), owner.clone());
    ensure!(
        !still_holds(&holder, &hold).await?,
        "the broken holder's renewal still renewed"
    );
    ensure!(
        holder.release(&hold).await? == Release::NotHeld,
        "the broken holder's release still found a hold"
    );
    let next_owner = OwnerToken::generate();
    let next = acquired(&*operator, &k, &next_owner, LONG_TTL).await?;
    if holder.capabilities().fencing {
        match (first.fence, next.fence) {
            (Some(a), Some(b)) if b > a => {}
            (a, b) => bail!("the grant after a break has fence {b:?}, the broken one had {a:?}"),
        }
    }
    ensure!(
        !operator.force_release(&k, &id).await?,
        "the broken holder's id {id} broke the next holder too"
    );
    operator.unlock(&k, &next_owner).await?;
    Ok(())
}

/// Breaking one of a semaphore's three holders leaves the other two
/// holding and renewing; one permit comes free, and only one.
pub async fn breaking_one_permit_leaves_the_others(h: &dyn Harness) -> Result<()> {
    let k = key("breaking_one_permit", "k");
    let operator = h.client().await;
    if !operator.capabilities().permits {
        return Ok(());
    }
    let kind = HoldKind::Permit { permits: 3 };
    let mut holds = Vec::new();
    for _ in 0..3 {
        let client = h.client().await;
        let hold = HoldId::new(k.clone(), OwnerToken::generate(), kind.clone());
        acquired_as(&*client, &hold, LONG_TTL).await?;
        holds.push((client, hold));
    }
    let holders = seen(&*operator, &k).await?;
    ensure!(
        holders.len() == 3,
        "three permits held, but the status lists {holders:?}"
    );
    let Some(id) = holders[1].id.clone() else {
        bail!("a semaphore's holder is listed with no id to break it by: {holders:?}");
    };
    ensure!(
        operator.force_release(&k, &id).await?,
        "breaking the permit holder {id} found no holder"
    );
    let mut kept = 0;
    for (client, hold) in &holds {
        if still_holds(client, hold).await? {
            kept += 1;
        }
    }
    ensure!(
        kept == 2,
        "after one of three permit holders was broken, {kept} still hold"
    );
    let left = seen(&*operator, &k).await?;
    ensure!(
        left.len() == 2 && left.iter().all(|h| h.id.as_deref() != Some(id.as_str())),
        "after breaking {id}, the status lists {left:?}"
    );
    let newcomer = HoldId::new(k.clone(), OwnerToken::generate(), kind.clone());
    acquired_as(&*operator, &newcomer, LONG_TTL).await?;
    let stranger = HoldId::new(k.clone(), OwnerToken::generate(), kind);
    let refused = operator
        .try_acquire(&AcquireRequest::new(stranger, LONG_TTL))
        .await?;
    ensure!(
        matches!(refused, Acquire::Contended { .. }),
        "a break freed more than one permit: a fourth holder got in"
    );
    operator.release(&newcomer).await?;
    for (client, hold) in &holds {
        client.release(hold).await?;
    }
    Ok(())
}
