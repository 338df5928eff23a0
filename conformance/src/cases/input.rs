//! Input: a bad key or TTL is a typed error (`InvalidKey`,
//! `InvalidOptions`) before anything reaches the store, never a panic or a
//! key cut short.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use lockwright_core::{ErrorKind, LockOptions, Locker, MAX_KEY_LEN, MAX_TTL};

use super::key;
use crate::Harness;

/// Bad input is a typed error, before anything reaches the store.
pub async fn invalid_input_is_typed(h: &dyn Harness) -> Result<()> {
    let l = Locker::from_arc(h.client().await);
    let caps = l.capabilities().clone();
    let e = l.try_lock("").await.err().context("empty key accepted")?;
    ensure!(e.kind() == ErrorKind::InvalidKey, "empty key: {e}");
    let e = l
        .try_lock("x".repeat(MAX_KEY_LEN + 1))
        .await
        .err()
        .context("oversized key accepted")?;
    ensure!(e.kind() == ErrorKind::InvalidKey, "oversized key: {e}");
    let k = key("invalid_input_is_typed", "k");
    let mut bad = vec![Duration::ZERO, MAX_TTL + Duration::from_secs(1)];
    if caps.min_ttl > Duration::from_millis(1) {
        bad.push(caps.min_ttl / 2);
    }
    for ttl in bad {
        let e = l.lock_with(&k, &LockOptions::new().ttl(ttl)).await.err();
        let e = e.with_context(|| format!("TTL {ttl:?} accepted"))?;
        ensure!(e.kind() == ErrorKind::InvalidOptions, "TTL {ttl:?}: {e}");
    }
    ensure!(
        l.try_lock(&k).await?.is_some(),
        "the key is free after refused attempts"
    );
    Ok(())
}
