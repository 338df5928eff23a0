//! The one mapping of the redis driver's errors onto the contract's kinds.

use std::sync::Arc;

use locksmith_core::backend::RedactedUrl;
use locksmith_core::Error;
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

/// Maps driver errors onto the contract's kinds, in one place.
pub(crate) fn map_err(e: RedisError) -> Error {
    let transient_code = matches!(
        e.code(),
        Some("LOADING" | "MASTERDOWN" | "READONLY" | "BUSY" | "TRYAGAIN" | "CLUSTERDOWN")
    );
    let msg = e.to_string();
    // Refused credentials or certificates will not get better by retrying.
    let refused_tls = std::error::Error::source(&e).is_some_and(is_tls_refusal);
    // No password where one is required, or a database the server lacks.
    let refused_config = e.code() == Some("NOAUTH")
        || e.code() == Some("WRONGPASS")
        || msg.contains("DB index is out of range");
    if e.kind() == redis::ErrorKind::AuthenticationFailed || refused_tls || refused_config {
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

/// A URL the driver cannot use: `Config`, the driver's reason as the source.
pub(crate) fn bad_url(url: &RedactedUrl, e: RedisError) -> Error {
    Error::config(format!("{url}: the driver cannot use this URL")).with_source(e)
}
