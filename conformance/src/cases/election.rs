//! Election: the leader is whoever holds the election's lock, and everyone
//! reads it right. At most one leader with a valid lease; `leader()`
//! shows the holder's value and term, never a former leader's; observers
//! see every reign in order and its end at its lease; a resignation hands
//! over at once; a former leader, or a leadership whose lease is gone,
//! cannot change the value; a dropped campaign leaves no leader; a store
//! that announces changes announces each one; a store that is down is an
//! error, never "nobody leads". A store without values must say
//! `Unsupported`.

use lockwright_core::backend::LockBackendExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use futures::StreamExt;
use lockwright_core::backend::{Binding, Release, Renew};
use lockwright_core::{
    Election, ErrorKind, Leader, LockKey, LockOptions, Locker, OwnerToken, MAX_VALUE_LEN,
};

use super::{acquired_with_value, end_hold, key, long, past_expiry, short_ttl, LONG_TTL};
use crate::faults::Stall;
use crate::Harness;

/// The election on `k` for a new client, or `None` after checking that a
/// store without values refuses elections with `Unsupported`.
async fn election(h: &dyn Harness, k: &LockKey) -> Result<Option<(Locker, Election)>> {
    let locker = Locker::from_arc(h.client().await);
    match locker.election(k) {
        Ok(e) => Ok(Some((locker, e))),
        Err(e) if !locker.capabilities().values && e.kind() == ErrorKind::Unsupported => Ok(None),
        Err(e) => bail!("election on a store that keeps values: {e}"),
    }
}

fn value_of(l: &Option<Leader>) -> Option<&[u8]> {
    l.as_ref().map(|l| l.value.as_slice())
}

/// The observer's next change, within `within`.
async fn next<S>(changes: &mut S, within: Duration) -> Result<Option<Leader>>
where
    S: futures::Stream<Item = lockwright_core::Result<Option<Leader>>> + Unpin,
{
    match tokio::time::timeout(within, changes.next()).await {
        Ok(Some(item)) => Ok(item?),
        Ok(None) => bail!("the observer's stream ended"),
        Err(_) => bail!("no change observed within {within:?}"),
    }
}

fn waiting(d: Duration) -> LockOptions {
    long().wait_for(d)
}

/// One leader at a time: while one candidate leads, another's campaign
/// waits and times out, and candidates campaigning together lead in turn,
/// never two at once.
pub async fn one_leader_at_a_time(h: &dyn Harness) -> Result<()> {
    let k = key("one_leader_at_a_time", "k");
    let Some((_, a)) = election(h, &k).await? else {
        return Ok(());
    };
    let Some((_, b)) = election(h, &k).await? else {
        bail!("a second client of the store keeps no values");
    };
    let la = a.campaign_with("a", &long()).await?;
    if let Some(lb) = b.try_campaign_with("b", &long().no_wait()).await? {
        bail!("a second candidate led while the first did: {lb:?}");
    }
    match b
        .campaign_with("b", &waiting(Duration::from_millis(300)))
        .await
    {
        Err(e) if e.kind() == ErrorKind::Timeout => {}
        other => bail!("a campaign against a live leader ended with {other:?}, not a timeout"),
    }
    ensure!(
        value_of(&b.leader().await?) == Some(b"a"),
        "the leader is not the first candidate"
    );
    la.resign().await?;

    // Four candidates at once, each leading twice: never two at a time.
    let leading = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let Some((_, e)) = election(h, &k).await? else {
            bail!("a client of the store keeps no values");
        };
        let leading = leading.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..2 {
                let l = e
                    .campaign_with(format!("c{i}-{round}"), &waiting(Duration::from_secs(60)))
                    .await?;
                ensure!(
                    leading.fetch_add(1, Ordering::SeqCst) == 0,
                    "two candidates led at once"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
                leading.fetch_sub(1, Ordering::SeqCst);
                l.resign().await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// `leader()` shows the holder's value, term and lease, any bytes up to
/// the size limit, a proclaimed value at once, and after a change of
/// leader the new one's value, never the former leader's.
pub async fn leader_agrees_with_the_holder(h: &dyn Harness) -> Result<()> {
    let k = key("leader_agrees_with_the_holder", "k");
    let Some((locker, reader)) = election(h, &k).await? else {
        return Ok(());
    };
    let caps = locker.capabilities().clone();
    ensure!(
        reader.leader().await?.is_none(),
        "a new election has a leader"
    );
    let Some((_, a)) = election(h, &k).await? else {
        bail!("a second client keeps no values");
    };
    let mut la = a.campaign_with("a", &long()).await?;
    let seen = reader
        .leader()
        .await?
        .ok_or_else(|| anyhow!("nobody leads while a candidate holds"))?;
    ensure!(seen.value == b"a", "leader value {:?}", seen.value_str());
    ensure!(
        seen.term == la.term(),
        "term {:?}, grant {:?}",
        seen.term,
        la.term()
    );
    if caps.binding == Binding::Lease {
        let left = seen
            .lease_left
            .ok_or_else(|| anyhow!("a lease store reports no lease left"))?;
        ensure!(left <= LONG_TTL, "lease left {left:?} of {LONG_TTL:?}");
    }
    let odd: Vec<u8> = vec![0, b'\n', b' ', 0xff, b'~', b'a'];
    for value in [b"a-2".to_vec(), odd, vec![b'x'; MAX_VALUE_LEN]] {
        la.proclaim(value.clone()).await?;
        ensure!(
            value_of(&reader.leader().await?) == Some(&value[..]),
            "a proclaimed value of {} bytes did not read back",
            value.len()
        );
    }
    match la.proclaim(vec![b'x'; MAX_VALUE_LEN + 1]).await {
        Err(e) if e.kind() == ErrorKind::InvalidOptions => {}
        other => bail!("an oversized value was not refused as invalid: {other:?}"),
    }
    let first_term = la.term();
    la.resign().await?;
    ensure!(
        reader.leader().await?.is_none(),
        "a resigned leader still leads"
    );
    let Some((_, b)) = election(h, &k).await? else {
        bail!("a third client keeps no values");
    };
    let lb = b.campaign_with("b", &long()).await?;
    let seen = reader.leader().await?;
    ensure!(
        value_of(&seen) == Some(b"b"),
        "after a change of leader, leader() shows {:?}",
        seen.as_ref()
            .map(|l| String::from_utf8_lossy(&l.value).into_owned())
    );
    if caps.fencing {
        ensure!(
            lb.term() > first_term,
            "terms {:?} then {:?}",
            first_term,
            lb.term()
        );
        ensure!(seen.and_then(|l| l.term) == lb.term(), "term read back");
    }
    lb.resign().await?;
    match b.campaign_with(vec![0u8; MAX_VALUE_LEN + 1], &long()).await {
        Err(e) if e.kind() == ErrorKind::InvalidOptions => {}
        other => bail!("a campaign with an oversized value: {other:?}"),
    }
    ensure!(
        reader.leader().await?.is_none(),
        "a refused campaign left a leader"
    );
    Ok(())
}

/// An observer sees who leads now, then every reign and value change in
/// order, and the end of a reign whose holder stopped renewing at the end
/// of its lease (or session): not before, and not long after.
pub async fn observe_reports_each_reign_in_order(h: &dyn Harness) -> Result<()> {
    let k = key("observe_reports_each_reign_in_order", "k");
    let Some((locker, watcher)) = election(h, &k).await? else {
        return Ok(());
    };
    let caps = locker.capabilities().clone();
    let mut changes = Box::pin(watcher.observe_every(Duration::from_millis(20)));
    let soon = Duration::from_secs(10);
    ensure!(
        next(&mut changes, soon).await?.is_none(),
        "a new election shows a leader"
    );
    let Some((_, a)) = election(h, &k).await? else {
        bail!("a second client keeps no values");
    };
    let mut la = a.campaign_with("a", &long()).await?;
    let seen = next(&mut changes, soon).await?;
    ensure!(value_of(&seen) == Some(b"a"), "first reign not observed");
    ensure!(seen.and_then(|l| l.term) == la.term(), "first reign's term");
    la.proclaim("a-2").await?;
    ensure!(
        value_of(&next(&mut changes, soon).await?) == Some(b"a-2"),
        "new value not observed"
    );
    let first_term = la.term();
    la.resign().await?;
    ensure!(
        next(&mut changes, soon).await?.is_none(),
        "a resignation was not observed"
    );

    // A holder that stops renewing: its reign ends with its lease.
    let holder = h.client().await;
    let ttl = short_ttl(&caps);
    let owner = OwnerToken::generate();
    let sent = Instant::now();
    acquired_with_value(&*holder, &k, &owner, "b", ttl).await?;
    let seen = next(&mut changes, soon).await?;
    ensure!(value_of(&seen) == Some(b"b"), "second reign not observed");
    if caps.fencing {
        ensure!(
            seen.and_then(|l| l.term) > first_term,
            "the second reign's term is not above the first's"
        );
    }
    match caps.binding {
        Binding::Lease => {
            let ended = next(&mut changes, past_expiry(&caps, ttl) + soon).await?;
            let at = sent.elapsed();
            ensure!(
                ended.is_none(),
                "after the lease, the observer shows {ended:?}"
            );
            ensure!(
                at + caps.ttl_resolution + Duration::from_millis(50) >= ttl,
                "the reign ended {at:?} after its grant, before its {ttl:?} lease"
            );
            ensure!(
                at <= past_expiry(&caps, ttl) + Duration::from_secs(3),
                "the reign of a {ttl:?} lease ended only {at:?} after its grant"
            );
        }
        Binding::Session => {
            end_hold(h, &holder, ttl).await?;
            let ended = next(&mut changes, soon + Duration::from_secs(20)).await?;
            ensure!(
                ended.is_none(),
                "after the session, the observer shows {ended:?}"
            );
        }
    }
    Ok(())
}

/// A resignation hands leadership to a waiting candidate at once, as a
/// release wakes a waiter: far sooner than the lease would have run out.
pub async fn resign_hands_over_at_once(h: &dyn Harness) -> Result<()> {
    let k = key("resign_hands_over_at_once", "k");
    let Some((_, a)) = election(h, &k).await? else {
        return Ok(());
    };
    let Some((_, b)) = election(h, &k).await? else {
        bail!("a second client keeps no values");
    };
    let la = a.campaign_with("a", &long()).await?;
    let waiter = tokio::spawn(async move {
        let lb = b.campaign_with("b", &waiting(LONG_TTL)).await?;
        anyhow::Ok((Instant::now(), lb))
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !waiter.is_finished(),
        "the second candidate led while the first did"
    );
    let resigned = Instant::now();
    la.resign().await?;
    // A tenth of the lease: a hand-off, not an expiry.
    let (led, lb) = tokio::time::timeout(LONG_TTL / 10, waiter)
        .await
        .map_err(|_| anyhow!("no hand-off within {:?} of a resignation", LONG_TTL / 10))???;
    ensure!(
        led >= resigned,
        "the second candidate led before the first resigned"
    );
    ensure!(
        value_of(&a.leader().await?) == Some(b"b"),
        "the new leader's value"
    );
    lb.resign().await?;
    Ok(())
}

/// A former leader (its lease over and someone else leading) and a
/// stranger cannot change the advertised value: `NotHeld`, nothing written.
pub async fn former_leader_cannot_proclaim(h: &dyn Harness) -> Result<()> {
    let k = key("former_leader_cannot_proclaim", "k");
    let Some((locker, reader)) = election(h, &k).await? else {
        return Ok(());
    };
    let caps = locker.capabilities().clone();
    let former = h.client().await;
    let ttl = short_ttl(&caps);
    let owner = OwnerToken::generate();
    acquired_with_value(&*former, &k, &owner, "a", ttl).await?;
    ensure!(
        former.proclaim_as(&k, &owner, b"a-2").await? == Renew::Renewed,
        "the leader could not proclaim"
    );
    end_hold(h, &former, ttl).await?;
    let Some((_, b)) = election(h, &k).await? else {
        bail!("a second client keeps no values");
    };
    let lb = b
        .campaign_with("b", &waiting(Duration::from_secs(30)))
        .await?;
    let refused = |r: lockwright_core::Result<Renew>| match r {
        Ok(Renew::NotHeld) => true,
        Err(e) => e.kind() == ErrorKind::NotHeld,
        Ok(Renew::Renewed) => false,
    };
    let r = former.proclaim_as(&k, &owner, b"former").await;
    ensure!(refused(r), "a former leader's proclaim was not refused");
    let stranger = OwnerToken::generate();
    let r = former.proclaim_as(&k, &stranger, b"stranger").await;
    ensure!(refused(r), "a stranger's proclaim was not refused");
    ensure!(
        value_of(&reader.leader().await?) == Some(b"b"),
        "the leader's value changed after refused proclaims"
    );
    lb.resign().await?;
    Ok(())
}

/// A leadership whose lease is gone from the store (freed behind its
/// back, then taken by another candidate) cannot proclaim:
/// `Leadership::proclaim` is an error, `NotHeld` (or `Lost`), never `Ok`,
/// and nothing is written.
pub async fn a_leadership_without_its_lease_cannot_proclaim(h: &dyn Harness) -> Result<()> {
    let k = key("a_leadership_without_its_lease_cannot_proclaim", "k");
    let Some((locker, a)) = election(h, &k).await? else {
        return Ok(());
    };
    let mut la = a.campaign_with("a", &long()).await?;
    // The lease ends without the leadership hearing of it.
    let backend = locker.backend().clone();
    ensure!(
        backend.release(&la.guard().lease().hold()).await? == Release::Freed,
        "the leader's lease could not be released from its own client"
    );
    match la.proclaim("a-2").await {
        Err(e) if matches!(e.kind(), ErrorKind::NotHeld | ErrorKind::Lost) => {}
        other => bail!("a leader whose lease was freed proclaimed: {other:?}, not a refusal"),
    }
    ensure!(
        a.leader().await?.is_none(),
        "a refused proclaim left a leader"
    );
    let Some((_, b)) = election(h, &k).await? else {
        bail!("a second client keeps no values");
    };
    let lb = b.campaign_with("b", &long()).await?;
    match la.proclaim("a-3").await {
        Err(e) if matches!(e.kind(), ErrorKind::NotHeld | ErrorKind::Lost) => {}
        other => bail!("a leader whose lease was taken over proclaimed: {other:?}, not a refusal"),
    }
    ensure!(
        value_of(&a.leader().await?) == Some(b"b"),
        "the new leader's value changed after a former leader's proclaim"
    );
    drop(la);
    lb.resign().await?;
    Ok(())
}

/// A campaign dropped while it waits, or while its grant is in flight,
/// leaves nobody leading once the store settles.
pub async fn cancelled_campaign_leaves_no_leader(h: &dyn Harness) -> Result<()> {
    let k = key("cancelled_campaign_leaves_no_leader", "k");
    let Some((_, a)) = election(h, &k).await? else {
        return Ok(());
    };
    let Some((_, b)) = election(h, &k).await? else {
        bail!("a second client keeps no values");
    };
    let la = a.campaign_with("a", &long()).await?;
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        b.campaign_with("b", &waiting(LONG_TTL)),
    )
    .await;
    ensure!(
        dropped.is_err(),
        "a campaign led while another candidate did"
    );
    la.resign().await?;
    nobody_leads(&a, "a campaign dropped while waiting").await?;
    // Dropped with its grant made in the store and the reply on its way:
    // undone when the reply arrives, as a lock's acquire is.
    let stall = Stall::new(h.client().await);
    let stalled = Locker::from_arc(stall.clone()).election(&k)?;
    let opts = long();
    tokio::select! {
        r = stalled.campaign_with("s", &opts) => {
            bail!("the stalled campaign returned ({:?}) before its reply was let through", r.map(|_| ()))
        }
        () = stall.granted() => {}
    }
    ensure!(
        value_of(&a.leader().await?) == Some(b"s"),
        "the store did not grant the stalled campaign"
    );
    stall.open();
    nobody_leads(&a, "a campaign dropped with its grant in flight").await?;
    for micros in [0, 200, 1_000, 3_000, 10_000, 30_000] {
        match tokio::time::timeout(
            Duration::from_micros(micros),
            b.campaign_with("b", &waiting(LONG_TTL)),
        )
        .await
        {
            Ok(led) => led?.resign().await?,
            Err(_) => nobody_leads(&a, &format!("a campaign dropped after {micros} µs")).await?,
        }
    }
    // A grant that lands after "nobody leads" was read would slip past the
    // checks above, so read again once any reply still on its way has had
    // time to arrive (and, from a correct client, to be undone).
    tokio::time::sleep(Duration::from_secs(1)).await;
    nobody_leads(&a, "campaigns dropped at every point, a second later").await?;
    Ok(())
}

async fn nobody_leads(e: &Election, why: &str) -> Result<()> {
    let start = Instant::now();
    while let Some(l) = e.leader().await? {
        if start.elapsed() > Duration::from_secs(10) {
            bail!(
                "{why}: {:?} still leads 10 s later",
                String::from_utf8_lossy(&l.value)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A store that announces changes (`LockBackend::changes` gives a subscription)
/// wakes its subscriber after another client's grant, proclaim and
/// release of a leader's lock: an observer that relies on the notices and
/// polls seldom sees each change within a round trip, not at its poll.
/// A store that announces nothing (`Ok(None)`) is polled and passes.
pub async fn announced_changes_wake_observers(h: &dyn Harness) -> Result<()> {
    let k = key("announced_changes_wake_observers", "k");
    let Some((_, election)) = election(h, &k).await? else {
        return Ok(());
    };
    let watcher = h.client().await;
    let Some(mut watch) = watcher.changes(&k).await? else {
        return Ok(());
    };
    let mut leading = election.campaign_with("a", &long()).await?;
    heard(&mut watch, "a grant").await?;
    quiet(&mut watch).await;
    leading.proclaim("a-2").await?;
    heard(&mut watch, "a proclaim").await?;
    quiet(&mut watch).await;
    leading.resign().await?;
    heard(&mut watch, "a resignation").await?;
    Ok(())
}

/// Generous for a loaded host: a notice takes a round trip.
const ANNOUNCED_WITHIN: Duration = Duration::from_secs(5);

/// The watch wakes within [`ANNOUNCED_WITHIN`].
async fn heard(watch: &mut lockwright_core::backend::Changes, what: &str) -> Result<()> {
    match tokio::time::timeout(ANNOUNCED_WITHIN, watch.notice()).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => bail!("the subscription ended before {what} was announced"),
        Err(_) => bail!("{what} was not announced within {ANNOUNCED_WITHIN:?}"),
    }
}

/// Takes the notices still coming for the last change (a store may
/// announce one change more than once), so the next one heard is new.
async fn quiet(watch: &mut lockwright_core::backend::Changes) {
    while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), watch.notice()).await {
    }
}

/// A store that cannot be reached is `Unavailable` to `leader()`, to a
/// campaign and to an observer: never "nobody leads", never a timeout.
pub async fn leader_of_a_down_store_is_unavailable(h: &dyn Harness) -> Result<()> {
    let k = key("leader_of_a_down_store_is_unavailable", "k");
    let down = Locker::from_arc(h.unreachable_client().await);
    let e = match down.election(&k) {
        Ok(e) => e,
        Err(e) if !down.capabilities().values && e.kind() == ErrorKind::Unsupported => {
            return Ok(())
        }
        Err(e) => bail!("election on a down store that keeps values: {e}"),
    };
    let kind = |r: lockwright_core::Result<()>| r.err().map(|e| e.kind());
    let want = Some(ErrorKind::Unavailable);
    let r = e.leader().await;
    ensure!(
        r.as_ref().err().map(|e| e.kind()) == want,
        "leader() on a down store: {r:?}"
    );
    let start = Instant::now();
    let r = e
        .campaign_with("x", &waiting(super::outage::OUTAGE_WAIT))
        .await;
    ensure!(kind(r.map(|_| ())) == want, "a campaign on a down store");
    ensure!(
        start.elapsed() < Duration::from_secs(15),
        "a campaign on a down store went on {:?} past its wait",
        start.elapsed()
    );
    let mut changes = Box::pin(e.observe_every(Duration::from_millis(20)));
    match tokio::time::timeout(Duration::from_secs(15), changes.next()).await {
        Ok(Some(Err(err))) if err.kind() == ErrorKind::Unavailable => Ok(()),
        other => bail!("an observer of a down store yielded {other:?}"),
    }
}

/// A candidate that stands for leadership leads, loses it when an
/// operator breaks its lease, and stands again: the other candidate leads
/// meanwhile, and the first leads once more after the other resigns. A
/// stand told to stop resigns before it returns.
pub async fn a_stander_leads_again_after_losing(h: &dyn Harness) -> Result<()> {
    let k = key("a_stander_leads_again", "k");
    let Some((la, a)) = election(h, &k).await? else {
        return Ok(());
    };
    let Some((_, b)) = election(h, &k).await? else {
        bail!("a second client keeps no values");
    };
    let operator = h.client().await;
    let (reigns, mut reigned) = tokio::sync::mpsc::unbounded_channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let reader = a.clone();
    // A short lease, so that the stander hears of the break soon.
    let ttl = short_ttl(la.capabilities()).max(Duration::from_secs(3));
    let opts = LockOptions::new()
        .ttl(ttl)
        .wait_for(Duration::from_secs(120));
    let stand = tokio::spawn(async move {
        let stopped = async move {
            let _ = stopped.await;
        };
        a.stand_with("a", &opts, stopped, move |reign| {
            let _ = reigns.send(reign.term());
            std::future::pending::<()>()
        })
        .await
    });
    let within = Duration::from_secs(60);
    let next_reign = async |reigned: &mut tokio::sync::mpsc::UnboundedReceiver<_>| {
        tokio::time::timeout(within, reigned.recv())
            .await
            .ok()
            .flatten()
    };
    if next_reign(&mut reigned).await.is_none() {
        bail!("a stand never led an election nobody else stood in");
    }
    let second_candidate = tokio::spawn(async move {
        let led = b
            .campaign_with("b", &waiting(Duration::from_secs(120)))
            .await;
        (b, led)
    });
    let holders = operator.inspect(&k).await?.without_owners().each_holder();
    let Some(id) = holders.first().and_then(|h| h.id.clone()) else {
        bail!("the leader is listed with no id to break it by: {holders:?}");
    };
    ensure!(
        operator.force_release(&k, &id).await?,
        "breaking the leader {id} found no holder"
    );
    let (b, led) = tokio::time::timeout(within, second_candidate)
        .await
        .context("the other candidate never led after the stander's lease was broken")??;
    let lb = led?;
    ensure!(
        value_of(&reader.leader().await?) == Some(b"b"),
        "the other candidate's campaign returned, but it does not lead"
    );
    lb.resign().await?;
    // Its term is the breaking rule's to check (`breaking`), not this one's.
    if next_reign(&mut reigned).await.is_none() {
        bail!("the stander did not lead again after the other candidate resigned");
    }
    ensure!(
        value_of(&b.leader().await?) == Some(b"a"),
        "the stander says it leads again, but the store names another leader"
    );
    let _ = stop.send(());
    tokio::time::timeout(within, stand)
        .await
        .context("a stand told to stop did not return")???;
    ensure!(
        b.leader().await?.is_none(),
        "a stand that stopped left its leadership behind"
    );
    Ok(())
}
