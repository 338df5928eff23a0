//! What `check` reports: each conformance case's outcome, the fault run's
//! figures and verdict, as the JSON object `--json` prints and as the
//! tables printed otherwise.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::faults::Fault;
use super::history::Verdict;
use super::observers::LeaderVerdict;
use super::worker::Claims;

/// How one conformance case came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum CaseOutcome {
    /// It passed.
    Pass,
    /// It could not run here (it needs access to the store's machines, or
    /// the store refused what it needs).
    Skip,
    /// It failed.
    Fail,
}

impl CaseOutcome {
    /// The word the table and the JSON use.
    fn as_str(self) -> &'static str {
        match self {
            CaseOutcome::Pass => "pass",
            CaseOutcome::Skip => "skip",
            CaseOutcome::Fail => "fail",
        }
    }
}

impl std::fmt::Display for CaseOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // pad, not write: the table aligns the word with a width.
        f.pad(self.as_str())
    }
}

/// One conformance case's line of the report.
#[derive(Debug, Serialize)]
pub(crate) struct CaseResult {
    pub(crate) case: &'static str,
    pub(crate) result: CaseOutcome,
    pub(crate) seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reason: Option<String>,
}

/// The fault run's part of the report.
#[derive(Debug, Serialize)]
pub(crate) struct FaultRun {
    pub(crate) seconds: f64,
    pub(crate) workers: u32,
    pub(crate) ttl_ms: u64,
    pub(crate) faults: BTreeMap<&'static str, u64>,
    pub(crate) faults_total: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) faults_not_possible: Vec<&'static str>,
    pub(crate) verdict: Verdict,
    pub(crate) counter: u64,
    pub(crate) acquire_errors: BTreeMap<String, u64>,
    /// Workers that ended without being killed (and were replaced).
    pub(crate) workers_exited: u64,
    pub(crate) left_held: bool,
    /// What the observers saw (`--election`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) election: Option<LeaderVerdict>,
    /// `pass` or `fail`, by [`fault_run_result`].
    pub(crate) result: CaseOutcome,
}

/// A fault run's result: a pass only if it found no exclusion, data or
/// leader violation and no fence regression, and proved something: it
/// acquired the lock, its observers (`--election`) read the leader, and a
/// failover asked for was made.
pub(crate) fn fault_run_result(
    verdict: &Verdict,
    faults: &BTreeMap<&'static str, u64>,
    election: Option<&LeaderVerdict>,
) -> CaseOutcome {
    let clean = verdict.exclusion_violations == 0
        && verdict.data_violations == 0
        && verdict.fence_regressions == 0
        && election.is_none_or(|e| e.violations == 0);
    let idle = verdict.acquisitions == 0
        || election.is_some_and(|e| e.sightings == 0)
        || faults.get("failover") == Some(&0);
    if clean && !idle {
        CaseOutcome::Pass
    } else {
        CaseOutcome::Fail
    }
}

/// The whole report, as `--json` prints it.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// The URL with its secrets redacted.
    pub(crate) url: String,
    /// The URL's scheme (`redis`, `postgres`, …).
    pub(crate) url_scheme: String,
    pub(crate) store: String,
    pub(crate) fencing: bool,
    /// The overall verdict: `pass` (exit status 0) if every case that ran
    /// passed and so did the fault run, else `fail`.
    pub(crate) result: CaseOutcome,
    /// Conformance cases that passed.
    pub(crate) cases_passed: usize,
    /// Conformance cases skipped (they cannot run here).
    pub(crate) cases_skipped: usize,
    /// Conformance cases that failed.
    pub(crate) cases_failed: usize,
    pub(crate) conformance: Vec<CaseResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fault_run: Option<FaultRun>,
    pub(crate) summary: String,
    pub(crate) exit_code: i32,
}

/// The line the fault run's table starts with.
pub(crate) fn print_fault_run_header(
    workers: u32,
    election: bool,
    claims: Claims,
    ttl: Duration,
    faults: &[Fault],
    duration: Duration,
    not_possible: &[&str],
) {
    let list: Vec<&str> = faults.iter().map(|f| f.name()).collect();
    println!(
        "\nfault run: {} workers {} one key, TTL {}, faults {} for {}{}",
        workers,
        match (election, claims) {
            (true, _) => "campaigning in an election on".to_owned(),
            (_, Claims::Permits(n)) => format!("each holding one of {n} permits of"),
            (_, Claims::ReadWrite) => "reading (2 in 3) or writing".to_owned(),
            (_, Claims::Lock) => "on".to_owned(),
        },
        humantime::format_duration(ttl),
        if list.is_empty() {
            "none".to_owned()
        } else {
            list.join(",")
        },
        humantime::format_duration(duration),
        if not_possible.is_empty() {
            String::new()
        } else {
            format!(
                " ({} not possible: the store is not reached over TCP)",
                not_possible.join(",")
            )
        }
    );
}

/// The fault run's table.
pub(crate) fn print_fault_table(run: &FaultRun, fencing: bool) {
    let v = &run.verdict;
    let list = |m: &mut dyn Iterator<Item = String>| m.collect::<Vec<_>>().join(", ");
    let kinds = list(&mut run.faults.iter().map(|(k, n)| format!("{k} {n}")));
    println!("  {:<24} {:>8}", "acquisitions", v.acquisitions);
    println!(
        "  {:<24} {:>8}  {kinds}",
        "faults injected", run.faults_total
    );
    println!(
        "  {:<24} {:>8}  sections still running past their holder's lease (frozen or cut off \
         mid-section)",
        "stale holders", v.late_sections
    );
    println!(
        "  {:<24} {:>8}",
        "exclusion violations", v.exclusion_violations
    );
    println!(
        "  {:<24} {:>8}  holders whose leases were valid at one time",
        "most at once", v.most_at_once
    );
    println!("  {:<24} {:>8}", "data violations", v.data_violations);
    if fencing {
        println!(
            "  {:<24} {:>8}  grants whose fence was below an earlier grant's",
            "fence regressions", v.fence_regressions
        );
    }
    println!(
        "  {:<24} {:>8}  {}",
        "fenced-out writes",
        v.fenced_out,
        if fencing {
            "stale holders the fence stopped: the fences working"
        } else {
            "(this store gives no fencing tokens)"
        }
    );
    let overlaps = format!("  {:<24} {:>8}", "unfenced overlaps", v.unfenced_overlaps);
    if v.unfenced_overlaps > 0 {
        println!(
            "{overlaps}  stale holders' late writes were accepted, losing {} increment(s): \
             expected without fences, and why they matter",
            v.increments_lost
        );
    } else {
        println!("{overlaps}");
    }
    println!(
        "  {:<24} {:>8}  counter {}",
        "accepted writes", v.accepted_writes, run.counter
    );
    let errors = &run.acquire_errors;
    if !errors.is_empty() {
        let e = list(&mut errors.iter().map(|(k, n)| format!("{k} {n}")));
        println!(
            "  {:<24} {:>8}  {e}",
            "acquire errors",
            errors.values().sum::<u64>()
        );
    }
    println!(
        "  {:<24} {:>8}",
        "lock left held",
        if run.left_held { "yes" } else { "no" }
    );
    if let Some(e) = &run.election {
        println!(
            "  {:<24} {:>8}  {} reigns seen by 2 observers (a stream and timed reads){}",
            "leader sightings",
            e.sightings,
            e.reigns_seen,
            if e.observer_errors > 0 {
                format!("; {} observer errors", e.observer_errors)
            } else {
                String::new()
            }
        );
        println!("  {:<24} {:>8}", "leader violations", e.violations);
    }
    for e in v
        .examples
        .iter()
        .chain(run.election.iter().flat_map(|e| &e.examples))
    {
        println!("  ! {e}");
    }
}
