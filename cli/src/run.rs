//! `locksmith run`: hold a lock for the lifetime of a command's whole
//! process tree. The supervision (process group, watcher, signals, the
//! timeline when renewal fails, exit codes) is `supervise`'s, shared with
//! `locksmith elect`.

use locksmith::{LockOptions, Result};

use super::supervise::{self, Spec};
use super::RunArgs;

pub(crate) async fn run(args: RunArgs) -> Result<i32> {
    let url = args.store.shared_url()?;
    let spec = Spec {
        url,
        key: &args.key,
        ttl: args.ttl,
        kill_after: args.kill_after,
        command: &args.command,
    };
    let opts = LockOptions::new().ttl(args.ttl).wait(args.wait_policy());
    let key = args.key.as_str();
    supervise::under_lease(
        &spec,
        |locker| async move { locker.lock_with(key, &opts).await },
    )
    .await
}
