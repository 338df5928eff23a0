//! `locksmith status`: what the store holds for one key, read only.

use std::time::Duration;

use locksmith::{LockStatus, Result};

use super::StatusArgs;

pub(crate) async fn status(args: StatusArgs) -> Result<i32> {
    // Lazy: a status read must not create the lease table (a mistyped
    // ?table= would otherwise read "free" from a table it just made).
    let locker = locksmith::connect_lazy(args.store.shared_url()?).await?;
    let s = locker.status(args.key.as_str()).await?;
    if args.json {
        println!("{}", json(&args.key, &s));
    } else {
        println!("{}", line(&args.key, &s));
    }
    locker.close().await?;
    Ok(0)
}

fn line(key: &str, s: &LockStatus) -> String {
    let mut out = format!("{key:?}: ");
    if s.held {
        let holds = if s.holds == 1 { "hold" } else { "holds" };
        out.push_str(&format!("held ({} {holds})", s.holds));
        if let Some(f) = s.fence {
            out.push_str(&format!(", fence {f}"));
        }
        if let Some(left) = s.remaining {
            out.push_str(&format!(", {} left", human(left)));
        }
    } else {
        out.push_str("free");
    }
    if let Some(w) = s.waiters {
        out.push_str(&format!(", {w} queued"));
    }
    out
}

/// Milliseconds shown as such; a lease of seconds to the tenth.
pub(crate) fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

fn json(key: &str, s: &LockStatus) -> serde_json::Value {
    serde_json::json!({
        "key": key,
        "held": s.held,
        "holds": s.holds,
        "fence": s.fence.map(|f| f.0),
        "remaining_ms": s.remaining.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "waiters": s.waiters,
    })
}
