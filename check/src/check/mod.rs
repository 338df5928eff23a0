//! `lockwright check`: the conformance suite against the user's own store,
//! then a fault run: worker processes contend for one lock through local
//! proxies while a nemesis kills, freezes, cuts off and slows them, and a
//! checker judges the history they leave.
//!
//! Here: the command itself and the conformance part. The fault run is
//! `fault_run` (start to verdict), `workers` (the worker processes and
//! the proxies in front of them), `faults` (which faults there are, as
//! `--faults` names them), `nemesis` (their injection), `resource` (the
//! counter the workers protect, and its records), `history` (the checker),
//! `observers` (`--election`'s leader watchers and their checker) and
//! `report` (the JSON and the tables); `worker` is a worker process's own
//! code, and says how a worker is started (its subcommand and
//! environment). `harness` is the conformance suite's view of the URL.
//!
//! Files import downwards only: this one uses the others, `fault_run` the
//! rest of the fault run's, down to `history`, which imports none.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use lockwright::backend::{Binding, RedactedUrl};
use lockwright::{Error, Result};

use crate::args::CheckArgs;
use crate::endpoints::{closed_port, Endpoints};

mod fault_run;
pub(crate) mod faults;
mod harness;
pub(crate) mod history;
mod memory;
mod nemesis;
mod observers;
mod report;
mod resource;
pub(crate) mod worker;
mod workers;

#[cfg(test)]
mod tests;

use fault_run::fault_run;
use faults::Fault;

use report::{CaseOutcome, CaseResult, Report};

/// The exit status when a case failed or the fault run found a violation.
const EX_FOUND: i32 = 1;

/// The longest `--ttl`: faults outlast it, so a longer one makes a run of
/// a few faults.
const MAX_FAULT_TTL: Duration = Duration::from_secs(60);

/// `lockwright check`: its exit status, or the error that ended it.
pub async fn check(args: CheckArgs) -> Result<i32> {
    let url = args.store.shared_url()?.to_owned();
    let shown = RedactedUrl::new(&url).to_string();
    if args.no_conformance && args.duration.is_zero() {
        return Err(Error::invalid_options(
            "--no-conformance with --duration 0s leaves nothing to check",
        ));
    }
    if args.ttl > MAX_FAULT_TTL {
        return Err(Error::invalid_options(format!(
            "--ttl {} is too long for a fault run: every pause and partition must outlast it; \
             at most {}",
            humantime::format_duration(args.ttl),
            humantime::format_duration(MAX_FAULT_TTL)
        )));
    }
    // Refused now, not after the run.
    if let Some(path) = &args.history {
        std::fs::File::create(path).map_err(|e| {
            Error::invalid_options(format!("cannot write --history {}: {e}", path.display()))
        })?;
    }
    let backend = lockwright::backend::open(&url).await?;
    lockwright::backend::verify(&url, &*backend).await?;
    let caps = backend.capabilities();
    if args.ttl < caps.min_ttl {
        return Err(Error::invalid_options(format!(
            "--ttl {:?} is below this store's shortest lease, {:?}",
            args.ttl, caps.min_ttl
        )));
    }
    if args.election && !caps.values && !args.duration.is_zero() {
        return Err(Error::new(
            lockwright::ErrorKind::Unsupported,
            "--election: this store keeps no value with a lock, so it cannot hold an election",
        ));
    }
    let claims = worker::Claims::of(&args);
    let refused = match claims {
        worker::Claims::Permits(_) if !caps.permits => {
            Some("--permits: this store cannot grant a semaphore's permits")
        }
        worker::Claims::ReadWrite if !caps.shared => {
            Some("--read-write: this store cannot grant shared (read) holds")
        }
        _ => None,
    };
    if let Some(why) = refused.filter(|_| !args.duration.is_zero()) {
        return Err(Error::new(
            lockwright::ErrorKind::Unsupported,
            format!("{why} (see the README's store table)"),
        ));
    }
    let scheme = lockwright::backend::scheme(&url)?;
    let store = scheme.store;
    if args.faults.0.contains(&Fault::Failover) && !args.duration.is_zero() && !scheme.replicas {
        // Refused, not skipped: a run that injected none of the faults
        // asked for would read as a pass.
        return Err(Error::invalid_options(format!(
            "--faults failover: {shown} names {store}, which has no replica to fail over to \
             (leave failover out, or use the URL of a store with replicas, as the README's \
             list of faults says)"
        )));
    }
    let endpoints = Endpoints::of(&url)?;
    let text = !args.json;
    if text {
        println!(
            "lockwright check: {shown} ({store}; {}, {}-bound)",
            if caps.fencing {
                "fencing tokens"
            } else {
                "no fencing tokens"
            },
            match caps.binding {
                Binding::Lease => "lease",
                Binding::Session => "session",
            }
        );
    }

    if let Some(e) = endpoints.as_ref().filter(|e| e.servers.len() > 1) {
        let mut silent = Vec::new();
        for (name, addr) in e
            .servers
            .iter()
            .zip(e.resolve(&url).await.unwrap_or_default())
        {
            let probe = tokio::net::TcpStream::connect(addr);
            if !matches!(
                tokio::time::timeout(Duration::from_secs(1), probe).await,
                Ok(Ok(_))
            ) {
                silent.push(name.as_str());
            }
        }
        if !silent.is_empty() {
            eprintln!(
                "lockwright check: warning: {} of {} servers do not answer ({}); the store works \
                 without them, but every request waits for them to time out, and cases that \
                 count attempts may prove nothing",
                silent.len(),
                e.servers.len(),
                silent.join(", ")
            );
        }
    }
    // A memcached lock server that evicts, or is nearly full, loses or
    // refuses locks whatever the client does: say so before the run.
    if let Some(e) = endpoints.as_ref().filter(|_| store == "memcached") {
        let addrs = e.resolve(&url).await.unwrap_or_default();
        for (name, addr) in e.servers.iter().zip(addrs) {
            if let Some(m) = memory::Memory::read(addr).await {
                for w in m.warnings(name) {
                    eprintln!("lockwright check: warning: {w}");
                }
            }
        }
    }
    let conformance = if args.no_conformance {
        Vec::new()
    } else {
        conformance(&url, endpoints.as_ref(), text).await
    };

    let fault_run = if args.duration.is_zero() {
        None
    } else {
        Some(fault_run(&args, &url, endpoints.as_ref(), &caps, text).await?)
    };

    let count = |outcome| conformance.iter().filter(|c| c.result == outcome).count();
    let (passed, skipped, failed) = (
        count(CaseOutcome::Pass),
        count(CaseOutcome::Skip),
        count(CaseOutcome::Fail),
    );
    let (a, k, x, d, r) = fault_run.as_ref().map_or((0, 0, 0, 0, 0), |f| {
        (
            f.verdict.acquisitions,
            f.faults_total,
            f.verdict.exclusion_violations,
            f.verdict.data_violations,
            f.verdict.fence_regressions,
        )
    });
    let leaders = fault_run
        .as_ref()
        .and_then(|f| f.election.as_ref())
        .map(|e| e.violations);
    let summary = format!(
        "check: {passed} cases passed, {skipped} skipped, {failed} failed; fault run: {a} \
         acquisitions, {k} faults, {x} exclusion violations, {d} data violations, {r} fence \
         regressions{}",
        leaders.map_or(String::new(), |l| format!(", {l} leader violations"))
    );
    // A fault run that never got the lock proved nothing.
    let idle = fault_run.as_ref().is_some_and(|f| {
        f.verdict.acquisitions == 0 || f.election.as_ref().is_some_and(|e| e.sightings == 0)
    });
    // Nor did one asked to fail the primary over that never could.
    let no_failover = fault_run
        .as_ref()
        .is_some_and(|f| f.faults.get("failover") == Some(&0));
    let idle = idle || no_failover;
    // The fault run's result counts the same violations, and fails an
    // idle run or a failover never made.
    let result = if failed == 0
        && fault_run
            .as_ref()
            .is_none_or(|f| f.result == CaseOutcome::Pass)
    {
        CaseOutcome::Pass
    } else {
        CaseOutcome::Fail
    };
    let code = if result == CaseOutcome::Pass {
        0
    } else {
        EX_FOUND
    };
    if no_failover {
        eprintln!(
            "lockwright check: no failover could be made (see `lockwright -v check` for why)"
        );
    } else if idle {
        eprintln!(
            "lockwright check: the fault run never acquired the lock, or its observers never \
             read the leader"
        );
    }
    if args.json {
        let report = Report {
            url: shown,
            url_scheme: scheme.name.to_owned(),
            store: store.to_string(),
            fencing: caps.fencing,
            result,
            cases_passed: passed,
            cases_skipped: skipped,
            cases_failed: failed,
            conformance,
            fault_run,
            summary: summary.clone(),
            exit_code: code,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&report)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
        eprintln!("{summary}");
    } else {
        println!("{summary}");
    }
    Ok(code)
}

/// Runs every conformance case through the URL alone, printing a line
/// each if `text`.
async fn conformance(url: &str, endpoints: Option<&Endpoints>, text: bool) -> Vec<CaseResult> {
    let down = endpoints.and_then(|e| {
        let ports: Option<Vec<u16>> = e.servers.iter().map(|_| closed_port()).collect();
        ports.map(|p| e.with_local_ports(&p))
    });
    let h = harness::UrlHarness::new(url, down);
    let cases = lockwright_conformance::CASES;
    if text {
        println!(
            "\nconformance: {} cases, keys under a random conformance-… prefix",
            cases.len()
        );
    }
    let mut out = Vec::new();
    for case in cases {
        let name = case.name;
        let started = Instant::now();
        let (result, reason) = if harness::NEEDS_STORE_ACCESS.contains(&name) {
            (CaseOutcome::Skip, Some(harness::STORE_ACCESS.to_owned()))
        } else {
            if text && std::io::stdout().is_terminal() {
                print!("  {name:<52} …");
                let _ = std::io::stdout().flush();
            }
            let r = case.run(&h).await;
            match (r, h.take_refusal()) {
                (Ok(()), _) => (CaseOutcome::Pass, None),
                (Err(_), Some(why)) => (CaseOutcome::Skip, Some(why.to_owned())),
                (Err(e), None) => (CaseOutcome::Fail, Some(format!("{e:#}"))),
            }
        };
        let seconds = started.elapsed().as_secs_f64();
        if text {
            if std::io::stdout().is_terminal() {
                print!("\r");
            }
            println!(
                "  {name:<52} {result:<4} {seconds:>5.1}s{}",
                reason
                    .as_deref()
                    .map(|r| format!("  {r}"))
                    .unwrap_or_default()
            );
        }
        out.push(CaseResult {
            case: name,
            result,
            seconds,
            reason,
        });
    }
    let held = h.clean_up().await;
    if text {
        println!(
            "  clean-up: every lock a case was granted directly and left held was released{}",
            if held == 0 {
                String::new()
            } else {
                format!("; {held} keys still held (they expire with their leases)")
            }
        );
    }
    out
}
