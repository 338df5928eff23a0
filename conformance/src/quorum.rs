//! The quorum tests every quorum backend runs (Redlock over Redis masters,
//! memcached servers): for every subset of its servers that is down, or
//! held by another owner, an acquire succeeds exactly when a majority is
//! free, and nothing of ours stays on any server; and a grant or renewal
//! that comes back after its TTL has run out does not count.

use lockwright_core::backend::LockBackendExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Result};
use async_trait::async_trait;
use lockwright_core::backend::{Acquire, LockBackend, Release, Renew, RenewRequest};
use lockwright_core::{ErrorKind, LockKey, OwnerToken};

use crate::faults::{Observed, Observer};

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
                        let got = direct[i].try_lock(&key, &stranger, TTL).await?;
                        ensure!(matches!(got, Acquire::Acquired(_)), "{case}: setup {got:?}");
                    }
                    quorum(&[])
                }
            };
            let me = OwnerToken::generate();
            let outcome = q.try_lock(&key, &me, TTL).await;
            if n - faulty.len() >= majority {
                ensure!(
                    matches!(outcome, Ok(Acquire::Acquired(g)) if g.fence.is_none()),
                    "{case}: expected a grant without a fence, got {outcome:?}"
                );
                ensure!(
                    q.unlock(&key, &me).await? == Release::Freed,
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
                    server.unlock(&key, &me).await? == Release::NotHeld,
                    "{case}: our hold was left on server {i}"
                );
            }
            // The other owner's holds are untouched.
            if fault == Fault::HeldByAnother {
                for &i in &faulty {
                    ensure!(
                        direct[i].unlock(&key, &stranger).await? == Release::Freed,
                        "{case}: the other owner's hold on server {i} was touched"
                    );
                }
            }
        }
    }
    Ok(keys)
}

/// The TTL of the late-answer case: long enough that a late grant's lease,
/// started when the request finally reached the server, is still live
/// when the undo lands, whatever the store's TTL resolution.
const LATE_TTL: Duration = Duration::from_secs(2);
/// How long a slowed request waits before it reaches its server: past
/// `LATE_TTL`, so its answer comes back after the lease may have ended.
const LATE: Duration = Duration::from_millis(2300);

/// Holds the next request back for [`LATE`] once armed (one request per
/// arming): later ones, the undo among them, go through at once.
#[derive(Debug, Default)]
struct LateOnce(AtomicBool);

#[async_trait]
impl Observer for LateOnce {
    async fn gate(&self) -> lockwright_core::Result<()> {
        if self.0.swap(false, Ordering::SeqCst) {
            tokio::time::sleep(LATE).await;
        }
        Ok(())
    }
}

/// A grant or renewal that comes back after its TTL has run out does not
/// count: by then the lease may have ended on every node, and another
/// owner may hold the lock. `nodes` are the quorum's nodes, one per real
/// server; `quorum_over` builds the backend's quorum over the given nodes
/// (here each behind a gate that holds one request back past the TTL).
///
/// - Every node grants, late: the acquire is not granted, and every late
///   grant is undone while its lease is still live on its server.
/// - Every node renews, late: the renewal is not `Renewed`.
///
/// # Errors
/// The first of these that the quorum gets wrong, or a node that kept our
/// hold.
pub async fn late_answers_do_not_count<Q: LockBackend>(
    nodes: Vec<Arc<dyn LockBackend>>,
    quorum_over: impl Fn(Vec<Arc<dyn LockBackend>>) -> Q,
    prefix: &str,
) -> Result<()> {
    let gated: Vec<Arc<Observed<LateOnce>>> = nodes
        .iter()
        .map(|n| Observed::wrap(n.clone(), LateOnce::default()))
        .collect();
    let q = quorum_over(
        gated
            .iter()
            .map(|g| g.clone() as Arc<dyn LockBackend>)
            .collect(),
    );
    let arm = || {
        for g in &gated {
            g.observer.0.store(true, Ordering::SeqCst);
        }
    };
    let ours_left = |key: LockKey, me: OwnerToken| {
        let nodes = nodes.clone();
        async move {
            // The late leases started at most LATE ago and last LATE_TTL:
            // a hold we left would still be there to release.
            for (i, node) in nodes.iter().enumerate() {
                ensure!(
                    node.unlock(&key, &me).await? == Release::NotHeld,
                    "our late hold was left on server {i}"
                );
            }
            Ok(())
        }
    };

    let key = LockKey::new(format!("{prefix}/late-grant"))?;
    let me = OwnerToken::generate();
    arm();
    let outcome = q.try_lock(&key, &me, LATE_TTL).await;
    ensure!(
        matches!(outcome, Ok(Acquire::Contended { .. })),
        "every grant came back {LATE:?} after the request, past the {LATE_TTL:?} TTL, \
         and the acquire answered {outcome:?}"
    );
    ours_left(key, me).await?;

    let key = LockKey::new(format!("{prefix}/late-renewal"))?;
    let me = OwnerToken::generate();
    let got = q.try_lock(&key, &me, Duration::from_secs(30)).await?;
    ensure!(matches!(got, Acquire::Acquired(_)), "setup: {got:?}");
    arm();
    let request = RenewRequest::new(
        lockwright_core::backend::HoldId::mutex(key.clone(), me.clone()),
        LATE_TTL,
    );
    let renewed = q.renew(std::slice::from_ref(&request)).await;
    ensure!(
        !matches!(renewed.as_slice(), [Ok(Renew::Renewed)]),
        "every renewal came back {LATE:?} after the request, past its {LATE_TTL:?} TTL, \
         and counted as renewed"
    );
    ensure!(
        q.unlock(&key, &me).await? == Release::Freed,
        "release after the late renewal did not free"
    );
    ours_left(key, me).await
}
