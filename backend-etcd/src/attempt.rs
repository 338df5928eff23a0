//! One attempt's contender key: reserved in this backend, put by the
//! attempt, and deleted unless the attempt keeps it (as a hold or a place
//! in line), in the background when the attempt was dropped or failed.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};
use lockwright_core::Result;

use crate::backend::Inner;
use crate::layout;
use crate::node::{lock, Session};

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
        let mut keys = lock(&inner.keys);
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
            lock(&keys).remove(&key);
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
            lock(&keys).remove(&key);
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

/// The first contender under `prefix`: the holder.
pub(crate) fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// The key-values of the `i`th answer of a transaction.
pub(crate) fn got(resp: &TxnResponse, i: usize) -> Vec<KeyValue> {
    match resp.op_responses().into_iter().nth(i) {
        Some(TxnOpResponse::Get(g)) => g.kvs().to_vec(),
        _ => Vec::new(),
    }
}
