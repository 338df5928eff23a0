//! Clean-ups that run after their caller has gone (releases of dropped
//! guards, undos of cancelled or failed acquires), counted so that a process
//! about to exit can wait for them instead of cutting them off.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Debug, Default)]
struct Inner {
    pending: AtomicUsize,
    idle: Notify,
}

/// The clean-ups of one `Locker` and everything it handed out.
#[derive(Debug, Clone, Default)]
pub(crate) struct Background(Arc<Inner>);

/// Counts one clean-up until dropped, so a panicking one is still counted out.
struct Pending(Arc<Inner>);

impl Drop for Pending {
    fn drop(&mut self) {
        if self.0.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Background {
    /// Runs `work` on the current runtime; `false` outside one, where
    /// nothing can run and the store's TTL has to do the clean-up.
    pub(crate) fn spawn(&self, work: impl Future<Output = ()> + Send + 'static) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        self.0.pending.fetch_add(1, Ordering::AcqRel);
        let pending = Pending(self.0.clone());
        runtime.spawn(async move {
            let _pending = pending;
            work.await;
        });
        true
    }

    /// How many clean-ups are pending now.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.0.pending.load(Ordering::Acquire)
    }

    /// Waits until no clean-up is pending, or `within` has passed.
    pub(crate) async fn settle(&self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let idle = self.0.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.0.pending.load(Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.0.pending.load(Ordering::Acquire) == 0;
            }
        }
    }
}
