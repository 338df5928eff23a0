//! The options of `lockwright run`, `status`, `list`, `break`, `elect`, `leader`,
//! `demo`, `completions` and `man`,
//! as clap reads them. `main.rs` names these structs in its subcommands and
//! hands each to the file that runs it; their field doc comments are the
//! `--help` text. Here, below both, so that a subcommand's file need not
//! import `main.rs`, which imports it.
//!
//! The structs have no `///`: clap would take it as the subcommand's
//! description, which is the doc of its variant in `main.rs`.

use std::time::Duration;

use clap::Args;
use lockwright::{Error, WaitPolicy};
use lockwright_cli_kit::{duration, StoreArgs};

#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// The lock name.
    #[arg(long)]
    pub(crate) key: String,
    /// Lease length; renewed every third of it while the command runs. On
    /// ZooKeeper and etcd the session keeps the lock instead: a holder that
    /// dies frees it once its `session_timeout` or `lease_ttl` (in the URL)
    /// runs out, and the TTL only paces renewals.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub(crate) ttl: Duration,
    /// How long to wait for a held lock: `none` (one attempt), `forever`
    /// (the default), or a duration such as `5s`.
    #[arg(long, value_parser = parse_wait, conflicts_with = "no_wait")]
    pub(crate) wait: Option<WaitPolicy>,
    /// Give up at once if the lock is held (the same as `--wait none`).
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// Hold one of N permits: at most N copies of the command run at once
    /// across every host (a cluster-wide `sem`). Every run on the key must
    /// give the same N, from 1 to 1024. `--permits 1` is the plain lock.
    #[arg(long, value_name = "N", conflicts_with = "shared",
        value_parser = clap::value_parser!(u32).range(1..=i64::from(lockwright::MAX_PERMITS)))]
    pub(crate) permits: Option<u32>,
    /// Hold a read (shared) lock: any number of `--shared` runs at once, none
    /// beside a run without it (a writer). A waiting writer stops new readers.
    #[arg(long)]
    pub(crate) shared: bool,
    /// When renewal fails, how long the command gets between SIGTERM and
    /// SIGKILL [default: a third of the TTL, at most 10s]. Capped so that the
    /// SIGKILL lands before the lease ends.
    #[arg(long, value_parser = duration)]
    pub(crate) kill_after: Option<Duration>,
    /// Who this holder is (a pod's or a job's name), shown with its host
    /// and process id by `status` and `list`: at most 128 bytes, no control
    /// characters but newline and tab.
    #[arg(long)]
    pub(crate) label: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub(crate) command: Vec<String>,
}

impl RunArgs {
    /// How long to wait for the lock: `--no-wait`, else `--wait`, else forever.
    pub(crate) fn wait_policy(&self) -> WaitPolicy {
        wait_policy(self.no_wait, self.wait)
    }
}

#[derive(Args, Debug)]
pub(crate) struct ElectArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// The election's name (the key of its lock).
    #[arg(long)]
    pub(crate) key: String,
    /// What this candidate advertises while it leads, e.g. its address (at
    /// most 1024 bytes); `lockwright leader` shows it.
    #[arg(long, value_parser = clap::value_parser!(std::ffi::OsString))]
    pub(crate) value: std::ffi::OsString,
    /// Lease length; renewed every third of it while the command runs. A
    /// leader that dies is replaced once it runs out (ZooKeeper and etcd:
    /// once its session's `session_timeout` or `lease_ttl` runs out).
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub(crate) ttl: Duration,
    /// How long to wait to lead: `forever` (the default: a candidate
    /// stands until it leads), `none` (one attempt), or a duration such as
    /// `5s`.
    #[arg(long, value_parser = parse_wait, conflicts_with = "no_wait")]
    pub(crate) wait: Option<WaitPolicy>,
    /// Give up at once if someone else leads (the same as `--wait none`).
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// When renewal fails, how long the command gets between SIGTERM and
    /// SIGKILL [default: a third of the TTL, at most 10s]. Capped so that the
    /// SIGKILL lands before the lease ends.
    #[arg(long, value_parser = duration)]
    pub(crate) kill_after: Option<Duration>,
    /// Who this holder is (a pod's or a job's name), shown with its host
    /// and process id by `status` and `list`: at most 128 bytes, no control
    /// characters but newline and tab.
    #[arg(long)]
    pub(crate) label: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub(crate) command: Vec<String>,
}

impl ElectArgs {
    /// How long to wait to lead: `--no-wait`, else `--wait`, else forever.
    pub(crate) fn wait_policy(&self) -> WaitPolicy {
        wait_policy(self.no_wait, self.wait)
    }
}

#[derive(Args, Debug)]
pub(crate) struct LeaderArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// The election's name (the key of its lock).
    #[arg(long)]
    pub(crate) key: String,
    /// One JSON object per line instead of text, for scripts:
    /// {"key":…,"leader":"VALUE","encoding":"utf8","term":N,"lease_left_ms":N},
    /// "encoding":"hex" with the value in hex when it is not UTF-8, or
    /// {"key":…,"leader":null} when nobody leads.
    #[arg(long)]
    pub(crate) json: bool,
    /// Follow the election: who leads now, then one line per change, until
    /// SIGINT or SIGTERM (exit 0). A store outage is one line on stderr; the
    /// watch goes on.
    #[arg(long)]
    pub(crate) watch: bool,
}

#[derive(Args, Debug)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// The lock name.
    #[arg(long)]
    pub(crate) key: String,
    /// One JSON object instead of a line of text, for scripts.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Only names starting with this.
    #[arg(long, default_value = "")]
    pub(crate) prefix: String,
    /// One JSON array of `status --json` objects instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct BreakArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// The lock name.
    #[arg(long)]
    pub(crate) key: String,
    /// The holder to break, by the id `status` shows; may be left out
    /// when the key has one holder.
    #[arg(long, value_name = "ID")]
    pub(crate) holder: Option<String>,
    /// Break without asking (needed when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub(crate) yes: bool,
}

#[derive(Args, Debug)]
pub(crate) struct DemoArgs {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Contending workers, each with its own connection.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub(crate) workers: u32,
    /// Increments per worker.
    #[arg(long, default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub(crate) rounds: u32,
}

/// `--no-wait` and `--wait`, as `run` and `elect` read them: forever unless told otherwise.
fn wait_policy(no_wait: bool, wait: Option<WaitPolicy>) -> WaitPolicy {
    match (no_wait, wait) {
        (true, _) => WaitPolicy::NoWait,
        (false, Some(p)) => p,
        (false, None) => WaitPolicy::Forever,
    }
}

/// `--wait`'s parser: `none`, `forever` or a duration; the library's message if not.
fn parse_wait(s: &str) -> Result<WaitPolicy, String> {
    s.parse().map_err(|e: Error| e.message().to_owned())
}

#[derive(Args, Debug)]
pub(crate) struct CompletionsArgs {
    /// The shell to write completions for.
    #[arg(value_enum)]
    pub(crate) shell: clap_complete::Shell,
}

#[derive(Args, Debug)]
pub(crate) struct ManArgs {
    /// Write a page for the command and one for each subcommand
    /// (lockwright.1, lockwright-run.1, …) into this directory, instead of
    /// the command's page to stdout.
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: Option<std::path::PathBuf>,
}
