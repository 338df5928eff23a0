//! The TLS files a URL names (`tls_ca`, `tls_cert`, `tls_key`): one
//! spelling and one set of checks for every store that speaks TLS
//! (`rediss://`, `etcds://`), whatever client library reads them.

use std::path::{Path, PathBuf};

use crate::params::UrlParams;
use crate::redact::RedactedUrl;
use crate::{Error, Result};

/// PEM files for a TLS connection; none given: the system's roots, no
/// client certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// Root certificates to trust instead of the system's.
    pub ca: Option<PathBuf>,
    /// Client certificate (with `key`), for servers that authenticate clients.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key.
    pub key: Option<PathBuf>,
}

/// The contents of [`TlsFiles`], read.
#[derive(Debug, Clone, Default)]
pub struct TlsPem {
    /// The roots to trust, if named.
    pub ca: Option<Vec<u8>>,
    /// The client certificate and its key, if named.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    /// Takes `tls_ca`, `tls_cert` and `tls_key` from the URL's parameters.
    ///
    /// # Errors
    /// As [`UrlParams::text`].
    pub fn from_params(p: &mut UrlParams) -> Result<Self> {
        Ok(TlsFiles {
            ca: p.text("tls_ca")?.map(PathBuf::from),
            cert: p.text("tls_cert")?.map(PathBuf::from),
            key: p.text("tls_key")?.map(PathBuf::from),
        })
    }

    /// No file given.
    pub fn is_empty(&self) -> bool {
        *self == TlsFiles::default()
    }

    /// Checks the files for the URL `shown`: only a TLS scheme (`tls`)
    /// takes them (`tls_scheme` names it in the message), each names a
    /// file, and a certificate comes with its key.
    ///
    /// # Errors
    /// `Config` saying which rule the URL breaks.
    pub fn check(&self, shown: &RedactedUrl, tls: bool, tls_scheme: &str) -> Result<()> {
        if !tls && !self.is_empty() {
            return Err(Error::config(format!(
                "{shown}: tls_ca, tls_cert and tls_key need a {tls_scheme}:// URL"
            )));
        }
        for (name, path) in [
            ("tls_ca", &self.ca),
            ("tls_cert", &self.cert),
            ("tls_key", &self.key),
        ] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(Error::config(format!("{shown}: {name} needs a file")));
            }
        }
        if self.cert.is_some() != self.key.is_some() {
            return Err(Error::config(format!(
                "{shown}: tls_cert and tls_key go together"
            )));
        }
        Ok(())
    }

    /// Reads the files named.
    ///
    /// # Errors
    /// `Config` naming a file that cannot be read.
    pub fn read(&self, shown: &RedactedUrl) -> Result<TlsPem> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| {
                Error::config(format!("{shown}: cannot read {}", path.display())).with_source(e)
            })
        };
        let identity = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            _ => None,
        };
        Ok(TlsPem {
            ca: self.ca.as_deref().map(read).transpose()?,
            identity,
        })
    }
}

/// Why a TLS connection was refused, when no retry mends it: one
/// classification for every backend, each of which words it with the URL
/// parameters of its own store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsRefusal {
    /// The server's certificate does not name the host the URL names.
    WrongHost,
    /// The server's certificate is not signed by a CA this client trusts.
    UntrustedCa,
    /// The server's certificate is otherwise not valid (expired, not yet
    /// valid, not a server's).
    BadCertificate,
    /// The server refused the handshake (a client certificate it wants).
    RefusedByServer,
    /// The server answered the handshake with something that is not TLS.
    NotTls,
    /// The server's TLS is not one this client speaks (too old, other
    /// ciphers).
    Incompatible,
    /// Any other TLS error in the handshake.
    Other,
}

impl TlsRefusal {
    /// The refusal inside `e` (a rustls error carried by an I/O error, as
    /// rustls and tokio-rustls report one). `handshake`: `e` came while
    /// the connection was being made, where a protocol error means the
    /// server does not speak our TLS; later, only a certificate or an
    /// alert counts, and anything else is a connection that broke.
    #[cfg(feature = "rustls")]
    pub fn of(e: &std::io::Error, handshake: bool) -> Option<Self> {
        use rustls::{CertificateError as C, Error as E};
        let tls = e.get_ref()?.downcast_ref::<E>()?;
        Some(match tls {
            E::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
                TlsRefusal::WrongHost
            }
            E::InvalidCertificate(C::UnknownIssuer | C::BadSignature) => TlsRefusal::UntrustedCa,
            E::InvalidCertificate(_) => TlsRefusal::BadCertificate,
            E::AlertReceived(_) | E::NoCertificatesPresented => TlsRefusal::RefusedByServer,
            _ if !handshake => return None,
            E::InvalidMessage(_) => TlsRefusal::NotTls,
            E::PeerIncompatible(_) | E::PeerMisbehaved(_) => TlsRefusal::Incompatible,
            _ => TlsRefusal::Other,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn files(query: &str) -> (TlsFiles, RedactedUrl) {
        let url = format!("x://h?{query}");
        let mut p = UrlParams::new(&url);
        (
            TlsFiles::from_params(&mut p).unwrap(),
            RedactedUrl::new(url),
        )
    }

    #[test]
    fn only_a_tls_url_takes_whole_pairs_of_named_files() {
        let (f, shown) = files("tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/c.key");
        assert!(f.check(&shown, true, "xs").is_ok());
        assert_eq!(
            f.check(&shown, false, "xs").unwrap_err().kind(),
            ErrorKind::Config
        );
        for bad in ["tls_cert=/c.pem", "tls_key=/c.key", "tls_ca="] {
            let (f, shown) = files(bad);
            assert_eq!(
                f.check(&shown, true, "xs").unwrap_err().kind(),
                ErrorKind::Config,
                "{bad}"
            );
        }
        let (f, shown) = files("tls_ca=/nonexistent.pem");
        assert_eq!(f.read(&shown).unwrap_err().kind(), ErrorKind::Config);
        assert!(files("").0.is_empty());
    }
}
