//! `memcaches://`: private memcached servers this test starts with TLS
//! (`-Z`), their certificates from a private CA; one of them takes only
//! clients with a certificate from that CA (`ssl_verify_mode=2`). A lock
//! handed from one locker to a waiting one goes through them, alone and as
//! a quorum; an untrusted server, a certificate for another host, an
//! unreadable file, a missing client certificate, and plain text on
//! either side are errors, never a grant, and never a hang.

use std::time::Duration;

use lockwright_conformance::kit::free_port;
use lockwright_conformance::kit::tls::{self, certificates};
use lockwright_core::{ErrorKind, LockOptions, Locker};
use lockwright_memcached::MemcachedBackend;

mod common;

use common::OwnServer;

fn locker(url: &str) -> Locker {
    Locker::new(MemcachedBackend::connect(url).unwrap())
}

/// A lock handed from one locker to a waiting one, over `url`. (The kit's
/// `tls::hand_off` also compares fencing tokens, which memcached has none
/// of.)
async fn hand_off(url: &str) {
    let (a, b) = (locker(url), locker(url));
    let g = a.lock("transport").await.unwrap();
    let waiter = tokio::spawn(async move {
        let opts = LockOptions::new().wait_for(Duration::from_secs(10));
        b.lock_with("transport", &opts).await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "{url}: granted while held");
    g.release().await.unwrap();
    let g2 = waiter.await.unwrap().expect("handed over");
    g2.release().await.unwrap();
}

/// The kind of error the first attempt over `url` ends with; within 20 s,
/// so that a client waiting on a server that waits too fails the test.
async fn refused(url: &str) -> ErrorKind {
    tokio::time::timeout(Duration::from_secs(20), tls::refused(locker(url), url))
        .await
        .unwrap_or_else(|_| panic!("{url}: no answer within 20 s"))
}

/// A memcached on a free port serving TLS with `options` (`-o`).
fn tls_server(options: &str) -> OwnServer {
    OwnServer::start_with(free_port(), 64, &["-Z", "-o", options])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_private_ca_and_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let file = |f: &str| dir.path().join(f).to_str().unwrap().to_owned();
    // memcached reads its certificate and key as it starts, before it
    // gives up root for `-u`: the files may stay the test's own.
    let serving = format!(
        "ssl_chain_cert={},ssl_key={}",
        file("server.pem"),
        file("server.key")
    );
    let ca = file("ca.pem");
    let server = tls_server(&serving);
    let port = server.port;
    let base = format!("memcaches://127.0.0.1:{port}?connect_timeout=1s&timeout=1s");
    hand_off(&format!("{base}&tls_ca={ca}")).await;

    // Three servers are a quorum over TLS just the same.
    let quorum: Vec<OwnServer> = (0..3).map(|_| tls_server(&serving)).collect();
    let hosts: Vec<String> = quorum.iter().map(OwnServer::addr).collect();
    hand_off(&format!(
        "memcaches://{}?timeout=250ms&connect_timeout=1s&tls_ca={ca}",
        hosts.join(",")
    ))
    .await;

    // A file that is not there: refused when the backend is made.
    let e = MemcachedBackend::connect(&format!("{base}&tls_ca=/nonexistent.pem")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.to_string().contains("/nonexistent.pem"), "{e}");

    // Not trusted by the system's roots; a certificate for 127.0.0.1 only,
    // reached as localhost; plain text to the TLS port, which memcached
    // ends at once (a reset, as a server going away would: `Unavailable`).
    let plain = format!("memcache://127.0.0.1:{port}?connect_timeout=1s&timeout=1s");
    for (bad, kind) in [
        (base.clone(), ErrorKind::Config),
        (
            format!("memcaches://localhost:{port}?connect_timeout=1s&timeout=1s&tls_ca={ca}"),
            ErrorKind::Config,
        ),
        (plain, ErrorKind::Unavailable),
    ] {
        assert_eq!(refused(&bad).await, kind, "{bad}");
    }

    // TLS to a plain-text server: it answers the ClientHello with `ERROR`
    // lines, which are no TLS record, so the handshake fails at once and
    // says the server does not speak TLS.
    let text = OwnServer::start(free_port(), 64);
    let to_text = format!(
        "memcaches://127.0.0.1:{}?connect_timeout=1s&timeout=1s&tls_ca={ca}",
        text.port
    );
    assert_eq!(refused(&to_text).await, ErrorKind::Config, "{to_text}");

    // A server that takes only clients with a certificate from the CA.
    let verifying = tls_server(&format!("{serving},ssl_ca_cert={ca},ssl_verify_mode=2"));
    let base = format!(
        "memcaches://127.0.0.1:{}?connect_timeout=1s&timeout=1s&tls_ca={ca}",
        verifying.port
    );
    hand_off(&format!(
        "{base}&tls_cert={}&tls_key={}",
        file("client.pem"),
        file("client.key")
    ))
    .await;
    // Without one: under TLS 1.3 the server's refusal (an alert) comes
    // with the first reply, or its reset first: `Config` or `Unavailable`,
    // never a grant.
    let kind = refused(&base).await;
    assert!(
        matches!(kind, ErrorKind::Config | ErrorKind::Unavailable),
        "{base}: {kind:?}"
    );
}
