//! Work done under a hold: the hold is taken, the work runs, the work is
//! stopped if the hold is lost, and the hold is given back, awaited,
//! before the caller gets the result. The scoped forms of every primitive
//! ([`Locker::with_lock`](crate::Locker::with_lock),
//! [`Semaphore::with_permit`](crate::Semaphore::with_permit), …) are
//! this one function over the hold each takes.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;

use crate::error::{Error, ErrorKind, Result};
use crate::key::LockKey;
use crate::lease::LostReason;

/// A hold that scoped work runs under: a lock guard (its impl is in
/// `guard.rs`), or a leadership (in `election.rs`).
pub(crate) trait Hold: Send {
    /// What the work is given to act under the hold with.
    type Target;
    /// The work's handle on the hold.
    fn target(&mut self) -> &mut Self::Target;
    /// Completes when the hold is lost; never while it is held.
    fn when_lost(&self) -> impl Future<Output = LostReason> + Send + 'static;
    /// The name held, for messages.
    fn name(&self) -> &LockKey;
    /// Gives the hold back and says what the store said.
    fn give_back(self) -> impl Future<Output = Result<()>> + Send;
}

/// Runs `work` under `hold`, then gives the hold back and awaits that.
///
/// - The hold is lost while the work runs: the work is dropped at its next
///   await point (it must not go on as if it still held the name) and the
///   answer is `Lost`.
/// - The work panics: the hold is given back, then the panic goes on.
/// - The work ends: its output, unless the release finds the hold gone
///   (`Lost`: the work may not have been exclusive to the end). A release
///   the store could not confirm is logged and the output still returned,
///   since the work did finish while the hold was known to be held; that
///   lock frees at its TTL.
pub(crate) async fn run_under<H, T>(
    mut hold: H,
    work: impl AsyncFnOnce(&mut H::Target) -> T,
) -> Result<T>
where
    H: Hold,
{
    let lost = hold.when_lost();
    let ran = {
        let work = AssertUnwindSafe(work(hold.target())).catch_unwind();
        tokio::select! {
            biased;
            reason = lost => Err(reason),
            ran = work => Ok(ran),
        }
    };
    match ran {
        Err(reason) => {
            let name = hold.name().clone();
            // The lock is gone already; the release only stops its
            // renewal and bookkeeping, so what it says adds nothing.
            let _ = hold.give_back().await;
            Err(Error::lost(format!(
                "lock {:?} was lost ({}) while work ran under it; the work was stopped",
                name.as_str(),
                reason.words()
            )))
        }
        Ok(Err(panic)) => {
            let _ = hold.give_back().await;
            std::panic::resume_unwind(panic)
        }
        Ok(Ok(output)) => {
            let name = hold.name().clone();
            match hold.give_back().await {
                Ok(()) => Ok(output),
                Err(e) if e.kind() == ErrorKind::Unavailable => {
                    tracing::warn!(key = %name, error = %e.chain(),
                        "the release after scoped work could not be confirmed; the lock frees at its TTL");
                    Ok(output)
                }
                Err(e) => Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::backend::{LockBackend, MemoryBackend};
    use crate::{ErrorKind, LockOptions, Locker};

    fn locker() -> (Locker, Arc<MemoryBackend>) {
        let store = Arc::new(MemoryBackend::new());
        let backend: Arc<dyn LockBackend> = store.clone();
        (Locker::from_arc(backend), store)
    }

    /// The name is free the moment the scoped call returns: the release
    /// was awaited, not left to a task.
    #[tokio::test]
    async fn the_name_is_free_when_with_lock_returns() {
        let (locker, _) = locker();
        let fence = locker
            .with_lock("job", async |guard| guard.fence())
            .await
            .unwrap();
        assert!(fence.is_some());
        assert!(
            locker.background_pending() == 0,
            "the release was left to a task"
        );
        let again = locker.try_lock("job").await.unwrap();
        assert!(again.is_some(), "the name was still held after with_lock");
    }

    /// `?` inside the work: its error comes back, and the name is free.
    #[tokio::test]
    async fn an_error_of_the_work_comes_back_and_frees_the_name() {
        let (locker, _) = locker();
        let out: crate::Result<std::result::Result<(), &str>> = locker
            .with_lock("job", async |_| {
                Err("disk full")?;
                Ok(())
            })
            .await;
        assert_eq!(out.unwrap(), Err("disk full"));
        assert!(locker.try_lock("job").await.unwrap().is_some());
    }

    /// A panic inside the work gives the hold back before it goes on.
    #[tokio::test]
    async fn a_panic_in_the_work_gives_the_hold_back_first() {
        use futures::FutureExt;
        let (locker, _) = locker();
        let work = locker.with_lock("job", async |_| -> () { panic!("the work failed") });
        let panicked = std::panic::AssertUnwindSafe(work).catch_unwind().await;
        assert!(panicked.is_err(), "the panic did not go on");
        // Checked before this task yields: a release left to a task has
        // not run yet.
        assert_eq!(
            locker.background_pending(),
            0,
            "the release was left to a task"
        );
        assert!(locker.try_lock("job").await.unwrap().is_some());
    }

    /// A hold lost while the work runs stops the work, and the answer is
    /// `Lost`, not the work's output.
    #[tokio::test]
    async fn work_that_outlives_its_hold_is_stopped_and_told_lost() {
        let (locker, store) = locker();
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let reached_end = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = reached_end.clone();
        let out = locker
            .with_lock_with("job", &opts, async |guard| {
                let hold = guard.lease().hold();
                let _ = store.release(&hold).await;
                guard.renew().await.unwrap_err();
                tokio::time::sleep(Duration::from_secs(30)).await;
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
            })
            .await;
        assert_eq!(out.unwrap_err().kind(), ErrorKind::Lost);
        assert!(!reached_end.load(std::sync::atomic::Ordering::SeqCst));
    }

    /// A leader's work ends with its leadership given back.
    #[tokio::test]
    async fn while_leading_resigns_when_the_work_ends() {
        let (locker, _) = locker();
        let election = locker.election("primary").unwrap();
        let opts = LockOptions::new().no_wait();
        let term = election
            .while_leading_with("node-a", &opts, async |leading| {
                leading.proclaim("node-a, busy").await.unwrap();
                leading.term()
            })
            .await
            .unwrap();
        assert!(term.is_some());
        assert!(election.leader().await.unwrap().is_none(), "still leading");
    }

    /// The scoped forms can be spawned: their futures are `Send` when the
    /// work's is.
    #[tokio::test]
    async fn scoped_work_can_be_spawned() {
        let (locker, _) = locker();
        let sem = locker.semaphore("pool", 2).unwrap();
        let rw = locker.rwlock("table").unwrap();
        let opts = LockOptions::new();
        let l = locker.clone();
        let spawned = tokio::spawn(async move {
            let a = l.with_lock("a", async |g| g.holds()).await.unwrap();
            let b = sem
                .with_permit_with(&opts, async |g| g.holds())
                .await
                .unwrap();
            let c = rw.with_read_with(&opts, async |g| g.holds()).await.unwrap();
            let d = rw
                .with_write_with(&opts, async |g| g.holds())
                .await
                .unwrap();
            let election = l.election("e").unwrap();
            let e = election
                .while_leading("a", async |l| l.guard().holds())
                .await
                .unwrap();
            let mut reigns = 0;
            election
                .stand("a", std::future::ready(()), |_| {
                    reigns += 1;
                    async {}
                })
                .await
                .unwrap();
            a + b + c + d + e + reigns
        });
        assert_eq!(spawned.await.unwrap(), 5);
    }
}
