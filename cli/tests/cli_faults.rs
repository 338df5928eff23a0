//! `lockwright run` under signals, kills, partitions and dying waiters,
//! against real stores: nothing of the command runs without the lock, and a
//! waiter that dies holds nobody up for long.

#![cfg(unix)]

#[cfg(feature = "redis")]
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

mod common;

#[cfg(feature = "redis")]
use common::unique;
use common::{lockwright, output, run_script, running, stderr_of, wait_exit, wait_gone};

fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}/locks.db", dir.display())
}

#[cfg(feature = "redis")]
fn redis_url() -> String {
    common::redis_url()
}

#[cfg(feature = "redis")]
fn redis_port() -> u16 {
    redis_url()
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or(6379)
}

/// Spawned in a process group of its own, as a shell starts a job, so a
/// signal to "its group" reaches it as a terminal would deliver it.
fn spawn(mut c: Command) -> Child {
    c.process_group(0).stderr(Stdio::piped()).spawn().unwrap()
}

#[cfg(feature = "redis")]
/// A holder of `key` (30 s TTL) whose command runs until the file `go` exists.
fn hold_until(dir: &Path, url: &str, key: &str, go: &Path) -> Child {
    let script = format!("while [ ! -e {} ]; do sleep 0.01; done", go.display());
    spawn(lockwright(
        dir,
        &[
            "run", "--url", url, "--key", key, "--ttl", "30s", "--", "sh", "-c", &script,
        ],
    ))
}

/// What a `run` that lost its lock says last: that it was lost, why (one
/// of `why`), and that the command was terminated, exit 70.
///
/// A command stopped before its lease ran out, because no renewal got
/// through in time, is told "not confirmed in time" rather than "lost":
/// that stands for [`EXPIRED`] too.
fn assert_ends_lost(err: &str, why: &[&str]) {
    let last = err.trim_end().lines().last().unwrap_or_default();
    let unconfirmed =
        why.contains(&EXPIRED) && last.starts_with("lockwright: lock not confirmed in time (");
    assert!(
        (last.starts_with("lockwright: lock lost: ") || unconfirmed)
            && last.contains("; the command was terminated (")
            && last.ends_with("; exit 70"),
        "last line {last:?} of:\n{err}"
    );
    assert!(
        unconfirmed || why.iter().any(|w| last.contains(w)),
        "{last:?} gives none of the reasons {why:?}"
    );
}

/// Why a lease ran out, or the store said it was gone.
const EXPIRED: &str = "not renewed before its deadline";
const NOT_HELD: &str = "the store says it is no longer held";

fn wait_for_file(path: &Path, within: Duration) -> String {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s;
            }
        }
        assert!(
            start.elapsed() < within,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A command that starts a grandchild in the background, records its pid,
/// and waits: the grandchild must not outlive the lock.
fn tree_script(pidfile: &Path) -> String {
    format!(
        "sleep 33 & echo $! > {p}.tmp && mv {p}.tmp {p}; wait",
        p = pidfile.display()
    )
}

/// `lockwright run` holding `key` on a fresh SQLite file around such a
/// command tree, once the grandchild runs: the directory, lockwright, and
/// the grandchild's pid.
fn run_tree(key: &str, ttl: &str) -> (tempfile::TempDir, Child, i32) {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pidfile = d.join("grandchild");
    let u = sqlite_url(d);
    let script = tree_script(&pidfile);
    let ls = spawn(lockwright(
        d,
        &[
            "run", "--url", &u, "--key", key, "--ttl", ttl, "--", "sh", "-c", &script,
        ],
    ));
    let grandchild = wait_for_file(&pidfile, Duration::from_secs(10))
        .trim()
        .parse()
        .unwrap();
    (dir, ls, grandchild)
}

#[test]
fn sigterm_to_lockwright_stops_the_whole_command_tree() {
    let (_dir, mut ls, grandchild) = run_tree("k", "30s");
    kill(Pid::from_raw(ls.id() as i32), Signal::SIGTERM).unwrap();
    let code = wait_exit(&mut ls, Duration::from_secs(10));
    assert_eq!(code, 128 + 15, "{}", stderr_of(&mut ls));
    assert!(
        !running(grandchild),
        "the grandchild outlived lockwright and its lock"
    );
}

#[test]
fn sigkill_of_lockwright_still_stops_the_whole_command_tree() {
    let (_dir, mut ls, grandchild) = run_tree("k", "30s");
    ls.kill().unwrap(); // SIGKILL: lockwright can do nothing more itself
    ls.wait().unwrap();
    assert!(
        wait_gone(grandchild, Duration::from_secs(3)),
        "the grandchild runs on after lockwright was killed, its lease unrenewed"
    );
}

/// Stopped rather than killed (SIGSTOP, or a shell's `kill -TSTP %1`),
/// lockwright can neither renew nor signal; its watcher still kills the
/// command's group before the lease ends.
#[test]
fn a_stopped_lockwright_still_stops_the_command_before_its_lease_ends() {
    // The command starts after the grant, so the lease ends at most a TTL
    // after the grandchild is first seen.
    let (_dir, mut ls, grandchild) = run_tree("k", "4s");
    let started = Instant::now();
    kill(Pid::from_raw(ls.id() as i32), Signal::SIGSTOP).unwrap();
    let gone = wait_gone(grandchild, Duration::from_secs(8));
    let after = started.elapsed();
    kill(Pid::from_raw(ls.id() as i32), Signal::SIGCONT).unwrap();
    assert!(gone, "the command ran on while lockwright was stopped");
    assert!(
        after < Duration::from_secs(4),
        "the command was stopped {after:?} after it started, past its 4 s lease"
    );
    let code = wait_exit(&mut ls, Duration::from_secs(10));
    let err = stderr_of(&mut ls);
    assert_eq!(code, 70, "{err}");
    assert_ends_lost(&err, &[EXPIRED, NOT_HELD]);
}

#[test]
fn a_command_that_exits_leaves_nothing_of_its_tree_behind_the_release() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pidfile = d.join("grandchild");
    let u = sqlite_url(d);
    let script = format!(
        "sleep 33 & echo $! > {p}.tmp && mv {p}.tmp {p}",
        p = pidfile.display()
    );
    let o = output(lockwright(
        d,
        &[
            "run", "--url", &u, "--key", "k", "--ttl", "3s", "--", "sh", "-c", &script,
        ],
    ));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let grandchild: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !running(grandchild),
        "a background process of the command ran on after the lock was released"
    );
}

#[test]
fn a_lost_lock_stops_the_whole_command_tree() {
    let (dir, mut ls, grandchild) = run_tree("stolen", "1s");
    let d = dir.path();
    // Someone with write access rewrites the owner: the next renewal finds
    // the lock is no longer ours.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", d.join("locks.db").display()))
            .await
            .unwrap();
        sqlx::query("UPDATE lockwright_locks SET owner = 'thief' WHERE lock_key = 'stolen'")
            .execute(&pool)
            .await
            .unwrap();
    });
    let code = wait_exit(&mut ls, Duration::from_secs(10));
    let err = stderr_of(&mut ls);
    assert_eq!(code, 70, "{err}");
    assert_ends_lost(&err, &[NOT_HELD]);
    assert!(
        !running(grandchild),
        "the grandchild outlived the lost lock"
    );
}

/// A shell ends a loop or script on Ctrl-C only if its child died by
/// SIGINT: lockwright, interrupted while waiting or when its command died by
/// SIGINT, ends the same way after cleaning up (not by exit code 130).
#[test]
fn an_interrupt_ends_lockwright_by_the_signal_so_shell_loops_stop() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let u = sqlite_url(d);
    let o = output(run_script(d, &u, "k", "kill -INT $$"));
    assert_eq!(
        o.status.signal(),
        Some(2),
        "{:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    // The lock was released before that.
    let o = output(lockwright(
        d,
        &["run", "--url", &u, "--key", "k", "--no-wait", "--", "true"],
    ));
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A terminal delivers Ctrl-C to its foreground process group. The command
/// runs in a group of its own (which takes the terminal when there is one),
/// so it gets the signal once: forwarded by lockwright, or from the terminal,
/// never both.
#[test]
fn a_signal_to_the_foreground_group_reaches_the_command_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let u = sqlite_url(d);
    let seen = d.join("seen");
    let ready = d.join("ready");
    let script = format!(
        "trap 'echo INT >> {s}; exit 0' INT; cut -d' ' -f5 /proc/$$/stat > {r}; \
         while :; do sleep 0.05; done",
        s = seen.display(),
        r = ready.display()
    );
    let mut ls = spawn(run_script(d, &u, "k", &script));
    let command_group: i32 = wait_for_file(&ready, Duration::from_secs(10))
        .trim()
        .parse()
        .unwrap();
    let our_group = ls.id() as i32;
    assert_ne!(
        command_group, our_group,
        "the command shares lockwright's process group"
    );
    killpg(Pid::from_raw(our_group), Signal::SIGINT).unwrap();
    let code = wait_exit(&mut ls, Duration::from_secs(10));
    assert_eq!(code, 0, "{}", stderr_of(&mut ls));
    let seen = std::fs::read_to_string(&seen).unwrap();
    assert_eq!(
        seen.lines().count(),
        1,
        "the command saw Ctrl-C {} times",
        seen.lines().count()
    );
}

/// The Redis cases: a partition at a proxy, the fair queue's clean-up.
#[cfg(feature = "redis")]
mod on_redis {
    use super::*;
    use std::io::Write;
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    /// A TCP proxy between one client and Redis that can cut the link: a
    /// partition of that client only.
    struct Proxy {
        port: u16,
        cut: Arc<AtomicBool>,
        conns: Arc<Mutex<Vec<TcpStream>>>,
    }

    impl Proxy {
        fn start(upstream: u16) -> Proxy {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            let cut = Arc::new(AtomicBool::new(false));
            let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
            let (c, cs) = (cut.clone(), conns.clone());
            std::thread::spawn(move || {
                for client in listener.incoming() {
                    let Ok(client) = client else { continue };
                    if c.load(Ordering::SeqCst) {
                        continue; // dropped: the connection is refused
                    }
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                        continue;
                    };
                    cs.lock()
                        .unwrap()
                        .extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                    for (mut from, mut to) in [
                        (client.try_clone().unwrap(), server.try_clone().unwrap()),
                        (server, client),
                    ] {
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut to);
                            let _ = to.shutdown(Shutdown::Both);
                        });
                    }
                }
            });
            Proxy { port, cut, conns }
        }

        fn cut(&self) {
            self.cut.store(true, Ordering::SeqCst);
            for c in self.conns.lock().unwrap().drain(..) {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
    }

    fn timestamps(text: &str, who: &str) -> Vec<u128> {
        text.lines()
            .filter_map(|l| l.strip_prefix(who))
            .map(|t| t.trim().parse().unwrap())
            .collect()
    }

    /// The reproduction: a holder cut off from Redis whose command
    /// ignores SIGTERM. Nothing it runs may write once the next holder has the
    /// lock: SIGKILL lands before the lease ends.
    #[test]
    fn a_holder_cut_off_from_the_store_stops_before_the_next_holder_starts() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let log = d.join("log");
        let key = unique("partition");
        let proxy = Proxy::start(redis_port());
        let via_proxy = format!("redis://127.0.0.1:{}", proxy.port);
        let direct = redis_url();
        let ready = d.join("ready");
        let a_script = format!(
            "trap '' TERM; touch {r}; while :; do echo A $(date +%s%N) >> {l}; sleep 0.02; done",
            r = ready.display(),
            l = log.display()
        );
        let mut a = spawn(lockwright(
            d,
            &[
                "run", "--url", &via_proxy, "--key", &key, "--ttl", "3s", "--", "sh", "-c",
                &a_script,
            ],
        ));
        let start = Instant::now();
        while !ready.exists() {
            assert!(start.elapsed() < Duration::from_secs(10), "A never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        proxy.cut();
        let b_script = format!("echo B $(date +%s%N) >> {}", log.display());
        let b = output(lockwright(
            d,
            &[
                "run", "--url", &direct, "--key", &key, "--ttl", "3s", "--wait", "20s", "--", "sh",
                "-c", &b_script,
            ],
        ));
        assert_eq!(
            b.status.code(),
            Some(0),
            "B: {}",
            String::from_utf8_lossy(&b.stderr)
        );
        let a_code = wait_exit(&mut a, Duration::from_secs(10));
        let a_err = stderr_of(&mut a);
        assert_eq!(a_code, 70, "A: {a_err}");
        assert_ends_lost(&a_err, &[EXPIRED]);
        let text = std::fs::read_to_string(&log).unwrap();
        let (a_lines, b_start) = (timestamps(&text, "A "), timestamps(&text, "B ")[0]);
        let last_a = *a_lines.iter().max().unwrap();
        assert!(
            last_a < b_start,
            "A wrote {} ms after B took the lock ({} lines after)\n{a_err}",
            (last_a - b_start) / 1_000_000,
            a_lines.iter().filter(|&&t| t > b_start).count()
        );
    }

    /// The report: cut off, a command that stops at SIGTERM ends
    /// the run before the lease does; what `run` says last is that the
    /// lock was lost and why, not only that the command was terminated.
    #[test]
    fn a_holder_cut_off_says_last_that_it_lost_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let key = unique("partition-said");
        let proxy = Proxy::start(redis_port());
        let via_proxy = format!("redis://127.0.0.1:{}", proxy.port);
        let ready = d.join("ready");
        let script = format!("touch {}; sleep 30", ready.display());
        let mut a = spawn(lockwright(
            d,
            &[
                "run", "--url", &via_proxy, "--key", &key, "--ttl", "3s", "--", "sh", "-c", &script,
            ],
        ));
        let start = Instant::now();
        while !ready.exists() {
            assert!(start.elapsed() < Duration::from_secs(10), "never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        proxy.cut();
        let code = wait_exit(&mut a, Duration::from_secs(15));
        let err = stderr_of(&mut a);
        assert_eq!(code, 70, "{err}");
        assert_ends_lost(&err, &[EXPIRED]);
        assert!(err.trim_end().ends_with("(SIGTERM); exit 70"), "{err}");
    }

    /// One Redis command over a plain socket (RESP), answered as text.
    fn redis(args: &[&str]) -> String {
        redis_at(redis_port(), args)
    }

    pub(super) fn redis_at(port: u16, args: &[&str]) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        s.write_all(req.as_bytes()).unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    fn queued(key: &str) -> i64 {
        queued_at(redis_port(), key)
    }

    pub(super) fn queued_at(port: u16, key: &str) -> i64 {
        let reply = redis_at(port, &["ZCARD", &format!("lockwright:{{{key}}}:queue")]);
        reply.trim().trim_start_matches(':').parse().unwrap_or(-1)
    }

    fn wait_held(key: &str) {
        let start = Instant::now();
        while redis(&["EXISTS", &format!("lockwright:{{{key}}}:lock")]).trim() != ":1" {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{key} never became held"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn wait_queued(key: &str, n: i64) {
        let start = Instant::now();
        while queued(key) != n {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the queue never held {n}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A waiter handed the lock with the default TTL runs its command: the
    /// short hand-off lease is extended first, not mistaken for a lease
    /// about to run out.
    #[test]
    fn a_waiter_handed_the_lock_runs_its_command() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let u = redis_url();
        for _ in 0..8 {
            let key = unique("handed");
            let mut holder = spawn(lockwright(
                d,
                &["run", "--url", &u, "--key", &key, "--", "sleep", "0.3"],
            ));
            wait_held(&key);
            let o = output(lockwright(
                d,
                &[
                    "run", "--url", &u, "--key", &key, "--wait", "60s", "--", "true",
                ],
            ));
            assert_eq!(
                o.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&o.stderr)
            );
            assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 0);
        }
    }

    /// SIGINT, SIGTERM or SIGHUP while waiting: the waiter leaves the queue
    /// before it exits with 128 + the signal.
    #[test]
    fn a_signal_while_waiting_leaves_the_queue_and_exits_128_plus_n() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let u = redis_url();
        for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            let key = unique("waiting");
            let mut holder = spawn(lockwright(
                d,
                &["run", "--url", &u, "--key", &key, "--", "sleep", "30"],
            ));
            wait_held(&key);
            let mut waiter = spawn(lockwright(
                d,
                &[
                    "run", "--url", &u, "--key", &key, "--wait", "60s", "--", "true",
                ],
            ));
            wait_queued(&key, 1);
            kill(Pid::from_raw(waiter.id() as i32), sig).unwrap();
            let code = wait_exit(&mut waiter, Duration::from_secs(10));
            assert_eq!(
                code,
                128 + sig as i32,
                "{sig:?}: {}",
                stderr_of(&mut waiter)
            );
            assert_eq!(
                queued(&key),
                0,
                "{sig:?}: the dead waiter kept its place in the queue"
            );
            holder.kill().unwrap();
            holder.wait().unwrap();
        }
    }

    /// A queued waiter SIGKILLed just before the holder releases is handed the
    /// lock as it dies. The hand-off lease is its liveness window (2 s by
    /// default), not the 30 s TTL, so the next waiter gets in soon after.
    #[test]
    fn a_waiter_killed_at_hand_off_holds_the_next_one_up_briefly() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let u = redis_url();
        let key = unique("handoff");
        let go = d.join("go");
        let done = d.join("c-done");
        let mut holder = hold_until(d, &u, &key, &go);
        wait_held(&key);
        let mut b = spawn(lockwright(
            d,
            &[
                "run", "--url", &u, "--key", &key, "--ttl", "30s", "--wait", "60s", "--", "true",
            ],
        ));
        wait_queued(&key, 1);
        let c_script = format!("touch {}", done.display());
        let mut c = spawn(lockwright(
            d,
            &[
                "run", "--url", &u, "--key", &key, "--ttl", "30s", "--wait", "60s", "--", "sh",
                "-c", &c_script,
            ],
        ));
        wait_queued(&key, 2);
        b.kill().unwrap();
        b.wait().unwrap();
        std::fs::write(&go, "").unwrap();
        assert_eq!(wait_exit(&mut holder, Duration::from_secs(10)), 0);
        let released = Instant::now();
        let grant = redis(&["HGET", &format!("lockwright:{{{key}}}:lock"), "~grant"]);
        assert!(
            !grant.starts_with("$-1"),
            "the release did not hand the lock to the dead waiter, so this tests nothing"
        );
        assert_eq!(
            wait_exit(&mut c, Duration::from_secs(20)),
            0,
            "{}",
            stderr_of(&mut c)
        );
        let waited = released.elapsed();
        assert!(done.exists());
        assert!(
            waited < Duration::from_secs(5),
            "the dead waiter held the next one up for {waited:?}"
        );
    }

    /// A redis-server of the test's own on `port`, persisting nothing: a
    /// restart brings it back empty.
    fn forgetful_redis(port: u16) -> lockwright_conformance::kit::process::ServerProcess {
        lockwright_conformance::kit::process::ServerProcess::start(
            Command::new("redis-server").args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ]),
            port,
        )
    }

    /// The trust-gaps issue's first defect: Redis without persistence
    /// restarts (SIGKILL) under a holder whose command runs on, with a
    /// waiter queued. The waiter gets the lock from the empty server; the
    /// holder must not run on beside it until its next renewal (20 s
    /// later with a 60 s TTL): its pub/sub connection ended with the
    /// server, and when it is made again every lease is re-verified, found
    /// gone, and the command stopped: exit 70.
    #[test]
    fn a_holder_hears_at_once_that_redis_restarted_empty() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let port = common::closed_port();
        let mut server = forgetful_redis(port);
        let url = format!("redis://127.0.0.1:{port}");
        let key = unique("restart-empty");
        let ready = d.join("ready");
        let a_script = format!("echo > {}; sleep 40", ready.display());
        // One attempt: the holder never waited, so nothing but the grant
        // made it listen to the server.
        let mut a = spawn(lockwright(
            d,
            &[
                "run",
                "--url",
                &url,
                "--key",
                &key,
                "--ttl",
                "60s",
                "--no-wait",
                "--",
                "sh",
                "-c",
                &a_script,
            ],
        ));
        wait_for_file(&ready, Duration::from_secs(10));
        let b_ran = d.join("b-ran");
        let b_script = format!("touch {}", b_ran.display());
        let mut b = spawn(lockwright(
            d,
            &[
                "run", "--url", &url, "--key", &key, "--ttl", "60s", "--wait", "60s", "--", "sh",
                "-c", &b_script,
            ],
        ));
        std::thread::sleep(Duration::from_millis(1000));
        server.kill();
        std::thread::sleep(Duration::from_secs(2));
        let _server = forgetful_redis(port);
        let restarted = Instant::now();
        let a_code = wait_exit(&mut a, Duration::from_secs(30));
        let noticed = restarted.elapsed();
        let a_err = stderr_of(&mut a);
        assert_eq!(a_code, 70, "A: {a_err}");
        assert_ends_lost(&a_err, &[NOT_HELD]);
        // The holder's identity record was forgotten too: bookkeeping,
        // whose loss the lock's own lines already tell.
        assert!(
            !a_err.contains("lockwright/holder/"),
            "the identity record shows in:\n{a_err}"
        );
        assert!(
            noticed < Duration::from_secs(10),
            "the holder ran on {noticed:?} after the restart: it waited for its renewal\n{a_err}"
        );
        assert_eq!(
            wait_exit(&mut b, Duration::from_secs(30)),
            0,
            "{}",
            stderr_of(&mut b)
        );
        assert!(b_ran.exists());
    }

    /// A `run` holder on a private forgetful Redis whose command runs
    /// `seconds`, with the server killed `kill_after` after the command
    /// started and started again `down` later (never, for `None`): A's
    /// exit code and stderr.
    fn release_across_a_restart(
        url_params: &str,
        ttl: &str,
        seconds: u32,
        kill_after: Duration,
        down: Option<Duration>,
    ) -> (i32, String) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let port = common::closed_port();
        let mut server = forgetful_redis(port);
        let url = format!("redis://127.0.0.1:{port}{url_params}");
        let key = unique("restart-release");
        let ready = d.join("ready");
        let a_script = format!("echo > {}; sleep {seconds}", ready.display());
        let mut a = spawn(lockwright(
            d,
            &[
                "run", "--url", &url, "--key", &key, "--ttl", ttl, "--", "sh", "-c", &a_script,
            ],
        ));
        wait_for_file(&ready, Duration::from_secs(10));
        std::thread::sleep(kill_after);
        server.kill();
        let _back = down.map(|down| {
            std::thread::sleep(down);
            forgetful_redis(port)
        });
        let a_code = wait_exit(&mut a, Duration::from_secs(30));
        (a_code, stderr_of(&mut a))
    }

    /// The same restart while the holder's command has already ended: its
    /// release meets a dead connection, is tried again once the server is
    /// back, finds the lock gone, and says the command may not have run
    /// exclusively (exit 70), never exit 0.
    #[test]
    fn a_release_after_redis_restarted_empty_is_not_a_success() {
        // The command ends while the server is down.
        let (a_code, a_err) = release_across_a_restart(
            "",
            "60s",
            2,
            Duration::from_millis(500),
            Some(Duration::from_secs(4)),
        );
        assert_eq!(a_code, 70, "A: {a_err}");
        assert!(
            a_err.contains("no longer held at release")
                && a_err.contains("may not have run exclusively"),
            "A's last word (the release tried again on the new connection): {a_err}"
        );
    }

    /// The server never comes back within the lease: the release is tried
    /// until the lease runs out, then the run says it could not confirm
    /// the hold (exit 70), rather than exit 0 with a warning.
    #[test]
    fn a_release_the_store_never_answers_is_not_a_success() {
        let (a_code, a_err) = release_across_a_restart(
            "?timeout=300ms&connect_timeout=300ms",
            "6s",
            1,
            Duration::ZERO,
            None,
        );
        assert_eq!(a_code, 70, "A: {a_err}");
        assert!(
            a_err.contains("could not be confirmed")
                && a_err.contains("may not have run exclusively"),
            "A's last word: {a_err}"
        );
    }
}

/// A waiter whose wait ends in a store stall gives up with 69 (it rode
/// the stall out until then); it leaves the queue once the store answers
/// again, so the next release goes to the waiter
/// behind it at once, not to the one that gave up (which would hold the
/// lock, unused, until its lease ran out).
#[cfg(feature = "redis")]
#[test]
fn a_waiter_that_gives_up_in_a_store_stall_holds_nobody_up() {
    use on_redis::{queued_at, redis_at};
    let server = common::PrivateRedis::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let u = format!("redis://127.0.0.1:{}", server.port);
    // The waiter behind refreshes rarely, so the stall does not reach it.
    let patient = format!("{u}?waiter_refresh=10s");
    let key = unique("stall");
    let go = d.join("go");
    let done = d.join("c-done");
    let mut holder = hold_until(d, &u, &key, &go);
    let start = Instant::now();
    while redis_at(
        server.port,
        &["EXISTS", &format!("lockwright:{{{key}}}:lock")],
    )
    .trim()
        != ":1"
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the holder never held {key}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // W's requests time out within the stall, and its wait ends in it.
    let hasty = format!("{u}?timeout=200ms");
    let w_started = Instant::now();
    let mut w = spawn(lockwright(
        d,
        &[
            "run", "--url", &hasty, "--key", &key, "--ttl", "30s", "--wait", "4s", "--", "true",
        ],
    ));
    while queued_at(server.port, &key) != 1 {
        assert!(start.elapsed() < Duration::from_secs(10), "W never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    let c_script = format!("touch {}", done.display());
    let mut c = spawn(lockwright(
        d,
        &[
            "run", "--url", &patient, "--key", &key, "--ttl", "30s", "--wait", "60s", "--", "sh",
            "-c", &c_script,
        ],
    ));
    while queued_at(server.port, &key) != 2 {
        assert!(start.elapsed() < Duration::from_secs(10), "C never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The stall covers W's deadline: from 3.2 s after it started to 5.7 s.
    let stall_at = w_started + Duration::from_millis(3200);
    assert!(Instant::now() < stall_at, "W and C queued too late");
    std::thread::sleep(stall_at - Instant::now());
    let redis_pid = Pid::from_raw(server.pid());
    kill(redis_pid, Signal::SIGSTOP).unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    kill(redis_pid, Signal::SIGCONT).unwrap();
    assert_eq!(
        wait_exit(&mut w, Duration::from_secs(10)),
        69,
        "{}",
        stderr_of(&mut w)
    );
    std::fs::write(&go, "").unwrap();
    assert_eq!(
        wait_exit(&mut holder, Duration::from_secs(10)),
        0,
        "{}",
        stderr_of(&mut holder)
    );
    let released = Instant::now();
    assert_eq!(
        wait_exit(&mut c, Duration::from_secs(40)),
        0,
        "{}",
        stderr_of(&mut c)
    );
    let waited = released.elapsed();
    assert!(done.exists());
    assert!(
        waited < Duration::from_secs(3),
        "the waiter that gave up held the next one up for {waited:?}"
    );
}

#[cfg(feature = "zookeeper")]
mod zookeeper {
    use super::*;

    /// Sessions of 2 s on the test server, whose ticks are 100 ms.
    fn url() -> String {
        format!("{}/lockwright-cli?session_timeout=2s", common::zk_url())
    }

    fn fence_in(path: &Path) -> u64 {
        wait_for_file(path, Duration::from_secs(15))
            .trim()
            .parse()
            .expect("a fencing token")
    }

    /// A holder frozen (SIGSTOP) past its session timeout: the server ends
    /// its session, another process takes the lock with a higher fence, and
    /// the thawed holder stops, exits 70, and its release leaves the new
    /// holder's node alone.
    #[test]
    fn a_frozen_holder_loses_to_a_higher_fence_and_spares_the_new_holder() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (url, key) = (url(), format!("frozen-{}", std::process::id()));
        let (fa, fb, go) = (d.join("a"), d.join("b"), d.join("go"));
        let mut a = spawn(lockwright(
            d,
            &[
                "run",
                "--url",
                &url,
                "--key",
                &key,
                "--ttl",
                "30s",
                "--",
                "sh",
                "-c",
                &format!("echo $LOCKWRIGHT_FENCE > {}; sleep 60", fa.display()),
            ],
        ));
        let first = fence_in(&fa);
        let a_pid = Pid::from_raw(a.id() as i32);
        kill(a_pid, Signal::SIGSTOP).unwrap();
        // If an assertion fails while it is stopped, it must not stay so.
        struct Thaw(Pid, bool);
        impl Drop for Thaw {
            fn drop(&mut self) {
                if !self.1 {
                    let _ = kill(self.0, Signal::SIGCONT);
                    let _ = kill(self.0, Signal::SIGKILL);
                }
            }
        }
        let mut thaw = Thaw(a_pid, false);
        let mut b = spawn(lockwright(
            d,
            &[
                "run",
                "--url",
                &url,
                "--key",
                &key,
                "--wait",
                "20s",
                "--ttl",
                "30s",
                "--",
                "sh",
                "-c",
                &format!(
                    "echo $LOCKWRIGHT_FENCE > {}; while [ ! -e {} ]; do sleep 0.01; done",
                    fb.display(),
                    go.display()
                ),
            ],
        ));
        let second = fence_in(&fb);
        assert!(second > first, "fences {first} then {second}");
        kill(a_pid, Signal::SIGCONT).unwrap();
        let code = wait_exit(&mut a, Duration::from_secs(15));
        thaw.1 = true;
        let err = stderr_of(&mut a);
        assert_eq!(code, 70, "{err}");
        assert_ends_lost(&err, &[EXPIRED, NOT_HELD]);
        let shown = output(lockwright(
            d,
            &["status", "--url", &url, "--key", &key, "--json"],
        ));
        let status: serde_json::Value = serde_json::from_slice(&shown.stdout)
            .unwrap_or_else(|e| panic!("status --json: {e}: {shown:?}"));
        assert_eq!(status["held"], true, "{status}");
        assert_eq!(
            status["fence"], second,
            "the new holder's node is not the one held"
        );
        std::fs::write(&go, "").unwrap();
        assert_eq!(
            wait_exit(&mut b, Duration::from_secs(15)),
            0,
            "{}",
            stderr_of(&mut b)
        );
    }
}
