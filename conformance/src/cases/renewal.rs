//! Renewal: the owner's renewal extends its lease, as a second client
//! sees, and the watchdog keeps a guard's lease alive by itself. A
//! renewal never reaches another owner's lease, alone or in a batch.

use lockwright_core::backend::LockBackendExt;
use std::time::Duration;

use anyhow::{bail, ensure, Result};
use lockwright_core::backend::{Acquire, Binding, LockBackend, Release, Renew, RenewRequest};
use lockwright_core::{LockKey, LockOptions, Locker, OwnerToken};

use super::{acquired, contended, end_hold, key, past_expiry, short_ttl, LONG_TTL};
use crate::Harness;

/// Renewal extends the lease, as a second client sees; renewal by the owner only.
pub async fn renew_extends_lease(h: &dyn Harness) -> Result<()> {
    let k = key("renew_extends_lease", "k");
    let (a, b) = (h.client().await, h.client().await);
    let caps = a.capabilities();
    let ttl = short_ttl(&caps);
    let owner = OwnerToken::generate();
    acquired(&*a, &k, &owner, ttl).await?;
    tokio::time::sleep(ttl / 3).await;
    ensure!(
        a.renew_lock(&k, &owner, ttl * 4).await? == Renew::Renewed,
        "owner could not renew"
    );
    ensure!(
        b.renew_lock(&k, &OwnerToken::generate(), LONG_TTL).await? == Renew::NotHeld,
        "a stranger renewed someone else's lock"
    );
    tokio::time::sleep(past_expiry(&caps, ttl)).await;
    contended(&*b, &k, "renewed past its first TTL").await?;
    ensure!(
        a.unlock(&k, &owner).await? == Release::Freed,
        "renewed lock did not release"
    );
    acquired(&*b, &k, &OwnerToken::generate(), LONG_TTL).await?;
    Ok(())
}

/// The watchdog keeps a short lease alive for several TTLs.
pub async fn renewal_watchdog_keeps_lock(h: &dyn Harness) -> Result<()> {
    let k = key("renewal_watchdog_keeps_lock", "k");
    let a = Locker::from_arc(h.client().await);
    let b = h.client().await;
    let ttl = short_ttl(a.capabilities()).max(Duration::from_millis(900));
    let g = a.lock_with(&k, &LockOptions::new().ttl(ttl)).await?;
    for _ in 0..6 {
        tokio::time::sleep(ttl / 2).await;
        contended(&*b, &k, "the watchdog renews it").await?;
    }
    ensure!(!g.is_lost(), "guard reported lost while renewals succeeded");
    g.release().await?;
    Ok(())
}

/// A batch of renewals answers for each lease on its own: every lease the
/// owner holds is renewed (past the lease it was taken for), however many (more than one statement's worth
/// where a store batches by the hundred), and a lease it released, one
/// another owner holds and one never taken are `NotHeld`, the other
/// owner's hold untouched and the untaken name left free.
pub async fn a_renewal_batch_answers_for_each_lease(h: &dyn Harness) -> Result<()> {
    let case = "a_renewal_batch_answers_for_each_lease";
    let (a, b) = (h.client().await, h.client().await);
    let (mine, theirs) = (OwnerToken::generate(), OwnerToken::generate());
    // A session-bound SQL lock holds a server connection each: fewer there.
    let n = match a.capabilities().binding {
        Binding::Session => 20,
        Binding::Lease => 120,
    };
    let held: Vec<LockKey> = (0..n).map(|i| key(case, &format!("mine-{i}"))).collect();
    // Taken for a lease the batch must extend, long enough to take them all.
    let caps = a.capabilities();
    let first = short_ttl(&caps).max(Duration::from_secs(3));
    let taken = futures::future::join_all(held.iter().map(|k| acquired(&*a, k, &mine, first)));
    for t in taken.await {
        t?;
    }
    let (released, other, never) = (
        key(case, "released"),
        key(case, "theirs"),
        key(case, "never"),
    );
    acquired(&*a, &released, &mine, LONG_TTL).await?;
    ensure!(
        a.unlock(&released, &mine).await? == Release::Freed,
        "release"
    );
    acquired(&*b, &other, &theirs, LONG_TTL).await?;

    let mut requests: Vec<RenewRequest> = held
        .iter()
        .map(|k| {
            RenewRequest::new(
                lockwright_core::backend::HoldId::mutex(k.clone(), mine.clone()),
                LONG_TTL,
            )
        })
        .collect();
    // The ones not held in the middle, so a batch split by the hundred has
    // them in its first part.
    for k in [&released, &other, &never] {
        let at = requests.len() / 2;
        requests.insert(
            at,
            RenewRequest::new(
                lockwright_core::backend::HoldId::mutex(k.clone(), mine.clone()),
                LONG_TTL,
            ),
        );
    }
    let answers = a.renew(&requests).await;
    ensure!(
        answers.len() == requests.len(),
        "{} answers to {} requests",
        answers.len(),
        requests.len()
    );
    for (r, answer) in requests.iter().zip(answers) {
        let want = if held.contains(r.key()) {
            Renew::Renewed
        } else {
            Renew::NotHeld
        };
        match answer {
            Ok(got) => ensure!(got == want, "{:?}: {got:?}, not {want:?}", r.key()),
            Err(e) => bail!("{:?}: {e}", r.key()),
        }
    }
    if caps.binding == Binding::Lease {
        tokio::time::sleep(past_expiry(&caps, first)).await;
        for k in [&held[0], &held[n - 1]] {
            contended(&*b, k, "renewed by the batch past its first lease").await?;
        }
    }
    contended(&*a, &other, "its owner's hold, untouched by a batch").await?;
    ensure!(
        b.unlock(&other, &theirs).await? == Release::Freed,
        "the other owner's hold was changed"
    );
    acquired(&*b, &never, &theirs, LONG_TTL).await?;
    b.unlock(&never, &theirs).await?;
    let freed = futures::future::join_all(held.iter().map(|k| a.unlock(k, &mine)));
    for f in freed.await {
        ensure!(f? == Release::Freed, "a renewed lease did not release");
    }
    Ok(())
}

/// A renewal never reaches another owner's lease. A batch made only of
/// leases their owner lost, each taken over by a new holder since (several,
/// and one alone), is `NotHeld` for every one, and leaves the new holder's
/// leases as they were: not extended to the longer TTL the batch asked
/// for. A stranger's renewal of a short lease, in a batch (alone or beside
/// a free name) or by itself and for a long TTL, is `NotHeld` and leaves
/// the lease to end at its own TTL, when a third owner takes the name.
pub async fn a_renewal_never_reaches_another_owners_lease(h: &dyn Harness) -> Result<()> {
    let case = "a_renewal_never_reaches_another_owners_lease";
    let (a, b, c) = (h.client().await, h.client().await, h.client().await);
    let caps = a.capabilities();
    let (mine, theirs) = (OwnerToken::generate(), OwnerToken::generate());

    // Leases lost, then taken over by another owner.
    let several: Vec<LockKey> = (0..3).map(|i| key(case, &format!("lost-{i}"))).collect();
    let alone = key(case, "lost-alone");
    let lost: Vec<LockKey> = several.iter().chain([&alone]).cloned().collect();
    let ttl = short_ttl(&caps);
    for k in &lost {
        acquired(&*a, k, &mine, ttl).await?;
    }
    end_hold(h, &a, ttl).await?;
    for k in &lost {
        acquired(&*b, k, &theirs, LONG_TTL).await?;
    }
    // The former owner from a fresh client (its sessions may have ended),
    // asking for more than the new holder's lease, so an extension shows.
    let a = h.client().await;
    let asked = LONG_TTL * 2;
    for keys in [&several[..], std::slice::from_ref(&alone)] {
        let requests: Vec<RenewRequest> = keys
            .iter()
            .map(|k| {
                RenewRequest::new(
                    lockwright_core::backend::HoldId::mutex(k.clone(), mine.clone()),
                    asked,
                )
            })
            .collect();
        let answers = a.renew(&requests).await;
        all_not_held(answers, &requests, "leases lost and taken over")?;
    }
    for k in &lost {
        if let Some(left) = c.inspect(k).await?.remaining {
            ensure!(
                left <= LONG_TTL + caps.ttl_resolution,
                "{k:?}: the new holder's {LONG_TTL:?} lease has {left:?} left after the \
                 former owner's batch asked for {asked:?}"
            );
        }
        contended(&*c, k, "its new holder's, untouched by the batch").await?;
        ensure!(
            b.unlock(k, &theirs).await? == Release::Freed,
            "{k:?}: the new holder's hold was changed by the former owner's batch"
        );
    }

    // A stranger's renewals, for a long TTL, of a short lease.
    let short = short_ttl(&caps).max(Duration::from_secs(3));
    let (k, free) = (key(case, "short"), key(case, "free"));
    acquired(&*b, &k, &theirs, short).await?;
    let stranger = |k: &LockKey| {
        RenewRequest::new(
            lockwright_core::backend::HoldId::mutex(k.clone(), mine.clone()),
            LONG_TTL,
        )
    };
    for requests in [vec![stranger(&k)], vec![stranger(&free), stranger(&k)]] {
        let answers = a.renew(&requests).await;
        all_not_held(answers, &requests, "a lease someone else holds")?;
    }
    ensure!(
        a.renew_lock(&k, &mine, LONG_TTL).await? == Renew::NotHeld,
        "a stranger renewed someone else's lease"
    );
    if let Some(left) = c.inspect(&k).await?.remaining {
        ensure!(
            left <= short + caps.ttl_resolution,
            "{k:?} has {left:?} left of a {short:?} lease after a stranger's renewals \
             for {LONG_TTL:?}"
        );
    }
    if caps.binding == Binding::Lease {
        tokio::time::sleep(past_expiry(&caps, short)).await;
        let third = OwnerToken::generate();
        match c.try_lock(&k, &third, LONG_TTL).await? {
            Acquire::Acquired(_) => {}
            Acquire::Contended { .. } => bail!(
                "{k:?} is still held past its {short:?} lease: a stranger's renewal extended it"
            ),
        }
        c.unlock(&k, &third).await?;
    } else {
        ensure!(
            b.unlock(&k, &theirs).await? == Release::Freed,
            "{k:?}: the holder's hold was changed by a stranger's renewals"
        );
    }
    let other = OwnerToken::generate();
    acquired(&*c, &free, &other, LONG_TTL).await?;
    c.unlock(&free, &other).await?;
    Ok(())
}

/// One answer per request, each `NotHeld`: none of `what` is renewed.
fn all_not_held(
    answers: Vec<lockwright_core::Result<Renew>>,
    requests: &[RenewRequest],
    what: &str,
) -> Result<()> {
    ensure!(
        answers.len() == requests.len(),
        "{} answers to {} requests",
        answers.len(),
        requests.len()
    );
    for (r, answer) in requests.iter().zip(answers) {
        match answer {
            Ok(got) => ensure!(
                got == Renew::NotHeld,
                "{:?}: {got:?} in a batch of {} for {what}",
                r.key(),
                requests.len()
            ),
            Err(e) => bail!("{:?}: {e}", r.key()),
        }
    }
    Ok(())
}
