//! Which faults a fault run can inject, and `--faults`, which names them.
//! Apart from the nemesis that injects them (`nemesis.rs`), so that the
//! options (`args.rs`) can name them without importing the fault run.

use serde::Serialize;

/// A fault the nemesis injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Fault {
    /// SIGKILL a worker (a holder when there is one), then start another.
    Kill,
    /// SIGSTOP a worker past its lease, then SIGCONT.
    Pause,
    /// Cut a worker off from the store at its proxy past its lease.
    Partition,
    /// Slow a worker's traffic to the store for a few seconds.
    Latency,
    /// Fail the store's primary over to a replica (Redis Sentinel and
    /// Cluster): the whole deployment, not one worker.
    Failover,
}

impl Fault {
    /// The name `--faults` and the reports use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::Partition => "partition",
            Fault::Latency => "latency",
            Fault::Failover => "failover",
        }
    }

    /// Faults made at the proxy.
    pub(crate) fn needs_proxy(self) -> bool {
        matches!(self, Fault::Partition | Fault::Latency)
    }

    /// Faults aimed at a holder inside its critical section.
    pub(crate) fn aims_at_holders(self) -> bool {
        matches!(self, Fault::Kill | Fault::Pause)
    }
}

/// The faults `--faults` asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Faults(pub(crate) Vec<Fault>);

/// Parses `--faults`: a comma-separated list, or `none`.
pub(crate) fn parse_faults(s: &str) -> std::result::Result<Faults, String> {
    if s.trim() == "none" {
        return Ok(Faults(Vec::new()));
    }
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let f = match part {
            "kill" => Fault::Kill,
            "pause" => Fault::Pause,
            "partition" => Fault::Partition,
            "latency" => Fault::Latency,
            "failover" => Fault::Failover,
            other => {
                return Err(format!(
                    "unknown fault {other:?}; known: kill, pause, partition, latency, failover, \
                     or none"
                ))
            }
        };
        if !out.contains(&f) {
            out.push(f);
        }
    }
    if out.is_empty() {
        return Err("no faults named; use none for a run without faults".into());
    }
    Ok(Faults(out))
}
