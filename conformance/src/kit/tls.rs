//! The TLS tests' kit: certificates for their private servers (a CA of
//! their own, made with `openssl`, which `scripts/test` installs), and the
//! hand-off and refusals they run through them.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use lockwright_core::{ErrorKind, LockOptions, Locker};

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
            "/CN=lockwright test CA",
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
                &format!("/CN=lockwright test {name}"),
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

/// A lock handed from `a` to `b`, waiting for it: every connection of a
/// backend (its notifications' too) goes through the transport under test.
///
/// # Panics
/// If the hand-off fails, or the second fence is not above the first.
pub async fn hand_off(a: Locker, b: Locker) {
    let g = a.lock("transport").await.unwrap();
    let fence = g.fence().unwrap();
    let waiter = tokio::spawn(async move {
        let opts = LockOptions::new().wait_for(Duration::from_secs(10));
        b.lock_with("transport", &opts).await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    g.release().await.unwrap();
    let g2 = waiter.await.unwrap().expect("handed over");
    assert!(g2.fence().unwrap() > fence);
    g2.release().await.unwrap();
}

/// The kind of error a first attempt through `l` (made from `url`, which
/// must be refused) ends with.
///
/// # Panics
/// If the attempt is granted.
pub async fn refused(l: Locker, url: &str) -> ErrorKind {
    match l.try_lock("transport").await {
        Ok(g) => panic!("{url} should be refused, got {g:?}"),
        Err(e) => {
            eprintln!("{url}: {}", e.chain());
            e.kind()
        }
    }
}
