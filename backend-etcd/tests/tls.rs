//! `etcds://`: a private member this test starts with TLS on its client
//! port, verified against a private CA, that takes only clients with a
//! certificate from that CA. A lock handed from one locker to a waiting
//! one goes through it; an untrusted server, a missing client certificate
//! and an unreadable file are errors, never "held by someone else".

use std::process::{Command, Stdio};

use lockwright_conformance::kit::free_port;
use lockwright_conformance::kit::process::ServerProcess;
use lockwright_conformance::kit::tls::{self, certificates};
use lockwright_core::{ErrorKind, Locker};
use lockwright_etcd::EtcdBackend;

fn locker(url: &str) -> Locker {
    Locker::new(EtcdBackend::connect(url).unwrap())
}

/// A lock handed from one locker to a waiting one, over `url`.
async fn hand_off(url: &str) {
    tls::hand_off(locker(url), locker(url)).await;
}

async fn refused(url: &str) -> ErrorKind {
    tls::refused(locker(url), url).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_private_ca_and_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let file = |f: &str| dir.path().join(f).to_str().unwrap().to_owned();
    let (port, peer) = (free_port(), free_port());
    let client_url = format!("https://127.0.0.1:{port}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let health = || {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &client_url, "--command-timeout", "2s"])
            .args(["--cacert", &file("ca.pem"), "--cert", &file("client.pem")])
            .args(["--key", &file("client.key"), "endpoint", "health"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let _server = ServerProcess::start_until(
        Command::new("etcd")
            .args(["--name", "tls", "--data-dir", &file("data")])
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("tls={peer_url}")])
            .args([
                "--cert-file",
                &file("server.pem"),
                "--key-file",
                &file("server.key"),
            ])
            .args(["--trusted-ca-file", &file("ca.pem"), "--client-cert-auth"])
            .args(["--log-level", "error"])
            .stderr(Stdio::null()),
        health,
    );
    let base = format!("etcds://127.0.0.1:{port}/tls-test?connect_timeout=1s&timeout=1s");
    let client = format!(
        "tls_cert={}&tls_key={}",
        file("client.pem"),
        file("client.key")
    );
    hand_off(&format!("{base}&tls_ca={}&{client}", file("ca.pem"))).await;
    // Not trusted by the system's roots; a file that is not there; no
    // client certificate (the member closes the connection, as a member
    // going away would: it cannot be told apart); plain text to a TLS port.
    let plain = format!("etcd://127.0.0.1:{port}/tls-test?connect_timeout=1s&timeout=1s");
    for (bad, kind) in [
        (format!("{base}&{client}"), ErrorKind::Config),
        (format!("{base}&tls_ca=/nonexistent.pem"), ErrorKind::Config),
        (
            format!("{base}&tls_ca={}", file("ca.pem")),
            ErrorKind::Unavailable,
        ),
        (plain, ErrorKind::Unavailable),
    ] {
        assert_eq!(refused(&bad).await, kind, "{bad}");
    }
}
