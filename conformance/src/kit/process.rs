//! A server of a test's own (a `redis-server` or `memcached` it starts with
//! options of its own, kills and restarts at will), as opposed to the
//! shared ones `scripts/servers.sh` starts.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to answer after it was started.
const START_WITHIN: Duration = Duration::from_secs(30);

/// A server process, killed when dropped (also when the test panics), so
/// that none outlives its test and keeps its port.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
}

impl ServerProcess {
    /// Starts `command` (its output discarded) and waits until it accepts
    /// connections on `127.0.0.1:<port>`.
    ///
    /// # Panics
    /// If it cannot be started, does not answer within 10 s, or exits
    /// once it did (another server had the port, and answered for it).
    pub fn start(command: &mut Command, port: u16) -> Self {
        let server = Self::start_until(command, || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        // Ours answers once it listens; if it died meanwhile, whatever
        // answered is not ours.
        std::thread::sleep(Duration::from_millis(50));
        let mut server = server;
        assert!(
            matches!(server.child.try_wait(), Ok(None)),
            "{command:?} exited (was port {port} taken?)"
        );
        server
    }

    /// Starts `command` (its output discarded) and waits until `ready`
    /// says it serves (a socket file, a TLS port).
    ///
    /// # Panics
    /// If it cannot be started or is not ready within 10 s.
    pub fn start_until(command: &mut Command, ready: impl Fn() -> bool) -> Self {
        let child = command.stdout(Stdio::null()).spawn().unwrap_or_else(|e| {
            panic!("{command:?} did not start (scripts/test installs it): {e}")
        });
        let server = ServerProcess { child };
        let start = Instant::now();
        while !ready() {
            assert!(
                start.elapsed() < START_WITHIN,
                "{command:?} did not answer within {START_WITHIN:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// Its process id, to stop and continue it.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills it now (a crash: nothing is saved) and waits for it to go.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `redis-server` of a test's own on a free loopback port, with `extra`
/// arguments (`--requirepass x`), persisting nothing; and its port.
///
/// # Panics
/// As [`ServerProcess::start`].
pub fn redis_server(extra: &[&str]) -> (ServerProcess, u16) {
    let port = super::free_port();
    let server = ServerProcess::start(
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(extra),
        port,
    );
    (server, port)
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
