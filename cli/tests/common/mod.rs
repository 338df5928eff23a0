//! Helpers shared by the command's test files (`cli/tests/*.rs`).

#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

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

/// Runs it to the end; what it printed and how it exited.
pub fn output(mut c: Command) -> Output {
    c.output().expect("locksmith runs")
}

/// The test servers' URLs: from the environment `scripts/test` sets, else
/// the defaults it provisions.
fn env_or(var: &str, fallback: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| fallback.to_owned())
}

/// The PostgreSQL test database.
pub fn postgres_url() -> String {
    env_or(
        "LOCKSMITH_TEST_POSTGRES_URL",
        "postgres://locksmith:locksmith@127.0.0.1:5432/locksmith_test",
    )
}

/// The MySQL/MariaDB test database.
pub fn mysql_url() -> String {
    env_or(
        "LOCKSMITH_TEST_MYSQL_URL",
        "mysql://locksmith:locksmith@127.0.0.1:3306/locksmith_test",
    )
}

/// The single Redis test server.
pub fn redis_url() -> String {
    env_or("LOCKSMITH_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

/// A Redlock URL over the test masters, with `tail` after the host list.
pub fn redlock_url(tail: &str) -> String {
    let ports = env_or(
        "LOCKSMITH_TEST_REDLOCK_PORTS",
        "16380 16381 16382 16383 16384",
    );
    let hosts: Vec<String> = ports
        .split_whitespace()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    format!("redis+redlock://{}{tail}", hosts.join(","))
}

/// A private redis-server on a free loopback port, killed when dropped.
pub struct PrivateRedis {
    child: Child,
    pub port: u16,
}

impl PrivateRedis {
    /// Starts one with `extra` arguments (e.g. `--requirepass x`).
    pub fn start(extra: &[&str]) -> PrivateRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is installed (scripts/test installs it)");
        let server = PrivateRedis { child, port };
        let start = Instant::now();
        loop {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                let _ = s.write_all(b"PING\r\n");
                let mut buf = [0u8; 64];
                if s.read(&mut buf).is_ok_and(|n| n > 0) {
                    return server;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "private redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its process id, to stop and continue it.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The standalone ZooKeeper test server.
pub fn zk_url() -> String {
    env_or("LOCKSMITH_TEST_ZK_URL", "zk://127.0.0.1:2181")
}

/// The single memcached test server.
pub fn memcached_url() -> String {
    env_or("LOCKSMITH_TEST_MEMCACHED_URL", "memcache://127.0.0.1:11211")
}

/// The three memcached test servers, as a quorum.
pub fn memcached_quorum_url() -> String {
    let ports = env_or("LOCKSMITH_TEST_MEMCACHED_QUORUM_PORTS", "11212 11213 11214");
    let hosts: Vec<String> = ports
        .split_whitespace()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
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
