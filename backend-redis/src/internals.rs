//! The key layout and the scripts themselves, for benchmarks that send the
//! same scripts raw as the floor of this scheme, and for fault tests. Only
//! with the `internals` feature, and outside semver: they change with the
//! layout.

use std::sync::Arc;

use lockwright_core::backend::{LockBackend, Quorum};
use lockwright_core::{LockKey, Result};
use redis::Script;

use crate::backend::RedisBackend;
use crate::config::RedisConfig;
use crate::error::map_err;
use crate::layout::Keys;
use crate::redlock::RedlockBackend;
use crate::scripts;

/// The Redis keys of `key` under `prefix`: lock, queue, waiters, in the
/// order the scripts take them.
pub fn key_names(prefix: &str, key: &LockKey) -> [String; 3] {
    Keys::new(prefix, key, false).names().clone()
}

/// The acquire script (KEYS: [`key_names`]; ARGV: owner, TTL in ms);
/// answers the bare fence for a fresh grant.
pub fn acquire_script(fenced: bool) -> &'static Script {
    scripts::acquire(fenced)
}

/// The release script (KEYS: [`key_names`]; ARGV: owner); answers the
/// holds left, or a negative number when the owner did not hold it.
pub fn release_script(fenced: bool) -> &'static Script {
    scripts::release(fenced)
}

/// The contract's kind for a driver error, as every request maps it:
/// for the tests that classify each error a failover can give.
pub fn map_error(e: redis::RedisError) -> lockwright_core::Error {
    map_err(e)
}

/// Shifts the fencing tokens' clock of `backend` by `secs` seconds
/// (negative: behind), as a primary whose clock is behind would: for
/// the tests of tokens across a failover.
pub fn skew_clock(backend: &RedisBackend, secs: i64) {
    backend.node().skew_clock(secs);
}

/// Redlock's nodes for a `redis+redlock://` URL, one lease backend per
/// master, for fault tests that wrap each node before building the
/// quorum with [`redlock_over`].
///
/// # Errors
/// `Config` for a bad URL.
pub fn redlock_nodes(url: &str) -> Result<Vec<Arc<dyn LockBackend>>> {
    let config = RedisConfig::from_url(url)?;
    Ok(RedlockBackend::nodes(&config)?
        .into_iter()
        .map(|n| Arc::new(n) as Arc<dyn LockBackend>)
        .collect())
}

/// Redlock's quorum, as [`RedlockBackend::connect`] builds it for `url`,
/// over `nodes` (from [`redlock_nodes`], wrapped).
///
/// # Errors
/// `Config` for a bad URL or no nodes.
pub fn redlock_over(
    url: &str,
    nodes: Vec<Arc<dyn LockBackend>>,
) -> Result<Quorum<Arc<dyn LockBackend>>> {
    let config = RedisConfig::from_url(url)?;
    RedlockBackend::quorum_over(&config, nodes)
}

/// Fails the deployment `url` names over on purpose (Sentinel or Cluster)
/// and waits until the new primary serves, as `lockwright check --faults
/// …,failover` does through the crate's driver: for fault tests.
///
/// # Errors
/// As the driver's failover: `Unsupported` for another kind of URL,
/// `Config` for a TLS file that cannot be used, `Unavailable` when no
/// failover could be made within a minute.
pub async fn failover(url: &str) -> Result<String> {
    crate::failover::failover(url).await
}
