//! Listing: an operator's [`Locker::list`] of the names under a prefix
//! shows every name held now, of every kind the store offers (a lock, a
//! semaphore's permit, a reader, a leader with its value), and no name
//! released; and reading it changes nothing. A store that cannot
//! enumerate its keys (no [`listing`](lockwright_core::backend::Capabilities::listing))
//! says `Unsupported`, and only such a store.

use std::collections::BTreeSet;

use anyhow::{bail, ensure, Result};
use lockwright_core::{ErrorKind, LockGuard, LockKey, LockStatus, Locker, OwnerToken};

use super::{acquired_with_value, key, long, LONG_TTL};
use crate::Harness;

/// What must not change when a name is listed: held, holds, fence and
/// how many hold it.
fn unchanged(s: &LockStatus) -> (bool, u32, Option<u64>, usize) {
    (s.held, s.holds, s.fence.map(|f| f.0), s.holder_count())
}

/// Every name held under a prefix is listed, of each kind the store has
/// and with the characters its layout escapes, with its status; a
/// released name is not; the listing changes nothing.
pub async fn list_shows_every_held_name_and_changes_nothing(h: &dyn Harness) -> Result<()> {
    let case = "list_shows_every_held_name";
    let prefix = key(case, "").as_str().to_owned();
    let name = |n: &str| key(case, n);
    let holder = Locker::from_arc(h.client().await);
    let caps = holder.capabilities();
    let mut guards: Vec<LockGuard> = Vec::new();
    let mut held: Vec<LockKey> = Vec::new();

    guards.push(holder.lock_with(name("lock"), &long()).await?);
    held.push(name("lock"));
    // Every store's escapes and markers at once: a slash, Redis's hash-tag
    // braces and glob characters, etcd's and ZooKeeper's `%` escapes, and
    // characters beyond ASCII.
    let odd = name("odd/{é}*[%2F%25]=🔒");
    guards.push(holder.lock_with(odd.clone(), &long()).await?);
    held.push(odd);
    if caps.permits {
        let semaphore = holder.semaphore(name("semaphore"), 3)?;
        guards.push(semaphore.acquire_with(&long()).await?);
        held.push(name("semaphore"));
    }
    if caps.shared {
        let rw = holder.rwlock(name("readers"))?;
        guards.push(rw.read_with(&long()).await?);
        held.push(name("readers"));
    }
    let leader = OwnerToken::generate();
    let backend = h.client().await;
    if caps.values {
        acquired_with_value(&*backend, &name("leader"), &leader, "me", LONG_TTL).await?;
        held.push(name("leader"));
    }
    holder
        .lock_with(name("released"), &long())
        .await?
        .release()
        .await?;

    let operator = Locker::from_arc(h.client().await);
    let mut before = Vec::new();
    for n in &held {
        before.push(unchanged(&operator.status(n.clone()).await?));
    }
    let listed = match operator.list(&prefix).await {
        Ok(listed) if caps.listing => listed,
        Ok(_) => bail!("a store without `listing` listed its names"),
        // Only a store that says it cannot list may answer so.
        Err(e) if e.kind() == ErrorKind::Unsupported && !caps.listing => {
            return release(guards, &*backend, &name("leader"), &leader, caps.values).await
        }
        Err(e) => bail!("listing {prefix:?}: {}", e.chain()),
    };
    let names: BTreeSet<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
    let expected: BTreeSet<&str> = held.iter().map(LockKey::as_str).collect();
    ensure!(
        names == expected,
        "listing {prefix:?} gave {names:?}, but {expected:?} are held (and `released` is not)"
    );
    for (k, status) in &listed {
        ensure!(status.held, "{k:?} is listed as not held: {status:?}");
        ensure!(status.owner.is_none(), "a listing shows an owner token");
    }
    for (n, was) in held.iter().zip(&before) {
        let now = unchanged(&operator.status(n.clone()).await?);
        ensure!(
            now == *was,
            "{n:?} read {was:?} before the listing and {now:?} after"
        );
    }
    release(guards, &*backend, &name("leader"), &leader, caps.values).await
}

/// Gives every hold of the case back.
async fn release(
    guards: Vec<LockGuard>,
    backend: &dyn lockwright_core::backend::LockBackend,
    leader: &LockKey,
    owner: &OwnerToken,
    values: bool,
) -> Result<()> {
    for g in guards {
        g.release().await?;
    }
    if values {
        lockwright_core::backend::LockBackendExt::unlock(backend, leader, owner).await?;
    }
    Ok(())
}

/// Who holds is shown: a locker that records who it is
/// ([`Locker::with_identity`]) is named, with its host, pid and label, as
/// each holder it is, of every kind the store offers, by `status` and by
/// `list`; a holder that records nothing is named by no one else's
/// identity. A store that keeps no values cannot keep the record, and
/// names no one.
pub async fn status_and_list_show_who_holds(h: &dyn Harness) -> Result<()> {
    let case = "who_holds";
    let prefix = key(case, "").as_str().to_owned();
    let name = |n: &str| key(case, n);
    let label = "worker \"7\"\nnext";
    let labelled = Locker::from_arc(h.client().await).with_identity(Some(label))?;
    let plain = Locker::from_arc(h.client().await);
    let caps = labelled.capabilities().clone();
    // (name, how many of its holders are the labelled locker's, how many not)
    let mut expected: Vec<(LockKey, usize, usize)> = Vec::new();
    let mut guards: Vec<LockGuard> = Vec::new();
    guards.push(labelled.lock_with(name("lock"), &long()).await?);
    expected.push((name("lock"), 1, 0));
    if caps.permits {
        guards.push(
            labelled
                .semaphore(name("sem"), 3)?
                .acquire_with(&long())
                .await?,
        );
        guards.push(
            plain
                .semaphore(name("sem"), 3)?
                .acquire_with(&long())
                .await?,
        );
        expected.push((name("sem"), 1, 1));
    }
    if caps.shared {
        guards.push(labelled.rwlock(name("readers"))?.read_with(&long()).await?);
        expected.push((name("readers"), 1, 0));
    }
    let mut leadership = None;
    if caps.values {
        let election = labelled.election(name("leader"))?;
        leadership = Some(election.campaign_with("me", &long()).await?);
        expected.push((name("leader"), 1, 0));
    }
    let operator = Locker::from_arc(h.client().await);
    let listed = if caps.listing {
        Some(operator.list(&prefix).await?)
    } else {
        None
    };
    for (n, mine, others) in &expected {
        let status = operator.status(n.clone()).await?;
        let mut seen = vec![status];
        if let Some(listed) = &listed {
            let Some((_, s)) = listed.iter().find(|(k, _)| k == n) else {
                bail!("{n:?} is held but not listed");
            };
            seen.push(s.clone());
        }
        for s in seen {
            let holders = s.each_holder();
            let named = holders.iter().filter(|h| h.who.is_some()).count();
            if !caps.values {
                ensure!(
                    named == 0,
                    "{n:?}: a store without values named a holder: {s:?}"
                );
                continue;
            }
            ensure!(
                named == *mine && holders.len() == mine + others,
                "{n:?}: {mine} of {} holders are the labelled locker's, but {named} were named: {s:?}",
                mine + others
            );
            for who in holders.iter().filter_map(|h| h.who.as_ref()) {
                ensure!(
                    who.label.as_deref() == Some(label) && who.pid == std::process::id(),
                    "{n:?}: a holder is named {who:?}"
                );
            }
        }
    }
    if let Some(listed) = &listed {
        ensure!(
            listed
                .iter()
                .all(|(k, _)| !lockwright_core::identity::is_record_name(k.as_str())),
            "an identity record was listed as a lock"
        );
    }
    for g in guards {
        g.release().await?;
    }
    if let Some(l) = leadership {
        l.resign().await?;
    }
    labelled.close().await?;
    Ok(())
}
