//! How the `lockwright` process ends: its exit codes (sysexits.h values, so
//! scripts can tell "busy" from "broken") and the signal it should end by.
//!
//! Shared because one process runs one subcommand, from the command
//! (`lockwright-cli`) or from its `check` and `bench` (`lockwright-check`),
//! and the command's `main` ends it the same way for all of them: one flag
//! to read at exit and one set of codes, instead of a copy in each crate
//! kept equal by comments.
//!
//! Why end by a signal at all: a shell stops a loop or script only for a
//! child that died by SIGINT, so the exit code 128+N alone would let
//! `for …; do lockwright run …; done` run on after Ctrl-C. Only the signals
//! that mean "stop" (SIGINT, SIGTERM, SIGHUP) are recorded; the command's
//! `main` restores the default action of the one recorded and raises it,
//! after everything is cleaned up.

use std::sync::atomic::{AtomicI32, Ordering};

use lockwright::ErrorKind;
use nix::sys::signal::Signal;

/// Configuration that retrying will not fix: bad usage, URL, option, credentials, database, table.
pub const EX_USAGE: i32 = 64;

/// What was named is not there: `break --holder` of an id nobody holds by.
pub const EX_NOINPUT: i32 = 66;

/// The lock was lost (or could not be kept) while the command ran.
pub const EX_SOFTWARE: i32 = 70;

/// The operating system refused something we need (a runtime, a process).
pub const EX_OSERR: i32 = 71;

/// The store cannot be reached now.
pub const EX_UNAVAILABLE: i32 = 69;

/// Not acquired: someone else holds the lock (busy, or the wait ran out).
pub const EX_TEMPFAIL: i32 = 75;

/// The store answered unexpectedly.
pub const EX_PROTOCOL: i32 = 76;

/// The exit status the command ends with for an error of `kind`: the
/// command's one table, which scripts rely on.
///
/// | kind | status |
/// |---|---|
/// | `Busy`, `Timeout` | 75 (`EX_TEMPFAIL`): not acquired, someone else holds it |
/// | `Lost`, `NotHeld`, `Closed` | 70 (`EX_SOFTWARE`): the lock could not be kept |
/// | `InvalidKey`, `InvalidOptions`, `Config`, `Unsupported` | 64 (`EX_USAGE`): retrying will not help |
/// | `Unavailable` | 69 (`EX_UNAVAILABLE`): the store cannot be reached now |
/// | `Backend`, and a kind added later | 76 (`EX_PROTOCOL`): the store answered unexpectedly |
pub fn exit_code(kind: ErrorKind) -> i32 {
    match kind {
        ErrorKind::Busy | ErrorKind::Timeout => EX_TEMPFAIL,
        ErrorKind::Lost | ErrorKind::NotHeld | ErrorKind::Closed => EX_SOFTWARE,
        ErrorKind::InvalidKey
        | ErrorKind::InvalidOptions
        | ErrorKind::Config
        | ErrorKind::Unsupported => EX_USAGE,
        ErrorKind::Unavailable => EX_UNAVAILABLE,
        // `ErrorKind` may grow: an unknown kind is the store's surprise.
        _ => EX_PROTOCOL,
    }
}

/// The signal this process should end by once it has cleaned up (0: none).
static DIE_BY: AtomicI32 = AtomicI32::new(0);

/// Records `sig` (SIGINT, SIGTERM or SIGHUP only) as the signal to end by, not code 128+N.
pub fn die_by_signal_on_exit(sig: Signal) {
    // A command that died by another signal (SIGKILL, SIGSEGV) is reported
    // by the code 128+N: `lockwright` itself did not crash, and raising
    // SIGSEGV or SIGABRT here would say that it did.
    if matches!(sig, Signal::SIGINT | Signal::SIGTERM | Signal::SIGHUP) {
        DIE_BY.store(sig as i32, Ordering::SeqCst);
    }
}

/// The signal [`die_by_signal_on_exit`] recorded, if any: the one to end by.
pub fn signal_to_end_by() -> Option<Signal> {
    match DIE_BY.load(Ordering::SeqCst) {
        0 => None,
        sig => Signal::try_from(sig).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind has the status the table gives it; a kind added to
    /// `ErrorKind` fails here until it is given a row.
    #[test]
    fn every_kind_has_its_row() {
        for &kind in ErrorKind::ALL {
            let want = match kind {
                ErrorKind::Busy | ErrorKind::Timeout => 75,
                ErrorKind::Lost | ErrorKind::NotHeld | ErrorKind::Closed => 70,
                ErrorKind::InvalidKey
                | ErrorKind::InvalidOptions
                | ErrorKind::Config
                | ErrorKind::Unsupported => 64,
                ErrorKind::Unavailable => 69,
                ErrorKind::Backend => 76,
                other => panic!("{other:?} has no row in the exit-code table"),
            };
            assert_eq!(exit_code(kind), want, "{kind:?}");
        }
    }
}
