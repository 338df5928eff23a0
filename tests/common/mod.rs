//! Helpers shared by the binary's test files.

#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
