//! The fault run from start to verdict: the resource and the workers are
//! started, the nemesis runs until the duration is up or a signal cuts it
//! short, the workers are stopped, and the history they left is judged.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockwright::backend::Capabilities;
use lockwright::{Error, LockKey, OwnerToken, Result};
use lockwright_cli_kit::exit::die_by_signal_on_exit;
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::history::{self, Verdict};
use super::nemesis::Nemesis;
use super::observers::{self, Observers};
use super::report::{fault_run_result, print_fault_run_header, print_fault_table, FaultRun};
use super::resource::Resource;
use super::worker::Claims;
use super::workers::{Spawner, Workers};
use crate::args::CheckArgs;
use crate::endpoints::Endpoints;

/// Runs the fault run `args` asks for against the store at `url`; its part
/// of the report (the table printed too, if `text`).
pub(crate) async fn fault_run(
    args: &CheckArgs,
    url: &str,
    endpoints: Option<&Endpoints>,
    caps: &Capabilities,
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

    let claims = Claims::of(args);
    let resource = match claims {
        Claims::Permits(n) => Resource::with_permits(n),
        _ => Resource::default(),
    };
    let port = resource.serve().await.map_err(|e| {
        Error::new(
            lockwright::ErrorKind::Backend,
            format!("cannot listen: {e}"),
        )
    })?;
    let key = format!(
        "lockwright-check/{}",
        &OwnerToken::generate().as_str()[..12]
    );
    let spawner = Arc::new(Spawner::new(key.clone(), ttl, port, args.election, claims)?);
    // Straight to the store, not through the proxies: the observers are
    // not under the faults, so what they report is the store's own answer.
    let observers = if args.election {
        let locker = lockwright::connect(url).await?;
        Some(Observers::start(locker.election(key.as_str())?))
    } else {
        None
    };
    let nemesis = Nemesis::new(faults.clone(), args.workers, outlast, url);
    let interrupts = Interrupts::watch(&resource);
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
    let workers =
        Workers::start(args.workers, spawner, url, upstream.as_deref(), endpoints).await?;
    if text {
        print_fault_run_header(
            args.workers,
            args.election,
            claims,
            ttl,
            &faults,
            args.duration,
            &not_possible,
        );
    }

    let progress = progress(&resource, nemesis.total(), args.duration, started);
    let mut nemesis = nemesis;
    let exited = nemesis
        .run(&workers, &resource, end, &interrupts.stop)
        .await;
    interrupts.judging.store(true, Ordering::SeqCst);
    progress.abort();
    if text && std::io::stderr().is_terminal() {
        eprintln!();
    }
    let interrupted = interrupts.first();
    if let Some((sig, at)) = interrupted {
        eprintln!(
            "lockwright check: {sig} at {:.1}s; no section begins after it; stopping the fault \
             run and judging what it saw",
            at.saturating_duration_since(started).as_secs_f64()
        );
        // Then end by that signal, as a shell expects of an interrupted command.
        die_by_signal_on_exit(sig);
    }

    // Stop now, not when the faults would have ended (a pause or partition
    // outlasts the lease): the faults are lifted below, so a frozen or
    // cut-off holder finishes the section it began in time, and is judged.
    let (counts, faults_total) = nemesis.lift().await;
    workers.stop(&resource).await;
    // The run judged ends at the cut-off, not when the workers were done.
    let seconds = interrupted
        .map_or(args.duration, |(_, at)| {
            at.saturating_duration_since(started)
        })
        .min(started.elapsed())
        .as_secs_f64();

    let election = match observers {
        Some(o) => {
            let (seen, errors) = o.stop().await;
            Some(observers::judge(
                &seen,
                &resource.snapshot().0.sections,
                outlast,
                errors,
            ))
        }
        None => None,
    };
    let judged = judge(&resource, args.history.as_deref())?;
    // Killed holders' leases run out, and their sessions end, on their own.
    // Cut short, the wait leaves the lock counted as held.
    let left_held = tokio::select! {
        held = still_held(url, &key, outlast * 2 + Duration::from_secs(2)) => held,
        () = interrupts.hurry.cancelled() => true,
    };
    interrupts.task.abort();
    if interrupted.is_none() {
        if let Some((sig, _)) = interrupts.first() {
            eprintln!(
                "lockwright check: {sig} after the fault run; not waiting for the lock to free"
            );
            die_by_signal_on_exit(sig);
        }
    }
    let result = fault_run_result(&judged.verdict, &counts, election.as_ref());
    let run = FaultRun {
        seconds,
        workers: args.workers,
        ttl_ms: ttl.as_millis() as u64,
        faults: counts,
        faults_total,
        faults_not_possible: not_possible,
        verdict: judged.verdict,
        counter: judged.counter,
        acquire_errors: judged.acquire_errors,
        workers_exited: exited,
        left_held,
        election,
        result,
    };
    if text {
        print_fault_table(&run, caps.fencing);
    }
    Ok(run)
}

/// Ctrl-C and SIGTERM, during the fault run and after it.
struct Interrupts {
    /// Cancelled by the first signal: the run is cut off the moment it
    /// comes, whatever the nemesis is doing (or while the workers start);
    /// what the run saw until then is still judged.
    stop: CancellationToken,
    /// Cancelled by a signal once the run is being judged, or a second
    /// one: the wait for the lock to free after the run is cut short.
    hurry: CancellationToken,
    /// Set when the nemesis is done and the run is being judged.
    judging: Arc<AtomicBool>,
    /// The first signal, and when it came.
    first: Arc<Mutex<Option<(Signal, Instant)>>>,
    /// The task that listens.
    task: JoinHandle<()>,
}

impl Interrupts {
    /// Listens for the signals; each cuts the resource off at once, so no
    /// section begins after it.
    fn watch(resource: &Resource) -> Interrupts {
        let stop = CancellationToken::new();
        let hurry = CancellationToken::new();
        let judging = Arc::new(AtomicBool::new(false));
        let first: Arc<Mutex<Option<(Signal, Instant)>>> = Arc::default();
        let mut sigint = signal(SignalKind::interrupt()).ok();
        let mut sigterm = signal(SignalKind::terminate()).ok();
        let task = {
            let (resource, stop, hurry, judging, first) = (
                resource.clone(),
                stop.clone(),
                hurry.clone(),
                judging.clone(),
                first.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let sig = tokio::select! {
                        Some(()) = recv(&mut sigint) => Signal::SIGINT,
                        Some(()) = recv(&mut sigterm) => Signal::SIGTERM,
                        else => return,
                    };
                    resource.cut_off(history::mono_ns());
                    let mut first = first.lock().unwrap_or_else(|e| e.into_inner());
                    if first.is_some() || judging.load(Ordering::SeqCst) {
                        hurry.cancel();
                    }
                    first.get_or_insert((sig, Instant::now()));
                    drop(first);
                    stop.cancel();
                }
            })
        };
        Interrupts {
            stop,
            hurry,
            judging,
            first,
            task,
        }
    }

    /// The first signal so far, and when it came.
    fn first(&self) -> Option<(Signal, Instant)> {
        *self.first.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The next delivery of a signal, or never if it could not be watched.
async fn recv(s: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match s {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// The progress line on stderr while the run lasts: redrawn every half
/// second on a terminal, else a line every ten seconds.
fn progress(
    resource: &Resource,
    total: Arc<AtomicU64>,
    duration: Duration,
    started: Instant,
) -> JoinHandle<()> {
    let resource = resource.clone();
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
}

/// What the run's history shows.
struct Judged {
    verdict: Verdict,
    /// The counter's last accepted value.
    counter: u64,
    /// The workers' failed acquires, by error kind.
    acquire_errors: BTreeMap<String, u64>,
}

/// Judges the history the resource recorded, and writes it to `path`
/// (`--history`) if asked.
fn judge(resource: &Resource, path: Option<&Path>) -> Result<Judged> {
    let (history, errors) = resource.snapshot();
    let verdict = history::check(&history);
    if let Some(path) = path {
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
    Ok(Judged {
        verdict,
        counter,
        acquire_errors,
    })
}

/// Whether `key` is still held after waiting up to `within` for it to free.
async fn still_held(url: &str, key: &str, within: Duration) -> bool {
    let (Ok(backend), Ok(key)) = (lockwright::backend::open(url).await, LockKey::new(key)) else {
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
