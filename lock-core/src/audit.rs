//! The audit line an operator's forced release leaves: who broke which
//! holder of which key, as one `WARN` event with the target
//! `lockwright::audit`, so a log pipeline can keep them apart.

use crate::key::LockKey;

/// Logs that `holder` of `key` was broken, by this process.
pub(crate) fn broke(key: &LockKey, holder: &str) {
    tracing::warn!(
        target: "lockwright::audit",
        key = ?key.as_str(),
        holder,
        by = ?breaker(),
        "broke a hold"
    );
}

/// This process as an audit line names it (quoted there, as it has
/// spaces): `user@host uid N pid M`. The user is the environment's `USER`
/// (or `LOGNAME`), which anyone can set, so the kernel's uid follows it.
fn breaker() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "?".to_owned());
    let host = crate::identity::host_name();
    let uid = uid().unwrap_or_else(|| "?".to_owned());
    format!("{user}@{host} uid {uid} pid {}", std::process::id())
}

/// This process's real user id, from `/proc/self/status` (Linux).
fn uid() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1).map(str::to_owned)
}
