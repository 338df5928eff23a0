//! The conformance cases, one module per rule of the contract they prove
//! (the module's docs state the rule). Each case is a plain `async fn`
//! over a [`Harness`] that returns an error saying which promise was
//! broken; [`CASES`](crate::CASES) lists them all.

use lockwright_core::backend::LockBackendExt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use lockwright_core::backend::{Acquire, Binding, Capabilities, LockBackend};
use lockwright_core::{LockKey, LockOptions, Locker, OwnerToken};

use crate::Harness;

pub mod breaking;
pub mod claim_rules;
pub mod election;
pub mod exclusion;
pub mod expiry;
pub mod fencing;
pub mod input;
pub mod listing;
pub mod loss;
pub mod multi_lock;
pub mod names;
pub mod outage;
pub mod ownership;
pub mod permits;
pub mod reentrancy;
pub mod renewal;
pub mod scoped;
pub mod status;
pub mod store_state;
pub mod waiting;

/// A rule of the lock contract. Each case proves one; the rule's module
/// under [`cases`](self) states it and holds its cases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// [`exclusion`]: one owner at a time.
    Exclusion,
    /// [`waiting`]: attempts, waits, timeouts, fairness and cancellation.
    Waiting,
    /// [`expiry`]: a lease ends at its TTL, not before.
    Expiry,
    /// [`renewal`]: renewal extends the owner's lease.
    Renewal,
    /// [`ownership`]: only the owner releases or renews.
    Ownership,
    /// [`loss`]: vanished holders free the key; lost holders are told.
    Loss,
    /// [`outage`]: a store that is down is an error, not contention.
    Outage,
    /// [`names`]: every key is a lock of its own.
    Names,
    /// [`input`]: bad input is a typed error.
    Input,
    /// [`reentrancy`]: an owner re-enters its own lock.
    Reentrancy,
    /// [`status`]: a lock's state reads without changing it.
    Status,
    /// [`fencing`]: fences rise with every grant.
    Fencing,
    /// [`store_state`]: the store keeps state only for live locks.
    StoreState,
    /// [`multi_lock`]: several keys, all or nothing.
    MultiLock,
    /// [`election`]: the leader is the holder, and everyone reads it right.
    Election,
    /// [`permits`]: semaphores and read-write locks, for more than one holder.
    Permits,
    /// [`claim_rules`]: every store answers claims as the reference model does.
    ClaimRules,
    /// [`breaking`]: an operator's forced release keeps a release's promises.
    Breaking,
    /// [`listing`]: an operator's listing shows every name held, and changes nothing.
    Listing,
    /// [`scoped`]: scoped work gives its hold back before it returns, and stops when it is lost.
    Scoped,
}

impl Rule {
    /// Its module's name (`store_state`).
    pub fn name(self) -> &'static str {
        match self {
            Rule::Exclusion => "exclusion",
            Rule::Waiting => "waiting",
            Rule::Expiry => "expiry",
            Rule::Renewal => "renewal",
            Rule::Ownership => "ownership",
            Rule::Loss => "loss",
            Rule::Outage => "outage",
            Rule::Names => "names",
            Rule::Input => "input",
            Rule::Reentrancy => "reentrancy",
            Rule::Status => "status",
            Rule::Fencing => "fencing",
            Rule::StoreState => "store_state",
            Rule::MultiLock => "multi_lock",
            Rule::Election => "election",
            Rule::Permits => "permits",
            Rule::ClaimRules => "claim_rules",
            Rule::Breaking => "breaking",
            Rule::Listing => "listing",
            Rule::Scoped => "scoped",
        }
    }
}

/// The doc comment of `pub async fn <name>` in `source`, without its
/// `///`s: so a case's docs are written once, on its function.
pub(crate) fn doc_comment(source: &str, name: &str) -> Option<String> {
    let signature = format!("pub async fn {name}(");
    let lines: Vec<&str> = source.lines().collect();
    let at = lines.iter().position(|l| l.starts_with(&signature))?;
    let mut doc: Vec<&str> = lines[..at]
        .iter()
        .rev()
        .skip_while(|l| l.starts_with("#["))
        .take_while(|l| l.starts_with("///"))
        .map(|l| l.trim_start_matches("///").trim())
        .collect();
    doc.reverse();
    Some(doc.join("\n"))
}

/// A prefix unique to this test process, so runs against a shared store
/// never see each other's keys.
fn run_prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let mut b = [0u8; 6];
        getrandom::fill(&mut b).expect("OS RNG");
        format!("conformance-{}", hex::encode(b))
    })
}

/// Builds this case's keys under the run prefix.
fn key(case: &str, name: &str) -> LockKey {
    LockKey::new(format!("{}/{case}/{name}", run_prefix())).expect("test keys are valid")
}

/// A TTL short enough for expiry cases yet well above the store's resolution.
fn short_ttl(caps: &Capabilities) -> Duration {
    Duration::from_millis(600)
        .max(caps.min_ttl * 2)
        .max(caps.ttl_resolution * 2)
}

/// How long to sleep so a lease of `ttl` has certainly expired in the store.
fn past_expiry(caps: &Capabilities, ttl: Duration) -> Duration {
    ttl + caps.ttl_resolution + Duration::from_millis(300)
}

/// Ends `holder`'s holds the way its store ends them on its own: the lease
/// runs out (lease-bound) or the session ends (session-bound).
async fn end_hold(h: &dyn Harness, holder: &Arc<dyn LockBackend>, ttl: Duration) -> Result<()> {
    let caps = holder.capabilities();
    match caps.binding {
        Binding::Lease => {
            tokio::time::sleep(past_expiry(&caps, ttl)).await;
            Ok(())
        }
        Binding::Session => h.end_sessions(holder).await,
    }
}

/// A TTL no case waits out.
const LONG_TTL: Duration = Duration::from_secs(60);

fn long() -> LockOptions {
    LockOptions::new().ttl(LONG_TTL)
}

async fn acquired(
    b: &dyn LockBackend,
    k: &LockKey,
    owner: &OwnerToken,
    ttl: Duration,
) -> Result<lockwright_core::backend::Grant> {
    match b.try_lock(k, owner, ttl).await? {
        Acquire::Acquired(g) => Ok(g),
        Acquire::Contended { .. } => bail!("expected to acquire {k:?}, but it is held"),
    }
}

/// [`acquired`], of `hold` (its key, owner and kind).
async fn acquired_as(
    b: &dyn LockBackend,
    hold: &lockwright_core::backend::HoldId,
    ttl: Duration,
) -> Result<lockwright_core::backend::Grant> {
    let request = lockwright_core::backend::AcquireRequest::new(hold.clone(), ttl);
    match b.try_acquire(&request).await? {
        Acquire::Acquired(g) => Ok(g),
        Acquire::Contended { .. } => bail!("expected to acquire {:?}, but it is held", hold.key),
    }
}

/// [`acquired`], by a candidate advertising `value` with its grant.
async fn acquired_with_value(
    b: &dyn LockBackend,
    k: &LockKey,
    owner: &OwnerToken,
    value: &str,
    ttl: Duration,
) -> Result<lockwright_core::backend::Grant> {
    let request =
        lockwright_core::backend::AcquireRequest::mutex(k, owner, ttl).with_value(value)?;
    match b.try_acquire(&request).await? {
        Acquire::Acquired(g) => Ok(g),
        Acquire::Contended { .. } => bail!("expected to acquire {k:?}, but it is held"),
    }
}

async fn contended(b: &dyn LockBackend, k: &LockKey, why: &str) -> Result<()> {
    match b.try_lock(k, &OwnerToken::generate(), LONG_TTL).await? {
        Acquire::Contended { .. } => Ok(()),
        Acquire::Acquired(_) => bail!("{k:?} should be held ({why}) but a stranger acquired it"),
    }
}

/// Polls until another client gets `k`, up to `within`; returns the guard.
async fn eventually_free(l: &Locker, k: &LockKey, within: Duration, why: &str) -> Result<()> {
    let start = Instant::now();
    loop {
        if let Some(g) = l.try_lock(k).await? {
            g.release().await?;
            return Ok(());
        }
        if start.elapsed() > within {
            bail!("{k:?} still held after {within:?}: {why}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `stored_names(prefix)` until it is at most `most`, acquiring and
/// releasing a name elsewhere between polls (stores may collect free state
/// as a side effect of any acquire), until `within` has passed.
async fn collected(
    h: &dyn Harness,
    client: &dyn LockBackend,
    prefix: &str,
    most: u64,
    within: Duration,
) -> Result<()> {
    let deadline = Instant::now() + within;
    let elsewhere = key("collection_trigger", &OwnerToken::generate().as_str()[..8]);
    loop {
        let owner = OwnerToken::generate();
        if let Acquire::Acquired(_) = client.try_lock(&elsewhere, &owner, LONG_TTL).await? {
            client.unlock(&elsewhere, &owner).await?;
        }
        let n = h.stored_names(prefix).await?;
        if n <= most {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "the store still keeps state for {n} names under {prefix:?} (at most {most} \
                 expected) {within:?} after they were freed"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use crate::{Rule, CASES};

    /// Every `pub async fn` of a rule's module, and nothing else, is in
    /// the list, under that rule: a case written but not listed would
    /// never run.
    #[test]
    fn the_list_holds_every_case_under_its_rule() {
        for case in CASES {
            assert_eq!(
                case.rule.name(),
                case.module,
                "{} is listed under the wrong rule",
                case.name
            );
            assert!(!case.doc().is_empty(), "{} has no doc comment", case.name);
        }
        let mut modules: Vec<(&str, &str)> = CASES.iter().map(|c| (c.module, c.source)).collect();
        modules.dedup();
        for (module, source) in modules {
            for line in source.lines() {
                if let Some(rest) = line.strip_prefix("pub async fn ") {
                    let name: String = rest
                        .chars()
                        .take_while(|c| *c == '_' || c.is_alphanumeric())
                        .collect();
                    assert!(
                        CASES.iter().any(|c| c.name == name && c.module == module),
                        "cases/{module}.rs has a case {name} that the list in lib.rs does not name"
                    );
                }
            }
        }
    }

    /// Every rule has cases, and the cases of a rule run together.
    #[test]
    fn every_rule_has_its_cases_together() {
        let mut seen: Vec<Rule> = Vec::new();
        for case in CASES {
            if seen.last() != Some(&case.rule) {
                assert!(
                    !seen.contains(&case.rule),
                    "{:?}'s cases are split",
                    case.rule
                );
                seen.push(case.rule);
            }
        }
        assert_eq!(seen.len(), 20);
    }
}
