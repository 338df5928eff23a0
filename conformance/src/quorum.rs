//! The quorum test every quorum backend runs (Redlock over Redis masters,
//! memcached servers): for every subset of its servers that is down, or
//! held by another owner, an acquire succeeds exactly when a majority is
//! free, and nothing of ours stays on any server.

use std::time::Duration;

use anyhow::{bail, ensure, Result};
use locksmith_core::backend::{Acquire, LockBackend, Release};
use locksmith_core::{ErrorKind, LockKey, OwnerToken};

/// What is wrong with the servers of a subset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Not reachable: the quorum client is pointed elsewhere.
    Down,
    /// Held by another owner, taken straight on that server.
    HeldByAnother,
}

/// Runs every subset of `direct.len()` servers under both faults.
/// `direct[i]` is a client of server `i` alone; `quorum(down)` is a quorum
/// client over all servers with the ones in `down` unreachable. Keys go
/// under `prefix`; every key used is returned, for store-specific checks of
/// what stays behind.
///
/// # Errors
/// The first subset whose outcome breaks the rule, or that left a hold of
/// ours (or took away the other owner's).
pub async fn acquire_succeeds_iff_a_majority_is_free<D, Q>(
    direct: &[D],
    quorum: impl Fn(&[usize]) -> Q,
    prefix: &str,
) -> Result<Vec<LockKey>>
where
    D: LockBackend,
    Q: LockBackend,
{
    const TTL: Duration = Duration::from_secs(10);
    let n = direct.len();
    let majority = n / 2 + 1;
    let mut keys = Vec::new();
    for fault in [Fault::Down, Fault::HeldByAnother] {
        for mask in 0u32..(1 << n) {
            let key = LockKey::new(format!("{prefix}/{fault:?}/{mask}"))?;
            keys.push(key.clone());
            let faulty: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
            let case = format!("{fault:?} on servers {faulty:?}");
            let stranger = OwnerToken::generate();
            let q = match fault {
                Fault::Down => quorum(&faulty),
                Fault::HeldByAnother => {
                    for &i in &faulty {
                        let got = direct[i].try_acquire(&key, &stranger, TTL).await?;
                        ensure!(matches!(got, Acquire::Acquired(_)), "{case}: setup {got:?}");
                    }
                    quorum(&[])
                }
            };
            let me = OwnerToken::generate();
            let outcome = q.try_acquire(&key, &me, TTL).await;
            if n - faulty.len() >= majority {
                ensure!(
                    matches!(outcome, Ok(Acquire::Acquired(g)) if g.fence.is_none()),
                    "{case}: expected a grant without a fence, got {outcome:?}"
                );
                ensure!(
                    q.release(&key, &me).await? == Release::Freed,
                    "{case}: release did not free"
                );
            } else {
                match (fault, &outcome) {
                    (Fault::Down, Err(e)) if e.kind() == ErrorKind::Unavailable => {}
                    (Fault::HeldByAnother, Ok(Acquire::Contended { .. })) => {}
                    _ => bail!("{case}: {outcome:?}"),
                }
            }
            // Nothing of ours anywhere: an owner-checked release on each
            // server finds no hold (and would have removed one).
            for (i, server) in direct.iter().enumerate() {
                ensure!(
                    server.release(&key, &me).await? == Release::NotHeld,
                    "{case}: our hold was left on server {i}"
                );
            }
            // The other owner's holds are untouched.
            if fault == Fault::HeldByAnother {
                for &i in &faulty {
                    ensure!(
                        direct[i].release(&key, &stranger).await? == Release::Freed,
                        "{case}: the other owner's hold on server {i} was touched"
                    );
                }
            }
        }
    }
    Ok(keys)
}
