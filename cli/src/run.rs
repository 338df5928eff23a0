//! `lockwright run`: hold a lock (a mutex, one of a semaphore's permits, or
//! a read hold) for the lifetime of a command's whole process tree. The supervision (process group, watcher, signals, the
//! timeline when renewal fails, exit codes) is `supervise`'s, shared with
//! `lockwright elect`.

use lockwright::{Claim, LockOptions, Result};

use crate::args::RunArgs;
use crate::supervise::{self, Spec};

/// `lockwright run`: the command's exit code, or the error that ended it.
pub(crate) async fn run(args: RunArgs) -> Result<i32> {
    let url = args.store.shared_url()?;
    supervise::check_label(args.label.as_deref())?;
    let spec = Spec {
        url,
        key: &args.key,
        ttl: args.ttl,
        kill_after: args.kill_after,
        command: &args.command,
        wait: args.wait_policy(),
        label: args.label.as_deref(),
    };
    let ttl = args.ttl;
    let key = args.key.as_str();
    let claim = match (args.permits, args.shared) {
        (_, true) => Claim::Shared,
        (Some(n), false) => Claim::permits(n)?,
        (None, false) => Claim::MUTEX,
    };
    supervise::under_lease(&spec, |locker, wait| async move {
        let opts = LockOptions::new().ttl(ttl).wait(wait);
        match claim {
            Claim::Shared => locker.rwlock(key)?.read_with(&opts).await,
            Claim::Exclusive { permits: 1 } => locker.lock_with(key, &opts).await,
            Claim::Exclusive { permits } => {
                locker.semaphore(key, permits)?.acquire_with(&opts).await
            }
        }
    })
    .await
}
