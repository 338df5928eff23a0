//! One attempt's contender key: reserved in this backend, put by the
//! attempt (`Inner::enter`, in the same transaction as the read of the
//! name's line), and deleted unless the attempt keeps it (as a hold or a
//! place in line), in the background when the attempt was dropped or
//! failed.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, PutOptions, Txn, TxnOp};
use lockwright_core::backend::lock_unpoisoned;
use lockwright_core::Result;

use crate::layout;
use crate::node::{got, lease_gone, Session};
use crate::state::Inner;

/// A contender key reserved for one attempt: released when the attempt
/// ends without a hold, and, once its put may have reached the cluster,
/// deleted first (in the background if the attempt was dropped or
/// failed), so a put whose answer was lost leaves nothing behind.
pub(crate) struct Attempt {
    pub(crate) keys: Arc<std::sync::Mutex<HashSet<String>>>,
    pub(crate) key: String,
    pub(crate) session: Arc<Session>,
    pub(crate) sent: bool,
    pub(crate) kept: bool,
}

impl Attempt {
    pub(crate) fn new(inner: &Inner, prefix: &str, session: Arc<Session>) -> Self {
        let mut keys = lock_unpoisoned(&inner.keys);
        let key = (0..)
            .map(|n| layout::contender(prefix, session.id, n))
            .find(|k| !keys.contains(k))
            .expect("a free key");
        keys.insert(key.clone());
        Attempt {
            keys: inner.keys.clone(),
            key,
            session,
            sent: false,
            kept: false,
        }
    }

    /// Deletes the key if it is still this lease's.
    pub(crate) async fn delete(&mut self) -> Result<()> {
        delete_ours(&self.session, &self.key).await?;
        self.sent = false;
        Ok(())
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        let keys = self.keys.clone();
        let key = std::mem::take(&mut self.key);
        if !self.sent {
            lock_unpoisoned(&keys).remove(&key);
            return;
        }
        let session = self.session.clone();
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        rt.spawn(async move {
            // While the lease lives its keep-alives reach the cluster, and
            // so does this in time; once it is dead the key is gone with it.
            while !session.is_dead() {
                if delete_ours(&session, &key).await.is_ok() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            lock_unpoisoned(&keys).remove(&key);
        });
    }
}

/// Deletes `key` if it is on `session`'s lease.
pub(crate) async fn delete_ours(session: &Session, key: &str) -> Result<()> {
    let txn = Txn::new()
        .when([Compare::lease(key, CompareOp::Equal, session.id)])
        .and_then([TxnOp::delete(key, None)]);
    session.txn(txn).await.map(drop)
}

impl Inner {
    /// Our key on `prefix`, made on our lease if missing, in the same
    /// transaction as reading the name's line with `read` (for a mutex,
    /// its first contender, as Go's `Mutex.Lock` begins): the key
    /// (reserved, to be deleted unless kept), its create revision (0 if
    /// it was there already), and the line.
    pub(crate) async fn enter(
        &self,
        prefix: &str,
        value: &[u8],
        read: GetOptions,
    ) -> Result<(Attempt, i64, Vec<KeyValue>)> {
        let mut tries = 0;
        loop {
            let session = self.node.session().await?;
            let mut attempt = Attempt::new(self, prefix, session.clone());
            let k = attempt.key.clone();
            let put = PutOptions::new().with_lease(session.id);
            let txn = Txn::new()
                .when([Compare::create_revision(k.as_str(), CompareOp::Equal, 0)])
                .and_then([
                    TxnOp::put(k.as_str(), value, Some(put)),
                    TxnOp::get(prefix, Some(read.clone())),
                ])
                .or_else([
                    TxnOp::get(k.as_str(), None),
                    TxnOp::get(prefix, Some(read.clone())),
                ]);
            attempt.sent = true;
            let resp = match session.txn(txn).await {
                Ok(r) => r,
                // Revoked or expired under us: the next session's lease.
                Err(e) if lease_gone(&e) && tries == 0 => {
                    session.mark_dead();
                    tries += 1;
                    continue;
                }
                Err(e) => return Err(e),
            };
            // Our key existed already: nothing of ours should be there (a key
            // left by an attempt whose delete has not run yet); it is not
            // taken for a grant, and goes with this attempt.
            let mine = if resp.succeeded() {
                resp.header().map_or(0, |h| h.revision())
            } else {
                0
            };
            return Ok((attempt, mine, got(&resp, 1)));
        }
    }
}
