//! The one mapping of the etcd client's errors onto the core's kinds.

use etcd_client::Error as EtcdError;
use lockwright_core::Error;
use tonic::Code;

/// An error of the client as a core error: the cluster out of reach (or
/// without a leader, or slower than the timeout) is `Unavailable`, refused
/// credentials or certificates are `Config`, anything else `Backend`.
pub(crate) fn map_err(e: EtcdError) -> Error {
    let text = e.to_string();
    match &e {
        // A token older than the last change of users or roles: the client
        // fetches a new one, as Go's does.
        EtcdError::GRpcStatus(s) if s.message().contains("revision of auth store is old") => {
            Error::unavailable(format!("etcd: {text}"))
        }
        EtcdError::GRpcStatus(s) if s.message().contains("user name is empty") => Error::config(
            format!("etcd asks for credentials (user:password@): {text}"),
        ),
        // A TLS handshake that failed on a certificate (an untrusted
        // server, no client certificate) fails the same way next time.
        EtcdError::GRpcStatus(s) if is_tls_refusal(s.message()) => Error::config(format!(
            "etcd: the TLS handshake failed (see tls_ca, tls_cert and tls_key): {text}"
        )),
        EtcdError::GRpcStatus(s) => match s.code() {
            Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Unknown => Error::unavailable(format!("etcd: {text}")),
            Code::Unauthenticated | Code::PermissionDenied => {
                Error::config(format!("etcd refused the credentials: {text}"))
            }
            // A wrong password, or credentials where auth is off.
            Code::InvalidArgument | Code::FailedPrecondition
                if s.message().contains("authentication") || s.message().contains("auth") =>
            {
                Error::config(format!("etcd refused the credentials: {text}"))
            }
            _ => Error::backend(format!("etcd: {text}")),
        },
        // A stream that broke with its connection (a member gone) is one
        // more way of not reaching the cluster; a lease the cluster no
        // longer has is told apart by its text (`lease not found`).
        EtcdError::TransportError(_)
        | EtcdError::IoError(_)
        | EtcdError::LeaseKeepAliveError(_)
        | EtcdError::WatchError(_) => Error::unavailable(format!("etcd: {text}")),
        _ => Error::backend(format!("etcd: {text}")),
    }
    .with_source(e)
}

/// A transport failure's text that says a certificate was refused (an
/// untrusted server's, or ours): not a handshake cut short by a member
/// going away, which is worth trying again.
fn is_tls_refusal(message: &str) -> bool {
    message.to_ascii_lowercase().contains("certificate")
}
