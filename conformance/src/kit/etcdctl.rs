//! `etcdctl lock`, Debian's etcd client, as the peer the etcd tests hold
//! Go's `concurrency.Mutex` with.

use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// `etcdctl lock <name>` on `endpoints`, on a session of `ttl` seconds,
/// holding until killed (on drop too; a killed holder's lease ends at its
/// TTL). It runs as itself: a `timeout` around it would leave it running
/// when killed.
pub struct EtcdctlLock {
    child: Child,
    lines: Receiver<String>,
}

impl EtcdctlLock {
    /// Starts it; it holds once it prints its key (see [`held`](Self::held)).
    ///
    /// # Panics
    /// If `etcdctl` cannot be run (`scripts/test` installs it).
    pub fn start(endpoints: &str, name: &str, ttl: u32) -> EtcdctlLock {
        let (child, lines) = spawn(endpoints, &["lock", "--ttl", &ttl.to_string(), name]);
        EtcdctlLock { child, lines }
    }

    /// The key it printed once it held (`<name>/<lease hex>`), if it held
    /// within `limit`. Blocks the thread.
    pub fn held(&self, limit: Duration) -> Option<String> {
        self.lines.recv_timeout(limit).ok()
    }
}

/// `etcdctl` (v3 API) on `endpoints` running `args`, and the lines it
/// prints, as they come.
///
/// # Panics
/// If `etcdctl` cannot be run (`scripts/test` installs it).
pub fn spawn(endpoints: &str, args: &[&str]) -> (Child, Receiver<String>) {
    let mut child = Command::new("etcdctl")
        .args(["--endpoints", endpoints, "--dial-timeout", "5s"])
        .args(args)
        .env("ETCDCTL_API", "3")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("etcdctl runs (scripts/test installs etcd-client)");
    let lines = lines_of(&mut child);
    (child, lines)
}

/// The lines `child` prints on its piped standard output, as they come
/// (read by a thread of their own).
///
/// # Panics
/// If its standard output was not piped, or was taken already.
fn lines_of(child: &mut Child) -> Receiver<String> {
    use std::io::{BufRead, BufReader};
    let out = child.stdout.take().expect("a piped standard output");
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

impl Drop for EtcdctlLock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
