//! The `lockwright` binary end to end, as scripts use it: real processes on a
//! shared SQLite file.

mod common;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use common::{lockwright, output, run_script};

fn url(dir: &Path) -> String {
    format!("sqlite://{}/locks.db", dir.display())
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exited normally")
}

#[test]
fn concurrent_processes_never_lose_an_increment() {
    let dir = tempfile::tempdir().unwrap();
    let counter = dir.path().join("counter");
    std::fs::write(&counter, "0").unwrap();
    // Read, pause, write: any overlap between two holders loses an increment.
    let script = format!(
        "v=$(cat {c}); sleep 0.01; echo $((v + 1)) > {c}",
        c = counter.display()
    );
    const PROCS: usize = 8;
    const ROUNDS: usize = 5;
    let u = url(dir.path());
    let children: Vec<_> = (0..PROCS)
        .map(|_| {
            let script = script.clone();
            let u = u.clone();
            let dir = dir.path().to_owned();
            std::thread::spawn(move || {
                for _ in 0..ROUNDS {
                    let o = output(lockwright(
                        &dir,
                        &[
                            "run", "--url", &u, "--key", "counter", "--wait", "60s", "--", "sh",
                            "-c", &script,
                        ],
                    ));
                    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
                }
            })
        })
        .collect();
    for c in children {
        c.join().unwrap();
    }
    let total: usize = std::fs::read_to_string(&counter)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(total, PROCS * ROUNDS, "increments were lost");
}

#[test]
fn exit_codes_follow_sysexits_and_the_command() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let u = url(d);
    // The command's own status, and the environment it gets.
    let o = output(run_script(
        d,
        &u,
        "k",
        "test \"$LOCKWRIGHT_KEY\" = k && test -n \"$LOCKWRIGHT_FENCE\" && exit 7",
    ));
    assert_eq!(code(&o), 7, "{}", String::from_utf8_lossy(&o.stderr));

    // Held elsewhere: 75 at once with --no-wait, after the wait with --wait.
    let mut holder = lockwright(
        d,
        &["run", "--url", &u, "--key", "busy", "--", "sleep", "30"],
    )
    .stdin(Stdio::null())
    .spawn()
    .unwrap();
    wait_until_held(d, &u, "busy");
    let o = output(lockwright(
        d,
        &[
            "run",
            "--url",
            &u,
            "--key",
            "busy",
            "--no-wait",
            "--",
            "true",
        ],
    ));
    assert_eq!(code(&o), 75, "{}", String::from_utf8_lossy(&o.stderr));
    let start = Instant::now();
    let o = output(lockwright(
        d,
        &[
            "run", "--url", &u, "--key", "busy", "--wait", "300ms", "--", "true",
        ],
    ));
    assert_eq!(code(&o), 75);
    assert!(start.elapsed() >= Duration::from_millis(300));
    holder.kill().unwrap();
    holder.wait().unwrap();

    // Bad usage, URL, key or TTL, and a store that retrying will not fix
    // (here a missing directory): 64. (tests/exit_codes.rs has every row.)
    let missing = format!("sqlite://{}/no/such/dir/locks.db", d.display());
    for args in [
        &["run", "--url", &missing, "--key", "k", "--", "true"][..],
        &["run", "--key", "k"],
        &["run", "--url", &u, "--", "true"],
        &["run", "--url", "ftp://x", "--key", "k", "--", "true"],
        &["run", "--url", &u, "--key", "", "--", "true"],
        &[
            "run", "--url", &u, "--key", "k", "--ttl", "0s", "--", "true",
        ],
        &[
            "run",
            "--url",
            &u,
            "--key",
            "k",
            "--wait",
            "1s",
            "--no-wait",
            "--",
            "true",
        ],
        &["frobnicate"],
    ] {
        let o = output(lockwright(d, args));
        assert_eq!(
            code(&o),
            64,
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // A mistyped duration is named as one, in words.
    let o = output(lockwright(
        d,
        &[
            "run", "--url", &u, "--key", "k", "--ttl", "banana", "--", "true",
        ],
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        code(&o) == 64 && err.contains("'banana' for '--ttl <TTL>': not a duration like"),
        "{err}"
    );
    // A command that cannot be found: 127, and the lock is released.
    let o = output(lockwright(
        d,
        &["run", "--url", &u, "--key", "k", "--", "/no/such/command"],
    ));
    assert_eq!(code(&o), 127);
    let o = output(lockwright(
        d,
        &["run", "--url", &u, "--key", "k", "--no-wait", "--", "true"],
    ));
    assert_eq!(code(&o), 0);
}

#[test]
fn default_store_is_an_sqlite_file_in_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let o = output(lockwright(dir.path(), &["run", "--key", "k", "--", "true"]));
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(dir.path().join("lockwright.db").exists());
    // $LOCKWRIGHT_URL wins over the default.
    let elsewhere = tempfile::tempdir().unwrap();
    let o = output({
        let mut c = lockwright(dir.path(), &["run", "--key", "k", "--", "true"]);
        c.env("LOCKWRIGHT_URL", url(elsewhere.path()));
        c
    });
    assert_eq!(code(&o), 0);
    assert!(elsewhere.path().join("locks.db").exists());
}

#[test]
fn a_lost_lock_terminates_the_command_and_exits_70() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let u = url(d);
    let started = Instant::now();
    let mut holder = lockwright(
        d,
        &[
            "run", "--url", &u, "--key", "stolen", "--ttl", "1s", "--", "sleep", "30",
        ],
    )
    .stdin(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    wait_until_held(d, &u, "stolen");
    // Someone with write access to the table rewrites the owner: the next
    // renewal finds the lock is no longer ours.
    steal(&d.join("locks.db"), "stolen");
    let status = holder.wait().unwrap();
    assert_eq!(status.code(), Some(70));
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the command was not terminated promptly"
    );
    let mut err = String::new();
    std::io::Read::read_to_string(holder.stderr.as_mut().unwrap(), &mut err).unwrap();
    // Said last: lost, why, and what became of the command.
    let last = err.trim_end().lines().last().unwrap_or_default();
    assert_eq!(
        last,
        "lockwright: lock lost: the store says it is no longer held; the command was terminated \
         (SIGKILL); exit 70",
        "{err}"
    );
}

#[test]
fn a_killed_holder_frees_the_lock_at_its_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let u = url(d);
    let marker = d.join("ran-on-unprotected");
    let script = format!("sleep 1; touch {}", marker.display());
    let mut holder = lockwright(
        d,
        &[
            "run", "--url", &u, "--key", "k", "--ttl", "2s", "--", "sh", "-c", &script,
        ],
    )
    .stdin(Stdio::null())
    .spawn()
    .unwrap();
    wait_until_held(d, &u, "k");
    let killed = Instant::now();
    holder.kill().unwrap(); // SIGKILL: no release, no renewal
    holder.wait().unwrap();
    let o = output(lockwright(
        d,
        &["run", "--url", &u, "--key", "k", "--no-wait", "--", "true"],
    ));
    assert_eq!(code(&o), 75, "freed before its TTL");
    let o = output(lockwright(
        d,
        &[
            "run", "--url", &u, "--key", "k", "--wait", "10s", "--", "true",
        ],
    ));
    assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        killed.elapsed() >= Duration::from_millis(1500),
        "freed too early: {:?}",
        killed.elapsed()
    );
    // The command died with its lockwright instead of running on without the lock.
    assert!(
        !marker.exists(),
        "the command kept running after its lockwright was killed"
    );
}

fn wait_until_held(dir: &Path, url: &str, key: &str) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(10) {
        let o = output(lockwright(
            dir,
            &["run", "--url", url, "--key", key, "--no-wait", "--", "true"],
        ));
        if code(&o) == 75 {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{key} never became held");
}

fn steal(db: &Path, key: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap();
        let r = sqlx::query("UPDATE lockwright_locks SET owner = 'thief' WHERE lock_key = ?1")
            .bind(key)
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(r.rows_affected(), 1);
    });
}

/// The same command line on another store: only the URL changes.
#[cfg(feature = "redis")]
#[test]
fn run_works_unchanged_on_redis() {
    let dir = tempfile::tempdir().unwrap();
    let url = lockwright_conformance::kit::servers::redis_url();
    let key = format!("cli-redis-{}", std::process::id());
    let o = output(lockwright(
        dir.path(),
        &[
            "run",
            "--url",
            &url,
            "--key",
            &key,
            "--",
            "sh",
            "-c",
            "test -n \"$LOCKWRIGHT_FENCE\" && exit 3",
        ],
    ));
    assert_eq!(code(&o), 3, "{}", String::from_utf8_lossy(&o.stderr));
    // A store that is down: a wait tries until it ends, then says so.
    for wait in ["--no-wait", "--wait=1s"] {
        let start = std::time::Instant::now();
        let o = output(lockwright(
            dir.path(),
            &[
                "run",
                "--url",
                "redis://127.0.0.1:1",
                "--key",
                &key,
                wait,
                "--",
                "true",
            ],
        ));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(code(&o), 69, "a Redis that is down, {wait}: {stderr}");
        if wait == "--wait=1s" {
            assert!(start.elapsed() >= Duration::from_secs(1), "{stderr}");
            assert!(stderr.contains("trying again"), "{stderr}");
        }
    }
}

/// A TTL the store cannot keep is refused up front; the shortest one it
/// accepts holds through a command that outlives it several times over.
#[test]
fn the_shortest_ttl_accepted_is_one_renewal_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut stores = vec![(url(d), "250ms")];
    if cfg!(feature = "redis") {
        let redis = lockwright_conformance::kit::servers::redis_url();
        stores.push((redis, "250ms"));
    }
    for (u, min) in stores {
        let key = format!("short-ttl-{}", std::process::id());
        let o = output(lockwright(
            d,
            &[
                "run", "--url", &u, "--key", &key, "--ttl", "10ms", "--", "true",
            ],
        ));
        assert_eq!(code(&o), 64, "{u}: {}", String::from_utf8_lossy(&o.stderr));
        for _ in 0..3 {
            let o = output(lockwright(
                d,
                &[
                    "run", "--url", &u, "--key", &key, "--ttl", min, "--", "sleep", "1",
                ],
            ));
            assert_eq!(
                code(&o),
                0,
                "{u} --ttl {min}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
}

/// `-v` on ZooKeeper: a renewal is trusted for the session timeout, not the
/// TTL, and the log says which lease it trusts.
#[cfg(feature = "zookeeper")]
#[test]
fn verbose_renewals_on_zookeeper_name_the_session_lease() {
    let dir = tempfile::tempdir().unwrap();
    let zk = lockwright_conformance::kit::servers::zk_url();
    let url = format!("{zk}/lockwright-cli?session_timeout=2s");
    let key = format!("verbose-lease-{}", std::process::id());
    // Renewals every third of the 2 s session: a few in 2 s.
    let o = output(lockwright(
        dir.path(),
        &[
            "-v", "run", "--url", &url, "--key", &key, "--ttl", "30s", "--", "sleep", "2",
        ],
    ));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(code(&o), 0, "{err}");
    let renewed: Vec<&str> = err.lines().filter(|l| l.contains("lock renewed")).collect();
    assert!(!renewed.is_empty(), "no renewal logged:\n{err}");
    for line in renewed {
        assert!(line.contains(" lease=2s"), "{line}");
        assert!(!line.contains(" ttl=30s"), "the TTL, unlabelled: {line}");
    }
}

/// In a log or a pipe, the demo's progress is not redrawn with `\r`.
#[test]
fn the_demo_writes_no_carriage_return_when_not_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let u = url(dir.path());
    let o = output(lockwright(
        dir.path(),
        &["demo", "--url", &u, "--workers", "4", "--rounds", "100"],
    ));
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(code(&o), 0, "{out}\n{err}");
    assert!(out.contains("mutual exclusion   held"), "{out}");
    assert!(
        !out.contains('\r') && !err.contains('\r'),
        "stdout {out:?}\nstderr {err:?}"
    );
}

/// `run --permits N` on the default store: of processes started together,
/// never more than N run the command at once, and N do; a permit count
/// out of range, or `--permits` with `--shared`, is refused by the parser.
#[test]
fn run_with_permits_runs_n_commands_at_once_and_no_more() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let u = url(d);
    let log = d.join("log");
    let job = format!(
        "echo \"$(date +%s%N) +\" >> {l}; sleep 1; echo \"$(date +%s%N) -\" >> {l}",
        l = log.display()
    );
    let runs: Vec<_> = (0..6)
        .map(|_| {
            lockwright(
                d,
                &[
                    "run",
                    "--url",
                    &u,
                    "--key",
                    "k",
                    "--permits",
                    "2",
                    "--wait",
                    "60s",
                    "--",
                    "sh",
                    "-c",
                    &job,
                ],
            )
            .stdin(Stdio::null())
            .spawn()
            .unwrap()
        })
        .collect();
    for run in runs {
        let o = run.wait_with_output().unwrap();
        assert_eq!(code(&o), 0, "{}", String::from_utf8_lossy(&o.stderr));
    }
    let mut events: Vec<(u128, i32)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            let (t, e) = l.split_once(' ').unwrap();
            (t.parse().unwrap(), if e == "+" { 1 } else { -1 })
        })
        .collect();
    events.sort();
    assert_eq!(events.len(), 12, "every command ran once");
    let (mut now, mut most) = (0, 0);
    for (_, e) in events {
        now += e;
        most = most.max(now);
    }
    assert_eq!(
        most, 2,
        "at most, and at some point, 2 commands ran at once"
    );

    for flags in [
        &["--permits", "0"][..],
        &["--permits", "1025"][..],
        &["--permits", "2", "--shared"][..],
    ] {
        let mut args = vec!["run", "--url", &u, "--key", "k"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "true"]);
        let o = output(lockwright(d, &args));
        assert_eq!(
            code(&o),
            64,
            "{flags:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
