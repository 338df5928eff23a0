//! Argument parsing and exit codes (sysexits.h values, so scripts can tell
//! "busy" from "broken").

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use locksmith::{Error, ErrorKind, WaitPolicy};

mod demo;
mod run;

/// Bad usage, URL or option.
pub(crate) const EX_USAGE: i32 = 64;
/// The store could not be reached.
pub(crate) const EX_UNAVAILABLE: i32 = 69;
/// The lock was lost while the command ran.
pub(crate) const EX_SOFTWARE: i32 = 70;
/// The lock was not acquired within the wait.
pub(crate) const EX_TEMPFAIL: i32 = 75;

#[derive(Parser, Debug)]
#[command(
    name = "locksmith",
    version,
    about = "Distributed locks over many stores"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Acquire a lock, run a command while holding it (auto-renewed), release.
    ///
    /// Exit status: the command's; 75 if the lock was not acquired within the
    /// wait, 69 if the store is unavailable, 64 for bad usage, 70 if the lock
    /// was lost while the command ran (the command is terminated).
    Run(RunArgs),
    /// N workers on separate connections contend for one lock around a
    /// read-modify-write of a shared counter; reports locks/s, hand-off
    /// latency and whether mutual exclusion held.
    Demo(DemoArgs),
}

#[derive(Args, Debug, Clone)]
struct StoreArgs {
    /// Store URL; defaults to $LOCKSMITH_URL, else an SQLite file locksmith.db here.
    #[arg(long, env = "LOCKSMITH_URL", default_value = locksmith::DEFAULT_URL, hide_env_values = true)]
    url: String,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The lock name.
    #[arg(long)]
    key: String,
    /// Lease length; renewed every third of it while the command runs.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Give up if the lock is not acquired within this long (default: wait forever).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Give up at once if the lock is held.
    #[arg(long)]
    no_wait: bool,
    /// After the lock is lost, how long the command gets between SIGTERM and SIGKILL.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    kill_after: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    command: Vec<String>,
}

impl RunArgs {
    fn wait_policy(&self) -> WaitPolicy {
        match (self.no_wait, self.wait) {
            (true, _) => WaitPolicy::NoWait,
            (false, Some(d)) => WaitPolicy::For(d),
            (false, None) => WaitPolicy::Forever,
        }
    }
}

#[derive(Args, Debug)]
struct DemoArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// Contending workers, each with its own connection.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    workers: u32,
    /// Increments per worker.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    rounds: u32,
}

/// The exit status for an error that ends the command.
pub(crate) fn exit_code(e: &Error) -> i32 {
    match e.kind() {
        ErrorKind::Timeout => EX_TEMPFAIL,
        ErrorKind::Lost | ErrorKind::NotHeld => EX_SOFTWARE,
        ErrorKind::InvalidKey | ErrorKind::InvalidOptions | ErrorKind::Config => EX_USAGE,
        _ => EX_UNAVAILABLE,
    }
}

pub(crate) fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EX_USAGE } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("locksmith: cannot start the async runtime: {e}");
            return EX_SOFTWARE;
        }
    };
    let outcome = runtime.block_on(async {
        match cli.command {
            Command::Run(args) => run::run(args).await,
            Command::Demo(args) => demo::demo(args).await,
        }
    });
    // Background releases of dropped guards get a moment to reach the store.
    runtime.shutdown_timeout(Duration::from_secs(2));
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("locksmith: {e}");
            exit_code(&e)
        }
    }
}
