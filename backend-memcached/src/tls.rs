//! TLS to memcached (`memcaches://`), as memcached serves it when started
//! with `-Z` (and `-o ssl_chain_cert=…,ssl_key=…`).
//!
//! The client settings are built once per backend, from the URL's
//! `tls_ca`, `tls_cert` and `tls_key`, so that a file that is missing or
//! holds no usable PEM is a `Config` error when the backend is made, not
//! an outage at the first request. Every server of a quorum is dialled
//! with the same settings, and its certificate must name the host the URL
//! gives for it. rustls with ring, the one crypto provider the workspace
//! builds (never aws-lc).
//!
//! A handshake refused for a certificate is `Config` (see [`refusal`]):
//! no retry mends it, and a waiter must not take it for a server that is
//! down.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use lockwright_core::backend::{RedactedUrl, TlsFiles, TlsRefusal};
use lockwright_core::{Error, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// The client side of TLS for one backend: the roots it trusts and the
/// certificate it shows, if any.
#[derive(Clone)]
pub(crate) struct Tls {
    connector: TlsConnector,
}

impl Tls {
    /// The settings `files` name: their CA's certificates as the only
    /// roots (without `tls_ca`, the system's), and a client certificate
    /// when `tls_cert` and `tls_key` are given.
    ///
    /// # Errors
    /// `Config` naming the parameter whose file cannot be read or used.
    pub(crate) fn new(files: &TlsFiles, shown: &RedactedUrl) -> Result<Tls> {
        let pem = files.read(shown)?;
        let roots = match &pem.ca {
            Some(ca) => ca_roots(ca, files.ca.as_deref(), shown)?,
            None => system_roots(),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::config(format!("{shown}: TLS cannot be set up")).with_source(e))?
            .with_root_certificates(roots);
        let config = match &pem.identity {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| unusable(shown, "tls_cert", files.cert.as_deref(), e))?;
                if chain.is_empty() {
                    return Err(no_pem(
                        shown,
                        "tls_cert",
                        files.cert.as_deref(),
                        "CERTIFICATE",
                    ));
                }
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|e| unusable(shown, "tls_key", files.key.as_deref(), e))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    Error::config(format!(
                        "{shown}: tls_cert and tls_key do not make a client certificate \
                         (is the key the certificate's?)"
                    ))
                    .with_source(e)
                })?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Tls {
            connector: TlsConnector::from(Arc::new(config)),
        })
    }

    /// TLS to the server at `addr` (`host:port`, `[v6]:port`), whose
    /// certificate must name that host.
    ///
    /// # Errors
    /// `Config` for a host that cannot be a certificate's name.
    pub(crate) fn for_server(&self, addr: &str, shown: &RedactedUrl) -> Result<ServerTls> {
        let host = host_of(addr);
        // An IP address becomes an IP name, which the certificate must
        // carry as such (subjectAltName=IP:…).
        let name = ServerName::try_from(host.to_owned()).map_err(|e| {
            Error::config(format!(
                "{shown}: {host} cannot be checked against a TLS certificate"
            ))
            .with_source(e)
        })?;
        Ok(ServerTls {
            connector: self.connector.clone(),
            name,
        })
    }
}

/// TLS to one server: the backend's settings, and the name its
/// certificate must carry.
pub(crate) struct ServerTls {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl ServerTls {
    /// The handshake over `tcp`; the caller bounds it in time.
    pub(crate) async fn connect(&self, tcp: TcpStream) -> io::Result<Stream> {
        let tls = self.connector.connect(self.name.clone(), tcp).await?;
        Ok(Stream::Tls(Box::new(tls)))
    }
}

/// The host of `host:port` or `[v6]:port`, without brackets.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// Every certificate in the `tls_ca` file, as the only roots.
fn ca_roots(pem: &[u8], path: Option<&Path>, shown: &RedactedUrl) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| unusable(shown, "tls_ca", path, e))?;
        roots
            .add(cert)
            .map_err(|e| unusable(shown, "tls_ca", path, e))?;
    }
    if roots.is_empty() {
        return Err(no_pem(shown, "tls_ca", path, "CERTIFICATE"));
    }
    Ok(roots)
}

/// The system's roots. None found is not an error here: the handshake
/// then fails on the server's certificate, whose message names `tls_ca`.
fn system_roots() -> RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        tracing::warn!(
            "memcaches: no system root certificates found ({} errors); name the CA's file with tls_ca",
            found.errors.len()
        );
    }
    roots
}

/// A file that was read but cannot be used.
fn unusable<E>(shown: &RedactedUrl, name: &str, path: Option<&Path>, e: E) -> Error
where
    E: std::error::Error + Send + Sync + 'static,
{
    let file = path.map(|p| p.display().to_string()).unwrap_or_default();
    Error::config(format!("{shown}: {name} ({file}) is not usable PEM")).with_source(e)
}

/// A file that holds none of what its parameter needs.
fn no_pem(shown: &RedactedUrl, name: &str, path: Option<&Path>, what: &str) -> Error {
    let file = path.map(|p| p.display().to_string()).unwrap_or_default();
    Error::config(format!(
        "{shown}: {name} ({file}) holds no PEM {what} (-----BEGIN {what}-----)"
    ))
}

/// Why a TLS connection failed, in words naming the parameter that would
/// mend it, when nothing but a change of settings will: a certificate the
/// client refused, a handshake the server refused, and (in the handshake
/// only) a server that does not speak TLS. `None` for anything else (a
/// connection that broke), which stays an outage.
pub(crate) fn refusal(e: &io::Error, handshake: bool) -> Option<&'static str> {
    Some(match TlsRefusal::of(e, handshake)? {
        TlsRefusal::WrongHost => {
            "the server's certificate is not for the host the URL names: name the server \
             as its certificate does"
        }
        TlsRefusal::UntrustedCa => {
            "the server's certificate is not signed by a trusted CA: name the CA's file with tls_ca"
        }
        TlsRefusal::BadCertificate => {
            "the server's certificate is not valid (expired, not yet valid, or not a server's)"
        }
        // memcached run with ssl_verify_mode=2 refuses a client without a
        // certificate from its ssl_ca_cert; under TLS 1.3 the refusal
        // comes after our side of the handshake, with the first reply.
        TlsRefusal::RefusedByServer => {
            "the server refused the TLS handshake (does it want a client certificate: \
             tls_cert and tls_key, signed by a CA it trusts?)"
        }
        // A plain-text memcached answers the ClientHello with `ERROR`
        // lines, which are no TLS record: a URL that should say
        // memcache://, or a server that should run with -Z. (It answers
        // at once: the ClientHello always holds a line feed, in the
        // supported_groups extension's number 0x000a.)
        TlsRefusal::NotTls => {
            "the server does not speak TLS (a memcached without -Z?): use memcache:// for \
             plain text, or start it with -Z"
        }
        TlsRefusal::Incompatible => {
            "the server's TLS is not one this client speaks (TLS 1.2 or 1.3, modern ciphers)"
        }
        // Anything else stays an outage, as before the handshake's words
        // were known.
        _ => return None,
    })
}

/// A connection to memcached: plain TCP, or TLS over it.
pub(crate) enum Stream {
    /// `memcache://`.
    Plain(TcpStream),
    /// `memcaches://` (boxed: rustls's state is large).
    Tls(Box<TlsStream<TcpStream>>),
}

impl Stream {
    /// Whether the server has sent nothing since the last reply (and has
    /// not closed the connection): a pooled connection fit to reuse. No
    /// round trip, and nothing waited for.
    pub(crate) fn quiet(&mut self) -> bool {
        match self {
            Stream::Plain(tcp) => {
                let mut probe = [0u8; 1];
                matches!(tcp.try_read(&mut probe),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            // A byte read off the TCP socket would be part of a TLS record,
            // so the probe is one poll of the TLS stream, woken by no one.
            // Session tickets the server sent after the handshake are taken
            // in and leave it quiet; a close_notify, a closed socket or
            // data do not.
            Stream::Tls(tls) => {
                let mut cx = Context::from_waker(Waker::noop());
                let mut probe = [0u8; 1];
                let mut buf = ReadBuf::new(&mut probe);
                Pin::new(&mut **tls)
                    .poll_read(&mut cx, &mut buf)
                    .is_pending()
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(&mut **s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(&mut **s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwright_core::ErrorKind;
    use rustls::CertificateError;

    fn shown() -> RedactedUrl {
        RedactedUrl::new("memcaches://127.0.0.1")
    }

    #[test]
    fn hosts_lose_their_port_and_brackets() {
        assert_eq!(host_of("h:11211"), "h");
        assert_eq!(host_of("127.0.0.1:11211"), "127.0.0.1");
        assert_eq!(host_of("[::1]:11211"), "::1");
    }

    #[test]
    fn refused_certificates_name_the_parameter_and_broken_connections_do_not() {
        let tls = |e: rustls::Error| io::Error::new(io::ErrorKind::InvalidData, e);
        let issuer = tls(rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer,
        ));
        assert!(refusal(&issuer, true).unwrap().contains("tls_ca"));
        let name = tls(rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName,
        ));
        assert!(refusal(&name, false).unwrap().contains("host"));
        let alert = tls(rustls::Error::AlertReceived(
            rustls::AlertDescription::CertificateRequired,
        ));
        assert!(refusal(&alert, false).unwrap().contains("tls_cert"));
        let plain = tls(rustls::Error::InvalidMessage(
            rustls::InvalidMessage::InvalidContentType,
        ));
        assert!(refusal(&plain, true).unwrap().contains("-Z"));
        assert!(refusal(&plain, false).is_none());
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert!(refusal(&reset, true).is_none());
    }

    #[test]
    fn unreadable_or_empty_files_are_config_errors() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        for files in [
            TlsFiles {
                ca: Some("/nonexistent.pem".into()),
                ..TlsFiles::default()
            },
            TlsFiles {
                ca: Some(junk.clone()),
                ..TlsFiles::default()
            },
            TlsFiles {
                cert: Some(junk.clone()),
                key: Some(junk.clone()),
                ..TlsFiles::default()
            },
        ] {
            let e = Tls::new(&files, &shown()).err().expect("refused");
            assert_eq!(e.kind(), ErrorKind::Config, "{files:?}: {e}");
        }
        // The system's roots, and no client certificate.
        let tls = Tls::new(&TlsFiles::default(), &shown()).unwrap();
        assert!(tls.for_server("[::1]:11211", &shown()).is_ok());
    }
}
