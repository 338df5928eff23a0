//! The fault run's worker processes, as `check` keeps them: one slot per
//! worker with the proxies in front of it, started, replaced when they end
//! by themselves, and stopped when the run is over.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockwright::{Error, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use super::history;
use super::resource::Resource;
use super::worker::{
    Claims, WORKER_CLAIMS_ENV, WORKER_ELECTION_ENV, WORKER_SUBCOMMAND, WORKER_URL_ENV,
};
use crate::endpoints::Endpoints;
use crate::proxy::{self, Control};

/// One worker process and the proxy switches in front of it.
pub(crate) struct Slot {
    /// The number of the worker now in the slot (a replacement gets a new one).
    pub(crate) id: AtomicU32,
    pub(crate) child: Mutex<Option<Child>>,
    /// The switches of the slot's proxies: partition and latency.
    pub(crate) ctl: Arc<Control>,
    /// The URL the worker uses: through its proxies when there are any.
    url: String,
    /// Under a fault now: the nemesis leaves it alone.
    pub(crate) busy: AtomicBool,
}

/// Starts worker processes, each with a new number.
pub(crate) struct Spawner {
    exe: std::path::PathBuf,
    key: String,
    ttl: Duration,
    port: u16,
    next_id: AtomicU32,
    /// The workers campaign instead of locking (`check --election`).
    election: bool,
    /// What the workers take instead of the lock.
    claims: Claims,
}

impl Spawner {
    /// Workers of this executable on `key` with leases of `ttl`, reporting
    /// to the resource on `port`; candidates in an election on `key` if
    /// `election`.
    pub(crate) fn new(
        key: String,
        ttl: Duration,
        port: u16,
        election: bool,
        claims: Claims,
    ) -> Result<Spawner> {
        Ok(Spawner {
            exe: std::env::current_exe()
                .map_err(|e| Error::new(lockwright::ErrorKind::Backend, format!("{e}")))?,
            key,
            ttl,
            port,
            next_id: AtomicU32::new(1),
            election,
            claims,
        })
    }

    /// Starts a worker in `slot`, numbering it.
    pub(crate) fn spawn(&self, slot: &Slot) -> std::io::Result<Child> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        slot.id.store(id, Ordering::Relaxed);
        // For studying a run: each worker's lock events, in a directory.
        let stderr = match std::env::var_os("LOCKWRIGHT_CHECK_WORKER_LOGS") {
            Some(dir) => {
                std::fs::File::create(std::path::Path::new(&dir).join(format!("worker-{id}.log")))
                    .map(std::process::Stdio::from)
                    .unwrap_or_else(|_| std::process::Stdio::null())
            }
            None => std::process::Stdio::null(),
        };
        let mut command = Command::new(&self.exe);
        if self.election {
            command.env(WORKER_ELECTION_ENV, "1");
        }
        command.env(WORKER_CLAIMS_ENV, self.claims.to_env());
        command
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

/// A child's process id, while it has one.
pub(crate) fn pid_of(child: &Child) -> Option<Pid> {
    child.id().map(|p| Pid::from_raw(p as i32))
}

/// Every worker slot, and what starts their workers.
pub(crate) struct Workers {
    pub(crate) slots: Vec<Arc<Slot>>,
    pub(crate) spawner: Arc<Spawner>,
}

impl Workers {
    /// Starts `count` workers, each behind proxies of its own to the
    /// `upstream` servers when the store is reached over TCP.
    pub(crate) async fn start(
        count: u32,
        spawner: Arc<Spawner>,
        url: &str,
        upstream: Option<&[SocketAddr]>,
        endpoints: Option<&Endpoints>,
    ) -> Result<Workers> {
        let mut slots = Vec::new();
        for _ in 0..count {
            let ctl = Control::new();
            let url = match (upstream, endpoints) {
                (Some(addrs), Some(e)) => through_proxies(addrs, e, &ctl).await?,
                _ => url.to_owned(),
            };
            let slot = Arc::new(Slot {
                id: AtomicU32::new(0),
                child: Mutex::new(None),
                ctl,
                url,
                busy: AtomicBool::new(false),
            });
            let child = spawner
                .spawn(&slot)
                .map_err(|e| Error::new(lockwright::ErrorKind::Backend, format!("worker: {e}")))?;
            *slot.child.lock().await = Some(child);
            slots.push(slot);
        }
        Ok(Workers { slots, spawner })
    }

    /// Counts and replaces the workers that ended by themselves (they could
    /// not connect, say), so contention does not quietly drop; slots under
    /// a fault are left to it.
    pub(crate) async fn replace_ended(&self, resource: &Resource) -> u64 {
        let mut exited = 0;
        for slot in &self.slots {
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
                *child = self.spawner.spawn(slot).ok();
            }
        }
        exited
    }

    /// The slots under a fault now.
    pub(crate) fn busy(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.busy.load(Ordering::Relaxed))
            .count()
    }

    /// The slots under no fault.
    pub(crate) fn free(&self) -> Vec<&Arc<Slot>> {
        self.slots
            .iter()
            .filter(|s| !s.busy.load(Ordering::Relaxed))
            .collect()
    }

    /// Ends the run for every worker: each is thawed, reconnected and sees
    /// its stdin close, so it releases and exits; one that does not within
    /// five seconds is killed.
    pub(crate) async fn stop(&self, resource: &Resource) {
        for slot in &self.slots {
            slot.ctl.heal();
            slot.ctl.set_latency(Duration::ZERO);
            if let Some(child) = slot.child.lock().await.as_mut() {
                if let Some(pid) = pid_of(child) {
                    let _ = kill(pid, Signal::SIGCONT);
                }
                drop(child.stdin.take());
            }
        }
        for slot in &self.slots {
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
    }
}

/// A proxy to each of the store's servers, all switched by `ctl`; the URL
/// that reaches the store through them.
async fn through_proxies(
    upstream: &[SocketAddr],
    endpoints: &Endpoints,
    ctl: &Arc<Control>,
) -> Result<String> {
    let mut ports = Vec::new();
    for a in upstream {
        ports.push(
            proxy::start(*a, ctl.clone())
                .await
                .map_err(|e| Error::new(lockwright::ErrorKind::Backend, format!("proxy: {e}")))?,
        );
    }
    Ok(endpoints.with_local_ports(&ports))
}
