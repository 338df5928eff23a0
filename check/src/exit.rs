//! The signal `lockwright check` should end by, once it has cleaned up and
//! reported. The command keeps the same kind of flag for `run` and `elect`
//! (`die_by_signal_on_exit` in cli/src/main.rs); this crate cannot reach
//! that one, so it keeps its own, and the command's `main` reads both when
//! it exits (at most one is ever set: a process runs one subcommand).

use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::signal::Signal;

/// A signal this process should end by, once everything is cleaned up
/// (0: none).
static DIE_BY: AtomicI32 = AtomicI32::new(0);

/// Ends `lockwright` by `sig` (after clean-up) rather than by exit code
/// 128+N, when the user interrupted it: a shell stops a loop or script
/// only for a child that died by SIGINT, so the exit code alone would let
/// `for …; do lockwright check …; done` run on after Ctrl-C. The same rule
/// as the command's own `die_by_signal_on_exit`.
pub(crate) fn die_by_signal_on_exit(sig: Signal) {
    if matches!(sig, Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP) {
        DIE_BY.store(sig as i32, Ordering::SeqCst);
    }
}

/// The signal `check` asked this process to end by at exit, if any.
pub fn signal_to_end_by() -> Option<Signal> {
    match DIE_BY.load(Ordering::SeqCst) {
        0 => None,
        sig => Signal::try_from(sig).ok(),
    }
}
