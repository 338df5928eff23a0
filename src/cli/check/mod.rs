//! `locksmith check`: the conformance suite against the user's own store,
//! then a fault run: worker processes contend for one lock through local
//! proxies while a nemesis kills, freezes, cuts off and slows them, and a
//! checker judges the history they leave.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use locksmith::backend::{store_of, Binding, RedactedUrl, Store};
use locksmith::{Error, LockKey, OwnerToken, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::Serialize;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::endpoints::{closed_port, Endpoints};
use super::proxy::{self, Control};
use super::CheckArgs;

mod harness;
pub(crate) mod history;
mod memory;
mod resource;
pub(crate) mod worker;

#[cfg(test)]
mod tests;

use history::Verdict;
use resource::Resource;

/// The exit status when a case failed or the fault run found a violation.
const EX_FOUND: i32 = 1;

/// The longest `--ttl`: faults outlast it, so a longer one makes a run of
/// a few faults.
const MAX_FAULT_TTL: Duration = Duration::from_secs(60);

/// The hidden subcommand a fault-run worker runs as.
pub(crate) const WORKER_SUBCOMMAND: &str = "__check-worker";

/// Where a worker finds its store URL.
pub(crate) const WORKER_URL_ENV: &str = "LOCKSMITH_CHECK_WORKER_URL";

/// A fault the nemesis injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Fault {
    /// SIGKILL a worker (a holder when there is one), then start another.
    Kill,
    /// SIGSTOP a worker past its lease, then SIGCONT.
    Pause,
    /// Cut a worker off from the store at its proxy past its lease.
    Partition,
    /// Slow a worker's traffic to the store for a few seconds.
    Latency,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Partition => "partition",
            Fault::Latency => "latency",
        }
    }

    /// Faults made at the proxy.
    fn needs_proxy(self) -> bool {
        matches!(self, Fault::Partition | Fault::Latency)
    }
}

/// The faults `--faults` asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Faults(pub(crate) Vec<Fault>);

/// Parses `--faults`: a comma-separated list, or `none`.
pub(crate) fn parse_faults(s: &str) -> std::result::Result<Faults, String> {
    if s.trim() == "none" {
        return Ok(Faults(Vec::new()));
    }
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let f = match part {
            "kill" => Fault::Kill,
            "pause" => Fault::Pause,
            "partition" => Fault::Partition,
            "latency" => Fault::Latency,
            other => {
                return Err(format!(
                    "unknown fault {other:?}; known: kill, pause, partition, latency, or none"
                ))
            }
        };
        if !out.contains(&f) {
            out.push(f);
        }
    }
    if out.is_empty() {
        return Err("no faults named; use none for a run without faults".into());
    }
    Ok(Faults(out))
}

#[derive(Debug, Serialize)]
struct CaseResult {
    case: &'static str,
    result: &'static str,
    seconds: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

#[derive(Debug, Serialize)]
struct FaultRun {
    seconds: f64,
    workers: u32,
    ttl_ms: u64,
    faults: BTreeMap<&'static str, u64>,
    faults_total: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    faults_not_possible: Vec<&'static str>,
    verdict: Verdict,
    counter: u64,
    acquire_errors: BTreeMap<String, u64>,
    /// Workers that ended without being killed (and were replaced).
    workers_exited: u64,
    left_held: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    url: String,
    store: String,
    fencing: bool,
    conformance: Vec<CaseResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fault_run: Option<FaultRun>,
    summary: String,
    exit_code: i32,
}

pub(crate) async fn check(args: CheckArgs) -> Result<i32> {
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
    let backend = locksmith::backend::open(&url).await?;
    backend.verify().await?;
    let caps = backend.capabilities();
    if args.ttl < caps.min_ttl {
        return Err(Error::invalid_options(format!(
            "--ttl {:?} is below this store's shortest lease, {:?}",
            args.ttl, caps.min_ttl
        )));
    }
    let store = locksmith::backend::store_of(&url)?;
    let endpoints = Endpoints::of(&url)?;
    let text = !args.json;
    if text {
        println!(
            "locksmith check: {shown} ({store}; {}, {}-bound)",
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
                "locksmith check: warning: {} of {} servers do not answer ({}); the store works \
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
    if let (Some(e), Ok(Store::Memcached)) = (endpoints.as_ref(), store_of(&url)) {
        let addrs = e.resolve(&url).await.unwrap_or_default();
        for (name, addr) in e.servers.iter().zip(addrs) {
            if let Some(m) = memory::Memory::read(addr).await {
                for w in m.warnings(name) {
                    eprintln!("locksmith check: warning: {w}");
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

    let passed = conformance.iter().filter(|c| c.result == "pass").count();
    let skipped = conformance.iter().filter(|c| c.result == "skip").count();
    let failed = conformance.iter().filter(|c| c.result == "fail").count();
    let (a, k, x, d) = fault_run.as_ref().map_or((0, 0, 0, 0), |f| {
        (
            f.verdict.acquisitions,
            f.faults_total,
            f.verdict.exclusion_violations,
            f.verdict.data_violations,
        )
    });
    let summary = format!(
        "check: {passed} cases passed, {skipped} skipped, {failed} failed; fault run: {a} \
         acquisitions, {k} faults, {x} exclusion violations, {d} data violations"
    );
    // A fault run that never got the lock proved nothing.
    let idle = fault_run
        .as_ref()
        .is_some_and(|f| f.verdict.acquisitions == 0);
    let code = if failed == 0 && x == 0 && d == 0 && !idle {
        0
    } else {
        EX_FOUND
    };
    if idle {
        eprintln!("locksmith check: the fault run never acquired the lock");
    }
    if args.json {
        let report = Report {
            url: shown,
            store: store.to_string(),
            fencing: caps.fencing,
            conformance,
            fault_run,
            summary: summary.clone(),
            exit_code: code,
        };
        println!(
            "{}",
            serde_json::to_string(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
        eprintln!("{summary}");
    } else {
        println!("{summary}");
    }
    Ok(code)
}

async fn conformance(url: &str, endpoints: Option<&Endpoints>, text: bool) -> Vec<CaseResult> {
    let down = endpoints.and_then(|e| {
        let ports: Option<Vec<u16>> = e.servers.iter().map(|_| closed_port()).collect();
        ports.map(|p| e.with_local_ports(&p))
    });
    let h = harness::UrlHarness::new(url, down);
    let cases = locksmith_conformance::CASES;
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
            ("skip", Some(harness::STORE_ACCESS.to_owned()))
        } else {
            if text && std::io::stdout().is_terminal() {
                print!("  {name:<52} …");
                let _ = std::io::stdout().flush();
            }
            let r = case.run(&h).await;
            match (r, h.take_refusal()) {
                (Ok(()), _) => ("pass", None),
                (Err(_), Some(why)) => ("skip", Some(why.to_owned())),
                (Err(e), None) => ("fail", Some(format!("{e:#}"))),
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

/// One worker process and the proxy switches in front of it.
struct Slot {
    id: AtomicU32,
    child: Mutex<Option<Child>>,
    ctl: Arc<Control>,
    url: String,
    busy: AtomicBool,
}

struct Spawner {
    exe: std::path::PathBuf,
    key: String,
    ttl: Duration,
    port: u16,
    next_id: AtomicU32,
}

impl Spawner {
    fn spawn(&self, slot: &Slot) -> std::io::Result<Child> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        slot.id.store(id, Ordering::Relaxed);
        // For studying a run: each worker's lock events, in a directory.
        let stderr = match std::env::var_os("LOCKSMITH_CHECK_WORKER_LOGS") {
            Some(dir) => {
                std::fs::File::create(std::path::Path::new(&dir).join(format!("worker-{id}.log")))
                    .map(std::process::Stdio::from)
                    .unwrap_or_else(|_| std::process::Stdio::null())
            }
            None => std::process::Stdio::null(),
        };
        Command::new(&self.exe)
            .arg(WORKER_SUBCOMMAND)
            .arg(&self.key)
            .arg(humantime::format_duration(self.ttl).to_string())
            .arg(self.port.to_string())
            .arg(id.to_string())
            // Not an argument: `ps` would show the URL's password.
            .env(WORKER_URL_ENV, &slot.url)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            // A group of its own: a Ctrl-C at the terminal goes to `check`,
            // which lets the sections begun finish, not to every worker at
            // once (they still die with `check`: PR_SET_PDEATHSIG).
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
    }
}

fn pid_of(child: &Child) -> Option<Pid> {
    child.id().map(|p| Pid::from_raw(p as i32))
}

async fn fault_run(
    args: &CheckArgs,
    url: &str,
    endpoints: Option<&Endpoints>,
    caps: &locksmith::backend::Capabilities,
    text: bool,
) -> Result<FaultRun> {
    let ttl = args.ttl;
    // Long enough that the store lets someone else in: past the lease, and
    // past a session store's session.
    let outlast = ttl.max(caps.max_lease.unwrap_or(ttl)) + Duration::from_millis(500);
    let upstream = match endpoints {
        Some(e) => Some(e.resolve(url).await?),
        None => None,
    };
    let mut faults = args.faults.0.clone();
    let mut not_possible = Vec::new();
    if upstream.is_none() {
        for f in faults.iter().filter(|f| f.needs_proxy()) {
            not_possible.push(f.name());
        }
        faults.retain(|f| !f.needs_proxy());
    }

    let resource = Resource::default();
    let port = resource
        .serve()
        .await
        .map_err(|e| Error::new(locksmith::ErrorKind::Backend, format!("cannot listen: {e}")))?;
    let key = format!("locksmith-check/{}", &OwnerToken::generate().as_str()[..12]);
    let spawner = Arc::new(Spawner {
        exe: std::env::current_exe()
            .map_err(|e| Error::new(locksmith::ErrorKind::Backend, format!("{e}")))?,
        key: key.clone(),
        ttl,
        port,
        next_id: AtomicU32::new(1),
    });
    let counts: Arc<std::sync::Mutex<BTreeMap<&'static str, u64>>> = Arc::default();
    let total = Arc::new(AtomicU64::new(0));
    // Ctrl-C or SIGTERM cuts the run off the moment it comes, whatever the
    // nemesis is doing (or while the workers start); what the run saw until
    // then is still judged.
    let stop = CancellationToken::new();
    // A signal once the run is over, or a second one, also cuts short the
    // wait for the lock to free after it.
    let hurry = CancellationToken::new();
    let judging = Arc::new(AtomicBool::new(false));
    let interrupted: Arc<std::sync::Mutex<Option<(Signal, Instant)>>> = Arc::default();
    let signals = {
        let mut sigint = signal(SignalKind::interrupt()).ok();
        let mut sigterm = signal(SignalKind::terminate()).ok();
        let (resource, stop, hurry, judging, interrupted) = (
            resource.clone(),
            stop.clone(),
            hurry.clone(),
            judging.clone(),
            interrupted.clone(),
        );
        tokio::spawn(async move {
            loop {
                let sig = tokio::select! {
                    Some(()) = recv(&mut sigint) => Signal::SIGINT,
                    Some(()) = recv(&mut sigterm) => Signal::SIGTERM,
                    else => return,
                };
                resource.cut_off(history::mono_ns());
                let mut first = interrupted.lock().unwrap_or_else(|e| e.into_inner());
                if first.is_some() || judging.load(Ordering::SeqCst) {
                    hurry.cancel();
                }
                first.get_or_insert((sig, Instant::now()));
                drop(first);
                stop.cancel();
            }
        })
    };
    // The run starts before its first worker, which may take the lock at
    // once. The end is fixed now, not when the nemesis loop next looks at
    // the clock: no section may begin past the duration asked for.
    let started = Instant::now();
    let end = started
        .checked_add(args.duration)
        .unwrap_or(started + Duration::from_secs(100 * 365 * 24 * 3600));
    resource.cut_off(
        history::mono_ns()
            .saturating_add(u64::try_from(args.duration.as_nanos()).unwrap_or(u64::MAX)),
    );
    let mut slots = Vec::new();
    for _ in 0..args.workers {
        let ctl = Control::new();
        let wurl = match (&upstream, endpoints) {
            (Some(addrs), Some(e)) => {
                let mut ports = Vec::new();
                for a in addrs {
                    ports.push(proxy::start(*a, ctl.clone()).await.map_err(|e| {
                        Error::new(locksmith::ErrorKind::Backend, format!("proxy: {e}"))
                    })?);
                }
                e.with_local_ports(&ports)
            }
            _ => url.to_owned(),
        };
        let slot = Arc::new(Slot {
            id: AtomicU32::new(0),
            child: Mutex::new(None),
            ctl,
            url: wurl,
            busy: AtomicBool::new(false),
        });
        let child = spawner
            .spawn(&slot)
            .map_err(|e| Error::new(locksmith::ErrorKind::Backend, format!("worker: {e}")))?;
        *slot.child.lock().await = Some(child);
        slots.push(slot);
    }
    if text {
        let list: Vec<&str> = faults.iter().map(|f| f.name()).collect();
        println!(
            "\nfault run: {} workers on one key, TTL {}, faults {} for {}{}",
            args.workers,
            humantime::format_duration(ttl),
            if list.is_empty() {
                "none".to_owned()
            } else {
                list.join(",")
            },
            humantime::format_duration(args.duration),
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

    let progress = {
        let (resource, total, duration) = (resource.clone(), total.clone(), args.duration);
        let tty = std::io::stderr().is_terminal();
        tokio::spawn(async move {
            let mut last_line = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let line = format!(
                    "  {:>4}s/{}s  {} acquisitions  {} faults",
                    started.elapsed().as_secs(),
                    duration.as_secs(),
                    resource.acquisitions(),
                    total.load(Ordering::Relaxed)
                );
                if tty {
                    eprint!("\r{line}   ");
                    let _ = std::io::stderr().flush();
                } else if last_line.elapsed() >= Duration::from_secs(10) {
                    eprintln!("{line}");
                    last_line = Instant::now();
                }
            }
        })
    };

    // The nemesis: a new fault every 50-250 ms while fewer than half the
    // workers are under one, so the rest keep taking the lock.
    let max_busy = (args.workers as usize / 2).max(1);
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let mut exited = 0u64;
    while Instant::now() < end && !stop.is_cancelled() {
        let tick = Duration::from_millis(50 + worker::rand_below(200));
        tokio::select! {
            () = tokio::time::sleep(tick) => {}
            () = tokio::time::sleep_until(end.into()) => break,
            () = stop.cancelled() => break,
        }
        // A worker refused a section at the cut-off has ended: not replaced.
        if Instant::now() >= end {
            break;
        }
        // A worker that ended by itself (it could not connect, say) is
        // counted and replaced, so contention does not quietly drop.
        for slot in &slots {
            if slot.busy.load(Ordering::Relaxed) {
                continue;
            }
            let mut child = slot.child.lock().await;
            let ended = match child.as_mut() {
                Some(c) => !matches!(c.try_wait(), Ok(None)),
                None => true,
            };
            if ended {
                exited += 1;
                resource.died(slot.id.load(Ordering::Relaxed), history::mono_ns());
                *child = spawner.spawn(slot).ok();
            }
        }
        if !faults.is_empty() {
            let busy = slots
                .iter()
                .filter(|s| s.busy.load(Ordering::Relaxed))
                .count();
            if busy >= max_busy {
                continue;
            }
            let fault = faults[worker::rand_below(faults.len() as u64) as usize];
            let free: Vec<&Arc<Slot>> = slots
                .iter()
                .filter(|s| !s.busy.load(Ordering::Relaxed))
                .collect();
            // Kill and pause aim at a holder inside its critical section:
            // wait up to half a second for one, then take anyone.
            let mut holding: Vec<&Arc<Slot>> = Vec::new();
            if matches!(fault, Fault::Kill | Fault::Pause) {
                for _ in 0..100 {
                    if stop.is_cancelled() {
                        break;
                    }
                    let holders = resource.holders();
                    holding = free
                        .iter()
                        .copied()
                        .filter(|s| holders.contains(&s.id.load(Ordering::Relaxed)))
                        .collect();
                    if !holding.is_empty() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            // The wait for a holder may have outlasted the run: no fault
            // starts after the cut-off.
            if stop.is_cancelled() || Instant::now() >= end {
                break;
            }
            let pool = if matches!(fault, Fault::Kill | Fault::Pause) && !holding.is_empty() {
                holding
            } else {
                free
            };
            let Some(slot) = pool.get(worker::rand_below(pool.len() as u64) as usize) else {
                continue;
            };
            let slot = (*slot).clone();
            slot.busy.store(true, Ordering::Relaxed);
            *counts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(fault.name())
                .or_default() += 1;
            total.fetch_add(1, Ordering::Relaxed);
            let (spawner, resource) = (spawner.clone(), resource.clone());
            tasks.push(tokio::spawn(async move {
                inject(fault, &slot, &spawner, &resource, outlast).await;
                slot.busy.store(false, Ordering::Relaxed);
            }));
            tasks.retain(|t| !t.is_finished());
        }
    }
    judging.store(true, Ordering::SeqCst);
    progress.abort();
    if text && std::io::stderr().is_terminal() {
        eprintln!();
    }
    let late_signal = interrupted.clone();
    let interrupted = *interrupted.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((sig, at)) = interrupted {
        eprintln!(
            "locksmith check: {sig} at {:.1}s; no section begins after it; stopping the fault \
             run and judging what it saw",
            at.saturating_duration_since(started).as_secs_f64()
        );
        // Then end by that signal, as a shell expects of an interrupted command.
        super::die_by_signal_on_exit(sig);
    }

    // Stop now, not when the faults would have ended (a pause or partition
    // outlasts the lease): the faults are lifted below, so a frozen or
    // cut-off holder finishes the section it began in time, and is judged.
    for t in &tasks {
        t.abort();
    }
    for t in tasks {
        let _ = t.await;
    }
    // Every worker is thawed, reconnected, and sees its stdin close; it
    // releases and exits.
    for slot in &slots {
        slot.ctl.heal();
        slot.ctl.set_latency(Duration::ZERO);
        if let Some(child) = slot.child.lock().await.as_mut() {
            if let Some(pid) = pid_of(child) {
                let _ = kill(pid, Signal::SIGCONT);
            }
            drop(child.stdin.take());
        }
    }
    for slot in &slots {
        if let Some(mut child) = slot.child.lock().await.take() {
            if tokio::time::timeout(Duration::from_secs(5), child.wait())
                .await
                .is_err()
                && child.start_kill().is_ok()
            {
                let _ = child.wait().await;
            }
            // A worker that ended inside a section (killed, or killed by
            // something else) ends it now at the latest; one that ended
            // its sections itself has none open, and this changes nothing.
            resource.died(slot.id.load(Ordering::Relaxed), history::mono_ns());
        }
    }
    // The run judged ends at the cut-off, not when the workers were done.
    let seconds = interrupted
        .map_or(args.duration, |(_, at)| {
            at.saturating_duration_since(started)
        })
        .min(started.elapsed())
        .as_secs_f64();

    let (history, errors) = resource.snapshot();
    let verdict = history::check(&history);
    if let Some(path) = &args.history {
        let json = serde_json::to_vec(&history).map_err(|e| Error::backend(e.to_string()))?;
        std::fs::write(path, json).map_err(|e| {
            Error::invalid_options(format!("cannot write --history {}: {e}", path.display()))
        })?;
    }
    let counter = history
        .ops
        .iter()
        .rev()
        .find(|o| o.accepted && o.kind == history::OpKind::Write)
        .map_or(0, |o| o.value);
    let mut acquire_errors: BTreeMap<String, u64> = BTreeMap::new();
    for e in &errors {
        let kind = e
            .split_once(": ")
            .and_then(|(_, rest)| rest.split_once(':'))
            .map_or(e.as_str(), |(k, _)| k);
        *acquire_errors.entry(kind.to_owned()).or_default() += 1;
    }
    // Killed holders' leases run out, and their sessions end, on their own.
    // Cut short, the wait leaves the lock counted as held.
    let left_held = tokio::select! {
        held = still_held(url, &key, outlast * 2 + Duration::from_secs(2)) => held,
        () = hurry.cancelled() => true,
    };
    signals.abort();
    if interrupted.is_none() {
        let late = *late_signal.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((sig, _)) = late {
            eprintln!(
                "locksmith check: {sig} after the fault run; not waiting for the lock to free"
            );
            super::die_by_signal_on_exit(sig);
        }
    }
    let faults_total = total.load(Ordering::Relaxed);
    let counts = counts.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if text {
        print_fault_table(
            &verdict,
            &counts,
            faults_total,
            counter,
            &acquire_errors,
            left_held,
            caps.fencing,
        );
    }
    Ok(FaultRun {
        seconds,
        workers: args.workers,
        ttl_ms: ttl.as_millis() as u64,
        faults: counts,
        faults_total,
        faults_not_possible: not_possible,
        verdict,
        counter,
        acquire_errors,
        workers_exited: exited,
        left_held,
    })
}

/// The next delivery of a signal, or never if it could not be watched.
async fn recv(s: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match s {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

async fn inject(
    fault: Fault,
    slot: &Slot,
    spawner: &Spawner,
    resource: &Resource,
    outlast: Duration,
) {
    let jitter = || Duration::from_millis(worker::rand_below(1000));
    match fault {
        Fault::Kill => {
            let mut child = slot.child.lock().await;
            if let Some(mut old) = child.take() {
                let id = slot.id.load(Ordering::Relaxed);
                if old.start_kill().is_ok() {
                    // SIGKILL is sent: the process runs no more code.
                    resource.died(id, history::mono_ns());
                }
                let _ = old.wait().await;
            }
            *child = spawner.spawn(slot).ok();
        }
        Fault::Pause => {
            let pid = slot.child.lock().await.as_ref().and_then(pid_of);
            if let Some(pid) = pid {
                let _ = kill(pid, Signal::SIGSTOP);
                tokio::time::sleep(outlast + jitter()).await;
                let _ = kill(pid, Signal::SIGCONT);
            }
        }
        Fault::Partition => {
            slot.ctl.cut();
            tokio::time::sleep(outlast + jitter()).await;
            slot.ctl.heal();
        }
        Fault::Latency => {
            slot.ctl
                .set_latency(Duration::from_millis(20 + worker::rand_below(130)));
            tokio::time::sleep(Duration::from_secs(1) + jitter() * 2).await;
            slot.ctl.set_latency(Duration::ZERO);
        }
    }
}

/// Whether `key` is still held after waiting up to `within` for it to free.
async fn still_held(url: &str, key: &str, within: Duration) -> bool {
    let (Ok(backend), Ok(key)) = (locksmith::backend::open(url).await, LockKey::new(key)) else {
        return false;
    };
    let until = Instant::now() + within;
    loop {
        match backend.inspect(&key).await {
            Ok(s) if !s.held => return false,
            _ if Instant::now() >= until => return true,
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

fn print_fault_table(
    v: &Verdict,
    counts: &BTreeMap<&'static str, u64>,
    total: u64,
    counter: u64,
    errors: &BTreeMap<String, u64>,
    left_held: bool,
    fencing: bool,
) {
    let list = |m: &mut dyn Iterator<Item = String>| m.collect::<Vec<_>>().join(", ");
    let kinds = list(&mut counts.iter().map(|(k, n)| format!("{k} {n}")));
    println!("  {:<24} {:>8}", "acquisitions", v.acquisitions);
    println!("  {:<24} {:>8}  {kinds}", "faults injected", total);
    println!(
        "  {:<24} {:>8}  sections still running past their holder's lease (frozen or cut off \
         mid-section)",
        "stale holders", v.late_sections
    );
    println!(
        "  {:<24} {:>8}",
        "exclusion violations", v.exclusion_violations
    );
    println!("  {:<24} {:>8}", "data violations", v.data_violations);
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
        "  {:<24} {:>8}  counter {counter}",
        "accepted writes", v.accepted_writes
    );
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
        if left_held { "yes" } else { "no" }
    );
    for e in &v.examples {
        println!("  ! {e}");
    }
}
