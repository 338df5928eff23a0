//! Fencing: where a store offers fencing tokens, each grant of a key
//! carries a larger one than every grant before, across owners, releases,
//! expiry and the collection of the key's state.

use lockwright_core::backend::LockBackendExt;
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Result};
use lockwright_core::backend::{LockBackend, Release};
use lockwright_core::OwnerToken;

use super::{acquired, collected, end_hold, key, short_ttl, LONG_TTL};
use crate::Harness;

/// Fencing tokens strictly increase across grants, owners, release and expiry
/// (or are absent where the backend does not offer them).
pub async fn fencing_strictly_increases(h: &dyn Harness) -> Result<()> {
    let k = key("fencing_strictly_increases", "k");
    let (a, b) = (h.client().await, h.client().await);
    let caps = a.capabilities();
    let mut fences = Vec::new();
    for i in 0..6 {
        let c = if i % 2 == 0 { &a } else { &b };
        let owner = OwnerToken::generate();
        fences.push(acquired(&**c, &k, &owner, LONG_TTL).await?.fence);
        c.unlock(&k, &owner).await?;
    }
    let ttl = short_ttl(&caps);
    fences.push(acquired(&*a, &k, &OwnerToken::generate(), ttl).await?.fence);
    end_hold(h, &a, ttl).await?;
    fences.push(
        acquired(&*b, &k, &OwnerToken::generate(), LONG_TTL)
            .await?
            .fence,
    );
    if !caps.fencing {
        ensure!(
            fences.iter().all(Option::is_none),
            "backend without fencing returned tokens"
        );
        return Ok(());
    }
    let tokens: Vec<u64> = fences
        .iter()
        .map(|f| {
            f.map(|t| t.0)
                .ok_or_else(|| anyhow!("a grant carried no fencing token"))
        })
        .collect::<Result<_>>()?;
    ensure!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing: {tokens:?}"
    );
    Ok(())
}

/// A name whose state was collected and is then locked again gets a fence
/// above the one before: fences rise through the collection too.
pub async fn fencing_rises_after_state_is_collected(h: &dyn Harness) -> Result<()> {
    let case = "fencing_rises_after_state_is_collected";
    let k = key(case, "k");
    let client = h.client().await;
    let caps = client.capabilities();
    let owner = OwnerToken::generate();
    let first = acquired(&*client, &k, &owner, LONG_TTL).await?.fence;
    ensure!(
        client.unlock(&k, &owner).await? == Release::Freed,
        "release did not free the key"
    );
    collected(
        h,
        &*client,
        k.as_str(),
        0,
        caps.retention + Duration::from_secs(5),
    )
    .await?;
    let second = acquired(&*h.client().await, &k, &OwnerToken::generate(), LONG_TTL)
        .await?
        .fence;
    match (caps.fencing, first, second) {
        (false, None, None) => Ok(()),
        (true, Some(a), Some(b)) if a < b => Ok(()),
        (true, Some(a), Some(b)) => {
            bail!(
                "fence went from {} to {} across the collection of the name's state",
                a.0,
                b.0
            )
        }
        _ => bail!(
            "fences {first:?} then {second:?} do not match fencing = {}",
            caps.fencing
        ),
    }
}
