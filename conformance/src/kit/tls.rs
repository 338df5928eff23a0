//! Certificates for the TLS tests' private servers: a CA of their own,
//! made with `openssl` (`scripts/test` installs it).

use std::path::Path;
use std::process::{Command, Stdio};

fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stderr(Stdio::null())
        .status()
        .expect("openssl is installed (scripts/test installs it)")
        .success();
    assert!(ok, "openssl {args:?} failed");
}

/// Makes, in `dir`, a private CA (`ca.pem`), a server certificate for
/// 127.0.0.1 (`server.pem`, `server.key`) and a client certificate
/// (`client.pem`, `client.key`), valid for two days.
///
/// # Panics
/// If `openssl` is missing or fails.
pub fn certificates(dir: &Path) {
    std::fs::write(dir.join("server.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=locksmith test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    );
    for name in ["server", "client"] {
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                &format!("/CN=locksmith test {name}"),
                "-keyout",
                &format!("{name}.key"),
                "-out",
                &format!("{name}.csr"),
            ],
        );
        let (csr, pem, ext) = (
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        let args = [
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-extfile",
            &ext,
        ];
        openssl(dir, &args);
    }
}
