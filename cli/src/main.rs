//! The `lockwright` command: run a command under a distributed lock or while
//! elected leader, say whether a key is held and who leads, demonstrate
//! mutual exclusion, prove a deployment (`check`) and size one (`bench`).
//!
//! This file: the subcommands, and how the process ends: its exit code
//! (sysexits.h values, so scripts can tell "busy" from "broken"; errors map
//! by [`lockwright_cli_kit::exit::exit_code`]) or the signal it ends by. The
//! codes and the one "end by this signal" flag are `lockwright_cli_kit::exit`,
//! which `check` shares; the subcommands' options are `args.rs`.
//!
//! Files import downwards only: this one uses the others; `run` and `elect`
//! use `supervise`, which uses `group`; `elect`, `list` and `breaking` use
//! `status`; the subcommands' files use `args`, and none uses this one;
//! `completions` is given the command line's definition by this one.
//!
//! `check` and `bench` (and their hidden worker and peer subcommands) are
//! the `lockwright-check` crate, behind the `check` feature (on by
//! default): they need the conformance suite, which the rest does not.

use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use lockwright::Error;
use lockwright_cli_kit::exit::{signal_to_end_by, EX_OSERR, EX_USAGE};

mod args;
mod breaking;
mod completions;
mod demo;
mod elect;
mod group;
mod list;
mod run;
mod status;
mod supervise;

use args::{
    BreakArgs, CompletionsArgs, DemoArgs, ElectArgs, LeaderArgs, ListArgs, ManArgs, RunArgs,
    StatusArgs,
};

// `Cli` and `Command` have no `///`: clap would take it as the command's
// description (`about` below, and each variant's doc for its subcommand).
#[derive(Parser, Debug)]
#[command(
    name = "lockwright",
    version,
    about = "Distributed locks over many stores"
)]
struct Cli {
    /// More detail on stderr: -v what the lock does (acquire, renewals,
    /// release), -vv the drivers' debug output too; RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Acquire a lock, run a command while holding it (auto-renewed), release.
    ///
    /// Exit status: the command's; 75 if the lock was not acquired within the
    /// wait, 69 if the store cannot be reached now, 64 for configuration that
    /// retrying will not fix, 70 if the lock was lost or could not be renewed
    /// while the command ran (the command's process group is stopped first),
    /// 76 for an unexpected store error, 128+N when ended by signal N while
    /// waiting.
    Run(RunArgs),
    /// Says whether a key is held: by how many holds, its fence, the lease
    /// left and queued waiters, where the store has them; for several
    /// holders (a semaphore's permits, readers), one line each. Reads only.
    ///
    /// Each holder is shown with its id, the name `break --holder` takes:
    /// the store's own (ZooKeeper's node, etcd's key after the name's
    /// prefix) or `o` and 16 hex digits of a digest of the owner; and
    /// with who it is, where it recorded that (`lockwright run` and
    /// `elect` do): `by LABEL on HOST pid PID`, escaped.
    ///
    /// With --json, `mode` is exclusive, shared or semaphore, `permits` the
    /// semaphore's N, and `holders` each holder with its `id` and `who`
    /// (`host`, `pid`, `label`, or null) (one for a lock); with several, the top-level `fence` is the newest holder's
    /// and `remaining_ms` the longest lease left.
    ///
    /// Exit status: 0 whether the key is held or free; otherwise as for run.
    Status(StatusArgs),
    /// Lists every lock, semaphore, read-write lock and election held under
    /// the URL's namespace whose name starts with --prefix, one `status`
    /// line each (holders with their ids and who they are, fence or term,
    /// lease left, waiters, a leader's value). Reads only.
    ///
    /// memcached cannot list its keys and SQL's ?mode=session holds no
    /// names (exit 64); ZooKeeper leaves out names over 255 bytes once
    /// escaped (their directory is a digest).
    ///
    /// Exit status: 0 whether anything is held or not; otherwise as for
    /// status.
    List(ListArgs),
    /// Breaks a stuck hold: removes one holder of a key (by the id `status`
    /// shows, or the key's only holder), so the next claimant proceeds.
    /// Asks first unless --yes; logs one audit line (who broke which holder
    /// of which key).
    ///
    /// The broken holder's next renewal fails, so a `lockwright run` holding
    /// it stops its command and exits 70; where the store has fences, the
    /// next grant's fence is above the broken holder's, so a resource that
    /// checks fences refuses its late writes. One holder of a semaphore or
    /// read-write lock goes, not the group. A Curator, Go or `etcdctl`
    /// holder is not told (they never check again), as with their own
    /// tools; Redlock and memcached have no fences to raise, and SQL's
    /// ?mode=session cannot break one holder (exit 64).
    ///
    /// Exit status: 0 when the holder is gone (or the key was free); 1 when
    /// the confirmation was refused; 66 when no holder has that id; 64 when
    /// the key has several holders and none was named, or stdin is not a
    /// terminal and --yes was not given; otherwise as for status.
    Break(BreakArgs),
    /// Campaigns to lead an election with a value, runs a command while
    /// leading (as `run` runs one under a lock), resigns when it exits.
    ///
    /// A candidate waits to lead: forever unless --wait or --no-wait says
    /// otherwise. The command gets LOCKWRIGHT_KEY, and where the store has
    /// fences LOCKWRIGHT_TERM (the term, also as LOCKWRIGHT_FENCE). Leadership
    /// is a lock whose holder advertises the value, so everything `run` does
    /// holds: the command's own process group, signals passed on, the group
    /// stopped before the lease ends when renewals fail.
    ///
    /// Exit status: as for run: the command's; 75 if not leading within the
    /// wait, 69 if the store cannot be reached now, 64 for configuration
    /// that retrying will not fix (a value over 1024 bytes, a store that
    /// keeps no values such as SQL's ?mode=session), 70 if leadership was
    /// lost or could not be renewed while the command ran, 76 for an
    /// unexpected store error, 128+N when ended by signal N while waiting.
    Elect(ElectArgs),
    /// Says who leads an election: the leader's value, its term and the
    /// lease left, or that nobody leads. Reads only.
    ///
    /// Exit status: 0 whether someone leads or not (--watch: 0 when ended
    /// by SIGINT or SIGTERM); 69 if the store cannot be reached on the first
    /// read, 64 for a bad URL or a store that keeps no values
    /// (?mode=session).
    Leader(LeaderArgs),
    /// Writes a shell's completion script to stdout, e.g.
    /// `lockwright completions bash > ~/.local/share/bash-completion/completions/lockwright`.
    Completions(CompletionsArgs),
    /// Writes the man page (roff) to stdout, or with --dir every page (the
    /// command's and each subcommand's) into a directory, e.g.
    /// `lockwright man --dir ~/.local/share/man/man1`.
    Man(ManArgs),
    /// Internal: kills a command's process group if `lockwright run` dies.
    #[command(name = "__watch-group", hide = true)]
    WatchGroup,
    /// Internal: `bench`'s peer process, contending for its key.
    #[cfg(feature = "check")]
    #[command(name = "__bench-peer", hide = true)]
    BenchPeer(lockwright_check::BenchPeerArgs),
    /// N workers on separate connections contend for one lock around a
    /// read-modify-write of a shared counter; reports locks/s, hand-off
    /// latency and whether mutual exclusion held.
    Demo(DemoArgs),
    /// Proves a deployment: the conformance suite against the store, then a
    /// fault run in which worker processes contend for one lock while they
    /// are killed, frozen, cut off from the store and slowed, and a checker
    /// judges the history.
    ///
    /// Nothing but the URL is needed: the store's machines are not touched.
    /// Exit status: 0 if every case that ran passed and the run found no
    /// exclusion or data violation; 1 otherwise; 69 if the store cannot be
    /// reached, 64 for a bad URL or option.
    #[cfg(feature = "check")]
    Check(lockwright_check::CheckArgs),
    /// Sizes a deployment: uncontended pairs/s with 1 and N clients, N
    /// contenders on one key, and one client holding many locks (renewal
    /// round trips, memory per held lock).
    ///
    /// Exit status: 0, or as for run (69 unreachable, 64 bad URL or option).
    #[cfg(feature = "check")]
    Bench(lockwright_check::BenchArgs),
}

/// The exit status for an error that ends the command: the one table,
/// [`lockwright_cli_kit::exit::exit_code`].
fn exit_code(e: &Error) -> i32 {
    lockwright_cli_kit::exit::exit_code(e.kind())
}

/// `-v`/`RUST_LOG`: watchdog retries, lost-lock reasons and acquire events
/// on stderr. `RUST_LOG` wins when set; `-v` is `info`, `-vv` `debug`.
///
/// `quiet`: warnings off too unless asked for (`check` injects faults, and
/// the lock's warnings about them are expected).
fn init_tracing(verbose: u8, quiet_warnings: bool) {
    use tracing_subscriber::EnvFilter;
    let default = log_filter(verbose, quiet_warnings);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// The log filter for `-v` given `verbose` times, when `RUST_LOG` is unset.
fn log_filter(verbose: u8, quiet_warnings: bool) -> String {
    // -v: what the lock does (acquire, renewals, release; debug in our
    // crates), without the drivers' own chatter; -vv: the drivers' too.
    // A directive's target is a prefix: `lockwright` is every crate whose
    // name begins so (the core and every backend, an outside one too), so
    // no store is named here.
    let ours = "lockwright=debug";
    // The ZooKeeper client warns of every failed connection attempt; the
    // error that matters reaches the user as ours.
    let quiet = "zookeeper_client=error";
    match verbose {
        0 if quiet_warnings => "error".to_owned(),
        0 => format!("warn,{quiet}"),
        1 => format!("warn,{quiet},{ours}"),
        2 => "debug".to_owned(),
        _ => "trace".to_owned(),
    }
}

/// Runs the command line, then exits with its code.
fn main() {
    std::process::exit(run_command());
}

/// Runs the command line this process was started with; its exit code.
fn run_command() -> i32 {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == group::WATCH_SUBCOMMAND)
    {
        return group::watcher_main();
    }
    if let Some(code) = check_worker() {
        return code;
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EX_USAGE } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    // `check` injects faults: the lock's warnings about them are expected.
    #[cfg(feature = "check")]
    let quiet_warnings = matches!(cli.command, Command::Check(_));
    #[cfg(not(feature = "check"))]
    let quiet_warnings = false;
    init_tracing(cli.verbose, quiet_warnings);
    // Generated from the definition alone: no runtime, no store.
    let generated = match &cli.command {
        Command::Completions(args) => Some((
            "completions",
            completions::completions(args.shell, &Cli::command(), &mut std::io::stdout()),
        )),
        Command::Man(args) => Some((
            "man page",
            match &args.dir {
                None => completions::man_page(Cli::command(), &mut std::io::stdout()),
                Some(dir) => completions::man_pages(Cli::command(), dir, &mut std::io::stdout()),
            },
        )),
        _ => None,
    };
    if let Some((what, written)) = generated {
        return match written {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("lockwright: cannot write the {what}: {e}");
                EX_OSERR
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lockwright: cannot start the async runtime: {e}");
            return EX_OSERR;
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Demo(args) => demo::demo(args).await,
            Command::Status(args) => status::status(args).await,
            Command::List(args) => list::list(args).await,
            Command::Break(args) => breaking::breaking(args).await,
            Command::Elect(args) => elect::elect(args).await,
            Command::Leader(args) => elect::leader(args).await,
            Command::WatchGroup => Ok(group::watcher_main()),
            // Answered above, before the runtime started.
            Command::Completions(_) | Command::Man(_) => Ok(0),
            #[cfg(feature = "check")]
            Command::BenchPeer(args) => lockwright_check::bench_peer(args).await,
            #[cfg(feature = "check")]
            Command::Check(args) => lockwright_check::check(args).await,
            #[cfg(feature = "check")]
            Command::Bench(args) => lockwright_check::bench(args).await,
        }
    });
    // Background releases of dropped guards get a moment to reach the store.
    runtime.shutdown_timeout(Duration::from_secs(2));
    let code = match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("lockwright: {}", e.chain());
            exit_code(&e)
        }
    };
    // Set by whichever subcommand ran (`run`, `elect`, `leader --watch`,
    // `check`): end by that signal, as a shell expects of an interrupted
    // command, now that everything is cleaned up.
    if let Some(sig) = signal_to_end_by() {
        // SAFETY: restores the default action of one signal, then
        // raises it on this process; no handler code runs.
        #[allow(unsafe_code)]
        unsafe {
            let _ = nix::sys::signal::signal(sig, nix::sys::signal::SigHandler::SigDfl);
        }
        let _ = nix::sys::signal::raise(sig);
    }
    code
}

/// `check`'s fault-run worker (`__check-worker`), if this process was
/// started as one: its exit code. Looked for before clap parses, as the
/// group watcher is: the worker takes its arguments as they come.
#[cfg(feature = "check")]
fn check_worker() -> Option<i32> {
    if std::env::args_os().nth(1)? != lockwright_check::WORKER_SUBCOMMAND {
        return None;
    }
    init_tracing(0, true);
    let rest: Vec<String> = std::env::args_os()
        .skip(2)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    Some(lockwright_check::worker_main(&rest))
}

/// Without the `check` feature there is no fault run, so no worker.
#[cfg(not(feature = "check"))]
fn check_worker() -> Option<i32> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The subcommands a user sees (the hidden workers left out).
    fn visible() -> Vec<String> {
        Cli::command()
            .get_subcommands()
            .filter(|c| !c.is_hide_set())
            .map(|c| c.get_name().to_owned())
            .collect()
    }

    #[test]
    fn bash_completions_parse_and_name_every_subcommand() {
        let mut script = Vec::new();
        completions::completions(clap_complete::Shell::Bash, &Cli::command(), &mut script).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lockwright.bash");
        std::fs::write(&path, &script).unwrap();
        let checked = std::process::Command::new("bash")
            .arg("-n")
            .arg(&path)
            .output()
            .expect("bash runs");
        assert!(
            checked.status.success(),
            "bash -n: {}",
            String::from_utf8_lossy(&checked.stderr)
        );
        let script = String::from_utf8(script).unwrap();
        let names = visible();
        assert!(names.len() >= 8, "{names:?}");
        for name in names {
            // The case arm that completes the subcommand's options.
            assert!(
                script.contains(&format!("lockwright,{name})")),
                "{name} is not completed"
            );
        }
        assert!(
            !script.contains("__watch-group") && !script.contains("__bench-peer"),
            "a hidden worker is completed"
        );
    }

    /// Every shell's script leaves the hidden workers out, and completes
    /// `run`'s options.
    #[test]
    fn no_shell_completes_the_hidden_workers() {
        use clap::ValueEnum;
        for shell in clap_complete::Shell::value_variants() {
            let mut script = Vec::new();
            completions::completions(*shell, &Cli::command(), &mut script).unwrap();
            let script = String::from_utf8(script).unwrap();
            assert!(script.contains("ttl"), "{shell}: no --ttl");
            assert!(
                !script.contains("__watch-group") && !script.contains("__bench-peer"),
                "{shell} completes a hidden worker"
            );
        }
    }

    #[test]
    fn the_man_page_names_every_subcommand() {
        let mut page = Vec::new();
        completions::man_page(Cli::command(), &mut page).unwrap();
        let page = String::from_utf8(page).unwrap();
        assert!(
            page.starts_with(".ie") || page.contains(".TH lockwright 1"),
            "{page}"
        );
        for name in visible() {
            assert!(
                page.contains(&format!("lockwright\\-{name}(1)")),
                "{name} is not in the man page"
            );
        }
        assert!(
            !page.contains("__watch-group"),
            "a hidden worker is in the man page"
        );
    }

    /// `man --dir` writes the page of every subcommand the command's page
    /// refers to, and none for a hidden worker.
    #[test]
    fn man_dir_writes_a_page_for_each_subcommand() {
        let dir = tempfile::tempdir().unwrap();
        let pages = dir.path().join("man1");
        let mut listed = Vec::new();
        completions::man_pages(Cli::command(), &pages, &mut listed).unwrap();
        let listed = String::from_utf8(listed).unwrap();
        for name in visible() {
            let page = pages.join(format!("lockwright-{name}.1"));
            let text = std::fs::read_to_string(&page).expect("a page per subcommand");
            assert!(text.contains(".SH OPTIONS"), "{name}: no options");
            assert!(listed.contains(&*page.to_string_lossy()), "{listed}");
        }
        assert!(pages.join("lockwright.1").exists());
        assert!(!pages.join("lockwright-__watch-group.1").exists());
    }

    /// `-v` turns on debug lines of every crate of ours: the core, each
    /// backend, and one written outside the workspace (`lockwright_*`); not
    /// the drivers'. `-vv` adds theirs.
    #[test]
    fn one_v_shows_every_stores_debug_lines_and_not_the_drivers() {
        use tracing::Level;
        use tracing_subscriber::EnvFilter;
        let at = |verbose: u8| {
            let subscriber = tracing_subscriber::fmt()
                .with_env_filter(EnvFilter::new(log_filter(verbose, false)))
                .with_writer(std::io::sink)
                .finish();
            tracing::subscriber::with_default(subscriber, || {
                [
                    tracing::enabled!(target: "lockwright_core::watchdog", Level::DEBUG),
                    tracing::enabled!(target: "lockwright_redis::node", Level::DEBUG),
                    tracing::enabled!(target: "lockwright_sql::lease", Level::DEBUG),
                    tracing::enabled!(target: "lockwright_zk::node", Level::DEBUG),
                    tracing::enabled!(target: "lockwright_etcd::node", Level::DEBUG),
                    tracing::enabled!(target: "lockwright_memcached::error", Level::DEBUG),
                    tracing::enabled!(target: "lockwright_nats::kv", Level::DEBUG),
                    tracing::enabled!(target: "lockwright", Level::DEBUG),
                    tracing::enabled!(target: "etcd_client::client", Level::DEBUG),
                ]
            })
        };
        let one = at(1);
        assert_eq!(&one[..8], &[true; 8], "-v: {one:?}");
        assert!(!one[8], "-v shows a driver's debug lines");
        assert_eq!(at(2), [true; 9], "-vv");
        assert_eq!(at(0), [false; 9], "no -v");
    }
}
