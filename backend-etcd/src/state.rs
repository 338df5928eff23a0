//! What every clone of a backend shares, under the files that use it: the
//! client and lease (`node.rs`), this backend's holds, its waiters in line
//! and the contender keys in use; and the bookkeeping of a hold that
//! attempts, waiters, downgrades and renewals all do (record it, forget
//! it). The feature files add their own `impl Inner` blocks.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use lockwright_core::backend::{lock_unpoisoned, Grant, HoldId};
use lockwright_core::{Claim, FencingToken, LockKey, OwnerToken, Result};
use tokio::sync::watch;

use crate::layout;
use crate::node::{Node, Session};

/// The state every clone of an `EtcdBackend` shares.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) node: Node,
    /// This backend's holds, by name and owner.
    pub(crate) held: std::sync::Mutex<HashMap<(LockKey, OwnerToken), Hold>>,
    /// The waiters that subscribed, by ticket (see `queue.rs`).
    pub(crate) waiters: std::sync::Mutex<HashMap<OwnerToken, Waiter>>,
    /// The contender keys in use (held, being tried, or being cleaned up),
    /// so no two attempts of this backend share one.
    pub(crate) keys: Arc<std::sync::Mutex<HashSet<String>>>,
}

#[derive(Debug, Clone)]
pub(crate) struct Hold {
    pub(crate) key: String,
    pub(crate) rev: i64,
    pub(crate) session: Arc<Session>,
    pub(crate) holds: u32,
    /// Its grant's fence: `rev`, but for a downgrade's reader.
    pub(crate) fence: i64,
    /// The claim it was granted for (a downgrade's reader shares its
    /// writer's key, so one key may carry two holds).
    pub(crate) claim: Claim,
}

impl Hold {
    /// Writes `value` to the hold's key on its lease, if the key is still
    /// the one its grant made (compared on its create revision, as Go's
    /// `Election.Proclaim`): the write's revision, or `None`.
    pub(crate) async fn rewrite(&self, value: &[u8]) -> Result<Option<i64>> {
        let put = PutOptions::new().with_lease(self.session.id);
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.as_str(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then([TxnOp::put(self.key.as_str(), value, Some(put))]);
        let resp = self.session.txn(txn).await?;
        Ok(resp
            .succeeded()
            .then(|| resp.header().map_or(self.rev, |h| h.revision())))
    }
}

/// A subscribed waiter: its wake-ups, its key while it is in line, and
/// the task watching its predecessor.
pub(crate) struct Waiter {
    pub(crate) tx: Arc<watch::Sender<u64>>,
    pub(crate) queued: Option<Queued>,
    pub(crate) watching: Option<tokio::task::AbortHandle>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("queued", &self.queued.as_ref().map(|q| &q.key))
            .finish_non_exhaustive()
    }
}

/// A waiter's key in line, made at `rev` on `session`'s lease.
#[derive(Clone)]
pub(crate) struct Queued {
    pub(crate) key: String,
    pub(crate) rev: i64,
    pub(crate) session: Arc<Session>,
}

impl Queued {
    pub(crate) fn same(&self, other: &Queued) -> bool {
        self.key == other.key && self.rev == other.rev
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(task) = self.watching.take() {
            task.abort();
        }
    }
}

pub(crate) fn fence(rev: i64) -> Option<FencingToken> {
    Some(FencingToken(u64::try_from(rev).unwrap_or(0)))
}

impl Inner {
    pub(crate) fn prefix(&self, key: &LockKey) -> String {
        layout::prefix(&self.node.config.root, key)
    }

    /// Forgets the hold `id` if it is still `seen` (a release and a new
    /// grant to the same owner may have come in between: that one stays).
    pub(crate) fn forget(&self, id: &(LockKey, OwnerToken), seen: &Hold) {
        let mut held = lock_unpoisoned(&self.held);
        if held
            .get(id)
            .is_some_and(|h| h.key == seen.key && h.rev == seen.rev)
        {
            held.remove(id);
            if !held.values().any(|h| h.key == seen.key) {
                lock_unpoisoned(&self.keys).remove(&seen.key);
            }
        }
    }

    /// Records the hold `attempt`'s key is, made at `rev`, and its grant.
    pub(crate) fn hold(&self, id: &HoldId, name: String, rev: i64, session: Arc<Session>) -> Grant {
        let hold = Hold {
            key: name,
            rev,
            session,
            holds: 1,
            fence: rev,
            claim: id.claim(),
        };
        lock_unpoisoned(&self.held).insert((id.key.clone(), id.owner.clone()), hold);
        Grant {
            fence: fence(rev),
            holds: 1,
            lease: None,
        }
    }
}
