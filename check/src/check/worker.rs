//! A fault-run worker: takes the shared lock again and again and, holding
//! it, increments `check`'s counter by a read, a short pause and a write,
//! reporting each step. It never asks whether its lease is still valid
//! before writing: a frozen or cut-off holder writes late on purpose, so
//! the run shows what the fence (or its absence) does about it.
//!
//! With `check --permits N` a worker holds one of N permits and touches
//! no counter (N holders at once would race on it by design); with
//! `--read-write`, two sections in three are a reader's, which only read.
//!
//! Here too: how a worker is started (its hidden subcommand and the
//! environment it reads), which `workers.rs` uses to start one.

use std::time::{Duration, Instant};

use lockwright::{Election, LockGuard, LockKey, LockOptions, Locker, Result};
// `EX_USAGE` for a command line `check` did not write, `EX_OSERR` for a
// runtime that cannot start: the command's own codes, since a worker is the
// `lockwright` executable too.
use lockwright_cli_kit::exit::{EX_OSERR, EX_USAGE};
use tokio_util::sync::CancellationToken;

use super::history::{instant_ns, mono_ns};
use super::observers::worker_value;
use super::resource::{Channel, Remote, Request};
use crate::args::CheckArgs;

/// The hidden subcommand a fault-run worker runs as.
pub const WORKER_SUBCOMMAND: &str = "__check-worker";

/// Where a worker finds its store URL.
pub(crate) const WORKER_URL_ENV: &str = "LOCKWRIGHT_CHECK_WORKER_URL";

/// What a worker takes instead of the lock (`--permits`, `--read-write`).
pub(crate) const WORKER_CLAIMS_ENV: &str = "LOCKWRIGHT_CHECK_WORKER_CLAIMS";

/// Set for a worker that campaigns instead of locking (`--election`).
pub(crate) const WORKER_ELECTION_ENV: &str = "LOCKWRIGHT_CHECK_WORKER_ELECTION";

/// The latest deadline a guard has reported (a lost guard keeps its last).
fn deadline(guard: &LockGuard, last: u64) -> u64 {
    guard.deadline().map_or(last, |d| instant_ns(d).max(last))
}

/// What a fault run's workers take instead of the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claims {
    /// The lock (or, with `--election`, a leadership).
    Lock,
    /// One of a semaphore's N permits.
    Permits(u32),
    /// A read-write lock's read or write hold.
    ReadWrite,
}

impl Claims {
    /// What `check`'s flags ask for.
    pub(crate) fn of(args: &CheckArgs) -> Self {
        match (args.permits, args.read_write) {
            (Some(n), _) => Claims::Permits(n),
            (None, true) => Claims::ReadWrite,
            (None, false) => Claims::Lock,
        }
    }

    /// How a worker's environment says it.
    pub(crate) fn to_env(self) -> String {
        match self {
            Claims::Lock => "lock".to_owned(),
            Claims::Permits(n) => format!("permits={n}"),
            Claims::ReadWrite => "read-write".to_owned(),
        }
    }

    /// Reads [`to_env`](Self::to_env)'s text back.
    pub(crate) fn from_env(s: &str) -> Option<Self> {
        match s {
            "lock" => Some(Claims::Lock),
            "read-write" => Some(Claims::ReadWrite),
            _ => s
                .strip_prefix("permits=")?
                .parse()
                .ok()
                .map(Claims::Permits),
        }
    }
}

/// How a worker takes the lock: a lock, or a leadership whose guard is the lock.
enum Hold {
    Lock(LockGuard),
    Lead(lockwright::Leadership),
}

impl Hold {
    fn guard(&self) -> &LockGuard {
        match self {
            Hold::Lock(g) => g,
            Hold::Lead(l) => l.guard(),
        }
    }

    async fn release(self) -> Result<()> {
        match self {
            Hold::Lock(g) => g.release().await,
            Hold::Lead(l) => l.resign().await,
        }
    }
}

/// Takes the lock, campaigns for it if `election` is given, or makes
/// `claims`' claim (a reader's if `shared`).
async fn take(
    locker: &Locker,
    key: &LockKey,
    election: Option<&Election>,
    (claims, shared): (Claims, bool),
    id: u32,
    opts: &LockOptions,
) -> Result<Hold> {
    if let Some(e) = election {
        return e
            .campaign_with(worker_value(id), opts)
            .await
            .map(Hold::Lead);
    }
    let guard = match claims {
        Claims::Lock => locker.lock_with(key, opts).await,
        Claims::Permits(n) => locker.semaphore(key, n)?.acquire_with(opts).await,
        Claims::ReadWrite if shared => locker.rwlock(key)?.read_with(opts).await,
        Claims::ReadWrite => locker.rwlock(key)?.write_with(opts).await,
    };
    guard.map(Hold::Lock)
}

/// What a worker does inside each section, between its read and its write
/// (tests use it to stall a holder).
pub(crate) type Inside<'a> = &'a (dyn Fn(u32) -> futures::future::BoxFuture<'static, ()> + Sync);

/// Runs until `stop`, until the resource refuses a new section (the run
/// is over), or until the resource is gone; campaigning instead of locking
/// when `election` is given (an election on `key`), or making `claims`.
///
/// # Errors
/// The resource could not be reached.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn work(
    locker: &Locker,
    key: &LockKey,
    election: Option<&Election>,
    claims: Claims,
    ttl: Duration,
    id: u32,
    ch: &mut dyn Channel,
    stop: &CancellationToken,
    inside: Option<Inside<'_>>,
) -> std::io::Result<()> {
    let opts = LockOptions::new().ttl(ttl).wait_for(ttl * 5);
    let mut seq = 0u64;
    while !stop.is_cancelled() {
        let shared = claims == Claims::ReadWrite && rand_below(3) != 0;
        let held = tokio::select! {
            g = take(locker, key, election, (claims, shared), id, &opts) => g,
            () = stop.cancelled() => break,
        };
        let held = match held {
            Ok(g) => g,
            Err(e) if e.kind() == lockwright::ErrorKind::Timeout => continue,
            Err(e) => {
                ch.call(Request::Error {
                    w: id,
                    what: format!("{:?}: {e}", e.kind()),
                })
                .await?;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        seq += 1;
        let start = mono_ns();
        let guard = held.guard();
        let fence = guard.fence().map(|f| f.0);
        let mut dl = deadline(guard, 0);
        let begun = ch
            .call(Request::Begin {
                w: id,
                s: seq,
                fence,
                start,
                deadline: dl,
                shared,
            })
            .await?;
        if !begun.ok {
            // The run is over: a section begun now would not be judged.
            let _ = held.release().await;
            break;
        }
        dl = deadline(guard, dl);
        let read = match claims {
            // A permit's holder has nothing to itself to write.
            Claims::Permits(_) => {
                tokio::time::sleep(Duration::from_micros(5_000 + rand_below(35_000))).await;
                None
            }
            _ => Some(
                ch.call(Request::Read {
                    w: id,
                    s: seq,
                    fence,
                    deadline: dl,
                    shared,
                })
                .await?,
            ),
        };
        if shared {
            // A reader reads, stays a while, and leaves.
            tokio::time::sleep(Duration::from_micros(5_000 + rand_below(35_000))).await;
        }
        if let Some(read) = read.filter(|r| r.ok && !shared) {
            // Work that takes a while, 5-40 ms: long enough that a holder
            // the nemesis picks is still between its read and its write when
            // the fault lands, so a frozen or cut-off holder writes late.
            let pause = Duration::from_micros(5_000 + rand_below(35_000));
            tokio::time::sleep(pause).await;
            if let Some(inside) = inside {
                inside(id).await;
            }
            dl = deadline(guard, dl);
            ch.call(Request::Write {
                w: id,
                s: seq,
                fence,
                read: read.value,
                deadline: dl,
            })
            .await?;
        }
        dl = deadline(guard, dl);
        ch.call(Request::End {
            w: id,
            s: seq,
            end: mono_ns(),
            deadline: dl,
        })
        .await?;
        // A lost lock's release says so; the run has already recorded it.
        let _ = held.release().await;
    }
    Ok(())
}

/// A cheap random number below `n`, for jitter.
pub(crate) fn rand_below(n: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(Instant::now().elapsed().as_nanos() ^ u128::from(mono_ns()));
    h.finish() % n.max(1)
}

/// The hidden `__check-worker KEY TTL PORT ID` subcommand: one worker
/// process, its URL in the environment, stopped by the end of its stdin.
pub fn main(args: &[String]) -> i32 {
    let parsed = (|| {
        let [key, ttl, port, id] = args else {
            return None;
        };
        Some((
            key.clone(),
            humantime::parse_duration(ttl).ok()?,
            port.parse::<u16>().ok()?,
            id.parse::<u32>().ok()?,
        ))
    })();
    let (Some((key, ttl, port, id)), Ok(url)) = (parsed, std::env::var(WORKER_URL_ENV)) else {
        eprintln!("lockwright: {WORKER_SUBCOMMAND} is started by `lockwright check` only");
        return EX_USAGE;
    };
    // Dies with `check`, even frozen: a worker left behind would hold a
    // connection, and perhaps the lock, with nobody to stop it.
    let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
    if nix::unistd::getppid() == nix::unistd::Pid::from_raw(1) {
        return 0;
    }
    let Ok(rt) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    else {
        return EX_OSERR;
    };
    let code = rt.block_on(run(&url, &key, ttl, port, id));
    rt.shutdown_timeout(Duration::from_secs(1));
    code
}

async fn run(url: &str, key: &str, ttl: Duration, port: u16, id: u32) -> i32 {
    let run = async {
        let key = LockKey::new(key)?;
        let locker = lockwright::connect(url).await?;
        let mut ch = Remote::connect(port)
            .await
            .map_err(|e| lockwright::Error::unavailable(format!("the check's resource: {e}")))?;
        let stop = CancellationToken::new();
        let eof = stop.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut sink = [0u8; 64];
            let mut stdin = tokio::io::stdin();
            while matches!(stdin.read(&mut sink).await, Ok(n) if n > 0) {}
            eof.cancel();
        });
        let election = match std::env::var_os(WORKER_ELECTION_ENV) {
            Some(_) => Some(locker.election(&key)?),
            None => None,
        };
        let claims = std::env::var(WORKER_CLAIMS_ENV)
            .ok()
            .and_then(|c| Claims::from_env(&c))
            .unwrap_or(Claims::Lock);
        let outcome = work(
            &locker,
            &key,
            election.as_ref(),
            claims,
            ttl,
            id,
            &mut ch,
            &stop,
            None,
        )
        .await;
        let _ = tokio::time::timeout(Duration::from_secs(2), locker.close()).await;
        outcome.map_err(|e| lockwright::Error::unavailable(format!("the check's resource: {e}")))
    };
    match run.await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("lockwright check worker {id}: {}", e.chain());
            // The command's one table.
            lockwright_cli_kit::exit::exit_code(e.kind())
        }
    }
}
