//! The one mapping of what a memcached server answers, or fails to, onto
//! the contract's kinds.
//!
//! Everything that leaves the lock's state unknown or unreachable is
//! `Unavailable`: a server that cannot be dialled, a connection that
//! breaks, an answer that does not come in time, and a `CLIENT_ERROR` or
//! `ERROR` line, which ends the exchange as a broken connection (see
//! `wire.rs`). A write refused for want of memory is `Unavailable` too, and
//! marked unapplied, so that a quorum does not undo it. Answers the
//! protocol does not allow for a command are `Backend` errors. A TLS
//! certificate refused, by either side, is `Config` (`tls.rs`): no retry
//! mends it.

use std::time::Duration;

use lockwright_core::Error;

use crate::tls::refusal;
use crate::wire::{Failure, Reply};

/// An exchange with the server at `addr` that failed.
pub(crate) fn wire(addr: &str, failure: Failure) -> Error {
    match failure {
        // Nothing was sent, whatever the kind.
        Failure::Dial(e) => match refusal(&e, true) {
            Some(why) => Error::config(format!("memcached at {addr}: {why}"))
                .with_source(e)
                .unapplied(),
            // Unapplied, so a waiter riding an outage need not retire its
            // owner for each attempt that found no server.
            None => Error::unavailable(format!("cannot reach memcached at {addr}"))
                .with_source(e)
                .unapplied(),
        },
        Failure::DialTimeout(within) => Error::unavailable(format!(
            "no connection to memcached at {addr} within {within:?}"
        ))
        .unapplied(),
        Failure::Broken(e) => match refusal(&e, false) {
            // A server that wants a client certificate refuses under TLS
            // 1.3 only once our side of the handshake is done: at the
            // first reply.
            Some(why) => Error::config(format!("memcached at {addr}: {why}")).with_source(e),
            None => Error::unavailable(format!("the connection to memcached at {addr} failed"))
                .with_source(e),
        },
        Failure::Timeout(within) => no_answer(addr, within),
        Failure::Closed => Error::backend("the connection pool was closed"),
    }
}

/// The server at `addr` did not answer within `within`.
pub(crate) fn no_answer(addr: &str, within: Duration) -> Error {
    Error::unavailable(format!(
        "no answer from memcached at {addr} within {within:?}"
    ))
}

/// A full server refused a write: nothing of it took effect (`add` and
/// `cas` leave the item alone), which the error says, so that a quorum
/// does not undo it.
pub(crate) fn full(addr: &str, message: &str) -> Error {
    tracing::debug!(server = %addr, "memcached refused a write: {message}");
    Error::unavailable(format!(
        "memcached at {addr} is full (it answered \"{message}\"): it refuses new locks and \
         renewals until memory frees; give it more memory (-m), or keep other items off \
         the lock server"
    ))
    .unapplied()
}

/// A reply the command cannot get, or an error line the server sent for it.
pub(crate) fn unexpected(reply: &Reply) -> Error {
    match reply {
        Reply::Refused(line) => Error::backend(format!("memcached refused a command: {line}")),
        other => Error::backend(format!("memcached answered {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwright_core::ErrorKind;
    use std::io;

    #[test]
    fn failures_to_talk_are_unavailable_and_a_full_server_changed_nothing() {
        let io = || io::Error::new(io::ErrorKind::InvalidData, "CLIENT_ERROR bad data chunk");
        let second = Duration::from_secs(1);
        for f in [
            Failure::Dial(io()),
            Failure::DialTimeout(second),
            Failure::Broken(io()),
            Failure::Timeout(second),
        ] {
            assert_eq!(wire("h:11211", f).kind(), ErrorKind::Unavailable);
        }
        let untrusted = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
            )
        };
        for f in [Failure::Dial(untrusted()), Failure::Broken(untrusted())] {
            let e = wire("h:11211", f);
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.to_string().contains("tls_ca"), "{e}");
        }
        let e = full("h:11211", "out of memory storing object");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(
            e.is_unapplied() && e.to_string().contains("out of memory"),
            "{e}"
        );
        let e = unexpected(&Reply::Refused("SERVER_ERROR busy".into()));
        assert_eq!(e.kind(), ErrorKind::Backend);
    }
}
