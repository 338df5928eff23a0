//! The transports beside plain TCP, each against a private server this test
//! starts: a unix socket with an ACL user and password, and TLS verified
//! against a private CA, with a client certificate. Each runs a hand-off
//! between two lockers (so the pub/sub hub authenticates too), and shows
//! that wrong credentials are an error, never "held by someone else".

use std::process::Command;

use lockwright_conformance::kit::free_port;
use lockwright_conformance::kit::process::ServerProcess;
use lockwright_conformance::kit::tls::{self, certificates};
use lockwright_core::{ErrorKind, Locker};
use lockwright_redis::RedisBackend;

/// The default user off; only `alice` with password `s3cret` may connect.
const ACL: &[&str] = &[
    "--user", "default", "off", "--user", "alice", "on", ">s3cret", "~*", "&*", "+@all",
];

/// A private server with [`ACL`] and `args`, serving once `ready` says so.
fn start(args: &[&str], ready: impl Fn() -> bool) -> ServerProcess {
    ServerProcess::start_until(
        Command::new("redis-server")
            .args(["--save", "", "--appendonly", "no"])
            .args(ACL)
            .args(args),
        ready,
    )
}

fn locker(url: &str) -> Locker {
    Locker::new(RedisBackend::connect(url).unwrap())
}

/// A lock handed from one locker to a waiting one, over `url`.
async fn hand_off(url: &str) {
    tls::hand_off(locker(url), locker(url)).await;
}

async fn refused(url: &str) -> ErrorKind {
    tls::refused(locker(url), url).await
}

#[tokio::test]
async fn unix_socket_with_acl_user() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("redis.sock");
    let sock_s = sock.to_str().unwrap().to_owned();
    let _server = start(
        &[
            "--port",
            "0",
            "--unixsocket",
            &sock_s,
            "--unixsocketperm",
            "700",
        ],
        || std::os::unix::net::UnixStream::connect(&sock).is_ok(),
    );
    hand_off(&format!("redis+unix://{sock_s}?user=alice&pass=s3cret")).await;
    let kind = refused(&format!("redis+unix://{sock_s}?user=alice&pass=wrong")).await;
    assert_eq!(
        kind,
        ErrorKind::Config,
        "a wrong password is not worth retrying"
    );
}

#[tokio::test]
async fn tls_with_private_ca_and_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let file = |f: &str| dir.path().join(f).to_str().unwrap().to_owned();
    let tls_port = free_port();
    let port = tls_port.to_string();
    let _server = start(
        &[
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--tls-port",
            &port,
            "--tls-cert-file",
            &file("server.pem"),
            "--tls-key-file",
            &file("server.key"),
            "--tls-ca-cert-file",
            &file("ca.pem"),
            "--tls-auth-clients",
            "yes",
        ],
        || std::net::TcpStream::connect(("127.0.0.1", tls_port)).is_ok(),
    );
    let base = format!("rediss://alice:s3cret@127.0.0.1:{tls_port}");
    let client = format!(
        "tls_cert={}&tls_key={}",
        file("client.pem"),
        file("client.key")
    );
    hand_off(&format!("{base}?tls_ca={}&{client}", file("ca.pem"))).await;
    // Not trusted by the system store; no client certificate; wrong password.
    for bad in [
        format!("{base}?{client}"),
        format!("{base}?tls_ca={}", file("ca.pem")),
        format!(
            "rediss://alice:wrong@127.0.0.1:{tls_port}?tls_ca={}&{client}",
            file("ca.pem")
        ),
    ] {
        let kind = refused(&bad).await;
        assert_eq!(kind, ErrorKind::Config, "{bad}");
    }
    assert_eq!(
        RedisBackend::connect(&format!("{base}?tls_ca=/nonexistent.pem"))
            .unwrap_err()
            .kind(),
        ErrorKind::Config
    );
}
