//! The command's process group: started in a group of its own so that every
//! signal reaches the whole tree, handed the terminal while it runs, and
//! killed by a watcher process if `lockwright` itself is killed.

use std::io::{BufRead, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::process::{ChildStdin, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, signal, SigHandler, Signal};
use nix::unistd::Pid;
use tokio::process::Command;

/// The hidden subcommand that runs the watcher.
pub(crate) const WATCH_SUBCOMMAND: &str = "__watch-group";

/// The terminal on standard input, when this process is in its foreground
/// process group: the command's group then takes the foreground while it
/// runs, so that Ctrl-C reaches the command's group once, from the terminal,
/// and never twice (once from the terminal, once forwarded).
pub(crate) fn foreground_terminal() -> bool {
    let stdin = std::io::stdin();
    std::io::IsTerminal::is_terminal(&stdin)
        && nix::unistd::tcgetpgrp(stdin.as_fd()).is_ok_and(|pg| pg == nix::unistd::getpgrp())
}

/// Makes the command the leader of a new process group, takes the terminal
/// for that group if `foreground`, and has the kernel kill the command if we
/// die before it execs or while it runs.
pub(crate) fn own_group(cmd: &mut Command, foreground: bool) {
    let parent = std::process::id();
    cmd.process_group(0);
    // SAFETY: the closure runs in the forked child before exec and makes
    // only async-signal-safe system calls (prctl, getppid, sigaction,
    // ioctl through tcsetpgrp); it allocates nothing and takes no locks.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            #[cfg(target_os = "linux")]
            {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // We may have died between fork and prctl.
                if nix::unistd::getppid().as_raw() as u32 != parent {
                    return Err(std::io::Error::other(
                        "lockwright exited before the command started",
                    ));
                }
            }
            #[cfg(not(target_os = "linux"))]
            let _ = parent;
            if foreground {
                // Ctrl-Z would stop the command's group, which the shell does
                // not know as a job, leaving the terminal to a stopped group;
                // and a suspended holder would keep the lock indefinitely.
                // The ignored disposition survives exec.
                signal(Signal::SIGTSTP, SigHandler::SigIgn)?;
                // A background group that sets the terminal's foreground
                // group gets SIGTTOU unless it ignores it for the call.
                signal(Signal::SIGTTOU, SigHandler::SigIgn)?;
                let tty = BorrowedFd::borrow_raw(0);
                let _ = nix::unistd::tcsetpgrp(tty, nix::unistd::getpid());
                signal(Signal::SIGTTOU, SigHandler::SigDfl)?;
            }
            Ok(())
        });
    }
}

/// Whether standard input's terminal is still there (not hung up).
pub(crate) fn terminal_alive() -> bool {
    nix::unistd::tcgetpgrp(std::io::stdin().as_fd()).is_ok()
}

/// Gives the terminal back to our own group once the command's is done.
pub(crate) fn reclaim_terminal() {
    // SAFETY: changes this process's SIGTTOU disposition around one
    // tcsetpgrp call; no handler runs Rust code.
    #[allow(unsafe_code)]
    unsafe {
        let old = signal(Signal::SIGTTOU, SigHandler::SigIgn);
        let _ = nix::unistd::tcsetpgrp(std::io::stdin().as_fd(), nix::unistd::getpgrp());
        if let Ok(old) = old {
            let _ = signal(Signal::SIGTTOU, old);
        }
    }
}

/// Sends `sig` to every process of the group.
pub(crate) fn signal_group(group: Pid, sig: Signal) {
    let _ = killpg(group, sig);
}

/// Whether any process of the group is still running (zombies waiting for a
/// parent to reap them do not count: they no longer run).
pub(crate) fn group_alive(group: Pid) -> bool {
    #[cfg(target_os = "linux")]
    {
        if let Ok(dir) = std::fs::read_dir("/proc") {
            let mut any = false;
            for entry in dir.flatten() {
                let name = entry.file_name();
                let Some(pid) = name
                    .to_str()
                    .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
                else {
                    continue;
                };
                let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                    continue;
                };
                // "pid (comm) state ppid pgrp ...": comm may hold anything, so
                // the fields are read after its last ')'.
                let Some((_, fields)) = stat.rsplit_once(')') else {
                    continue;
                };
                let mut fields = fields.split_whitespace();
                let (state, _ppid, pgrp) = (fields.next(), fields.next(), fields.next());
                if pgrp == Some(&group.as_raw().to_string()) && state != Some("Z") {
                    any = true;
                    break;
                }
            }
            return any;
        }
    }
    killpg(group, None).is_ok()
}

/// Waits until the group has no running process left, or `within` passed.
pub(crate) async fn wait_group_gone(group: Pid, within: Duration) -> bool {
    let until = Instant::now() + within;
    loop {
        if !group_alive(group) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A process that outlives us: if `lockwright` dies without saying it is
/// done (SIGKILL, OOM), its end of a pipe closes and the watcher kills the
/// command's whole group, so nothing runs on without the lock. `PDEATHSIG`
/// alone would reach the command's first process only.
pub(crate) struct Watcher {
    pipe: Option<ChildStdin>,
    child: std::process::Child,
}

impl Watcher {
    /// Starts the watcher (this executable, hidden subcommand), before the
    /// command, so that no moment passes with the command unwatched.
    pub(crate) fn start() -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut cmd = std::process::Command::new(exe);
        cmd.arg(WATCH_SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // Its own group: terminal signals and signals to our group do not
        // reach it.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn()?;
        Ok(Watcher {
            pipe: child.stdin.take(),
            child,
        })
    }

    /// Tells the watcher which group to kill if we die.
    pub(crate) fn watch(&mut self, group: Pid) -> std::io::Result<()> {
        let pipe = self.pipe.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        writeln!(pipe, "{}", group.as_raw())?;
        pipe.flush()
    }

    /// Kill the group in `within` unless told a later time (or "done").
    pub(crate) fn arm(&mut self, within: Duration) -> std::io::Result<()> {
        let pipe = self.pipe.as_mut().ok_or(std::io::ErrorKind::BrokenPipe)?;
        writeln!(pipe, "kill-in {}", within.as_millis())?;
        pipe.flush()
    }

    /// The group is gone: the watcher may exit without killing anything.
    pub(crate) fn done(mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            let _ = writeln!(pipe, "done");
        }
        let _ = self.child.wait();
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // Without "done" the pipe's end makes the watcher kill the group:
        // the safe outcome for every path that did not wait for it.
        self.pipe.take();
        let _ = self.child.try_wait();
    }
}

/// The watcher's body: reads a group id, then kill times ("kill-in <ms>",
/// each replacing the last) until "done". The group is SIGKILLed when the
/// pipe ends without "done" (lockwright died) or a kill time passes without
/// a later one (lockwright stopped or stalled while its lease ran out).
pub(crate) fn watcher_main() -> i32 {
    for sig in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGTSTP,
    ] {
        // SAFETY: setting a signal to be ignored runs no handler code.
        #[allow(unsafe_code)]
        unsafe {
            let _ = signal(sig, SigHandler::SigIgn);
        }
    }
    let (tx, rx) = std::sync::mpsc::channel::<Option<String>>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(Some(line)).is_err() {
                return;
            }
        }
        let _ = tx.send(None);
    });
    let mut group: Option<Pid> = None;
    let mut kill_at: Option<Instant> = None;
    loop {
        let next = match kill_at {
            Some(at) => rx.recv_timeout(at.saturating_duration_since(Instant::now())),
            None => rx
                .recv()
                .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(Some(line)) => match line.trim().split_once(' ') {
                Some(("kill-in", ms)) => {
                    if let Ok(ms) = ms.parse::<u64>() {
                        kill_at = Some(Instant::now() + Duration::from_millis(ms));
                    }
                }
                _ if line.trim() == "done" => return 0,
                _ => {
                    if let Ok(p) = line.trim().parse::<i32>() {
                        group = Some(Pid::from_raw(p));
                    }
                }
            },
            // The pipe ended without "done", or the kill time passed.
            Ok(None) | Err(_) => break,
        }
    }
    if let Some(g) = group.filter(|g| g.as_raw() > 1) {
        let _ = killpg(g, Signal::SIGKILL);
    }
    0
}
