//! What an election's observer is woken by: every change of a name's
//! contenders (a grant, a release, a proclaim, and harmlessly a waiter
//! that queues or leaves), from one watch on the name's prefix, as Go's
//! `Election.Observe` watches it.

use lockwright_core::backend::{AbortOnDrop, Watch};
use lockwright_core::{LockKey, Result};
use tokio::sync::watch;

use crate::node::within;
use crate::state::Inner;

impl Inner {
    /// A watch on `key`'s prefix, made (the cluster answered that it
    /// watches) before this returns, so no change after it is missed. It
    /// ends when its stream does: the observer subscribes again.
    pub(crate) async fn changes(&self, key: &LockKey) -> Result<Watch> {
        let prefix = self.prefix(key);
        let mut client = self.node.client().await?;
        let timeout = self.node.config.timeout;
        let opts = etcd_client::WatchOptions::new().with_prefix();
        let mut stream = within(timeout, client.watch(prefix, Some(opts))).await?;
        let made = within(timeout, stream.message()).await?;
        if made.is_none_or(|r| r.canceled()) {
            return Err(lockwright_core::Error::unavailable(
                "etcd refused to watch the name's changes",
            ));
        }
        let (tx, rx) = watch::channel(0u64);
        let task = tokio::spawn(async move {
            while let Ok(Some(resp)) = stream.message().await {
                if !resp.events().is_empty() {
                    tx.send_modify(|v| *v = v.wrapping_add(1));
                }
                if resp.canceled() {
                    break;
                }
            }
        });
        // The task that follows the watch ends when the observer lets it go.
        Ok(Watch::new(
            rx,
            Some(Box::new(AbortOnDrop::new(task.abort_handle()))),
        ))
    }
}
