//! Helpers shared by the command's test files (`cli/tests/*.rs`).

#![allow(dead_code, unreachable_pub)]

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The `lockwright` binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_lockwright");

/// `lockwright ARGS` in `dir`, as a script runs it: no `$LOCKWRIGHT_URL`
/// from the test's environment, stdin closed.
pub fn lockwright(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(dir)
        .env_remove("LOCKWRIGHT_URL")
        .args(args)
        .stdin(Stdio::null());
    c
}

/// `lockwright run --url URL --key KEY -- sh -c SCRIPT` in `dir`.
#[allow(dead_code)] // not every test file runs a script
pub fn run_script(dir: &Path, url: &str, key: &str, script: &str) -> Command {
    lockwright(
        dir,
        &["run", "--url", url, "--key", key, "--", "sh", "-c", script],
    )
}

/// `lockwright ARGS` in `dir`, which must succeed, and the JSON it printed.
pub fn json_of(dir: &Path, args: &[&str]) -> serde_json::Value {
    let o = output(lockwright(dir, args));
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Runs it to the end; what it printed and how it exited.
pub fn output(mut c: Command) -> Output {
    c.output().expect("lockwright runs")
}

// The test servers, by the kit's one rule (see
// `lockwright_conformance::kit::servers`).
use lockwright_conformance::kit::servers;

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
    server: lockwright_conformance::kit::process::ServerProcess,
    pub port: u16,
}

impl PrivateRedis {
    /// Starts one with `extra` arguments (e.g. `--requirepass x`).
    pub fn start(extra: &[&str]) -> PrivateRedis {
        let (server, port) = lockwright_conformance::kit::process::redis_server(extra);
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

/// A name no other test or run shares.
pub fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

/// What a finished child wrote to its piped stderr.
pub fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    if let Some(e) = child.stderr.as_mut() {
        let _ = e.read_to_string(&mut err);
    }
    err
}

/// The exit code, or 128+N for death by signal N (as a shell reports it).
pub fn wait_exit(child: &mut Child, within: Duration) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status
                .code()
                .or_else(|| status.signal().map(|s| 128 + s))
                .unwrap_or(-1);
        }
        if start.elapsed() > within {
            let _ = child.kill();
            panic!("lockwright did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a process still runs (a zombie nobody reaped does not).
pub fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, f)| f.split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

/// Whether process `pid` is gone within `within`.
pub fn wait_gone(pid: i32, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if !running(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// A child process killed (SIGKILL, which ends a stopped one too) and
/// reaped when dropped, so a failed assertion leaves nothing running.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}
