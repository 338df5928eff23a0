//! The one mapping of the redis driver's errors onto the contract's kinds.

use std::sync::Arc;

use lockwright_core::backend::RedactedUrl;
use lockwright_core::Error;
use redis::RedisError;

/// A TLS handshake the client or server refused (untrusted or missing
/// certificate), found through the layers the driver wraps it in.
fn is_tls_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    type Shared = Arc<dyn std::error::Error + Send + Sync>;
    let e = match e.downcast_ref::<Shared>() {
        Some(shared) => &**shared as &(dyn std::error::Error + 'static),
        None => e,
    };
    let inner = e
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::get_ref)
        .map_or(e, |i| i as &(dyn std::error::Error + 'static));
    inner.is::<rustls::Error>()
}

/// Whether `msg` carries rustls's words for a refused handshake (an
/// untrusted certificate; an alert from a server that refused ours). A
/// Cluster's first connections pass a node's error on as text only, with
/// no source to find the rustls error in.
fn says_tls_refusal(msg: &str) -> bool {
    ["invalid peer certificate", "received fatal alert"]
        .iter()
        .any(|w| msg.contains(w))
}

/// Server error codes that a restart, a failover or a slot's move gives
/// while it lasts: the request did not complete, and the same request a
/// little later will find the new primary (or the loaded data). Each one's
/// place here is checked by a test:
/// - `LOADING`: a restarted server still reading its data set;
/// - `MASTERDOWN`: a replica whose primary is gone (`replica-serve-stale-data no`);
/// - `READONLY`: a write sent to a node demoted to replica;
/// - `BUSY`: a script still running on the server;
/// - `TRYAGAIN`, `CLUSTERDOWN`, `MOVED`, `ASK`: a Cluster resharding or
///   failing over, past the driver's own redirects and retries;
/// - `UNBLOCKED`: a blocking command (the `WAIT` sent with a grant) cut
///   short because its node became a replica (`CLUSTER FAILOVER FORCE`);
/// - `NOSCRIPT`: a script sent again after loading it met a failover to a
///   primary that has not loaded it yet.
pub(crate) const TRANSIENT_CODES: [&str; 10] = [
    "LOADING",
    "MASTERDOWN",
    "READONLY",
    "BUSY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MOVED",
    "ASK",
    "UNBLOCKED",
    "NOSCRIPT",
];

/// The server's error codes in `e`: its own, or each failed command's in
/// a pipeline (where the driver reports no single code).
fn codes(e: &RedisError) -> Vec<String> {
    match e.clone().into_server_errors() {
        Some(items) => items.iter().map(|(_, s)| s.code().to_owned()).collect(),
        None => e.code().map(str::to_owned).into_iter().collect(),
    }
}

/// Maps driver errors onto the contract's kinds, in one place.
pub(crate) fn map_err(e: RedisError) -> Error {
    let codes = codes(&e);
    let transient_code = codes.iter().any(|c| TRANSIENT_CODES.contains(&c.as_str()));
    let msg = e.to_string();
    // Refused credentials or certificates will not get better by retrying.
    // The words are looked for only in I/O errors, never in a server's
    // reply (which could hold any text).
    let refused_tls = std::error::Error::source(&e).is_some_and(is_tls_refusal)
        || (e.kind() == redis::ErrorKind::Io && says_tls_refusal(&msg));
    // No password where one is required (also each command of a pipeline
    // refused so, as a sentinel asked without its password refuses both
    // of its questions), or a database the server lacks.
    let refused_config = codes
        .iter()
        .any(|c| matches!(c.as_str(), "NOAUTH" | "WRONGPASS" | "NOPERM"))
        || msg.contains("DB index is out of range");
    if let Some(what) = wrong_kind(&msg) {
        Error::config(what).with_source(e)
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed || refused_tls || refused_config {
        Error::config("redis refused the connection").with_source(e)
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
        || transient_code
    {
        Error::unavailable("cannot reach redis").with_source(e)
    } else {
        Error::backend("redis answered with an error").with_source(e)
    }
}

/// What a server that is not the kind the URL asked for answers with,
/// named: a retry will not change what it is.
fn wrong_kind(msg: &str) -> Option<&'static str> {
    let unknown = |command: &str| {
        msg.contains(&format!("unknown command '{command}'"))
            || msg.contains(&format!("unknown command `{command}`"))
    };
    if msg.contains("cluster support disabled") {
        Some(
            "the server answered as a Redis without cluster mode, not a Redis Cluster node \
             (use redis://)",
        )
    } else if unknown("SENTINEL") {
        Some(
            "the server answered as a Redis data server, not a Sentinel (use redis:// for it, \
             or redis+sentinel:// with the sentinels' ports)",
        )
    } else if unknown("EVALSHA") || unknown("EVAL") || unknown("SCRIPT") {
        Some(
            "the server runs no scripts: their commands are disabled or renamed there, or it \
             is a Redis Sentinel (use redis+sentinel://<sentinels>/<master name>)",
        )
    } else {
        None
    }
}

/// A URL the driver cannot use: `Config`, the driver's reason as the source.
pub(crate) fn bad_url(url: &RedactedUrl, e: RedisError) -> Error {
    Error::config(format!("{url}: the driver cannot use this URL")).with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwright_core::ErrorKind;

    #[test]
    fn a_refused_handshake_passed_on_as_text_is_config() {
        // As a Cluster's first connections report a node's error.
        let e = RedisError::from((
            redis::ErrorKind::Io,
            "Failed to create initial connections",
            "invalid peer certificate: UnknownIssuer".to_owned(),
        ));
        assert_eq!(map_err(e).kind(), ErrorKind::Config);
        let e = RedisError::from((
            redis::ErrorKind::Io,
            "Failed to create initial connections",
            "Connection reset by peer (os error 104)".to_owned(),
        ));
        assert_eq!(map_err(e).kind(), ErrorKind::Unavailable);
    }
}
