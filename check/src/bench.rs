//! `lockwright bench`: how much one deployment takes. Uncontended pairs/s
//! with one and N clients (and of a semaphore's permit and of read and
//! write holds, where the store has them), N contenders on one key, and one client holding
//! many locks: the renewal round trips it costs (counted at a local proxy
//! in front of the store) and the client memory per held lock.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use lockwright::backend::RedactedUrl;
use lockwright::{Error, LockGuard, LockOptions, Locker, OwnerToken, Result};
use lockwright_conformance::faults::{Observed, Observer};
use serde::Serialize;
use serde_json::json;

use crate::args::BenchArgs;
use crate::bench_election;
use crate::bench_procs;
use crate::endpoints::Endpoints;
use crate::proxy::{self, Control};
use lockwright_cli_kit::timing::{percentile, percentile_ms, HandOffs};

/// Most locks the held-lock run takes with SQL session locks, where each
/// one holds a server connection.
const SESSION_HELD: usize = 50;

/// Acquires or releases in flight at once while filling the held-lock run.
const FILL_CONCURRENCY: usize = 64;

/// A progress bar on stderr (redrawn only on a terminal).
struct Bar {
    label: String,
    tty: bool,
}

impl Bar {
    fn new(label: impl Into<String>) -> Bar {
        let bar = Bar {
            label: label.into(),
            tty: std::io::stderr().is_terminal(),
        };
        bar.show(0.0);
        bar
    }

    fn show(&self, done: f64) {
        if self.tty {
            let filled = (done.clamp(0.0, 1.0) * 30.0) as usize;
            eprint!(
                "\r  {:<34} [{}{}] {:>3.0}%",
                self.label,
                "#".repeat(filled),
                " ".repeat(30 - filled),
                done * 100.0
            );
            let _ = std::io::stderr().flush();
        }
    }

    fn done(self) {
        if self.tty {
            eprint!("\r{:80}\r", "");
        } else {
            eprintln!("  {} done", self.label);
        }
    }
}

/// Shows a bar for `d` while `f` runs.
async fn timed<F: std::future::Future>(label: &str, d: Duration, f: F) -> F::Output {
    let bar = Bar::new(label);
    let started = Instant::now();
    tokio::pin!(f);
    loop {
        tokio::select! {
            out = &mut f => { bar.done(); return out; }
            () = tokio::time::sleep(Duration::from_millis(200)) => {
                bar.show(started.elapsed().as_secs_f64() / d.as_secs_f64());
            }
        }
    }
}

fn run_key(tag: &str) -> String {
    format!(
        "lockwright-bench/{}/{tag}",
        &OwnerToken::generate().as_str()[..12]
    )
}

/// `lockwright bench`: the table on stdout, or with `--json` one JSON
/// document (progress and notices on stderr either way).
pub async fn bench(args: BenchArgs) -> Result<i32> {
    let url = args.store.shared_url()?.to_owned();
    let shown = RedactedUrl::new(&url);
    let scheme = lockwright::backend::scheme(&url)?;
    let text = !args.json;
    let n = args.clients as usize;
    if args.held > 0 && args.hold_for < Duration::from_secs(1) {
        return Err(Error::invalid_options("--hold-for must be at least 1s"));
    }
    if args.held > 0 && args.ttl > lockwright::MAX_TTL {
        return Err(Error::invalid_options(format!(
            "--ttl is longer than the longest lease, {}",
            humantime::format_duration(lockwright::MAX_TTL)
        )));
    }
    if args.duration.is_zero() {
        return Err(Error::invalid_options("--duration must be more than 0s"));
    }
    let first = lockwright::connect(&url).await?;
    first.backend().verify().await?;
    let caps = first.capabilities().clone();
    if args.held > 0 && args.ttl < caps.min_ttl {
        return Err(Error::invalid_options(format!(
            "--ttl {:?} is below this store's shortest lease, {:?}",
            args.ttl, caps.min_ttl
        )));
    }
    let header = format!(
        "lockwright bench: {shown} ({n} clients, {} per throughput run)",
        humantime::format_duration(args.duration)
    );
    if text {
        println!("{header}");
    } else {
        eprintln!("{header}");
    }
    let mut lockers = vec![first];
    for _ in 1..n {
        lockers.push(lockwright::connect(&url).await?);
    }
    let d = args.duration;

    let (one, lat) = timed("uncontended, 1 client", d, uncontended(&lockers[..1], d)).await?;
    let (many, _) = timed(
        &format!("uncontended, {n} clients"),
        d,
        uncontended(&lockers, d),
    )
    .await?;
    let contended = timed(
        &format!("contended, {n} clients"),
        d,
        contended(&lockers, d),
    )
    .await?;
    let procs = timed(
        "contended, 2 processes",
        d,
        bench_procs::run(&lockers[0], &url, &run_key("processes"), d),
    )
    .await?;
    // Semaphores and read-write locks beside the mutex, one client each,
    // where the store has them.
    let mut claims = Vec::new();
    for (label, take, offered) in [
        ("semaphore of 3, 1 client", Take::Permit(3), caps.permits),
        ("read hold, 1 client", Take::Read, caps.shared),
        ("write hold, 1 client", Take::Write, caps.shared),
    ] {
        if offered {
            let (rate, lat) = timed(label, d, uncontended_taking(&lockers[..1], d, take)).await?;
            claims.push((label, rate, lat));
        }
    }
    let election = if caps.values {
        let watcher = lockwright::connect(&url).await?;
        let figures = timed(
            "election, 2 candidates",
            d,
            bench_election::run(&lockers[..2], &watcher, &run_key("election"), d),
        )
        .await?;
        let _ = watcher.close().await;
        Some(figures)
    } else {
        None
    };
    for l in &lockers {
        let _ = l.close().await;
    }
    drop(lockers);

    let (rate, gaps, shares) = contended;
    let (lo, hi) = shares
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), s| (lo.min(*s), hi.max(*s)));
    if text {
        println!("  {:<34} figures", "run");
        println!(
            "  {:<34} {:>8.0} pairs/s  pair p50 {}  p99 {}",
            "uncontended, 1 client",
            one,
            percentile(&lat, 0.50),
            percentile(&lat, 0.99)
        );
        println!(
            "  {:<34} {:>8.0} pairs/s  ({:.2}x one client)",
            format!("uncontended, {n} clients"),
            many,
            many / one.max(f64::MIN_POSITIVE)
        );
        for (label, rate, lat) in &claims {
            println!(
                "  {:<34} {:>8.0} pairs/s  pair p50 {}  p99 {}  ({:.2}x the lock)",
                label,
                rate,
                percentile(lat, 0.50),
                percentile(lat, 0.99),
                rate / one.max(f64::MIN_POSITIVE)
            );
        }
        if claims.is_empty() {
            println!(
                "  {:<34} this store has neither: no such runs",
                "semaphores, read-write locks"
            );
        }
        println!(
            "  {:<34} {:>8.0} locks/s  hand-off p50 {}  p99 {}  share {:.1}%..{:.1}%",
            format!("contended, {n} clients, one key"),
            rate,
            percentile(&gaps, 0.50),
            percentile(&gaps, 0.99),
            lo * 100.0,
            hi * 100.0
        );
        println!(
            "  {:<34} {:>8.0} locks/s  hand-off p50 {}  p99 {}  share {:.1}%/{:.1}%  (held {} ms, {} ms between turns)",
            "contended, 2 processes, one key",
            procs.rate,
            percentile(&procs.handoffs, 0.50),
            percentile(&procs.handoffs, 0.99),
            procs.shares[0] * 100.0,
            procs.shares[1] * 100.0,
            bench_procs::HOLD.as_millis(),
            bench_procs::THINK.as_millis()
        );
        match &election {
            Some(e) => println!(
                "  {:<34} resign to next leader p50 {}  p99 {};  observed p50 {}  p99 {} ({} of {} \
                 reigns; polls every {} ms)",
                "election, 2 candidates",
                percentile(&e.handoffs, 0.50),
                percentile(&e.handoffs, 0.99),
                percentile(&e.observed, 0.50),
                percentile(&e.observed, 0.99),
                e.observed.len(),
                e.observed.len() + e.missed,
                lockwright::OBSERVE_EVERY.as_millis()
            ),
            None => println!(
                "  {:<34} this store keeps no values: no elections",
                "election"
            ),
        }
    }
    let held_run = if args.held > 0 {
        Some(held(&url, &args, &caps, text).await?)
    } else {
        None
    };
    if let Some(h) = held_run.as_ref().filter(|_| text) {
        h.print();
    }
    if args.json {
        let vs_one = |rate: f64| rate / one.max(f64::MIN_POSITIVE);
        let mut runs = vec![
            json!({
                "scenario": "uncontended, 1 client",
                "clients": 1,
                "pairs_per_sec": one,
                "p50_ms": percentile_ms(&lat, 0.50),
                "p99_ms": percentile_ms(&lat, 0.99),
            }),
            json!({
                "scenario": format!("uncontended, {n} clients"),
                "clients": n,
                "pairs_per_sec": many,
                "vs_one_client": vs_one(many),
            }),
        ];
        for (label, rate, lat) in &claims {
            runs.push(json!({
                "scenario": label,
                "clients": 1,
                "pairs_per_sec": rate,
                "p50_ms": percentile_ms(lat, 0.50),
                "p99_ms": percentile_ms(lat, 0.99),
                "vs_lock": vs_one(*rate),
            }));
        }
        runs.push(json!({
            "scenario": format!("contended, {n} clients, one key"),
            "clients": n,
            "locks_per_sec": rate,
            "handoff_p50_ms": percentile_ms(&gaps, 0.50),
            "handoff_p99_ms": percentile_ms(&gaps, 0.99),
            "share_min_pct": lo * 100.0,
            "share_max_pct": hi * 100.0,
        }));
        runs.push(json!({
            "scenario": "contended, 2 processes, one key",
            "processes": 2,
            "locks_per_sec": procs.rate,
            "handoff_p50_ms": percentile_ms(&procs.handoffs, 0.50),
            "handoff_p99_ms": percentile_ms(&procs.handoffs, 0.99),
            "shares_pct": procs.shares.map(|s| s * 100.0),
            "hold_ms": u64::try_from(bench_procs::HOLD.as_millis()).unwrap_or(u64::MAX),
            "think_ms": u64::try_from(bench_procs::THINK.as_millis()).unwrap_or(u64::MAX),
        }));
        if let Some(e) = &election {
            runs.push(json!({
                "scenario": "election, 2 candidates",
                "candidates": 2,
                "resign_to_leader_p50_ms": percentile_ms(&e.handoffs, 0.50),
                "resign_to_leader_p99_ms": percentile_ms(&e.handoffs, 0.99),
                "observed_p50_ms": percentile_ms(&e.observed, 0.50),
                "observed_p99_ms": percentile_ms(&e.observed, 0.99),
                "reigns_observed": e.observed.len(),
                "reigns": e.observed.len() + e.missed,
                "observe_every_ms":
                    u64::try_from(lockwright::OBSERVE_EVERY.as_millis()).unwrap_or(u64::MAX),
            }));
        }
        let doc = json!({
            "url": shown.to_string(),
            "url_scheme": scheme.name,
            "store": scheme.store,
            "clients": n,
            "duration_seconds": d.as_secs_f64(),
            "runs": runs,
            "held": held_run,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&doc).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    }
    Ok(0)
}

/// What an uncontended run takes: a lock, one of a semaphore's permits,
/// or a read or write hold.
#[derive(Debug, Clone, Copy)]
enum Take {
    Lock,
    Permit(u32),
    Read,
    Write,
}

impl Take {
    /// One attempt on `key`, which nobody else uses.
    async fn once(self, l: &Locker, key: &str) -> Result<LockGuard> {
        let now = LockOptions::new().no_wait();
        let held = match self {
            Take::Lock => l.try_lock(key).await?,
            Take::Permit(n) => l.semaphore(key, n)?.try_acquire_with(&now).await?,
            Take::Read => l.rwlock(key)?.try_read_with(&now).await?,
            Take::Write => l.rwlock(key)?.try_write_with(&now).await?,
        };
        held.ok_or_else(|| Error::backend("an uncontended key was held"))
    }
}

/// Acquire+release pairs/s, each client on its own key, and the sorted
/// pair latencies.
async fn uncontended(lockers: &[Locker], d: Duration) -> Result<(f64, Vec<Duration>)> {
    uncontended_taking(lockers, d, Take::Lock).await
}

/// As [`uncontended`], taking what `take` says.
async fn uncontended_taking(
    lockers: &[Locker],
    d: Duration,
    take: Take,
) -> Result<(f64, Vec<Duration>)> {
    let started = Instant::now();
    let runs = lockers.iter().map(|l| async move {
        let key = run_key("free");
        let mut lat = Vec::new();
        while started.elapsed() < d {
            let t = Instant::now();
            let g = take.once(l, key.as_str()).await?;
            g.release().await?;
            lat.push(t.elapsed());
        }
        Ok::<_, Error>(lat)
    });
    let mut all = Vec::new();
    for r in futures::future::join_all(runs).await {
        all.extend(r?);
    }
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    all.sort();
    Ok((rate, all))
}

/// Locks/s, sorted hand-off gaps, and each client's share of the locks.
async fn contended(lockers: &[Locker], d: Duration) -> Result<(f64, Vec<Duration>, Vec<f64>)> {
    let key = run_key("contended");
    let handoffs = HandOffs::default();
    let opts =
        LockOptions::new().ttl(Duration::from_secs(10).max(lockers[0].capabilities().min_ttl));
    let started = Instant::now();
    let stop = AtomicBool::new(false);
    let runs = lockers.iter().enumerate().map(|(id, l)| {
        let (key, opts, handoffs, stop) = (&key, &opts, &handoffs, &stop);
        async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let g = l.lock_with(key.as_str(), opts).await?;
                handoffs.granted(id);
                n += 1;
                if started.elapsed() >= d {
                    stop.store(true, Ordering::Relaxed);
                }
                handoffs.releasing(id);
                g.release().await?;
            }
            Ok::<_, Error>(n)
        }
    });
    let mut counts = Vec::new();
    for r in futures::future::join_all(runs).await {
        counts.push(r?);
    }
    let total: u64 = counts.iter().sum();
    let rate = total as f64 / started.elapsed().as_secs_f64();
    let shares = counts
        .iter()
        .map(|c| *c as f64 / total.max(1) as f64)
        .collect();
    Ok((rate, handoffs.take(), shares))
}

/// Renewal requests and the leases they carried.
#[derive(Debug, Default)]
struct Renewals {
    calls: AtomicU64,
    leases: AtomicU64,
}

impl Renewals {
    fn read(&self) -> (u64, u64) {
        (
            self.calls.load(Ordering::Relaxed),
            self.leases.load(Ordering::Relaxed),
        )
    }
}

/// Counts a client's renewals into shared [`Renewals`].
#[derive(Debug)]
struct Counting(Arc<Renewals>);

impl Observer for Counting {
    fn renewing(&self, leases: usize) {
        self.0.calls.fetch_add(1, Ordering::Relaxed);
        self.0.leases.fetch_add(leases as u64, Ordering::Relaxed);
    }
}

/// This process's resident memory, in bytes.
fn rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The held-lock run's figures, as the table shows them and as `--json`
/// writes them; `None` (null) where there is no figure.
#[derive(Debug, Serialize)]
struct Held {
    /// Locks held.
    locks: usize,
    /// How long they were held.
    #[serde(skip)]
    hold_for: Duration,
    /// Their lease.
    #[serde(skip)]
    ttl: Duration,
    /// How often each lease was renewed (to the ms).
    #[serde(skip)]
    period: Duration,
    hold_for_seconds: f64,
    ttl_seconds: f64,
    renewed_every_ms: u64,
    /// Renewal batches (one store call each) per renewal period.
    renewal_batches_per_period: f64,
    /// The same, per 100 held locks.
    renewal_batches_per_period_per_100_locks: f64,
    /// Leases a batch carried.
    leases_per_batch: f64,
    /// The renewals' network round trips per period, counted at a local
    /// proxy: none for a store not reached over TCP.
    renewal_round_trips_per_period: Option<f64>,
    /// The same, per 100 held locks.
    renewal_round_trips_per_period_per_100_locks: Option<f64>,
    /// Round trips per held lock per minute.
    round_trips_per_lock_per_minute: Option<f64>,
    /// The most connections open to the store at once, to all servers,
    /// while taking, holding and releasing.
    connections_to_store: Option<u64>,
    /// Resident memory growth per held lock.
    client_memory_per_lock_bytes: Option<f64>,
    /// Resident memory growth for all of them (may be negative).
    rss_growth_bytes: Option<f64>,
    /// Locks lost while held.
    locks_lost: usize,
}

impl Held {
    /// The held-lock run's lines of the table.
    fn print(&self) {
        let n = self.locks;
        println!(
            "  {:<34} {n} locks held for {}, TTL {} (renewed every {})",
            "held locks",
            humantime::format_duration(self.hold_for),
            humantime::format_duration(self.ttl),
            humantime::format_duration(self.period)
        );
        println!(
            "  {:<34} {:>8.1}  ({:.2} per 100 held locks; {:.1} leases per batch, one store call each)",
            "  renewal batches / period",
            self.renewal_batches_per_period,
            self.renewal_batches_per_period_per_100_locks,
            self.leases_per_batch
        );
        match (
            self.renewal_round_trips_per_period,
            self.renewal_round_trips_per_period_per_100_locks,
            self.round_trips_per_lock_per_minute,
            self.connections_to_store,
        ) {
            (Some(per_period), Some(per_100), Some(per_minute), Some(connections)) => {
                println!(
                    "  {:<34} {:>8.1}  ({:.2} per 100 held locks; requests sent together share one)",
                    "  renewal round trips / period", per_period, per_100
                );
                println!(
                    "  {:<34} {:>8.3}",
                    "  round trips / lock / minute", per_minute
                );
                println!(
                    "  {:<34} {:>8}  (most open at once, to all servers, while taking, holding and releasing)",
                    "  connections to the store",
                    connections
                );
            }
            _ => println!(
                "  {:<34} {:>8}  (the store is not reached over TCP, so there is no proxy to count at)",
                "  renewal round trips / period", "n/a"
            ),
        }
        match (self.client_memory_per_lock_bytes, self.rss_growth_bytes) {
            (Some(per_lock), Some(growth)) => println!(
                "  {:<34} {:>8.0} B  (RSS {:+.1} MiB for {n} locks)",
                "  client memory / held lock",
                per_lock,
                growth / (1024.0 * 1024.0)
            ),
            _ => println!("  {:<34} {:>8}", "  client memory / held lock", "n/a"),
        }
        println!("  {:<34} {:>8}", "  locks lost while held", self.locks_lost);
    }
}

/// One client holds `--held` locks for `--hold-for`: renewal round trips
/// (through a counting proxy, for a store reached over TCP) and memory.
/// A notice goes to stdout if `text`, else to stderr.
async fn held(
    url: &str,
    args: &BenchArgs,
    caps: &lockwright::backend::Capabilities,
    text: bool,
) -> Result<Held> {
    let mut n = args.held as usize;
    // SQL session locks each keep a server connection (ZooKeeper's share
    // one session).
    let per_connection = caps.binding == lockwright::backend::Binding::Session
        && matches!(
            lockwright::backend::scheme(url)?.store,
            "PostgreSQL" | "MySQL/MariaDB"
        );
    if per_connection && n > SESSION_HELD {
        let notice = format!(
            "  held locks: SQL session locks each keep a server connection of their own, \
             so {SESSION_HELD} instead of {n} (more would exhaust the server's connections)"
        );
        if text {
            println!("{notice}");
        } else {
            eprintln!("{notice}");
        }
        n = SESSION_HELD;
    }
    let ctl = Control::new();
    let counted = match Endpoints::of(url)? {
        Some(e) => {
            let mut ports = Vec::new();
            for a in e.resolve(url).await? {
                ports.push(
                    proxy::start(a, ctl.clone())
                        .await
                        .map_err(|e| Error::backend(format!("proxy: {e}")))?,
                );
            }
            Some(e.with_local_ports(&ports))
        }
        None => None,
    };
    let renewals = Arc::new(Renewals::default());
    let backend = lockwright::backend::open(counted.as_deref().unwrap_or(url)).await?;
    let locker = Locker::from_arc(Observed::wrap(backend, Counting(renewals.clone())));
    let opts = LockOptions::new().ttl(args.ttl);
    let prefix = run_key("held");
    // Warm the connection, so the delta is the locks' own.
    locker.try_lock(format!("{prefix}/warm").as_str()).await?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = rss();

    let bar = Bar::new(format!("acquiring {n} locks"));
    // Straight into one vector of the final size: a second one, or the
    // growth of this one, would count freed memory as the locks'.
    let mut guards: Vec<LockGuard> = Vec::with_capacity(n);
    let mut acquiring = stream::iter(0..n)
        .map(|i| {
            let (locker, opts, prefix) = (&locker, &opts, &prefix);
            async move {
                locker
                    .try_lock_with(format!("{prefix}/{i}").as_str(), opts)
                    .await?
                    .ok_or_else(|| Error::backend("a fresh key was held"))
            }
        })
        .buffer_unordered(FILL_CONCURRENCY);
    while let Some(g) = acquiring.next().await {
        guards.push(g?);
        if guards.len().is_multiple_of(500) {
            bar.show(guards.len() as f64 / n as f64);
        }
    }
    drop(acquiring);
    bar.done();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = rss();

    let rt_start = ctl.round_trips();
    let (calls_start, leases_start) = renewals.read();
    timed(
        &format!("holding {n} locks"),
        args.hold_for,
        tokio::time::sleep(args.hold_for),
    )
    .await;
    let round_trips = ctl.round_trips() - rt_start;
    let (calls, leases) = renewals.read();
    let (calls, leases) = (calls - calls_start, leases - leases_start);
    let lost = guards.iter().filter(|g| g.is_lost()).count();

    let bar = Bar::new(format!("releasing {n} locks"));
    stream::iter(guards)
        .map(|g| async move {
            let _ = g.release().await;
        })
        .buffer_unordered(FILL_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
    bar.done();
    let _ = locker.close().await;

    // A lease is renewed every third of what the store trusts a hold for
    // (the TTL, or a ZooKeeper session when that is shorter).
    let period = caps.trusted_lease(args.ttl) / 3;
    let periods = args.hold_for.as_secs_f64() / period.as_secs_f64();
    let per_100 = |per_period: f64| per_period / (n as f64 / 100.0);
    let batches = calls as f64 / periods;
    let round_trips_per_period = counted.as_ref().map(|_| round_trips as f64 / periods);
    let renewed_every_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX);
    Ok(Held {
        locks: n,
        hold_for: args.hold_for,
        ttl: args.ttl,
        period: Duration::from_millis(renewed_every_ms),
        hold_for_seconds: args.hold_for.as_secs_f64(),
        ttl_seconds: args.ttl.as_secs_f64(),
        renewed_every_ms,
        renewal_batches_per_period: batches,
        renewal_batches_per_period_per_100_locks: per_100(batches),
        leases_per_batch: leases as f64 / calls.max(1) as f64,
        renewal_round_trips_per_period: round_trips_per_period,
        renewal_round_trips_per_period_per_100_locks: round_trips_per_period.map(per_100),
        round_trips_per_lock_per_minute: counted
            .as_ref()
            .map(|_| round_trips as f64 / n as f64 / (args.hold_for.as_secs_f64() / 60.0)),
        connections_to_store: counted.as_ref().map(|_| ctl.most_open()),
        client_memory_per_lock_bytes: before
            .zip(after)
            .map(|(b, a)| a.saturating_sub(b) as f64 / n as f64),
        rss_growth_bytes: before.zip(after).map(|(b, a)| a as f64 - b as f64),
        locks_lost: lost,
    })
}
