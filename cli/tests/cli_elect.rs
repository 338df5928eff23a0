//! `lockwright elect` and `lockwright leader` through the binary, against the
//! real Redis and ZooKeeper test servers: a crashed leader is replaced
//! within its lease while a watcher sees both reigns in order, the command
//! gets its term, and the exit codes are `run`'s.

#![cfg(all(unix, feature = "redis", feature = "zookeeper"))]

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use common::{lockwright, output, stderr_of, unique, wait_exit, wait_gone};

/// Room for a loaded 2-core host on top of any lease: process start-up,
/// connecting, a waiter noticing the lease's end. Generous on purpose;
/// nothing here asserts speed.
const SLACK: Duration = Duration::from_secs(10);

/// One store the elections run on.
struct Store {
    name: &'static str,
    url: String,
    /// How long after a leader's crash its lease can last: the 2 s TTL the
    /// tests ask for on Redis, the session timeout in the URL on ZooKeeper
    /// (where the TTL is trusted no longer than the session).
    lease: Duration,
}

fn stores() -> Vec<Store> {
    vec![
        Store {
            name: "redis",
            url: common::redis_url(),
            lease: Duration::from_secs(2),
        },
        Store {
            name: "zookeeper",
            url: format!(
                "{}/lockwright-cli-elect?session_timeout=2s",
                common::zk_url()
            ),
            lease: Duration::from_secs(2),
        },
    ]
}

fn code(o: &Output) -> i32 {
    o.status
        .code()
        .or_else(|| o.status.signal().map(|s| 128 + s))
        .unwrap_or(-1)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// In a process group of its own, as a shell starts a job, so that killing
/// "its group" reaches nothing of the test's.
fn spawn(mut c: Command) -> Child {
    c.process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// What a candidate's command wrote when it started (written whole, by
/// rename): its pid (its group's id), `$LOCKWRIGHT_TERM`, `$LOCKWRIGHT_FENCE`.
struct Started {
    pid: i32,
    term: u64,
    fence: u64,
}

/// A command that records [`Started`] in `file`, then runs `rest`.
fn record(file: &Path, rest: &str) -> String {
    format!(
        "echo $$ $LOCKWRIGHT_TERM $LOCKWRIGHT_FENCE > {f}.tmp && mv {f}.tmp {f}; {rest}",
        f = file.display()
    )
}

fn read_started(file: &Path) -> Option<Started> {
    let text = std::fs::read_to_string(file).ok()?;
    let f: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(f.len(), 3, "{}: {text:?}", file.display());
    Some(Started {
        pid: f[0].parse().unwrap(),
        term: f[1].parse().unwrap(),
        fence: f[2].parse().unwrap(),
    })
}

fn wait_started(file: &Path, within: Duration) -> Started {
    let start = Instant::now();
    loop {
        if let Some(s) = read_started(file) {
            return s;
        }
        assert!(
            start.elapsed() < within,
            "{} did not start within {within:?}",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `lockwright elect` for `value` on `key`, running `sh -c script`.
fn elect(dir: &Path, url: &str, key: &str, value: &str, ttl: &str, script: &str) -> Command {
    lockwright(
        dir,
        &[
            "elect", "--url", url, "--key", key, "--value", value, "--ttl", ttl, "--", "sh", "-c",
            script,
        ],
    )
}

/// `lockwright leader --json` once: the object it printed, after asserting
/// it exited 0.
fn leader_json(dir: &Path, url: &str, key: &str) -> Value {
    let o = output(lockwright(
        dir,
        &["leader", "--url", url, "--key", key, "--json"],
    ));
    assert_eq!(code(&o), 0, "{url}: {}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert_eq!(out.lines().count(), 1, "one object: {out:?}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out:?}: {e}"))
}

fn leader_text(dir: &Path, url: &str, key: &str) -> String {
    let o = output(lockwright(dir, &["leader", "--url", url, "--key", key]));
    assert_eq!(code(&o), 0, "{url}: {}", stderr(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// `leader --watch --json` running, its lines read as they come.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<Value>,
}

impl Watch {
    fn start(dir: &Path, url: &str, key: &str) -> Watch {
        let mut child = spawn(lockwright(
            dir,
            &["leader", "--url", url, "--key", key, "--watch", "--json"],
        ));
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watch {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one satisfies `done`; panics after `within`.
    fn until(&mut self, within: Duration, done: impl Fn(&Value) -> bool) {
        let until = Instant::now() + within;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).unwrap_or_else(|_| {
                panic!(
                    "the watch never showed what was awaited; it showed {:?}",
                    self.seen
                )
            });
            let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
            let hit = done(&v);
            self.seen.push(v);
            if hit {
                return;
            }
        }
    }

    /// Ends it as a user would (`sig`); its exit code and stderr.
    fn stop(mut self, sig: Signal) -> (i32, String, Vec<Value>) {
        kill(Pid::from_raw(self.child.id() as i32), sig).unwrap();
        let code = wait_exit(&mut self.child, Duration::from_secs(10));
        while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
            self.seen.push(serde_json::from_str(&line).unwrap());
        }
        (code, stderr_of(&mut self.child), self.seen)
    }
}

/// The reigns a watch showed, in order: (value, term), nobody-leads lines
/// left out.
fn reigns(seen: &[Value]) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for v in seen {
        if v["leader"].is_null() {
            continue;
        }
        let reign = (
            v["leader"].as_str().unwrap().to_owned(),
            v["term"].as_u64().unwrap_or_else(|| panic!("no term: {v}")),
        );
        if out.last() != Some(&reign) {
            out.push(reign);
        }
    }
    out
}

/// Two candidates; the leader crashes (its lockwright SIGKILLed, then its
/// command's group, as when the machine goes): the other runs its command
/// within the lease, and a watch running throughout showed both reigns in
/// order, with rising terms that are the commands' LOCKWRIGHT_TERM.
#[test]
fn a_crashed_leader_is_replaced_within_its_lease_and_the_watch_sees_both_reigns() {
    for store in stores() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let key = unique("takeover");
        let url = store.url.as_str();
        let mut watch = Watch::start(d, url, &key);
        // The watch's first line is who leads now: nobody, on a fresh key.
        watch.until(SLACK, |v| v["leader"].is_null());

        let file = |name: &str| d.join(format!("started-{name}"));
        let mut candidates: Vec<(&str, Child)> = ["a", "b"]
            .into_iter()
            .map(|name| {
                let script = record(&file(name), "sleep 60");
                (name, spawn(elect(d, url, &key, name, "2s", &script)))
            })
            .collect();
        let start = Instant::now();
        let first = loop {
            if let Some(i) = (0..2).find(|&i| file(candidates[i].0).exists()) {
                break i;
            }
            assert!(start.elapsed() < SLACK * 2, "{}: nobody led", store.name);
            std::thread::sleep(Duration::from_millis(20));
        };
        let (first_name, mut first_child) = candidates.remove(first);
        let (second_name, mut second_child) = candidates.remove(0);
        let reign1 = wait_started(&file(first_name), SLACK);
        // Both stand; only one runs its command.
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            !file(second_name).exists(),
            "{}: two leaders at once",
            store.name
        );

        // The crash: lockwright first (so its watcher is the only thing left
        // that could stop the command), then the command's whole group.
        let crashed = Instant::now();
        first_child.kill().unwrap();
        first_child.wait().unwrap();
        let _ = killpg(Pid::from_raw(reign1.pid), Signal::SIGKILL);

        let reign2 = wait_started(&file(second_name), store.lease + SLACK);
        let took = crashed.elapsed();
        assert!(
            took <= store.lease + SLACK,
            "{}: taken over after {took:?}",
            store.name
        );
        assert!(
            reign2.term > reign1.term,
            "{}: term {} after {}",
            store.name,
            reign2.term,
            reign1.term
        );
        for r in [&reign1, &reign2] {
            assert_eq!(r.fence, r.term, "{}: the fence is the term", store.name);
        }

        watch.until(SLACK, |v| v["leader"] == second_name);
        let (code, err, seen) = watch.stop(Signal::SIGTERM);
        assert_eq!(code, 0, "{}: the watch ended {code}: {err}", store.name);
        assert_eq!(
            reigns(&seen),
            vec![
                (first_name.to_owned(), reign1.term),
                (second_name.to_owned(), reign2.term)
            ],
            "{}: {seen:?}",
            store.name
        );
        assert!(err.is_empty(), "{}: {err}", store.name);

        // The survivor is interrupted: its command gets the signal, and it
        // resigns on the way out.
        kill(Pid::from_raw(second_child.id() as i32), Signal::SIGTERM).unwrap();
        let code = wait_exit(&mut second_child, SLACK);
        assert_eq!(
            code,
            128 + 15,
            "{}: {}",
            store.name,
            stderr_of(&mut second_child)
        );
        assert!(
            leader_json(d, url, &key)["leader"].is_null(),
            "{}",
            store.name
        );
    }
}

/// `leader` says nobody leads on a fresh key (exit 0); while a candidate
/// leads it shows its value and the term its command got; the command's
/// exit code is elect's; the leader resigns when the command exits.
#[test]
fn leader_shows_the_value_and_the_term_the_command_got() {
    for store in stores() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let key = unique("shown");
        let url = store.url.as_str();
        assert_eq!(
            leader_text(d, url, &key).trim_end(),
            format!("{key:?}: nobody leads"),
            "{}",
            store.name
        );
        assert_eq!(
            leader_json(d, url, &key),
            serde_json::json!({ "key": &key, "leader": null }),
            "{}",
            store.name
        );

        let started = d.join("started");
        let go = d.join("go");
        let script = record(
            &started,
            &format!(
                "test \"$LOCKWRIGHT_KEY\" = {key} || exit 9; \
                 while [ ! -e {} ]; do sleep 0.02; done; exit 7",
                go.display()
            ),
        );
        // A 30 s lease: gone before it ends, the leader resigned.
        let mut candidate = spawn(elect(d, url, &key, "node-a:8080", "30s", &script));
        let got = wait_started(&started, SLACK * 2);
        let shown = leader_json(d, url, &key);
        assert_eq!(shown["leader"], "node-a:8080", "{}: {shown}", store.name);
        assert_eq!(shown["encoding"], "utf8", "{}: {shown}", store.name);
        assert_eq!(shown["term"], got.term, "{}: {shown}", store.name);
        assert_eq!(got.fence, got.term, "{}", store.name);
        if let Some(left) = shown["lease_left_ms"].as_u64() {
            assert!(left > 0 && left <= 30_000, "{}: {shown}", store.name);
        }
        let line = leader_text(d, url, &key);
        assert!(
            line.starts_with(&format!(
                "{key:?}: led by \"node-a:8080\" (term {}",
                got.term
            )),
            "{}: {line}",
            store.name
        );

        std::fs::write(&go, "").unwrap();
        let code = wait_exit(&mut candidate, SLACK);
        assert_eq!(code, 7, "{}: {}", store.name, stderr_of(&mut candidate));
        assert!(
            leader_json(d, url, &key)["leader"].is_null(),
            "{}: still shown as leading after its command exited",
            store.name
        );
    }
}

/// A value that is not UTF-8 is shown in hex, and says so.
#[test]
fn a_value_that_is_not_text_is_shown_in_hex() {
    let store = &stores()[0];
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = unique("hex");
    let started = d.join("started");
    let go = d.join("go");
    let script = record(
        &started,
        &format!("while [ ! -e {} ]; do sleep 0.02; done", go.display()),
    );
    let value = std::ffi::OsStr::from_bytes(b"\xffnode\n");
    let mut c = lockwright(d, &["elect", "--url", &store.url, "--key", &key, "--value"]);
    c.arg(value).args(["--", "sh", "-c", &script]);
    let mut candidate = spawn(c);
    let got = wait_started(&started, SLACK);
    let shown = leader_json(d, &store.url, &key);
    assert_eq!(
        shown,
        serde_json::json!({
            "key": &key,
            "leader": "ff6e6f64650a",
            "encoding": "hex",
            "term": got.term,
            "lease_left_ms": shown["lease_left_ms"].clone(),
        })
    );
    let line = leader_text(d, &store.url, &key);
    assert!(line.contains("led by hex:ff6e6f64650a ("), "{line}");
    std::fs::write(&go, "").unwrap();
    assert_eq!(wait_exit(&mut candidate, SLACK), 0);
}

/// The command's own exit code, and `run`'s codes for what is not the
/// command's.
#[test]
fn exit_codes_are_runs() {
    for store in stores() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let url = store.url.as_str();
        let key = unique("codes");
        let o = output(elect(d, url, &key, "v", "5s", "exit 3"));
        assert_eq!(code(&o), 3, "{}: {}", store.name, stderr(&o));
        let o = output(lockwright(
            d,
            &[
                "elect",
                "--url",
                url,
                "--key",
                &key,
                "--value",
                "v",
                "--",
                "/no/such/command",
            ],
        ));
        assert_eq!(code(&o), 127, "{}: {}", store.name, stderr(&o));

        // Someone leads: 75 at once with --no-wait, after the wait with --wait.
        let started = d.join("started");
        let go = d.join("go");
        let script = record(
            &started,
            &format!("while [ ! -e {} ]; do sleep 0.02; done", go.display()),
        );
        let mut leader = spawn(elect(d, url, &key, "first", "30s", &script));
        wait_started(&started, SLACK);
        for wait in [&["--no-wait"][..], &["--wait", "300ms"]] {
            let mut c = lockwright(d, &["elect", "--url", url, "--key", &key, "--value", "v"]);
            c.args(wait).args(["--", "true"]);
            let o = output(c);
            assert_eq!(code(&o), 75, "{} {wait:?}: {}", store.name, stderr(&o));
        }
        std::fs::write(&go, "").unwrap();
        assert_eq!(wait_exit(&mut leader, SLACK), 0, "{}", store.name);
    }
}

/// A value over 1024 bytes is refused as an invalid option, before anything
/// is taken; a mistyped URL is a usage error; a store that is down is 69
/// for both commands.
#[test]
fn bad_input_is_refused_with_runs_codes_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let big = "x".repeat(1025);
    for store in stores() {
        let url = store.url.as_str();
        let key = unique("too-big");
        let marker = d.join("ran");
        let script = format!("touch {}", marker.display());
        let o = output(elect(d, url, &key, &big, "5s", &script));
        assert_eq!(code(&o), 64, "{}: {}", store.name, stderr(&o));
        let err = stderr(&o);
        assert!(
            err.starts_with("lockwright: invalid options: ")
                && err.contains("1024")
                && err.lines().count() == 1,
            "{}: {err}",
            store.name
        );
        assert!(!marker.exists(), "{}: the command ran", store.name);
        assert!(
            leader_json(d, url, &key)["leader"].is_null(),
            "{}",
            store.name
        );
        let o = output(lockwright(
            d,
            &["status", "--url", url, "--key", &key, "--json"],
        ));
        let status: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(status["held"], false, "{}: {status}", store.name);
        // Exactly the limit is a value like any other.
        let o = output(elect(d, url, &key, &big[1..], "5s", "exit 0"));
        assert_eq!(code(&o), 0, "{}: {}", store.name, stderr(&o));
    }

    let down = format!("redis://127.0.0.1:{}", common::closed_port());
    let typo = common::redis_url().replacen("://", "//", 1);
    for (url, expected) in [
        (typo.as_str(), 64),
        ("reddis://127.0.0.1:6379", 64),
        (down.as_str(), 69),
    ] {
        for args in [
            // A wait would ride out the store that is down until it ends.
            &[
                "elect",
                "--url",
                url,
                "--key",
                "k",
                "--value",
                "v",
                "--no-wait",
                "--",
                "true",
            ][..],
            &["leader", "--url", url, "--key", "k"],
            &["leader", "--url", url, "--key", "k", "--watch", "--json"],
        ] {
            let o = output(lockwright(d, args));
            assert_eq!(code(&o), expected, "{args:?}: {}", stderr(&o));
            assert_eq!(stderr(&o).lines().count(), 1, "{args:?}: {}", stderr(&o));
            assert!(o.stdout.is_empty(), "{args:?}");
        }
    }
}

/// A store that keeps no value with a lock cannot hold an election: one
/// typed line, the configuration exit code, for both commands.
#[cfg(feature = "postgres")]
#[test]
fn a_store_without_values_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("{}?mode=session", common::postgres_url());
    for args in [
        &[
            "elect", "--url", &url, "--key", "k", "--value", "v", "--", "true",
        ][..],
        &["leader", "--url", &url, "--key", "k"],
        &["leader", "--url", &url, "--key", "k", "--watch"],
    ] {
        let o = output(lockwright(dir.path(), args));
        let err = stderr(&o);
        assert_eq!(code(&o), 64, "{args:?}: {err}");
        assert!(
            err.starts_with("lockwright: unsupported: ") && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}

/// Cut off from the store, a leader stops its command as `run` does and
/// says last that leadership was not kept: exit 70, the group gone.
#[test]
fn a_leader_cut_off_from_the_store_stops_its_command_and_exits_70() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let redis = common::PrivateRedis::start(&[]);
    let url = format!("redis://127.0.0.1:{}?timeout=300ms", redis.port);
    let started = d.join("started");
    let script = record(&started, "sleep 60");
    let mut candidate = spawn(elect(d, &url, "cut-off", "a", "2s", &script));
    let got = wait_started(&started, SLACK);
    kill(Pid::from_raw(redis.pid()), Signal::SIGSTOP).unwrap();
    let code = wait_exit(&mut candidate, SLACK);
    let _ = kill(Pid::from_raw(redis.pid()), Signal::SIGCONT);
    let err = stderr_of(&mut candidate);
    assert_eq!(code, 70, "{err}");
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert!(
        (last.starts_with("lockwright: leadership lost: ")
            || last.starts_with("lockwright: leadership not confirmed in time ("))
            && last.contains("; the command was terminated (")
            && last.ends_with("; exit 70"),
        "last line {last:?} of:\n{err}"
    );
    assert!(
        wait_gone(got.pid, Duration::from_secs(3)),
        "the command outlived its leadership"
    );
}

/// A watch reports an outage once on stderr and goes on: it shows the
/// leader who comes after, and ends with 0 on SIGINT.
#[test]
fn a_watch_reports_an_outage_once_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let redis = common::PrivateRedis::start(&[]);
    let url = format!("redis://127.0.0.1:{}?timeout=300ms", redis.port);
    let key = unique("outage");
    let mut watch = Watch::start(d, &url, &key);
    watch.until(SLACK, |v| v["leader"].is_null());
    kill(Pid::from_raw(redis.pid()), Signal::SIGSTOP).unwrap();
    // Several reads' worth of outage.
    std::thread::sleep(Duration::from_secs(2));
    kill(Pid::from_raw(redis.pid()), Signal::SIGCONT).unwrap();
    let started = d.join("started");
    let go = d.join("go");
    let script = record(
        &started,
        &format!("while [ ! -e {} ]; do sleep 0.02; done", go.display()),
    );
    let mut candidate = spawn(elect(d, &url, &key, "after", "30s", &script));
    let got = wait_started(&started, SLACK);
    watch.until(SLACK, |v| v["leader"] == "after");
    let (code, err, seen) = watch.stop(Signal::SIGINT);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        reigns(&seen),
        vec![("after".to_owned(), got.term)],
        "{seen:?}"
    );
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line per outage: {err}");
    assert!(lines[0].starts_with("lockwright: unavailable: "), "{err}");
    std::fs::write(&go, "").unwrap();
    assert_eq!(wait_exit(&mut candidate, SLACK), 0);
}
