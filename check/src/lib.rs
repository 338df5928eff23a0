//! Prove (`check`) and size (`bench`) a deployment of the `lockwright`
//! command; not a stable API.
//!
//! `lockwright check` runs the conformance suite against the user's own
//! store, then a fault run whose history a checker judges; `lockwright
//! bench` measures how much one deployment takes. Both live here, apart
//! from the command (`lockwright-cli`), because they need the conformance
//! suite (and its tokio `test-util`), which the command's other subcommands
//! do not: the command takes this crate behind its `check` feature, on by
//! default. The command is the product; this library exists for it, and
//! its items change whenever the command needs them to.
//!
//! The files import downwards only. `bench` uses `bench_procs` and
//! `bench_election`; `check/` (its `mod.rs` says how its files stack) and
//! they use `args` (the subcommands' options), `endpoints` and `proxy`,
//! which import nothing of this crate but `--faults`' parser,
//! `check/faults.rs`, a leaf itself.
//!
//! How the process ends is not here: the exit codes and the signal to end
//! by (which an interrupted fault run sets) are `lockwright_cli_kit::exit`,
//! one flag and one set of codes for the whole command, which its `main`
//! reads at exit.

mod args;
mod bench;
mod bench_election;
mod bench_procs;
mod check;
mod endpoints;
mod proxy;

pub use args::{BenchArgs, BenchPeerArgs, CheckArgs};
pub use bench::bench;
pub use bench_procs::peer as bench_peer;
pub use check::check;
pub use check::worker::{main as worker_main, WORKER_SUBCOMMAND};
