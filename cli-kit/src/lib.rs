//! What the `lockwright` command (`lockwright-cli`), its `check` and
//! `bench` (`lockwright-check`, a crate of its own so that the command
//! builds without the test suite) and `lockwright-bench` share, so that
//! they read options, report figures and end the process the same way.
//! Not a stable API: the command is the product.
//!
//! This file: the `--url` option and its default, and duration options. `timing` is the
//! hand-off timing, `exit` the exit codes and the signal to end by; the
//! files use nothing of each other.

use std::time::Duration;

use clap::Args;
use lockwright::Error;

pub mod exit;
pub mod timing;

/// The store used when no URL is given: an SQLite file in the working directory.
pub const DEFAULT_URL: &str = "sqlite://lockwright.db";

// No `///` on the struct: clap would take it as the description of every
// subcommand that flattens it.
#[allow(missing_docs)]
#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Store URL; defaults to $LOCKWRIGHT_URL, else an SQLite file lockwright.db here.
    #[arg(long, env = "LOCKWRIGHT_URL", default_value = DEFAULT_URL, hide_env_values = true)]
    pub url: String,
}

impl StoreArgs {
    /// The URL, refused if it names a store no other process can share.
    ///
    /// # Errors
    /// `Config` for an unknown scheme, or for `memory://`.
    pub fn shared_url(&self) -> Result<&str, Error> {
        if lockwright::backend::scheme(&self.url)?.name == "memory" {
            return Err(Error::config(
                "memory:// locks live inside one process, so no other `lockwright` can see \
                 them; use a shared store (sqlite://file.db, redis://…, postgres://…)",
            ));
        }
        Ok(&self.url)
    }
}

/// A duration option: humantime's parser, with its "expected number at 0"
/// put in words a user can act on.
///
/// # Errors
/// The words, for clap to show.
pub fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|_| "not a duration like 500ms, 30s or 2m".to_owned())
}
