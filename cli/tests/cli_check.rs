//! `lockwright check` and `lockwright bench` through the binary, against the
//! real servers: a short fault run per store (the README's long runs use
//! the same command), and the exit codes shared with `run`.

#![cfg(all(
    unix,
    feature = "check",
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis",
    feature = "zookeeper",
    feature = "memcached"
))]

mod common;

use std::process::{Command, Stdio};

use common::BIN;

/// Runs the binary; its exit code, stdout and stderr.
fn lockwright(args: &[&str]) -> (i32, String, String) {
    let o = common::output(common::lockwright(&std::env::temp_dir(), args));
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The numbers in the summary line: passed, skipped, failed, acquisitions,
/// faults, exclusion violations, data violations, fence regressions.
fn summary(stdout: &str) -> [u64; 8] {
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("check: "), "last line: {last:?}");
    let nums: Vec<u64> = last
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    nums.try_into()
        .unwrap_or_else(|n| panic!("eight numbers in {last:?}, got {n:?}"))
}

/// The whole check (conformance, then 15 s of faults) exits 0 on `url`.
fn check_passes(url: &str) {
    let (code, out, err) =
        lockwright(&["check", "--url", url, "--duration", "15s", "--workers", "6"]);
    let [passed, _skipped, failed, acquisitions, faults, x, d, r] = summary(&out);
    assert_eq!(
        (code, failed, x, d, r),
        (0, 0, 0, 0, 0),
        "check on {url}:\n{out}\n{err}"
    );
    assert!(passed >= 20, "only {passed} cases ran:\n{out}");
    assert!(acquisitions > 0 && faults > 0, "an idle fault run:\n{out}");
    assert!(
        out.contains("lock left held") && out.contains(" no\n"),
        "{out}"
    );
}

#[test]
fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    check_passes(&format!("sqlite://{}/check.db", dir.path().display()));
}

#[test]
fn postgres() {
    check_passes(&common::postgres_url());
}

#[test]
fn postgres_session() {
    check_passes(&format!("{}?mode=session", common::postgres_url()));
}

#[test]
fn mysql() {
    check_passes(&common::mysql_url());
}

#[test]
fn mysql_session() {
    check_passes(&format!("{}?mode=session", common::mysql_url()));
}

#[test]
fn redis() {
    check_passes(&common::redis_url());
}

/// `--faults failover` on Redis under Sentinel with `replicas=1`: the
/// primary is failed over again and again while workers are killed, and
/// nothing breaks exclusion or the order of fences.
#[test]
fn failovers_under_sentinel() {
    let url = format!(
        "{}?replicas=1",
        lockwright_conformance::kit::servers::redis_sentinel_url()
    );
    failovers_pass(&url);
}

/// The same on the Cluster (`CLUSTER FAILOVER` on a replica of a random
/// primary: the lock's own, a third of the time).
#[test]
fn failovers_on_the_cluster() {
    let url = format!(
        "{}?replicas=1",
        lockwright_conformance::kit::servers::redis_cluster_url()
    );
    failovers_pass(&url);
}

fn failovers_pass(url: &str) {
    let (code, out, err) = lockwright(&[
        "check",
        "--url",
        url,
        "--no-conformance",
        "--duration",
        "30s",
        "--workers",
        "6",
        "--faults",
        "failover,kill",
    ]);
    let [_, _, _, acquisitions, _, x, d, r] = summary(&out);
    assert_eq!(
        (code, x, d, r),
        (0, 0, 0, 0),
        "check on {url}:\n{out}\n{err}"
    );
    assert!(acquisitions > 0, "an idle fault run:\n{out}");
    // "faults injected   N  failover F, kill K"
    let failovers: u64 = out
        .lines()
        .find(|l| l.contains("faults injected"))
        .and_then(|l| {
            l.split([',', ' '])
                .skip_while(|w| *w != "failover")
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no failover count in:\n{out}"));
    assert!(failovers >= 2, "only {failovers} failovers:\n{out}\n{err}");
}

#[test]
fn redlock() {
    let url = common::redlock_url("");
    // Three of the five test masters: a quorum of independent servers.
    let three: Vec<&str> = url.splitn(4, ',').take(3).collect();
    check_passes(&three.join(","));
}

#[test]
fn zookeeper() {
    // A short session, so a frozen holder's node goes within the run.
    check_passes(&format!(
        "{}/lockwright-check?session_timeout=2s",
        common::zk_url()
    ));
}

#[test]
fn memcached() {
    check_passes(&common::memcached_url());
}

#[test]
fn memcached_quorum() {
    check_passes(&common::memcached_quorum_url());
}

#[test]
fn json_output_is_one_object_and_the_summary_ends_stderr() {
    let (code, out, err) = lockwright(&[
        "check",
        "--url",
        &common::redis_url(),
        "--no-conformance",
        "--duration",
        "3s",
        "--faults",
        "kill",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    assert!(
        v["fault_run"]["verdict"]["acquisitions"].as_u64().unwrap() > 0,
        "{v}"
    );
    assert!(
        err.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("check: "),
        "{err}"
    );
}

/// `check --election` on `url`: workers campaign under kills and pauses
/// while two observers watch; the run exits 0 having seen several reigns.
fn election_passes(url: &str) {
    let (code, out, err) = lockwright(&[
        "check",
        "--url",
        url,
        "--election",
        "--no-conformance",
        "--duration",
        "10s",
        "--workers",
        "4",
        "--faults",
        "kill,pause",
        "--json",
    ]);
    assert_eq!(code, 0, "check --election on {url}:\n{out}\n{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    let e = &v["fault_run"]["election"];
    assert_eq!(e["violations"].as_u64(), Some(0), "{v}");
    assert!(e["reigns_seen"].as_u64().unwrap() > 1, "{v}");
    assert!(
        err.trim_end().ends_with("0 leader violations"),
        "the summary counts leader violations: {err}"
    );
}

#[test]
fn election_redis() {
    election_passes(&common::redis_url());
}

#[test]
fn election_zookeeper() {
    election_passes(&format!("{}?session_timeout=2s", common::zk_url()));
}

#[test]
fn election_on_a_store_without_values_is_refused_before_the_run() {
    let url = format!("{}?mode=session", common::postgres_url());
    let (code, out, err) = lockwright(&["check", "--url", &url, "--election", "--no-conformance"]);
    assert_eq!(code, 64, "{out}\n{err}");
    assert!(err.contains("cannot hold an election"), "{err}");
    assert!(!out.contains("fault run:"), "{out}");
}

/// `check --permits N` and `--read-write` on `url`, with kills and pauses:
/// every run exits 0 with no violation and at most `most` holders at
/// once, and one of up to three runs shows more than one (the run did
/// share the name: on a loaded host, kills and pauses can hold the name
/// for most of a short run, so one run may not get the chance).
fn claims_pass(url: &str, flags: &[&str], most: u64) {
    let mut args = vec![
        "check",
        "--url",
        url,
        "--no-conformance",
        "--duration",
        "8s",
    ];
    args.extend_from_slice(&["--workers", "6", "--faults", "kill,pause", "--json"]);
    args.extend_from_slice(flags);
    let mut runs = Vec::new();
    for _ in 0..3 {
        let (code, out, err) = lockwright(&args);
        assert_eq!(code, 0, "check {flags:?} on {url}:\n{out}\n{err}");
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
        let verdict = &v["fault_run"]["verdict"];
        assert_eq!(verdict["exclusion_violations"].as_u64(), Some(0), "{v}");
        let seen = verdict["most_at_once"].as_u64().unwrap();
        assert!(seen <= most, "{seen} at once with {flags:?}: {v}");
        if seen >= 2 {
            return;
        }
        runs.push(v);
    }
    panic!("never more than one at once with {flags:?} in 3 runs: {runs:?}");
}

#[test]
fn permits_and_readers_redis() {
    let url = common::redis_url();
    claims_pass(&url, &["--permits", "3"], 3);
    claims_pass(&url, &["--read-write"], 6);
}

#[test]
fn readers_postgres_session() {
    let url = format!("{}?mode=session", common::postgres_url());
    claims_pass(&url, &["--read-write"], 6);
}

/// A failover asked of a store with no replica to promote is refused
/// before anything runs, with the true reason: a run that injected none of
/// the faults asked for would read as a pass.
#[test]
fn a_failover_on_a_store_without_replicas_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("f.db").display());
    let redlock = common::redlock_url("");
    for url in [
        sqlite.as_str(),
        common::redis_url().as_str(),
        redlock.as_str(),
    ] {
        for faults in ["failover", "failover,kill"] {
            let (code, out, err) = lockwright(&[
                "check",
                "--url",
                url,
                "--no-conformance",
                "--faults",
                faults,
            ]);
            assert_eq!(code, 64, "{url} --faults {faults}: {out}\n{err}");
            assert!(err.contains("no replica to fail over to"), "{err}");
            assert!(!out.contains("fault run:"), "{out}");
        }
    }
}

#[test]
fn claims_a_store_cannot_grant_are_refused_before_the_run() {
    let url = format!("{}?mode=session", common::mysql_url());
    for (flag, says) in [
        (&["--permits", "2"][..], "--permits: this store cannot"),
        (&["--read-write"][..], "--read-write: this store cannot"),
    ] {
        let mut args = vec!["check", "--url", &url, "--no-conformance"];
        args.extend_from_slice(flag);
        let (code, out, err) = lockwright(&args);
        assert_eq!(code, 64, "{out}\n{err}");
        assert!(err.contains(says), "{err}");
        assert!(!out.contains("fault run:"), "{out}");
    }
    let (code, _, err) = lockwright(&["check", "--url", &url, "--permits", "2", "--read-write"]);
    assert_eq!(code, 64, "--permits with --read-write: {err}");
    assert!(err.contains("cannot be used with"), "{err}");
}

#[test]
fn both_commands_share_runs_exit_codes() {
    let dead = format!("redis://127.0.0.1:{}", common::closed_port());
    for (args, want) in [
        (vec!["check", "--url", dead.as_str()], 69),
        (vec!["bench", "--url", dead.as_str()], 69),
        (vec!["check", "--url", "memcach://127.0.0.1"], 64),
        (vec!["bench", "--url", "memcach://127.0.0.1"], 64),
        (
            vec!["check", "--url", "redis://127.0.0.1:6379/?timout=1s"],
            64,
        ),
        (vec!["check", "--url", "memory://"], 64),
        (
            vec![
                "check",
                "--url",
                "redis://127.0.0.1:6379",
                "--faults",
                "flood",
            ],
            64,
        ),
        (
            vec![
                "check",
                "--url",
                "memcache://127.0.0.1:11211",
                "--ttl",
                "1s",
            ],
            64,
        ),
        (
            vec!["bench", "--url", "redis://127.0.0.1:6379", "--clients", "1"],
            64,
        ),
        (
            vec!["bench", "--url", dead.as_str(), "--hold-for", "0s"],
            64,
        ),
        (vec!["check", "--url", dead.as_str(), "--ttl", "2m"], 64),
        (
            vec![
                "check",
                "--url",
                dead.as_str(),
                "--no-conformance",
                "--duration",
                "0s",
            ],
            64,
        ),
        (
            vec![
                "check",
                "--url",
                dead.as_str(),
                "--history",
                "/nonexistent-dir/h.json",
            ],
            64,
        ),
    ] {
        let (code, out, err) = lockwright(&args);
        assert_eq!(code, want, "{args:?}:\n{out}\n{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn bench_prints_every_figure() {
    let (code, out, err) = lockwright(&[
        "bench",
        "--url",
        &common::redis_url(),
        "--duration",
        "1s",
        "--held",
        "300",
        "--hold-for",
        "3s",
        "--ttl",
        "3s",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(
        !out.contains('\r') && !err.contains('\r'),
        "{out:?}\n{err:?}"
    );
    for figure in [
        "uncontended, 1 client",
        "uncontended, 8 clients",
        "contended, 8 clients, one key",
        "renewal batches / period",
        "renewal round trips / period",
        "client memory / held lock",
        "connections to the store",
        "locks lost while held",
    ] {
        assert!(out.contains(figure), "no {figure:?} in:\n{out}");
    }
    let lost = out
        .lines()
        .find(|l| l.contains("locks lost while held"))
        .unwrap();
    assert!(lost.trim_end().ends_with(" 0"), "{lost}");
}

/// A figure of `bench`'s output: the first number on the line naming it.
fn figure(out: &str, name: &str) -> f64 {
    let line = out
        .lines()
        .find(|l| l.contains(name))
        .unwrap_or_else(|| panic!("no {name:?} in:\n{out}"));
    line[line.find(name).unwrap() + name.len()..]
        .split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no number in {line:?}"))
}

/// memcached: a Locker holding thousands of locks keeps to its 4
/// connections (the URL's default) and loses none; renewals go in batches
/// of two round trips. The lease and the exchange's timeout leave room
/// for a loaded 2-core host, where a batch of 3,000 renewals once took
/// more than the default 1 s: two renewal rounds still come in the hold.
#[test]
fn bench_holds_memcached_locks_on_a_bounded_number_of_connections() {
    let url = common::memcached_url();
    let url = format!(
        "{url}{}timeout=3s",
        if url.contains('?') { '&' } else { '?' }
    );
    let (code, out, err) = lockwright(&[
        "bench",
        "--url",
        &url,
        "--duration",
        "1s",
        "--held",
        "3000",
        "--hold-for",
        "5s",
        "--ttl",
        "6s",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let connections = figure(&out, "connections to the store");
    assert!(
        (1.0..=4.0).contains(&connections),
        "{connections} connections:\n{out}"
    );
    assert_eq!(figure(&out, "locks lost while held"), 0.0, "{out}");
    assert!(!err.contains("renewal failed"), "renewals failed:\n{err}");
}

/// Nanoseconds of `CLOCK_MONOTONIC`, the clock `--history` times are on.
fn mono_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

/// When each section in a `--history` file began.
fn section_starts(history: &std::path::Path) -> Vec<u64> {
    let h: serde_json::Value =
        serde_json::from_slice(&std::fs::read(history).unwrap()).expect("--history is JSON");
    h["sections"]
        .as_array()
        .expect("sections")
        .iter()
        .map(|s| s["start"].as_u64().expect("a start"))
        .collect()
}

/// The arguments of a fault run on SQLite under pauses, which outlast the
/// lease: at its end some holder is nearly always frozen.
fn paused_run(url: &str, duration: &str, history: &std::path::Path) -> Vec<String> {
    [
        "check",
        "--url",
        url,
        "--no-conformance",
        "--duration",
        duration,
        "--workers",
        "8",
        "--faults",
        "pause",
        "--history",
        history.to_str().unwrap(),
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Every section began after the run started, so one that began past its
/// duration makes the history span longer than the duration.
#[test]
fn a_fault_run_begins_no_section_after_its_duration() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/check.db", dir.path().display());
    let history = dir.path().join("history.json");
    let args = paused_run(&url, "4s", &history);
    let (code, out, err) = lockwright(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{out}\n{err}");
    // Not on a terminal: progress in plain lines, never redrawn with \r.
    assert!(
        !out.contains('\r') && !err.contains('\r'),
        "{out:?}\n{err:?}"
    );
    let starts = section_starts(&history);
    let [.., acquisitions, _, _, _, _] = summary(&out);
    assert_eq!(acquisitions, starts.len() as u64, "{out}");
    let span = starts.iter().max().unwrap() - starts.iter().min().unwrap();
    assert!(
        span < 4_000_000_000,
        "sections began over {} ms of a 4 s run:\n{out}",
        span / 1_000_000
    );
}

/// SIGINT: the message names when it came, no section began after it, and
/// the run ends by that signal.
#[test]
fn an_interrupt_is_reported_at_its_time_and_no_section_begins_after_it() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/check.db", dir.path().display());
    let history = dir.path().join("history.json");
    let mut cmd = Command::new(BIN);
    cmd.args(paused_run(&url, "60s", &history));
    let (child, header, stdout) = until_the_fault_run(cmd);
    // Well into the run, however long starting it took.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let (sent, sent_ns) = (header.elapsed(), mono_ns());
    let sent_at = std::time::Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    let stopping = sent_at.elapsed();
    let (out, err) = (stdout.join().unwrap(), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.signal(), Some(2), "{:?}\n{out}\n{err}", o.status);
    // Only a hang guard: stopping takes well under a second.
    assert!(
        stopping < std::time::Duration::from_secs(10),
        "{stopping:?} to stop after SIGINT\n{err}"
    );
    let starts = section_starts(&history);
    assert!(!starts.is_empty(), "{out}\n{err}");
    // Far more than delivering a signal takes, far less than a pause.
    let late: Vec<u64> = starts
        .iter()
        .filter(|&&s| s > sent_ns + 500_000_000)
        .map(|s| (s - sent_ns) / 1_000_000)
        .collect();
    assert!(
        late.is_empty(),
        "sections began this many ms after SIGINT: {late:?}\n{err}"
    );
    // The fault run's clock starts before its header is printed (its
    // workers start in between), so it names a time at least `sent` after
    // the header, and not much more.
    let at: f64 = err
        .split_once("SIGINT at ")
        .and_then(|(_, rest)| rest.split_once('s'))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no \"SIGINT at Ns\" in:\n{err}"));
    let sent = sent.as_secs_f64();
    assert!(
        at >= sent - 0.1 && at < sent + 10.0,
        "SIGINT sent {sent:.1}s after the header, reported at {at}s:\n{err}"
    );
}

/// Starts `check` and waits until its fault run's header is out (its
/// signal handlers are in place by then); the rest of its output is read
/// on a thread of its own.
fn until_the_fault_run(
    mut cmd: Command,
) -> (
    std::process::Child,
    std::time::Instant,
    std::thread::JoinHandle<String>,
) {
    use std::io::BufRead;
    let mut child = cmd
        .current_dir(std::env::temp_dir())
        .env_remove("LOCKWRIGHT_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut out = String::new();
    loop {
        let mut line = String::new();
        assert!(
            lines.read_line(&mut line).unwrap() > 0,
            "check ended before its fault run:\n{out}"
        );
        out.push_str(&line);
        if line.starts_with("fault run:") {
            break;
        }
    }
    let header = std::time::Instant::now();
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut lines, &mut rest);
        out + &rest
    });
    (child, header, rest)
}

/// A signal after the fault run, while `check` waits for killed holders'
/// leases to run out, ends that wait too: the lock is reported held, and
/// `check` ends by the signal.
#[test]
fn an_interrupt_after_the_run_ends_the_wait_for_the_lock_to_free() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/check.db", dir.path().display());
    // Killed holders' 10 s leases outlast the 2 s run by far: the wait for
    // them is some 20 s, and the signal comes 1.5 s into it.
    let mut cmd = Command::new(BIN);
    cmd.args([
        "check",
        "--url",
        &url,
        "--no-conformance",
        "--duration",
        "2s",
        "--workers",
        "2",
        "--faults",
        "kill",
        "--ttl",
        "10s",
    ]);
    let (child, _, stdout) = until_the_fault_run(cmd);
    std::thread::sleep(std::time::Duration::from_millis(3500));
    let sent = std::time::Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let o = child.wait_with_output().unwrap();
    let (out, err) = (stdout.join().unwrap(), String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.signal(), Some(2), "{:?}\n{out}\n{err}", o.status);
    assert!(err.contains("SIGINT after the fault run"), "{err}");
    assert!(out.contains("lock left held                yes"), "{out}");
    // Only a hang guard: the leases would free about 10 s after the kills.
    assert!(sent.elapsed() < std::time::Duration::from_secs(4), "{out}");
}
