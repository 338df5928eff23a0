//! Helpers shared by the command's test files (`cli/tests/*.rs`).

#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The `locksmith` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_locksmith");

/// `locksmith ARGS` in `dir`, as a script runs it: no `$LOCKSMITH_URL`
/// from the test's environment, stdin closed.
pub fn locksmith(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(dir)
        .env_remove("LOCKSMITH_URL")
        .args(args)
        .stdin(Stdio::null());
    c
}

/// `locksmith run --url URL --key KEY -- sh -c SCRIPT` in `dir`.
#[allow(dead_code)] // not every test file runs a script
pub fn run_script(dir: &Path, url: &str, key: &str, script: &str) -> Command {
    locksmith(
        dir,
        &["run", "--url", url, "--key", key, "--", "sh", "-c", script],
    )
}

/// Runs it to the end; what it printed and how it exited.
pub fn output(mut c: Command) -> Output {
    c.output().expect("locksmith runs")
}

// The test servers, by the kit's one rule (see
// `locksmith_conformance::kit::servers`).
use locksmith_conformance::kit::servers;

/// The PostgreSQL test database.
pub fn postgres_url() -> String {
    servers::postgres_url()
}

/// The MySQL/MariaDB test database.
pub fn mysql_url() -> String {
    servers::mysql_url()
}

/// The single Redis test server.
pub fn redis_url() -> String {
    servers::redis_url()
}

/// A Redlock URL over the test masters, with `tail` after the host list.
pub fn redlock_url(tail: &str) -> String {
    let hosts = servers::loopback(&servers::redlock_ports());
    format!("redis+redlock://{}{tail}", hosts.join(","))
}

/// A private redis-server on a free loopback port, killed when dropped.
pub struct PrivateRedis {
    server: locksmith_conformance::kit::process::ServerProcess,
    pub port: u16,
}

impl PrivateRedis {
    /// Starts one with `extra` arguments (e.g. `--requirepass x`).
    pub fn start(extra: &[&str]) -> PrivateRedis {
        let (server, port) = locksmith_conformance::kit::process::redis_server(extra);
        PrivateRedis { server, port }
    }

    /// Its process id, to stop and continue it.
    pub fn pid(&self) -> i32 {
        self.server.pid() as i32
    }
}

/// The standalone ZooKeeper test server.
pub fn zk_url() -> String {
    servers::zk_url()
}

/// The single memcached test server.
pub fn memcached_url() -> String {
    servers::memcached_url()
}

/// The three memcached test servers, as a quorum.
pub fn memcached_quorum_url() -> String {
    let hosts = servers::loopback(&servers::memcached_quorum_ports());
    format!("memcache://{}", hosts.join(","))
}

/// A loopback port where nothing listens.
pub fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
