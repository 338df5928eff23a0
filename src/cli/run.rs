//! `locksmith run`: hold a lock for the lifetime of a child process.

use std::process::ExitStatus;
use std::time::Duration;

use locksmith::{Error, LockOptions, LostReason, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use super::{RunArgs, EX_SOFTWARE};

pub(crate) async fn run(args: RunArgs) -> Result<i32> {
    let locker = locksmith::connect(&args.store.url).await?;
    let opts = LockOptions::new().ttl(args.ttl).wait(args.wait_policy());
    let guard = locker.lock_with(args.key.as_str(), &opts).await?;

    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LOCKSMITH_KEY", &args.key)
        .kill_on_drop(true);
    if let Some(fence) = guard.fence() {
        cmd.env("LOCKSMITH_FENCE", fence.to_string());
    }
    die_with_parent(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.release().await;
            eprintln!("locksmith: cannot run {:?}: {e}", args.command[0]);
            // The shells' convention: 127 not found, 126 found but not runnable.
            return Ok(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };

    let lost = guard.lost();
    tokio::pin!(lost);
    let forwarded = forward_signals(child.id().map(|id| Pid::from_raw(id as i32)));
    tokio::pin!(forwarded);
    let status = tokio::select! {
        status = child.wait() => status,
        reason = &mut lost => {
            terminate(&mut child, args.kill_after, reason).await;
            // Nothing to release: the lock is gone.
            drop(guard.leak());
            return Ok(EX_SOFTWARE);
        }
        _ = &mut forwarded => unreachable!("signal forwarding never finishes"),
    };
    let status =
        status.map_err(|e| Error::backend(format!("waiting for the command failed: {e}")))?;
    match guard.release().await {
        Ok(()) => Ok(status_code(status)),
        Err(e) if e.kind() == locksmith::ErrorKind::Lost => {
            eprintln!("locksmith: {e}; the command may not have run exclusively");
            Ok(EX_SOFTWARE)
        }
        Err(e) => {
            // The command ran under the lock; the store just missed the release.
            eprintln!("locksmith: warning: {e}; the lock frees when its TTL runs out");
            Ok(status_code(status))
        }
    }
}

/// Passes SIGINT, SIGTERM and SIGHUP on to the child instead of dying with
/// the lock held; the child decides, and we release when it exits.
async fn forward_signals(pid: Option<Pid>) {
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    loop {
        let sig = tokio::select! {
            _ = int.recv() => Signal::SIGINT,
            _ = term.recv() => Signal::SIGTERM,
            _ = hup.recv() => Signal::SIGHUP,
        };
        if let Some(pid) = pid {
            let _ = kill(pid, sig);
        }
    }
}

async fn terminate(child: &mut Child, grace: Duration, reason: LostReason) {
    eprintln!("locksmith: lock lost ({reason:?}); terminating the command");
    if let Some(id) = child.id() {
        let _ = kill(Pid::from_raw(id as i32), Signal::SIGTERM);
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

/// If locksmith itself is killed (SIGKILL, OOM) it can neither renew nor
/// terminate the command, which would then run on after the lease expires,
/// unprotected. On Linux the kernel kills the command with us instead.
#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut Command) {
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // two async-signal-safe system calls (prctl, getppid); it allocates
    // nothing and touches no locks.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // We may have died between fork and prctl.
            if nix::unistd::getppid().as_raw() as u32 != parent {
                return Err(std::io::Error::other(
                    "locksmith exited before the command started",
                ));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut Command) {}

fn status_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(EX_SOFTWARE)
}
