//! TLS for every connection a backend makes, from the URL's one TLS
//! setting: the one server of `rediss://`; under `rediss+sentinel://` the
//! sentinels and the data nodes they name; under `rediss+cluster://` every
//! node of the Cluster. One set of files serves them all, as redis-py,
//! go-redis and Lettuce do with their one TLS setting.
//!
//! A connection asked to be TLS is never made in plain text: its address
//! is the driver's TLS address, so the handshake either completes with a
//! server the roots trust or the connection fails.

use lockwright_core::backend::{HostPort, RedactedUrl, TlsFiles};
use lockwright_core::Result;
use redis::cluster::ClusterClientBuilder;
use redis::{
    ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo, RedisResult, TlsCertificates,
};

use crate::error::bad_url;

/// The certificates the URL's TLS files name (with no `tls_ca`, the
/// system's roots), read and checked now.
///
/// # Errors
/// `Config` for a file that cannot be read or holds no usable PEM.
pub(crate) fn certificates(files: &TlsFiles, shown: &RedactedUrl) -> Result<TlsCertificates> {
    let pem = files.read(shown)?;
    // The driver takes a file without a certificate in it as no roots at
    // all, and every handshake would then fail as an untrusted server.
    if let Some(ca) = &pem.ca {
        use rustls::pki_types::pem::PemObject;
        let found = rustls::pki_types::CertificateDer::pem_slice_iter(ca)
            .filter(|c| c.is_ok())
            .count();
        if found == 0 {
            return Err(lockwright_core::Error::config(format!(
                "{shown}: tls_ca names a file with no PEM certificate in it"
            )));
        }
    }
    let certs = TlsCertificates {
        client_tls: pem
            .identity
            .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: pem.ca,
    };
    // The driver parses the files again for each client it builds, where a
    // bad one would read as a server that cannot be reached: parsed once
    // here, it is a `Config` error before any connection.
    redis::Client::build_with_tls("rediss://127.0.0.1", certs.clone())
        .map_err(|e| bad_url(shown, e))?;
    Ok(certs)
}

/// The handshake settings for a server that takes `user` and `password`
/// (neither: none is sent).
pub(crate) fn credentials(user: Option<&str>, password: Option<&str>) -> RedisConnectionInfo {
    let mut settings = RedisConnectionInfo::default();
    if let Some(u) = user {
        settings = settings.set_username(u);
    }
    if let Some(p) = password {
        settings = settings.set_password(p);
    }
    settings
}

/// A client of the server at `at` with `settings`, over TLS with `tls`
/// when given (and then never in plain text).
pub(crate) fn client(
    at: &HostPort,
    settings: RedisConnectionInfo,
    tls: Option<&TlsCertificates>,
) -> RedisResult<redis::Client> {
    let (host, port) = (at.host().to_owned(), at.port());
    let addr = match tls {
        Some(_) => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            tls_params: None,
        },
        None => ConnectionAddr::Tcp(host, port),
    };
    let info = addr.into_connection_info()?.set_redis_settings(settings);
    match tls {
        Some(certs) => redis::Client::build_with_tls(info, certs.clone()),
        None => redis::Client::open(info),
    }
}

/// `builder` with every node's connection over TLS with `tls`, when
/// given. The nodes must announce their TLS ports (`tls-cluster yes`,
/// and `port 0` or the TLS port announced): `CLUSTER SLOTS` and the
/// `MOVED` and `ASK` redirects name the ports the nodes announce, and the
/// driver connects to those with TLS.
pub(crate) fn cluster(
    builder: ClusterClientBuilder,
    tls: Option<&TlsCertificates>,
) -> ClusterClientBuilder {
    match tls {
        Some(certs) => builder.tls(redis::TlsMode::Secure).certs(certs.clone()),
        None => builder,
    }
}
