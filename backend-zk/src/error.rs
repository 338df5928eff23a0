//! The one mapping of the ZooKeeper client's errors onto the contract's kinds.

use locksmith_core::Error;
use zookeeper_client::Error as ZkError;

/// The server or the link failed, so the outcome of a request is unknown
/// (or the request was never answered).
pub(crate) fn is_transient(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::ConnectionLoss | ZkError::NoHosts | ZkError::Timeout | ZkError::Throttled
    )
}

/// The session is over: every node it created is gone or going.
pub(crate) fn is_session_over(e: &ZkError) -> bool {
    matches!(
        e,
        ZkError::SessionExpired
            | ZkError::ClientClosed
            | ZkError::AuthFailed
            | ZkError::SessionMoved
    )
}

/// Maps client errors onto the contract's kinds, in one place.
pub(crate) fn map_err(e: ZkError) -> Error {
    if is_transient(&e) || is_session_over(&e) {
        Error::unavailable("cannot reach ZooKeeper").with_source(e)
    } else if matches!(e, ZkError::NoAuth | ZkError::InvalidAcl) {
        Error::config(
            "ZooKeeper refused access: the lock nodes belong to another identity \
             (zk://user:password@… must match)",
        )
        .with_source(e)
    } else {
        Error::backend("ZooKeeper answered with an error").with_source(e)
    }
}
