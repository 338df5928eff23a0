//! The one mapping of the ZooKeeper client's errors onto the contract's kinds.

use lockwright_core::Error;
use zookeeper_client::Error as ZkError;

/// The server answered this request with a definite result code: the
/// request is known to have done nothing (or, for a read, to have seen
/// nothing). Anything else, a lost or reset connection (the client reports
/// some as `Custom` I/O errors), a timeout, a request that never got an
/// answer, leaves its outcome unknown.
fn is_definite(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::NoNode
            | ZkError::NoAuth
            | ZkError::BadVersion
            | ZkError::NoChildrenForEphemerals
            | ZkError::NodeExists
            | ZkError::NotEmpty
            | ZkError::InvalidAcl
            | ZkError::BadArguments(_)
            | ZkError::QuotaExceeded
            | ZkError::Unimplemented
            | ZkError::NotReadOnly
            | ZkError::NoWatcher
            | ZkError::ReconfigDisabled
            | ZkError::MarshallingError
    )
}

/// The session is over: every node it created is gone or going, and every
/// later request of this client fails.
pub(crate) fn is_session_over(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::SessionExpired | ZkError::ClientClosed | ZkError::AuthFailed
    )
}

/// The link or the ensemble failed and the session may live on: the
/// request's outcome is unknown, and trying again once connected may help.
pub(crate) fn is_transient(e: &ZkError) -> bool {
    !is_definite(e) && !is_session_over(e)
}

/// Maps client errors onto the contract's kinds, in one place.
pub(crate) fn map_err(e: ZkError) -> Error {
    if matches!(e, ZkError::NoAuth | ZkError::InvalidAcl) {
        Error::config(
            "ZooKeeper refused access: the lock nodes belong to another identity \
             (zk://user:password@… must match)",
        )
        .with_source(e)
    } else if is_definite(&e) {
        Error::backend("ZooKeeper answered with an error").with_source(e)
    } else {
        Error::unavailable("cannot reach ZooKeeper").with_source(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwright_core::ErrorKind;

    #[test]
    fn a_broken_connection_is_unavailable_and_its_outcome_unknown() {
        for e in [
            ZkError::ConnectionLoss,
            ZkError::Timeout,
            ZkError::NoHosts,
            ZkError::SessionMoved,
            ZkError::UnexpectedError("connection reset".into()),
        ] {
            assert!(is_transient(&e), "{e}");
            assert_eq!(map_err(e).kind(), ErrorKind::Unavailable);
        }
        assert!(is_session_over(&ZkError::SessionExpired));
        assert!(!is_transient(&ZkError::SessionExpired));
        assert!(!is_transient(&ZkError::NoNode));
        assert_eq!(map_err(ZkError::NoAuth).kind(), ErrorKind::Config);
    }
}
