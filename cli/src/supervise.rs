//! The command under a held lease, for `lockwright run` (a lock) and
//! `lockwright elect` (a leadership): one supervision path, so both stop the
//! command's group on the same timeline, pass signals on the same way and
//! exit with the same codes.
//!
//! The timeline when renewal fails: the lease (the TTL, or the store's
//! `max_lease` when shorter: a ZooKeeper session) has a conservative local
//! deadline `D`. The command's group gets SIGTERM at `D − margin − grace`
//! and SIGKILL at `D − margin` at the latest (`margin` covers delivering the
//! signal and timer lateness), so nothing of it runs once someone else can
//! hold the lock. Renewals keep the remaining lease above two thirds of the
//! TTL, and `grace` is capped at half of it, so SIGTERM goes out only after
//! renewals have failed for a while. "TTL" below means that lease.

use std::future::Future;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use lockwright::{Error, ErrorKind, Leadership, LockGuard, Locker, LostReason, Result, WaitPolicy};
use lockwright_cli_kit::exit::{die_by_signal_on_exit, EX_SOFTWARE};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, Signal as Stream, SignalKind};

use crate::group::{self, Watcher};

/// How long background clean-ups (leaving a wait queue, undoing an acquire
/// whose reply was lost) get before the process exits.
const SETTLE: Duration = Duration::from_secs(4);

/// The signals that end `lockwright` while it waits, and that it passes
/// on to the command while it runs.
pub(crate) struct Signals {
    int: Stream,
    term: Stream,
    hup: Stream,
}

impl Signals {
    /// Listens for SIGINT, SIGTERM and SIGHUP from now on.
    pub(crate) fn new() -> Result<Self> {
        let listen =
            |kind| signal(kind).map_err(|e| Error::backend(format!("cannot handle signals: {e}")));
        Ok(Signals {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
        })
    }

    /// The next of them to arrive.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}

/// A lease the command runs under: what supervising needs of a lock guard
/// or of a leadership.
pub(crate) trait Held: Send + Sized {
    /// What is held, as the last line names it when it is lost.
    const WHAT: &'static str;

    /// The lock guard underneath: deadline, lost signal, fence.
    fn guard(&self) -> &LockGuard;

    /// The command's environment beyond the key and the fence.
    fn env(&self, _cmd: &mut Command) {}

    /// Gives the lease up (owner-checked, as a release is).
    fn release(self) -> impl Future<Output = Result<()>> + Send;
}

impl Held for LockGuard {
    const WHAT: &'static str = "lock";

    fn guard(&self) -> &LockGuard {
        self
    }

    fn release(self) -> impl Future<Output = Result<()>> + Send {
        LockGuard::release(self)
    }
}

impl Held for Leadership {
    const WHAT: &'static str = "leadership";

    fn guard(&self) -> &LockGuard {
        Leadership::guard(self)
    }

    fn env(&self, cmd: &mut Command) {
        if let Some(term) = self.term() {
            cmd.env("LOCKWRIGHT_TERM", term.to_string());
        }
    }

    fn release(self) -> impl Future<Output = Result<()>> + Send {
        self.resign()
    }
}

/// What the command runs under, whatever takes the lease.
pub(crate) struct Spec<'a> {
    /// The store, already refused if no other process can share it.
    pub(crate) url: &'a str,
    /// The lock's (or election's) name, exported as `LOCKWRIGHT_KEY`.
    pub(crate) key: &'a str,
    /// The lease asked for.
    pub(crate) ttl: Duration,
    /// `--kill-after`: the grace between SIGTERM and SIGKILL.
    pub(crate) kill_after: Option<Duration>,
    /// The command and its arguments (at least the command).
    pub(crate) command: &'a [String],
    /// How long to wait for the lease, connecting included.
    pub(crate) wait: WaitPolicy,
    /// `--label`: who the holder says it is, beside its host and pid.
    pub(crate) label: Option<&'a str>,
}

/// Connects to `url`, as a locker that records who holds (this host,
/// this pid, `label`); a caller prepared to wait rides out a store that
/// cannot be reached yet (a restart, an election) as the acquire itself
/// does, and reports the last error only when the wait is over. Returns
/// the locker and what is left of the wait.
async fn connect_within(
    url: &str,
    wait: WaitPolicy,
    label: Option<&str>,
) -> Result<(Locker, WaitPolicy)> {
    const FIRST_PAUSE: Duration = Duration::from_millis(50);
    let start = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        let error = match lockwright::connect(url).await {
            Ok(locker) => {
                let locker = locker.with_identity(label)?;
                let left = match wait {
                    WaitPolicy::For(d) => WaitPolicy::For(d.saturating_sub(start.elapsed())),
                    other => other,
                };
                return Ok((locker, left));
            }
            Err(e) => e,
        };
        let left = match wait {
            WaitPolicy::NoWait => Duration::ZERO,
            WaitPolicy::For(d) => d.saturating_sub(start.elapsed()),
            // Forever, and any policy added later: keep trying.
            _ => Duration::MAX,
        };
        if error.kind() != ErrorKind::Unavailable || left.is_zero() {
            return Err(error);
        }
        if pause == FIRST_PAUSE {
            // Once: a wrong address must not look like a long queue.
            tracing::warn!(error = %error.chain(),
                "cannot reach the store; trying again until the wait ({wait}) ends");
        } else {
            tracing::debug!(error = %error.chain(), "cannot reach the store; trying again");
        }
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// Refuses a `--label` the locker would refuse, before anything is taken
/// or run (and without echoing it: it may be 10 KiB).
pub(crate) fn check_label(label: Option<&str>) -> Result<()> {
    lockwright::HolderInfo::this_process(label).map(drop)
}

/// Ends a run that holds no lease (a signal or an error before the
/// command started): waits for the background clean-ups and gives back
/// the holder identity record, at most [`SETTLE`] in all, so that a
/// store that cannot be reached does not hold the exit up.
async fn give_up(locker: &Locker) {
    if tokio::time::timeout(SETTLE, locker.close()).await.is_err() {
        tracing::debug!("the clean-ups did not end in time; the store drops them at their TTL");
    }
}

/// When to signal the command as the lease runs out.
#[derive(Debug, Clone, Copy)]
struct Timeline {
    /// SIGKILL this long before the lease's local deadline.
    margin: Duration,
    /// SIGTERM this long before the SIGKILL.
    grace: Duration,
}

impl Timeline {
    /// The timeline for a lease of `ttl`, with `--kill-after` capped to fit it.
    fn new(ttl: Duration, kill_after: Option<Duration>) -> Self {
        let margin = (ttl / 20).clamp(Duration::from_millis(5), Duration::from_secs(1));
        let cap = (ttl / 2).saturating_sub(margin);
        let grace = kill_after
            .unwrap_or_else(|| (ttl / 3).min(Duration::from_secs(10)))
            .min(cap);
        Timeline { margin, grace }
    }
}

/// Connects, takes the lease with `acquire` (given the locker and what is
/// left of the wait), runs the command while the lease is held, gives it
/// up: the exit code.
pub(crate) async fn under_lease<H, A, F>(spec: &Spec<'_>, acquire: A) -> Result<i32>
where
    H: Held,
    A: FnOnce(Locker, WaitPolicy) -> F,
    F: Future<Output = Result<H>>,
{
    let mut signals = Signals::new()?;
    let (locker, wait) = tokio::select! {
        r = connect_within(spec.url, spec.wait, spec.label) => r?,
        sig = signals.recv() => {
            die_by_signal_on_exit(sig);
            return Ok(128 + sig as i32);
        }
    };
    // A session-bound store trusts a hold for its session timeout at most,
    // whatever the TTL: the command's timeline follows the shorter.
    let lease = locker.capabilities().trusted_lease(spec.ttl);
    let timeline = Timeline::new(lease, spec.kill_after);
    if spec.kill_after.is_some_and(|k| k > timeline.grace) {
        eprintln!(
            "lockwright: --kill-after capped at {} so the command stops before the {} lease ends",
            humantime::format_duration(timeline.grace),
            humantime::format_duration(lease)
        );
    }
    // Dropping the acquire on a signal leaves the queue and undoes a grant
    // in flight; settle() waits for that before we exit.
    let acquired = tokio::select! {
        r = acquire(locker.clone(), wait) => r,
        sig = signals.recv() => {
            give_up(&locker).await;
            die_by_signal_on_exit(sig);
            return Ok(128 + sig as i32);
        }
    };
    let held = match acquired {
        Ok(h) => h,
        Err(e) => {
            give_up(&locker).await;
            return Err(e);
        }
    };
    // A fair store's hand-off grants a short lease (Redis: 2 s), which
    // can put the command inside its kill grace before the watchdog's
    // renewal halfway through it (a 3 s TTL: SIGTERM at 0.8 s, renewal at
    // 1 s): extend it to the TTL before the command runs. A full grant has
    // the TTL less the drift margin and a round trip left, well over 90%.
    let short = held
        .guard()
        .deadline()
        .is_none_or(|d| d.saturating_duration_since(Instant::now()) < lease.mul_f64(0.9));
    if short {
        if let Err(e) = held.guard().renew().await {
            give_up(&locker).await;
            return Err(e);
        }
    }
    let ended = hold(spec, held, lease, timeline, &mut signals).await;
    // The lease is given up by now; close() also waits out any clean-up.
    if let Err(e) = locker.close().await {
        eprintln!("lockwright: warning: {}", e.chain());
    }
    let ended = ended?;
    // Last, so that a lost lock is what the user reads at the end.
    if let Some(word) = ended.last_word {
        eprintln!("lockwright: {word}");
    }
    Ok(ended.code)
}

/// How `hold` ended: the exit code, and a line to print after everything
/// else.
struct Ended {
    code: i32,
    last_word: Option<String>,
}

impl Ended {
    /// Ended with `code`, nothing more to say.
    fn code(code: i32) -> Ended {
        Ended {
            code,
            last_word: None,
        }
    }

    /// `what` ("lock", "leadership") was lost, or could not be kept, and
    /// the command was stopped by `by`: exit 70, saying why.
    fn lost(what: &str, reason: Option<LostReason>, by: Signal) -> Ended {
        let what = match reason {
            Some(r) => format!("{what} lost: {}", describe(r)),
            // Stopped before the deadline, which no renewal had reached
            // in time: the lock may still be ours, but is not confirmed.
            None => format!(
                "{what} not confirmed in time (renewals did not get through before the \
                 command had to stop)"
            ),
        };
        Ended {
            code: EX_SOFTWARE,
            last_word: Some(format!(
                "{what}; the command was terminated ({by}); exit {EX_SOFTWARE}"
            )),
        }
    }
}

/// Why the lock is gone, as the guard says; `None` while it still counts
/// down to a deadline no renewal reached.
fn reason_of(guard: &LockGuard) -> Option<LostReason> {
    match guard.state() {
        lockwright::LeaseState::Lost(r) => Some(r),
        // Held; or released, which is not seen here: this is asked before the release.
        _ => None,
    }
}

/// Runs the command while the lease is held; its exit code, or ours.
async fn hold<H: Held>(
    spec: &Spec<'_>,
    held: H,
    lease: Duration,
    timeline: Timeline,
    signals: &mut Signals,
) -> Result<Ended> {
    let mut watcher = match Watcher::start() {
        Ok(w) => w,
        Err(e) => {
            let _ = held.release().await;
            return Err(Error::backend(format!(
                "cannot start the process that guards the command: {e}"
            )));
        }
    };
    let foreground = group::foreground_terminal();
    let child = match command(spec, &held, foreground).spawn() {
        Ok(child) => child,
        Err(e) => {
            watcher.done();
            let _ = held.release().await;
            eprintln!("lockwright: cannot run {:?}: {e}", spec.command[0]);
            // The shells' convention: 127 not found, 126 found but not runnable.
            return Ok(Ended::code(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            }));
        }
    };
    let Some(group) = child.id().map(|id| Pid::from_raw(id as i32)) else {
        return Err(Error::backend("the command has no process id"));
    };
    if let Err(e) = watcher.watch(group) {
        group::signal_group(group, Signal::SIGKILL);
        let _ = held.release().await;
        return Err(Error::backend(format!("cannot reach the watcher: {e}")));
    }
    let mut running = Running {
        child,
        group,
        foreground,
        watcher,
    };
    let ran = supervise(held.guard(), &mut running, lease, timeline, signals).await;
    match ran.end {
        End::Exited(status) => {
            Ok(exited(held, running, status, &ran, timeline.grace, signals).await)
        }
        End::Stopped(why) => stopped(held, running, why).await,
    }
}

/// The command, to run as the leader of a process group of its own, with
/// the key, the fence and what the lease adds in its environment.
fn command<H: Held>(spec: &Spec<'_>, held: &H, foreground: bool) -> Command {
    let mut cmd = Command::new(&spec.command[0]);
    cmd.args(&spec.command[1..])
        .env("LOCKWRIGHT_KEY", spec.key)
        .kill_on_drop(true);
    if let Some(fence) = held.guard().fence() {
        cmd.env("LOCKWRIGHT_FENCE", fence.to_string());
    }
    held.env(&mut cmd);
    group::own_group(&mut cmd, foreground);
    cmd
}

/// The command while it runs under the lock, and what guards it.
struct Running {
    child: Child,
    /// The command's process group (the command leads it).
    group: Pid,
    /// Whether the command was given the terminal.
    foreground: bool,
    /// The process that kills the group if `lockwright` cannot.
    watcher: Watcher,
}

/// Why supervising the command ended.
#[derive(Debug)]
enum End {
    /// The command ended: by itself, by a signal, or killed by the watcher
    /// at its kill time.
    Exited(ExitStatus),
    /// The hold ended first, and the command must be killed.
    Stopped(Stop),
}

/// Why the hold ended while the command still ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Waiting for the command failed.
    WaitFailed,
    /// The lock is lost (the guard says so, or has no deadline left).
    Lost,
    /// The watcher is gone before the kill time it was last told.
    WatcherGone,
    /// The command did not stop within its grace after SIGTERM.
    Killed,
}

/// How supervising ended, and what it did on the way.
struct Supervised {
    end: End,
    /// The kill time the watcher was last told.
    told: Option<Instant>,
    /// When the command got SIGTERM because the lease was about to run out.
    terminated_at: Option<Instant>,
}

/// Watches the command until it ends, or the hold ends before it: passes
/// signals on to its group, keeps the watcher's kill time current, and
/// stops the command on the lease's timeline when renewals fail.
async fn supervise(
    guard: &LockGuard,
    running: &mut Running,
    lease: Duration,
    timeline: Timeline,
    signals: &mut Signals,
) -> Supervised {
    let (group, foreground) = (running.group, running.foreground);
    // The watcher also kills the group by the lease's kill time unless told
    // a later one, so a stopped or stalled lockwright cannot leave the
    // command running past the lease. Told again a few times per renewal.
    let mut told: Option<Instant> = None;
    let mut tell = tokio::time::interval((lease / 6).max(Duration::from_millis(5)));
    tell.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let lost = guard.lost();
    tokio::pin!(lost);
    let mut terminated_at: Option<Instant> = None;
    let end = loop {
        let Some(deadline) = guard.deadline() else {
            break End::Stopped(Stop::Lost);
        };
        let kill_at = deadline.checked_sub(timeline.margin).unwrap_or(deadline);
        let wake = match terminated_at {
            None => kill_at.checked_sub(timeline.grace).unwrap_or(kill_at),
            Some(t) => kill_at.min(t + timeline.grace),
        };
        // Biased: after a freeze, several branches are ready at once, and
        // the command's end (killed by the watcher at its kill time) is the
        // one that says what happened.
        tokio::select! {
            biased;
            status = running.child.wait() => match status {
                Ok(s) => break End::Exited(s),
                Err(_) => break End::Stopped(Stop::WaitFailed),
            },
            _ = &mut lost => break End::Stopped(Stop::Lost),
            sig = signals.recv() => pass_on(sig, group, foreground),
            _ = tell.tick() => {
                if let Some(stop) = tell_watcher(&mut running.watcher, &mut told, kill_at) {
                    break End::Stopped(stop);
                }
            }
            _ = tokio::time::sleep_until(wake.into()) => {
                if let Some(stop) = on_timeline(guard, timeline, group, &mut terminated_at) {
                    break End::Stopped(stop);
                }
            }
        }
    };
    Supervised {
        end,
        told,
        terminated_at,
    }
}

/// Passes a signal `lockwright` got on to the command's group.
fn pass_on(sig: Signal, group: Pid, foreground: bool) {
    // The command's group is not ours, so this is the one copy it gets;
    // except a hang-up of its terminal, which the kernel already sent to
    // the terminal's foreground group, the command's.
    let hung_up = sig == Signal::SIGHUP && foreground && !group::terminal_alive();
    if !hung_up {
        group::signal_group(group, sig);
    }
}

/// Tells the watcher the current kill time if it has changed; `Some` if
/// the watcher is gone and the hold must end.
fn tell_watcher(
    watcher: &mut Watcher,
    told: &mut Option<Instant>,
    kill_at: Instant,
) -> Option<Stop> {
    if *told == Some(kill_at) {
        return None;
    }
    // A watcher gone is the end of the protection: stop now. Unless the
    // kill time it was told has passed: then it killed the command and
    // left, as it should (we were frozen), and the command's end says so
    // next.
    if watcher
        .arm(kill_at.saturating_duration_since(Instant::now()))
        .is_err()
    {
        if told.is_some_and(|k| Instant::now() >= k) {
            return None;
        }
        return Some(Stop::WatcherGone);
    }
    *told = Some(kill_at);
    None
}

/// A wake-up on the lease's timeline: SIGTERM to the command when no
/// renewal has moved its kill time out of the grace, and the end of the
/// hold when the grace is over (or the lock is gone).
fn on_timeline(
    guard: &LockGuard,
    timeline: Timeline,
    group: Pid,
    terminated_at: &mut Option<Instant>,
) -> Option<Stop> {
    let now = Instant::now();
    // A renewal may have moved the deadline while we slept.
    let current = guard
        .deadline()
        .map(|d| d.checked_sub(timeline.margin).unwrap_or(d));
    match (*terminated_at, current) {
        (_, None) => return Some(Stop::Lost),
        (None, Some(k)) if now + timeline.grace >= k => {
            eprintln!(
                "lockwright: the lease was not renewed in time (renewals failed, or this \
                 process was paused); terminating the command ({} before it must stop)",
                humantime::format_duration(Duration::from_millis(
                    k.saturating_duration_since(now).as_millis() as u64
                ))
            );
            group::signal_group(group, Signal::SIGTERM);
            *terminated_at = Some(now);
        }
        (Some(t), Some(k)) if now >= k || now >= t + timeline.grace => {
            eprintln!("lockwright: the command did not stop in time; killing it");
            return Some(Stop::Killed);
        }
        _ => {}
    }
    None
}

/// The command ended: whatever it left in its group is stopped, then the
/// lock is released. Its exit code; or 70 when it was stopped for the
/// lease, or the release found the lock lost.
async fn exited<H: Held>(
    held: H,
    running: Running,
    status: ExitStatus,
    ran: &Supervised,
    grace: Duration,
    signals: &mut Signals,
) -> Ended {
    let Running {
        group,
        foreground,
        watcher,
        ..
    } = running;
    // Whatever the command left running in its group stops too, before
    // the lock is released.
    if group::group_alive(group) {
        group::signal_group(group, Signal::SIGTERM);
        if !group::wait_group_gone(group, grace).await {
            group::signal_group(group, Signal::SIGKILL);
            group::wait_group_gone(group, Duration::from_secs(5)).await;
        }
    }
    finish(foreground, watcher);
    // Killed by the watcher at the kill time it was last told: the
    // lease was not confirmed in time (lockwright stopped or stalled),
    // even if a renewal got through after.
    let by_watcher = std::os::unix::process::ExitStatusExt::signal(&status)
        == Some(Signal::SIGKILL as i32)
        && ran.told.is_some_and(|k| Instant::now() >= k);
    if by_watcher {
        eprintln!("lockwright: the command was killed at the lease's kill time");
    }
    if ran.terminated_at.is_some() || by_watcher {
        let reason = reason_of(held.guard());
        let _ = tokio::time::timeout(Duration::from_secs(1), held.release()).await;
        let by = if by_watcher {
            Signal::SIGKILL
        } else {
            Signal::SIGTERM
        };
        return Ended::lost(H::WHAT, reason, by);
    }
    // A release that cannot reach the store is tried until the lease runs
    // out; a signal ends that wait (the release stays unconfirmed), after
    // a second more: the signal may be the one the command got too (a stop
    // of the whole group), and a store that answers finishes in time.
    let release = held.release();
    tokio::pin!(release);
    let released = tokio::select! {
        r = &mut release => r,
        sig = signals.recv() => match tokio::time::timeout(Duration::from_secs(1), &mut release).await {
            Ok(r) => r,
            Err(_) => Err(Error::unavailable(format!(
                "{} arrived while the release was being tried",
                sig.as_str()
            ))),
        },
    };
    match released {
        Ok(()) => Ended::code(status_code(status)),
        Err(e) if e.kind() == ErrorKind::Lost => {
            eprintln!(
                "lockwright: {}; the command may not have run exclusively",
                e.chain()
            );
            Ended::code(EX_SOFTWARE)
        }
        Err(e) => {
            // Tried until the lease ran out: whether the lock was still
            // held when the command ended is unknown (a store that
            // restarted empty may have granted it to someone else), so the
            // run cannot be called exclusive.
            eprintln!(
                "lockwright: {}; the release was not confirmed, so the command may not \
                 have run exclusively (the lock frees when its TTL runs out)",
                e.chain()
            );
            Ended::code(EX_SOFTWARE)
        }
    }
}

/// The hold ended before the command: its group is killed, then the lock
/// released (if the store still has it as ours); exit 70, saying why.
async fn stopped<H: Held>(held: H, running: Running, why: Stop) -> Result<Ended> {
    let Running {
        mut child,
        group,
        foreground,
        watcher,
    } = running;
    group::signal_group(group, Signal::SIGKILL);
    let _ = child.wait().await;
    group::wait_group_gone(group, Duration::from_secs(5)).await;
    finish(foreground, watcher);
    if why == Stop::WaitFailed {
        let _ = held.release().await;
        return Err(Error::backend("waiting for the command failed"));
    }
    let reason = reason_of(held.guard());
    // Owner-checked: frees the lock if the store still has it as ours
    // (renewals failed but the store is back), else changes nothing.
    let _ = tokio::time::timeout(Duration::from_secs(1), held.release()).await;
    if why == Stop::WatcherGone {
        return Ok(Ended {
            code: EX_SOFTWARE,
            last_word: Some(format!(
                "the process that guards the command is gone; the command was killed \
                 (SIGKILL); exit {EX_SOFTWARE}"
            )),
        });
    }
    Ok(Ended::lost(H::WHAT, reason, Signal::SIGKILL))
}

/// The command's group is gone: the terminal comes back, the watcher may leave.
fn finish(foreground: bool, watcher: Watcher) {
    if foreground {
        group::reclaim_terminal();
    }
    watcher.done();
}

/// Why a lock was lost, in words for the last line.
fn describe(reason: LostReason) -> &'static str {
    match reason {
        LostReason::Expired => "not renewed before its deadline",
        LostReason::NotHeld => "the store says it is no longer held",
        LostReason::Closed => "its locker was closed",
        _ => "the lock was lost",
    }
}

/// The command's exit code, or 128+N when signal N ended it (N recorded to end by, too).
fn status_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal().and_then(|s| Signal::try_from(s).ok()) {
        die_by_signal_on_exit(sig);
    }
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(EX_SOFTWARE)
}
