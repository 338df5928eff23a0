//! The options of `lockwright check`, `lockwright bench` and the hidden
//! `__bench-peer`, as clap reads them. The command (`cli/src/main.rs`)
//! names these structs in its subcommands; their doc comments are the
//! `--help` text.

use std::time::Duration;

use clap::Args;
use lockwright_cli_kit::{duration, StoreArgs};

use crate::check::faults::{parse_faults, Faults};

/// What `lockwright check` is asked to do.
#[derive(Args, Debug)]
pub struct CheckArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// How long the fault run lasts; 0s skips it.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub(crate) duration: Duration,
    /// Worker processes in the fault run.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=64))]
    pub(crate) workers: u32,
    /// Faults to inject: any of kill, pause, partition, latency, failover,
    /// or none. `failover` (Redis Sentinel and Cluster URLs only, never on
    /// by default) fails the deployment's primary over to a replica every
    /// few seconds: it changes your deployment, so run it against one you
    /// may change.
    #[arg(long, default_value = "kill,pause,partition,latency", value_parser = parse_faults)]
    pub(crate) faults: Faults,
    /// The workers' lease length (short, so faults outlast it).
    #[arg(long, default_value = "2s", value_parser = duration)]
    pub(crate) ttl: Duration,
    /// Skip the conformance cases; only the fault run.
    #[arg(long)]
    pub(crate) no_conformance: bool,
    // The doc below is --help text, where `w<id>` reads as it should; as
    // rustdoc sees it, an unclosed HTML tag.
    #[allow(rustdoc::invalid_html_tags)]
    /// Workers campaign in an election (advertising w<id>) instead of
    /// locking, and two observers in this process watch the leader: the
    /// run also checks that terms never go back, that each term names the
    /// worker granted it, and that no read showed anyone but a holder whose
    /// lease was valid throughout. Needs a store that keeps values.
    #[arg(long)]
    pub(crate) election: bool,
    /// Workers hold one of N permits of a semaphore instead of the lock:
    /// the run checks that no more than N holders' leases were valid at
    /// once (the workers touch no counter: N holders would race on it).
    /// N is 1 to 1024.
    #[arg(long, value_name = "N", conflicts_with_all = ["election", "read_write"],
          value_parser = clap::value_parser!(u32).range(1..=i64::from(lockwright::MAX_PERMITS)))]
    pub(crate) permits: Option<u32>,
    /// Workers take a read-write lock, two sections in three as readers
    /// (which only read the counter, with their grant's fence): the run
    /// checks that no reader began beside a valid writer, nor a writer
    /// beside anyone, and that no writer's increment was lost.
    #[arg(long, conflicts_with = "election")]
    pub(crate) read_write: bool,
    /// Also write the fault run's whole history (every critical section
    /// and resource op, as JSON) to this file, to study a violation.
    #[arg(long)]
    pub(crate) history: Option<std::path::PathBuf>,
    /// Write the figures as one JSON document on stdout, for dashboards
    /// (the summary line still ends stderr).
    #[arg(long)]
    pub(crate) json: bool,
}

/// What `lockwright bench` is asked to do.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Clients for the N-client and contended runs.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..=256))]
    pub(crate) clients: u32,
    /// How long each throughput run lasts.
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub(crate) duration: Duration,
    /// Locks one client holds for the scale run; 0 skips it.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub(crate) held: u32,
    /// How long the locks are held in the scale run.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub(crate) hold_for: Duration,
    /// The held locks' lease (renewed every third of it).
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub(crate) ttl: Duration,
    /// Write the figures as one JSON document on stdout, for dashboards.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `__bench-peer`: what `bench` tells its peer process.
#[derive(Args, Debug)]
pub struct BenchPeerArgs {
    /// From the environment: a command line can be read by other users.
    #[arg(long, env = "LOCKWRIGHT_URL", hide_env_values = true)]
    pub(crate) url: String,
    #[arg(long)]
    pub(crate) key: String,
    #[arg(long, value_parser = duration)]
    pub(crate) duration: Duration,
}
