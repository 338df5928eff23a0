//! `lockwright bench --json` and `lockwright check --json` through the
//! binary, on an SQLite file (no server needed): stdout is one JSON
//! document, its figures JSON numbers, and everything else goes to stderr.

#![cfg(all(unix, feature = "check", feature = "sqlite"))]

mod common;

use std::path::Path;

use serde_json::Value;

/// Runs the binary in `dir`; its exit code, stdout and stderr.
fn lockwright(dir: &Path, args: &[&str]) -> (i32, String, String) {
    let o = common::output(common::lockwright(dir, args));
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `v[key]`, which must be a JSON number (never a string like "1.2 ms").
fn number(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key:?} is not a number in {v}"))
}

/// The run of `bench`'s document named `scenario`.
fn run<'a>(doc: &'a Value, scenario: &str) -> &'a Value {
    doc["runs"]
        .as_array()
        .unwrap_or_else(|| panic!("no runs in {doc}"))
        .iter()
        .find(|r| r["scenario"] == scenario)
        .unwrap_or_else(|| panic!("no {scenario:?} run in {doc}"))
}

#[test]
fn bench_json_is_one_document_of_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/bench.db", dir.path().display());
    let (code, out, err) = lockwright(
        dir.path(),
        &[
            "bench",
            "--url",
            &url,
            "--clients",
            "2",
            "--duration",
            "300ms",
            "--held",
            "20",
            "--hold-for",
            "1s",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let v: Value = serde_json::from_str(&out).expect("stdout is one JSON document");
    assert_eq!(v["url_scheme"], "sqlite", "{v}");
    assert_eq!(v["clients"], 2, "{v}");
    assert!((number(&v, "duration_seconds") - 0.3).abs() < 1e-9, "{v}");

    let one = run(&v, "uncontended, 1 client");
    assert!(number(one, "pairs_per_sec") > 0.0, "{one}");
    assert!(number(one, "p50_ms") <= number(one, "p99_ms"), "{one}");
    assert!(number(run(&v, "uncontended, 2 clients"), "pairs_per_sec") > 0.0);
    // SQLite has permits and shared holds: their runs are there too.
    for scenario in [
        "semaphore of 3, 1 client",
        "read hold, 1 client",
        "write hold, 1 client",
    ] {
        assert!(number(run(&v, scenario), "pairs_per_sec") > 0.0, "{v}");
    }
    let contended = run(&v, "contended, 2 clients, one key");
    assert!(number(contended, "locks_per_sec") > 0.0, "{contended}");
    assert!(
        number(contended, "share_min_pct") <= number(contended, "share_max_pct"),
        "{contended}"
    );
    let procs = run(&v, "contended, 2 processes, one key");
    assert!(number(procs, "locks_per_sec") > 0.0, "{procs}");
    number(procs, "hold_ms");
    // SQLite keeps values: the election run is there.
    let election = run(&v, "election, 2 candidates");
    assert!(number(election, "reigns") >= 1.0, "{election}");

    let held = &v["held"];
    assert_eq!(held["locks"], 20, "{held}");
    assert_eq!(held["locks_lost"], 0, "{held}");
    number(held, "renewal_batches_per_period");
    number(held, "renewed_every_ms");
    // SQLite is not reached over TCP: no proxy, so no round trips counted.
    assert!(held["renewal_round_trips_per_period"].is_null(), "{held}");
    if cfg!(target_os = "linux") {
        number(held, "client_memory_per_lock_bytes");
    }

    assert!(
        !out.contains("lockwright bench:") && err.contains("lockwright bench:"),
        "the header goes to stderr:\n{out}\n{err}"
    );
}

#[test]
fn check_json_is_one_document_with_each_outcome_and_the_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/check.db", dir.path().display());
    let (code, out, err) = lockwright(
        dir.path(),
        &[
            "check",
            "--url",
            &url,
            "--no-conformance",
            "--duration",
            "3s",
            "--workers",
            "2",
            "--faults",
            "kill",
            "--json",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}");
    let v: Value = serde_json::from_str(&out).expect("stdout is one JSON document");
    assert_eq!(v["result"], "pass", "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    assert_eq!(v["url_scheme"], "sqlite", "{v}");
    assert_eq!(v["cases_failed"], 0, "{v}");
    number(&v, "cases_passed");
    number(&v, "cases_skipped");
    assert!(
        v["conformance"].as_array().is_some_and(Vec::is_empty),
        "{v}"
    );

    let run = &v["fault_run"];
    assert_eq!(run["result"], "pass", "{run}");
    number(run, "faults_total");
    assert!(run["faults"].is_object(), "{run}");
    let verdict = &run["verdict"];
    assert!(number(verdict, "acquisitions") > 0.0, "{verdict}");
    for violations in [
        "exclusion_violations",
        "data_violations",
        "fence_regressions",
    ] {
        assert_eq!(verdict[violations], 0, "{verdict}");
    }
    // The summary line still ends stderr; stdout is the document alone.
    assert!(
        err.trim_end()
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("check: ")),
        "{err}"
    );
    // The human table's lines are not on stdout (the summary field may
    // quote them).
    assert!(!out.lines().any(|l| l.starts_with("fault run:")), "{out}");
}
