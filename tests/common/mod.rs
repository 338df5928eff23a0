//! Helpers shared by the binary's test files.

#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
