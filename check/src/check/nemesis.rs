//! The fault run's nemesis: the loop that injects the faults (`faults.rs`
//! says which there are) into the workers (killing, freezing, cutting off
//! and slowing them) while keeping enough of them free to take the lock.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::faults::Fault;
use super::history;
use super::resource::Resource;
use super::worker::rand_below;
use super::workers::{pid_of, Slot, Spawner, Workers};

/// The nemesis: a new fault every 50-250 ms while fewer than half the
/// workers are under one, so the rest keep taking the lock.
pub(crate) struct Nemesis {
    /// The faults it may inject into workers (those possible on this store).
    faults: Vec<Fault>,
    /// The store whose primary it fails over now and then, if asked.
    failover: Option<String>,
    /// Failovers made, and attempts that failed.
    failovers: Arc<AtomicU64>,
    failovers_failed: Arc<AtomicU64>,
    /// How long a pause or partition lasts at least: past the lease.
    outlast: Duration,
    /// The most workers under a fault at once.
    max_busy: usize,
    /// Faults injected, by name.
    counts: BTreeMap<&'static str, u64>,
    /// Faults injected in all, for the progress line too.
    total: Arc<AtomicU64>,
    /// The faults under way.
    tasks: Vec<JoinHandle<()>>,
}

impl Nemesis {
    /// A nemesis for `workers` workers; with [`Fault::Failover`] among
    /// `faults`, it fails the primary of the store at `url` over too.
    pub(crate) fn new(faults: Vec<Fault>, workers: u32, outlast: Duration, url: &str) -> Nemesis {
        let failover = faults.contains(&Fault::Failover).then(|| url.to_owned());
        Nemesis {
            faults: faults
                .into_iter()
                .filter(|f| *f != Fault::Failover)
                .collect(),
            failover,
            failovers: Arc::default(),
            failovers_failed: Arc::default(),
            outlast,
            max_busy: (workers as usize / 2).max(1),
            counts: BTreeMap::new(),
            total: Arc::new(AtomicU64::new(0)),
            tasks: Vec::new(),
        }
    }

    /// The count of faults injected so far, shared.
    pub(crate) fn total(&self) -> Arc<AtomicU64> {
        self.total.clone()
    }

    /// Injects faults until `end` or `stop`, replacing the workers that end
    /// by themselves on the way; how many did.
    pub(crate) async fn run(
        &mut self,
        workers: &Workers,
        resource: &Resource,
        end: Instant,
        stop: &CancellationToken,
    ) -> u64 {
        let mut exited = 0u64;
        if let Some(url) = self.failover.clone() {
            let (made, failed, total) = (
                self.failovers.clone(),
                self.failovers_failed.clone(),
                self.total.clone(),
            );
            let stop = stop.clone();
            self.tasks.push(tokio::spawn(async move {
                failovers(&url, end, &stop, &made, &failed, &total).await;
            }));
        }
        while Instant::now() < end && !stop.is_cancelled() {
            let tick = Duration::from_millis(50 + rand_below(200));
            tokio::select! {
                () = tokio::time::sleep(tick) => {}
                () = tokio::time::sleep_until(end.into()) => break,
                () = stop.cancelled() => break,
            }
            // A worker refused a section at the cut-off has ended: not replaced.
            if Instant::now() >= end {
                break;
            }
            exited += workers.replace_ended(resource).await;
            if self.faults.is_empty() {
                continue;
            }
            if let ControlFlow::Break(()) = self.strike(workers, resource, end, stop).await {
                break;
            }
        }
        exited
    }

    /// Injects one fault into a free worker, if fewer than `max_busy` are
    /// under one; `Break` if the run ended while it looked for a target.
    async fn strike(
        &mut self,
        workers: &Workers,
        resource: &Resource,
        end: Instant,
        stop: &CancellationToken,
    ) -> ControlFlow<()> {
        if workers.busy() >= self.max_busy {
            return ControlFlow::Continue(());
        }
        let fault = self.faults[rand_below(self.faults.len() as u64) as usize];
        let free = workers.free();
        // Kill and pause aim at a holder inside its critical section:
        // wait up to half a second for one, then take anyone.
        let mut holding: Vec<&Arc<Slot>> = Vec::new();
        if fault.aims_at_holders() {
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
            return ControlFlow::Break(());
        }
        let pool = if fault.aims_at_holders() && !holding.is_empty() {
            holding
        } else {
            free
        };
        let Some(slot) = pool.get(rand_below(pool.len() as u64) as usize) else {
            return ControlFlow::Continue(());
        };
        let slot = (*slot).clone();
        slot.busy.store(true, Ordering::Relaxed);
        *self.counts.entry(fault.name()).or_default() += 1;
        self.total.fetch_add(1, Ordering::Relaxed);
        let (spawner, resource, outlast) =
            (workers.spawner.clone(), resource.clone(), self.outlast);
        self.tasks.push(tokio::spawn(async move {
            inject(fault, &slot, &spawner, &resource, outlast).await;
            slot.busy.store(false, Ordering::Relaxed);
        }));
        self.tasks.retain(|t| !t.is_finished());
        ControlFlow::Continue(())
    }

    /// Stops the faults under way where they are (the workers are thawed
    /// and healed after); the faults injected, by name, and in all.
    pub(crate) async fn lift(self) -> (BTreeMap<&'static str, u64>, u64) {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
        let mut counts = self.counts;
        if self.failover.is_some() {
            counts.insert("failover", self.failovers.load(Ordering::Relaxed));
            let failed = self.failovers_failed.load(Ordering::Relaxed);
            if failed > 0 {
                counts.insert("failover (failed)", failed);
            }
        }
        (counts, self.total.load(Ordering::Relaxed))
    }
}

/// Fails the primary of the store at `url` over, one failover after
/// another four to eight seconds apart (time for the replicas to catch
/// up), until `end` or `stop`.
async fn failovers(
    url: &str,
    end: Instant,
    stop: &CancellationToken,
    made: &AtomicU64,
    failed: &AtomicU64,
    total: &AtomicU64,
) {
    loop {
        let pause = Duration::from_millis(4000 + rand_below(4000));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = tokio::time::sleep_until(end.into()) => return,
            () = stop.cancelled() => return,
        }
        match tokio::time::timeout(Duration::from_secs(70), lockwright::backend::failover(url))
            .await
        {
            Ok(Ok(what)) => {
                tracing::info!("failover: {what}");
                made.fetch_add(1, Ordering::Relaxed);
                total.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Err(e)) => {
                tracing::warn!("failover failed: {}", e.chain());
                failed.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Makes one fault on one worker, for as long as it lasts.
async fn inject(
    fault: Fault,
    slot: &Slot,
    spawner: &Spawner,
    resource: &Resource,
    outlast: Duration,
) {
    let jitter = || Duration::from_millis(rand_below(1000));
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
                .set_latency(Duration::from_millis(20 + rand_below(130)));
            tokio::time::sleep(Duration::from_secs(1) + jitter() * 2).await;
            slot.ctl.set_latency(Duration::ZERO);
        }
        // The whole store's, made by `failovers`.
        Fault::Failover => {}
    }
}
