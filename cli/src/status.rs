//! `lockwright status`: what the store holds for one key, read only.

use std::time::Duration;

use lockwright::{LockStatus, Result};

use crate::args::StatusArgs;

/// `lockwright status`: 0 whether the key is held or free, or the error that ended it.
pub(crate) async fn status(args: StatusArgs) -> Result<i32> {
    // Lazy: a status read must not create the lease table (a mistyped
    // ?table= would otherwise read "free" from a table it just made).
    let locker = lockwright::connect_lazy(args.store.shared_url()?).await?;
    let s = locker.status(args.key.as_str()).await?;
    if args.json {
        println!("{}", json(&args.key, &s));
    } else {
        println!("{}", line(&args.key, &s));
    }
    locker.close().await?;
    Ok(0)
}

/// The status as text: a headline, then one line per holder when there are several.
pub(crate) fn line(key: &str, s: &LockStatus) -> String {
    let mut out = format!("{key:?}: ");
    if s.held && s.holders.len() > 1 {
        // Several holders: a semaphore's permits, or readers.
        let mode = if s.is_shared() {
            "readers".to_owned()
        } else {
            match s.permits {
                Some(n) => format!("of {n} permits"),
                None => "permits".to_owned(),
            }
        };
        out.push_str(&format!("held by {} {mode}", s.holders.len()));
        // On the headline: the queue is the name's, not the last holder's.
        if let Some(w) = s.waiters {
            out.push_str(&format!(", {w} queued"));
        }
        for h in &s.holders {
            out.push_str("\n  ");
            out.push_str(if h.shared { "read" } else { "permit" });
            if let Some(id) = &h.id {
                out.push_str(&format!(" {id}"));
            }
            if h.holds > 1 {
                out.push_str(&format!(" ({} holds)", h.holds));
            }
            if let Some(who) = &h.who {
                out.push_str(&format!(", by {who}"));
            }
            if let Some(f) = h.fence {
                out.push_str(&format!(", fence {f}"));
            }
            if let Some(left) = h.remaining {
                out.push_str(&format!(", {} left", human(left)));
            }
        }
    } else if s.held {
        let holds = if s.holds == 1 { "hold" } else { "holds" };
        out.push_str(&format!("held ({} {holds}", s.holds));
        if s.is_shared() {
            out.push_str(", read");
        } else if let Some(n) = s.permits.filter(|n| *n > 1) {
            out.push_str(&format!(", 1 of {n} permits"));
        }
        out.push(')');
        let lone = s.each_holder().into_iter().next();
        if let Some(id) = lone.as_ref().and_then(|h| h.id.as_ref()) {
            out.push_str(&format!(", holder {id}"));
        }
        if let Some(who) = lone.as_ref().and_then(|h| h.who.as_ref()) {
            out.push_str(&format!(", by {who}"));
        }
        if let Some(f) = s.fence {
            out.push_str(&format!(", fence {f}"));
        }
        if let Some(left) = s.remaining {
            out.push_str(&format!(", {} left", human(left)));
        }
    } else {
        out.push_str("free");
    }
    // A leader's value, escaped: it is the holder's to choose. (A Go or
    // `etcdctl` mutex's key holds an empty one, which says nothing.)
    if let Some(v) = s.value.as_ref().filter(|v| s.held && !v.is_empty()) {
        out.push_str(&format!(", value {:?}", String::from_utf8_lossy(v)));
    }
    if let (Some(w), false) = (s.waiters, s.held && s.holders.len() > 1) {
        out.push_str(&format!(", {w} queued"));
    }
    out
}

/// `shared` for readers, `semaphore` for a semaphore's permits (each
/// holder one of N, not alone), `exclusive` for a lock or a writer.
fn mode(s: &LockStatus) -> Option<&'static str> {
    if !s.held {
        None
    } else if s.is_shared() {
        Some("shared")
    } else if s.permits.is_some_and(|n| n > 1) {
        Some("semaphore")
    } else {
        Some("exclusive")
    }
}

/// Milliseconds shown as such; a lease of seconds to the tenth.
pub(crate) fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// The status as `--json`'s one object.
pub(crate) fn json(key: &str, s: &LockStatus) -> serde_json::Value {
    serde_json::json!({
        "key": key,
        "held": s.held,
        "holds": s.holds,
        "fence": s.fence.map(|f| f.0),
        "remaining_ms": s.remaining.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "waiters": s.waiters,
        "mode": mode(s),
        "permits": s.permits,
        "holders": s.each_holder().iter().map(|h| serde_json::json!({
            "id": h.id,
            "shared": h.shared,
            "holds": h.holds,
            "fence": h.fence.map(|f| f.0),
            "remaining_ms": h.remaining.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            "who": h.who.as_ref().map(|w| serde_json::json!({
                "host": w.host,
                "pid": w.pid,
                "label": w.label,
            })),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lockwright::{FencingToken, Holder, HolderInfo, LockStatus};

    use super::{json, line};

    #[test]
    fn several_holders_are_listed_with_their_mode_and_leases() {
        let permit = |fence, ms| {
            Holder::new(false, 1)
                .with_fence(Some(FencingToken(fence)))
                .with_remaining(Some(Duration::from_millis(ms)))
        };
        let s = LockStatus::of_holders(vec![permit(7, 900), permit(9, 2500)]).with_permits(Some(3));
        assert_eq!(
            line("backups", &s),
            "\"backups\": held by 2 of 3 permits\n  permit, fence 7, 900ms left\n  permit, fence 9, 2.5s left"
        );
        let j = json("backups", &s);
        assert_eq!(j["mode"], "semaphore");
        assert_eq!(j["permits"], 3);
        assert_eq!(j["holders"].as_array().unwrap().len(), 2);
        assert_eq!(j["fence"], 9, "the highest fence");

        let readers = LockStatus::of_holders(vec![Holder::new(true, 1), Holder::new(true, 2)]);
        assert_eq!(
            line("catalogue", &readers),
            "\"catalogue\": held by 2 readers\n  read\n  read (2 holds)"
        );
        assert_eq!(json("catalogue", &readers)["mode"], "shared");
        let queued = readers.clone().with_waiters(Some(1));
        assert_eq!(
            line("catalogue", &queued),
            "\"catalogue\": held by 2 readers, 1 queued\n  read\n  read (2 holds)"
        );
        let lock = LockStatus::held(1).with_waiters(Some(2));
        assert_eq!(line("job", &lock), "\"job\": held (1 hold), 2 queued");
        assert_eq!(json("job", &lock)["mode"], "exclusive");
        let one = LockStatus::of_holders(vec![Holder::new(true, 1)]);
        assert_eq!(
            line("catalogue", &one),
            "\"catalogue\": held (1 hold, read)"
        );
        assert_eq!(line("free", &LockStatus::free()), "\"free\": free");
    }

    #[test]
    fn each_holder_is_shown_with_the_id_break_takes() {
        let lone = LockStatus::held(1)
            .with_id(Some("o0123456789abcdef".to_owned()))
            .with_fence(Some(FencingToken(4)));
        assert_eq!(
            line("job", &lone),
            "\"job\": held (1 hold), holder o0123456789abcdef, fence 4"
        );
        let j = json("job", &lone);
        assert_eq!(
            j["holders"][0]["id"], "o0123456789abcdef",
            "a lock's one holder is listed"
        );
        assert_eq!(j["holders"][0]["fence"], 4);
        let permit = |id: &str| Holder::new(false, 1).with_id(Some(id.to_owned()));
        let two = LockStatus::of_holders(vec![permit("a1"), permit("b2")]).with_permits(Some(3));
        assert_eq!(
            line("backups", &two),
            "\"backups\": held by 2 of 3 permits\n  permit a1\n  permit b2"
        );
        assert_eq!(json("backups", &two)["holders"][1]["id"], "b2");
        let who = HolderInfo::this_process(Some("pod \"7\"\nnext")).unwrap();
        let labelled = LockStatus::of_holders(vec![permit("a1").with_who(Some(who.clone()))]);
        let shown = line("job", &labelled);
        assert!(
            shown.ends_with(&format!(
                ", holder a1, by pod \\\"7\\\"\\nnext on {} pid {}",
                who.host,
                std::process::id()
            )),
            "the label is escaped: {shown}"
        );
        let j = json("job", &labelled);
        assert_eq!(j["holders"][0]["who"]["label"], "pod \"7\"\nnext");
        assert_eq!(j["holders"][0]["who"]["pid"], std::process::id());
        assert!(json("backups", &two)["holders"][0]["who"].is_null());
        let leader = LockStatus::held(1).with_value(Some(b"node \"1\"\nrm -rf".to_vec()));
        assert_eq!(
            line("lead", &leader),
            "\"lead\": held (1 hold), value \"node \\\"1\\\"\\nrm -rf\""
        );
    }
}
