//! The conformance cases. Each is a plain `async fn` over a [`Harness`] that
//! returns an error saying which promise was broken.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use locksmith_core::backend::{Acquire, Binding, Capabilities, LockBackend, Release, Renew};
use locksmith_core::{ErrorKind, LockKey, LockOptions, Locker, OwnerToken, MAX_KEY_LEN, MAX_TTL};
use rand::Rng;

use crate::faults::{Partition, Stall};
use crate::Harness;

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
) -> Result<locksmith_core::backend::Grant> {
    match b.try_acquire(k, owner, ttl).await? {
        Acquire::Acquired(g) => Ok(g),
        Acquire::Contended { .. } => bail!("expected to acquire {k:?}, but it is held"),
    }
}

async fn contended(b: &dyn LockBackend, k: &LockKey, why: &str) -> Result<()> {
    match b.try_acquire(k, &OwnerToken::generate(), LONG_TTL).await? {
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

/// Exclusion: a second client is refused while the first holds the key, and
/// gets it once released.
pub async fn exclusion_between_clients(h: &dyn Harness) -> Result<()> {
    let k = key("exclusion_between_clients", "k");
    let (a, b) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    let ga = a
        .try_lock(&k)
        .await?
        .context("first try_lock on a free key")?;
    ensure!(
        b.try_lock(&k).await?.is_none(),
        "second client acquired a held key"
    );
    contended(&**b.backend(), &k, "first client holds it").await?;
    ga.release().await?;
    let gb = b
        .try_lock(&k)
        .await?
        .context("key not free after release")?;
    gb.release().await?;
    Ok(())
}

/// Exclusion under load: 8 clients on separate connections increment a
/// shared counter with a non-atomic read-modify-write inside the lock.
pub async fn exclusion_shared_counter(h: &dyn Harness) -> Result<()> {
    const CLIENTS: usize = 8;
    const ROUNDS: u64 = 20;
    let k = key("exclusion_shared_counter", "counter");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlap = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let locker = Locker::from_arc(h.client().await);
        let (k, counter, inside, overlap) =
            (k.clone(), counter.clone(), inside.clone(), overlap.clone());
        tasks.push(tokio::spawn(async move {
            let opts = long().wait_for(Duration::from_secs(60));
            for _ in 0..ROUNDS {
                let g = locker.lock_with(&k, &opts).await?;
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlap.store(true, Ordering::SeqCst);
                }
                let v = counter.load(Ordering::SeqCst);
                let pause = rand::rng().random_range(0..400);
                tokio::time::sleep(Duration::from_micros(pause)).await;
                counter.store(v + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                g.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    ensure!(
        !overlap.load(Ordering::SeqCst),
        "two clients were inside the lock at once"
    );
    let total = counter.load(Ordering::SeqCst);
    ensure!(
        total == CLIENTS as u64 * ROUNDS,
        "lost increments: {total} of {}",
        CLIENTS as u64 * ROUNDS
    );
    Ok(())
}

/// `try_lock` and a no-wait `lock` answer at once when the key is held.
pub async fn try_lock_never_waits(h: &dyn Harness) -> Result<()> {
    let k = key("try_lock_never_waits", "k");
    let (a, b) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    let ga = a.lock_with(&k, &long()).await?;
    let start = Instant::now();
    ensure!(b.try_lock(&k).await?.is_none(), "try_lock got a held key");
    let err = b
        .lock_with(&k, &long().no_wait())
        .await
        .err()
        .context("no-wait lock got a held key")?;
    ensure!(
        err.kind() == ErrorKind::Timeout,
        "no-wait on a held key should be Timeout, got {err}"
    );
    // Far below any wait or TTL: the point is that it did not wait for the holder.
    ensure!(
        start.elapsed() < Duration::from_secs(5),
        "no-wait calls took {:?}",
        start.elapsed()
    );
    ga.release().await?;
    Ok(())
}

/// A waiter gets the lock after the holder releases, within its wait.
pub async fn wait_acquires_after_release(h: &dyn Harness) -> Result<()> {
    let k = key("wait_acquires_after_release", "k");
    let (a, b) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    let ga = a.lock_with(&k, &long()).await?;
    let fence_a = ga.fence();
    let kb = k.clone();
    let waiter = tokio::spawn(async move {
        b.lock_with(&kb, &long().wait_for(Duration::from_secs(20)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    ensure!(
        !waiter.is_finished(),
        "waiter acquired while the key was held"
    );
    ga.release().await?;
    let gb = waiter
        .await?
        .context("waiter did not get the released lock")?;
    if let (Some(fa), Some(fb)) = (fence_a, gb.fence()) {
        ensure!(
            fb > fa,
            "fence did not increase on hand-off: {fa} then {fb}"
        );
    }
    gb.release().await?;
    Ok(())
}

/// A bounded wait on a key that stays held ends in `Timeout`, near the deadline.
pub async fn wait_times_out_near_deadline(h: &dyn Harness) -> Result<()> {
    let k = key("wait_times_out_near_deadline", "k");
    let (a, b) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    let ga = a.lock_with(&k, &long()).await?;
    let wait = Duration::from_millis(700);
    let start = Instant::now();
    let err = b
        .lock_with(&k, &long().wait_for(wait))
        .await
        .err()
        .context("waiter got a held key")?;
    let took = start.elapsed();
    ensure!(
        err.kind() == ErrorKind::Timeout,
        "expected Timeout, got {err}"
    );
    ensure!(took >= wait, "gave up early, after {took:?} of {wait:?}");
    ensure!(
        took < wait + Duration::from_secs(3),
        "gave up late, after {took:?} of {wait:?}"
    );
    ga.release().await?;
    Ok(())
}

/// A release is seen promptly by a waiter even when the holder's lease and
/// the poll ceiling are long: by notification where the store has it, else
/// by backoff capped at `max_poll`.
pub async fn waiter_is_woken_by_release(h: &dyn Harness) -> Result<()> {
    let k = key("waiter_is_woken_by_release", "k");
    let client_b = h.client().await;
    let notify = client_b.capabilities().notify;
    let (a, b) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(client_b),
    );
    let ga = a.lock_with(&k, &long()).await?;
    // With notification the fallback wake is the holder's remaining lease
    // (about a minute), so only the release message can wake the waiter in time.
    let mut opts = long().wait_for(Duration::from_secs(30));
    if !notify {
        opts.max_poll = Duration::from_millis(250);
    }
    let kb = k.clone();
    let waiter = tokio::spawn(async move {
        let g = b.lock_with(&kb, &opts).await;
        (g, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    ga.release().await?;
    let (g, got) = waiter.await?;
    let g = g.context("waiter did not get the lock")?;
    let lag = got.saturating_duration_since(released);
    ensure!(
        lag < Duration::from_secs(5),
        "waiter took {lag:?} to notice the release"
    );
    g.release().await?;
    Ok(())
}

/// Dropping an acquire future, while waiting or mid-request, leaves nothing held.
pub async fn cancelled_acquire_leaves_nothing_held(h: &dyn Harness) -> Result<()> {
    let k = key("cancelled_acquire_leaves_nothing_held", "k");
    let (a, b, c) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    // Dropped while waiting for a holder.
    let ga = a.lock_with(&k, &long()).await?;
    let r = tokio::time::timeout(Duration::from_millis(150), b.lock_with(&k, &long())).await;
    ensure!(r.is_err(), "waiter should still be waiting");
    ga.release().await?;
    if c.capabilities().fair {
        // A fair store may hand the key to the dropped waiter before its
        // place is given up, which happens in the background, at once.
        eventually_free(
            &c,
            &k,
            Duration::from_secs(2),
            "the holder released and the only waiter was dropped",
        )
        .await?;
    } else {
        let gc = c
            .try_lock(&k)
            .await?
            .context("key held after the holder released and the waiter was dropped")?;
        gc.release().await?;
    }
    // Dropped at assorted points of an uncontended acquire.
    for i in 0..20u64 {
        let cut = Duration::from_micros(i * i * 40);
        match tokio::time::timeout(cut, b.lock_with(&k, &long())).await {
            Ok(g) => g?.release().await?,
            Err(_) => {
                eventually_free(
                    &c,
                    &k,
                    Duration::from_secs(5),
                    "an acquire dropped mid-flight left the lock held",
                )
                .await?
            }
        }
    }
    Ok(())
}

/// An acquire dropped after the store granted it, while the reply is still
/// on its way, is undone when the reply arrives: nobody holds a guard for
/// that grant, so it must not keep the key until its TTL.
pub async fn cancelled_acquire_with_a_grant_in_flight_is_undone(h: &dyn Harness) -> Result<()> {
    let k = key("cancelled_acquire_with_a_grant_in_flight_is_undone", "k");
    let stall = Stall::new(h.client().await);
    let b = Locker::from_arc(stall.clone());
    let c = Locker::from_arc(h.client().await);
    let opts = long();
    tokio::select! {
        r = b.lock_with(&k, &opts) => {
            bail!("the stalled acquire returned ({:?}) before its reply was let through", r.map(|_| ()))
        }
        // The acquire future is dropped here, its grant in flight.
        () = stall.granted() => {}
    }
    contended(
        c.backend().as_ref(),
        &k,
        "the store granted the stalled acquire",
    )
    .await?;
    stall.open();
    eventually_free(
        &c,
        &k,
        Duration::from_secs(5),
        "an acquire dropped with its grant in flight left the lock held",
    )
    .await
}

/// Until its lease is about to run out, an unrenewed lock stays exclusive:
/// another client trying all along never gets the key before 90% of the TTL
/// has passed (counted from before the holder's request was sent).
pub async fn still_exclusive_near_expiry(h: &dyn Harness) -> Result<()> {
    let k = key("still_exclusive_near_expiry", "k");
    let a = Locker::from_arc(h.client().await);
    let b = h.client().await;
    let ttl = short_ttl(a.capabilities()).max(Duration::from_secs(1));
    let sent = Instant::now();
    let g = a
        .lock_with(&k, &LockOptions::new().ttl(ttl).auto_renew(false))
        .await?;
    let until = sent + ttl.mul_f64(0.9);
    let mut tries = 0;
    while Instant::now() < until {
        let owner = OwnerToken::generate();
        if let Acquire::Acquired(_) = b.try_acquire(&k, &owner, LONG_TTL).await? {
            let early = until.saturating_duration_since(Instant::now());
            b.release(&k, &owner).await?;
            bail!(
                "another client took the key {early:?} before 90% of the holder's TTL had passed"
            );
        }
        tries += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ensure!(
        tries >= 10,
        "only {tries} attempts were made; the case proves nothing"
    );
    let _ = g.release().await;
    Ok(())
}

/// Every waiter gets its turn; on a fair store, in arrival order, and no
/// releaser (the first holder, then each waiter in turn) can take the key
/// back ahead of those still queued.
pub async fn fair_waiters_served_in_order(h: &dyn Harness) -> Result<()> {
    const WAITERS: usize = 4;
    let k = key("fair_waiters_served_in_order", "k");
    let a = Locker::from_arc(h.client().await);
    let fair = a.capabilities().fair;
    let ga = a.lock_with(&k, &long()).await?;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let barged = Arc::new(AtomicUsize::new(0));
    let mut waiters = Vec::new();
    for id in 0..WAITERS {
        let l = Locker::from_arc(h.client().await);
        let (k, order, barged) = (k.clone(), order.clone(), barged.clone());
        waiters.push(tokio::spawn(async move {
            let g = l
                .lock_with(&k, &long().wait_for(Duration::from_secs(30)))
                .await?;
            order.lock().unwrap_or_else(|e| e.into_inner()).push(id);
            tokio::time::sleep(Duration::from_millis(20)).await;
            g.release().await?;
            let served = order.lock().unwrap_or_else(|e| e.into_inner()).len();
            if served < WAITERS {
                if let Some(g) = l.try_lock(&k).await? {
                    barged.fetch_add(1, Ordering::SeqCst);
                    g.release().await?;
                }
            }
            anyhow::Ok(())
        }));
        // Time for this waiter to queue before the next one arrives.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    ga.release().await?;
    if let Some(g) = a.try_lock(&k).await? {
        barged.fetch_add(1, Ordering::SeqCst);
        g.release().await?;
    }
    for w in waiters {
        w.await??;
    }
    let order = order.lock().unwrap_or_else(|e| e.into_inner()).clone();
    ensure!(
        order.len() == WAITERS,
        "only {order:?} of {WAITERS} waiters got the key"
    );
    if fair {
        let barged = barged.load(Ordering::SeqCst);
        ensure!(
            barged == 0,
            "a releaser took the key back ahead of queued waiters {barged} times"
        );
        ensure!(
            order == (0..WAITERS).collect::<Vec<_>>(),
            "waiters were served in order {order:?}, not in arrival order"
        );
    }
    Ok(())
}

/// A lease not renewed expires, and another client takes the key then, not before.
pub async fn expired_lease_can_be_taken(h: &dyn Harness) -> Result<()> {
    let k = key("expired_lease_can_be_taken", "k");
    let (a, b) = (h.client().await, h.client().await);
    let ttl = short_ttl(&a.capabilities());
    acquired(&*a, &k, &OwnerToken::generate(), ttl).await?;
    tokio::time::sleep(ttl / 3).await;
    contended(&*b, &k, "lease not yet expired").await?;
    end_hold(h, &a, ttl).await?;
    acquired(&*b, &k, &OwnerToken::generate(), LONG_TTL)
        .await
        .context("expired lease was not taken over")?;
    Ok(())
}

/// A holder that vanishes (client dropped, nothing released) frees the key at TTL.
pub async fn abandoned_lock_frees_at_ttl(h: &dyn Harness) -> Result<()> {
    let k = key("abandoned_lock_frees_at_ttl", "k");
    let caps;
    let ttl;
    {
        let a = Locker::from_arc(h.client().await);
        caps = a.capabilities().clone();
        ttl = short_ttl(&caps);
        let g = a.lock_with(&k, &LockOptions::new().ttl(ttl)).await?;
        // Simulates a process killed mid-section: no release, no renewal.
        let _ = g.leak();
    }
    let b = Locker::from_arc(h.client().await);
    if caps.binding == Binding::Lease {
        // A session-bound lock may go at once: its session closed with the client.
        ensure!(
            b.try_lock(&k).await?.is_none(),
            "abandoned lock freed before its TTL"
        );
        tokio::time::sleep(past_expiry(&caps, ttl)).await;
    }
    eventually_free(
        &b,
        &k,
        Duration::from_secs(2),
        "abandoned lock not freed at TTL",
    )
    .await
}

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
        a.renew(&k, &owner, ttl * 4).await? == Renew::Renewed,
        "owner could not renew"
    );
    ensure!(
        b.renew(&k, &OwnerToken::generate(), LONG_TTL).await? == Renew::NotHeld,
        "a stranger renewed someone else's lock"
    );
    tokio::time::sleep(past_expiry(&caps, ttl)).await;
    contended(&*b, &k, "renewed past its first TTL").await?;
    ensure!(
        a.release(&k, &owner).await? == Release::Freed,
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

/// After its lease expired and someone else took the key, the old owner can
/// neither renew nor release the new holder's lock, and is told so.
pub async fn stale_owner_cannot_renew_or_release(h: &dyn Harness) -> Result<()> {
    let k = key("stale_owner_cannot_renew_or_release", "k");
    let (a, b, c) = (h.client().await, h.client().await, h.client().await);
    let caps = a.capabilities();
    let ttl = short_ttl(&caps);
    let stale = OwnerToken::generate();
    acquired(&*a, &k, &stale, ttl).await?;
    end_hold(h, &a, ttl).await?;
    let fresh = OwnerToken::generate();
    acquired(&*b, &k, &fresh, LONG_TTL).await?;
    ensure!(
        a.renew(&k, &stale, LONG_TTL).await? == Renew::NotHeld,
        "stale owner renewed"
    );
    ensure!(
        a.release(&k, &stale).await? == Release::NotHeld,
        "stale owner released"
    );
    contended(&*c, &k, "the new holder still has it").await?;
    ensure!(
        b.release(&k, &fresh).await? == Release::Freed,
        "new holder could not release"
    );
    Ok(())
}

/// Release is owner-checked and idempotent: a stranger's release changes
/// nothing, a second release reports `NotHeld`.
pub async fn release_checks_owner(h: &dyn Harness) -> Result<()> {
    let k = key("release_checks_owner", "k");
    let (a, b) = (h.client().await, h.client().await);
    let owner = OwnerToken::generate();
    acquired(&*a, &k, &owner, LONG_TTL).await?;
    ensure!(
        b.release(&k, &OwnerToken::generate()).await? == Release::NotHeld,
        "a stranger's release was accepted"
    );
    contended(&*b, &k, "only the owner may release").await?;
    ensure!(
        a.release(&k, &owner).await? == Release::Freed,
        "owner's release failed"
    );
    ensure!(
        a.release(&k, &owner).await? == Release::NotHeld,
        "double release did not report NotHeld"
    );
    ensure!(
        b.release(&k, &OwnerToken::generate()).await? == Release::NotHeld,
        "release of a free key did not report NotHeld"
    );
    acquired(&*b, &k, &OwnerToken::generate(), LONG_TTL).await?;
    Ok(())
}

/// A guard dropped without release frees the lock in the background, long
/// before its TTL.
pub async fn dropped_guard_releases_in_background(h: &dyn Harness) -> Result<()> {
    let k = key("dropped_guard_releases_in_background", "k");
    let (a, b) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    let g = a.lock_with(&k, &long()).await?;
    drop(g);
    eventually_free(
        &b,
        &k,
        Duration::from_secs(5),
        "a dropped guard did not release",
    )
    .await
}

/// Cut off from the store, a holder's lost signal fires by its local
/// deadline, and before anyone else can take the key.
pub async fn lost_signal_fires_before_takeover(h: &dyn Harness) -> Result<()> {
    let k = key("lost_signal_fires_before_takeover", "k");
    let client = h.client().await;
    if client.capabilities().binding == Binding::Session {
        return lost_signal_fires_when_session_ends(h, client, &k).await;
    }
    let link = Partition::new(client);
    let a = Locker::from_arc(link.clone());
    let b = h.client().await;
    let ttl = short_ttl(a.capabilities()).max(Duration::from_secs(1));
    let g = a.lock_with(&k, &LockOptions::new().ttl(ttl)).await?;
    let deadline = g.lease().deadline;
    link.cut();
    let started = Instant::now();
    // Another client keeps trying; record when it first succeeds.
    let kb = k.clone();
    let taken_at = tokio::spawn(async move {
        loop {
            match b.try_acquire(&kb, &OwnerToken::generate(), LONG_TTL).await {
                Ok(Acquire::Acquired(_)) => return Some(Instant::now()),
                _ if started.elapsed() > ttl * 4 => return None,
                _ => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    });
    let reason = tokio::time::timeout(ttl * 3, g.lost())
        .await
        .map_err(|_| anyhow!("lost signal did not fire within 3 TTLs of losing the store"))?;
    let fired = Instant::now();
    ensure!(
        g.is_lost(),
        "lost fired ({reason:?}) but the guard does not say so"
    );
    ensure!(
        fired <= deadline + Duration::from_millis(250),
        "lost fired {:?} after the local deadline",
        fired - deadline
    );
    if let Some(t) = taken_at.await? {
        ensure!(
            t >= fired,
            "another client took the key {:?} before the lost signal fired",
            fired - t
        );
    } else {
        bail!("the key was never freed after its holder was cut off");
    }
    Ok(())
}

/// Session-bound: the server frees the lock the moment the session ends, so
/// the promise is that the holder hears of it within one renewal period.
async fn lost_signal_fires_when_session_ends(
    h: &dyn Harness,
    client: Arc<dyn LockBackend>,
    k: &LockKey,
) -> Result<()> {
    let a = Locker::from_arc(client.clone());
    let ttl = Duration::from_secs(1);
    let g = a.lock_with(k, &LockOptions::new().ttl(ttl)).await?;
    h.end_sessions(&client).await?;
    let ended = Instant::now();
    let reason = tokio::time::timeout(ttl, g.lost())
        .await
        .map_err(|_| anyhow!("lost signal did not fire within a TTL of the session ending"))?;
    ensure!(
        g.is_lost(),
        "lost fired ({reason:?}) but the guard does not say so"
    );
    let lag = ended.elapsed();
    ensure!(
        lag <= ttl / 3 + Duration::from_millis(300),
        "lost fired {lag:?} after the session ended"
    );
    let b = Locker::from_arc(h.client().await);
    eventually_free(
        &b,
        k,
        Duration::from_secs(5),
        "the ended session's lock was not freed",
    )
    .await
}

/// A store that cannot be reached is an `Unavailable` error on every path,
/// never "held by someone else" and never a timeout.
pub async fn unavailable_is_an_error_not_contention(h: &dyn Harness) -> Result<()> {
    let k = key("unavailable_is_an_error_not_contention", "k");
    let down = h.unreachable_client().await;
    let owner = OwnerToken::generate();
    let kind = |r: std::result::Result<(), locksmith_core::Error>| r.err().map(|e| e.kind());
    let want = Some(ErrorKind::Unavailable);
    ensure!(
        kind(down.try_acquire(&k, &owner, LONG_TTL).await.map(|_| ())) == want,
        "try_acquire on a down store"
    );
    // A session-bound client knows without asking that it holds nothing, so
    // it may say NotHeld; nobody may claim a release or renewal succeeded.
    let session = down.capabilities().binding == Binding::Session;
    let r = down.release(&k, &owner).await;
    ensure!(
        r.as_ref().err().map(|e| e.kind()) == want
            || (session && matches!(r, Ok(Release::NotHeld))),
        "release on a down store: {r:?}"
    );
    let r = down.renew(&k, &owner, LONG_TTL).await;
    ensure!(
        r.as_ref().err().map(|e| e.kind()) == want || (session && matches!(r, Ok(Renew::NotHeld))),
        "renew on a down store: {r:?}"
    );
    let l = Locker::from_arc(down);
    ensure!(
        kind(l.try_lock(&k).await.map(|_| ())) == want,
        "try_lock on a down store"
    );
    let start = Instant::now();
    let waited = l
        .lock_with(&k, &long().wait_for(Duration::from_secs(20)))
        .await
        .map(|_| ());
    ensure!(kind(waited) == want, "lock with a wait on a down store");
    ensure!(
        start.elapsed() < Duration::from_secs(15),
        "lock on a down store waited instead of failing"
    );
    Ok(())
}

/// Keys differing only in case are different locks.
pub async fn keys_are_case_sensitive(h: &dyn Harness) -> Result<()> {
    let (a, b) = (h.client().await, h.client().await);
    let upper = key("keys_are_case_sensitive", "Key");
    let lower = key("keys_are_case_sensitive", "key");
    acquired(&*a, &upper, &OwnerToken::generate(), LONG_TTL).await?;
    acquired(&*b, &lower, &OwnerToken::generate(), LONG_TTL)
        .await
        .context("\"key\" collided with \"Key\"")?;
    Ok(())
}

/// Awkward keys are accepted, and no two of them share a lock.
pub async fn tricky_keys_are_distinct(h: &dyn Harness) -> Result<()> {
    let (a, b) = (h.client().await, h.client().await);
    let base = key("tricky_keys_are_distinct", "").as_str().to_owned();
    let max_tail = MAX_KEY_LEN - base.len();
    let long_x = "x".repeat(max_tail);
    let mut long_y = "x".repeat(max_tail - 1);
    long_y.push('y');
    let names: Vec<String> = vec![
        "/".into(),
        "a/b".into(),
        "a b".into(),
        "a b ".into(),
        "'".into(),
        "\"".into(),
        "''".into(),
        "..".into(),
        "../..".into(),
        "\\".into(),
        "%".into(),
        "_".into(),
        "a%".into(),
        "a_".into(),
        "\t\u{1}\u{7f}".into(),
        "\n".into(),
        "🔒".into(),
        "e\u{301}".into(),
        "\u{e9}".into(),
        "Robert'); DROP TABLE locks;--".into(),
        "*".into(),
        "?".into(),
        "{tag}".into(),
        long_x,
        long_y,
    ];
    let mut keys = Vec::new();
    for n in &names {
        let k = LockKey::new(format!("{base}{n}")).with_context(|| format!("key {n:?} refused"))?;
        keys.push(k);
    }
    for k in &keys {
        acquired(&*a, k, &OwnerToken::generate(), LONG_TTL)
            .await
            .with_context(|| format!("{k:?} collided with another key"))?;
    }
    for k in &keys {
        contended(&*b, k, "acquired above").await?;
    }
    Ok(())
}

/// Bad input is a typed error, before anything reaches the store.
pub async fn invalid_input_is_typed(h: &dyn Harness) -> Result<()> {
    let l = Locker::from_arc(h.client().await);
    let caps = l.capabilities().clone();
    let e = l.try_lock("").await.err().context("empty key accepted")?;
    ensure!(e.kind() == ErrorKind::InvalidKey, "empty key: {e}");
    let e = l
        .try_lock("x".repeat(MAX_KEY_LEN + 1))
        .await
        .err()
        .context("oversized key accepted")?;
    ensure!(e.kind() == ErrorKind::InvalidKey, "oversized key: {e}");
    let k = key("invalid_input_is_typed", "k");
    let mut bad = vec![Duration::ZERO, MAX_TTL + Duration::from_secs(1)];
    if caps.min_ttl > Duration::from_millis(1) {
        bad.push(caps.min_ttl / 2);
    }
    for ttl in bad {
        let e = l.lock_with(&k, &LockOptions::new().ttl(ttl)).await.err();
        let e = e.with_context(|| format!("TTL {ttl:?} accepted"))?;
        ensure!(e.kind() == ErrorKind::InvalidOptions, "TTL {ttl:?}: {e}");
    }
    ensure!(
        l.try_lock(&k).await?.is_some(),
        "the key is free after refused attempts"
    );
    Ok(())
}

/// The same owner re-enters a key it holds; the key frees only when every
/// hold is released, and other owners are excluded throughout.
pub async fn reentrant_same_owner(h: &dyn Harness) -> Result<()> {
    let k = key("reentrant_same_owner", "k");
    let a = Locker::from_arc(h.client().await);
    let b = h.client().await;
    let me = OwnerToken::generate();
    let outer = a.lock_as(&k, &long(), &me).await?;
    let inner = a
        .lock_as(&k, &long().no_wait(), &me)
        .await
        .context("owner could not re-enter")?;
    ensure!(
        outer.holds() == 1 && inner.holds() == 2,
        "holds {} then {}",
        outer.holds(),
        inner.holds()
    );
    ensure!(
        inner.fence() == outer.fence(),
        "re-entry changed the fencing token"
    );
    contended(&*b, &k, "held twice").await?;
    inner.release().await?;
    contended(&*b, &k, "one hold remains").await?;
    outer.release().await?;
    acquired(&*b, &k, &OwnerToken::generate(), LONG_TTL)
        .await
        .context("free after the last hold")?;
    Ok(())
}

/// Another client reads a lock's status without changing it: free, then
/// held with its holds, fence and lease left, then free again.
pub async fn status_reads_without_changing(h: &dyn Harness) -> Result<()> {
    let k = key("status_reads_without_changing", "k");
    let reader = Locker::from_arc(h.client().await);
    let holder = Locker::from_arc(h.client().await);
    let caps = reader.capabilities().clone();
    let s = reader.status(&k).await?;
    ensure!(!s.held && s.holds == 0, "a free key reads as {s:?}");
    let me = OwnerToken::generate();
    let guard = holder.lock_as(&k, &long(), &me).await?;
    let s = reader.status(&k).await?;
    ensure!(s.held && s.holds == 1, "a held key reads as {s:?}");
    if caps.fencing {
        ensure!(
            s.fence == guard.fence(),
            "status fence {:?}, grant {:?}",
            s.fence,
            guard.fence()
        );
    }
    if caps.binding == Binding::Lease {
        let left = s
            .remaining
            .ok_or_else(|| anyhow!("a lease store reports no lease left"))?;
        ensure!(
            left > Duration::ZERO && left <= LONG_TTL,
            "lease left {left:?} of {LONG_TTL:?}"
        );
    }
    if caps.binding == Binding::Lease {
        // Stores with leases count re-entrant holds.
        let again = holder.lock_as(&k, &long().no_wait(), &me).await?;
        let s = reader.status(&k).await?;
        ensure!(s.held && s.holds == 2, "held twice reads as {s:?}");
        again.release().await?;
    }
    // Reading changed nothing: still held, and only the holder frees it.
    contended(&**reader.backend(), &k, "after status reads").await?;
    guard.release().await?;
    let s = reader.status(&k).await?;
    ensure!(!s.held, "a released key reads as {s:?}");
    Ok(())
}

/// Fencing tokens strictly increase across grants, owners, release and expiry
/// (or are absent where the backend does not offer them).
pub async fn fencing_strictly_increases(h: &dyn Harness) -> Result<()> {
    let k = key("fencing_strictly_increases", "k");
    let (a, b) = (h.client().await, h.client().await);
    let caps = a.capabilities();
    let mut fences = Vec::new();
    for i in 0..6 {
        let c = if i % 2 == 0 { &a } else { &b };
        let owner = OwnerToken::generate();
        fences.push(acquired(&**c, &k, &owner, LONG_TTL).await?.fence);
        c.release(&k, &owner).await?;
    }
    let ttl = short_ttl(&caps);
    fences.push(acquired(&*a, &k, &OwnerToken::generate(), ttl).await?.fence);
    end_hold(h, &a, ttl).await?;
    fences.push(
        acquired(&*b, &k, &OwnerToken::generate(), LONG_TTL)
            .await?
            .fence,
    );
    if !caps.fencing {
        ensure!(
            fences.iter().all(Option::is_none),
            "backend without fencing returned tokens"
        );
        return Ok(());
    }
    let tokens: Vec<u64> = fences
        .iter()
        .map(|f| {
            f.map(|t| t.0)
                .ok_or_else(|| anyhow!("a grant carried no fencing token"))
        })
        .collect::<Result<_>>()?;
    ensure!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens not strictly increasing: {tokens:?}"
    );
    Ok(())
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
        if let Acquire::Acquired(_) = client.try_acquire(&elsewhere, &owner, LONG_TTL).await? {
            client.release(&elsewhere, &owner).await?;
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

/// Names locked once each, then released, leave no state behind beyond the
/// store's stated retention; nor do holders whose leases ran out (or whose
/// sessions ended) without a release. Per-entity locking (`order:81723`…)
/// must not make the lock library the store's biggest tenant.
pub async fn store_state_is_bounded(h: &dyn Harness) -> Result<()> {
    const NAMES: usize = 10_000;
    const HELD: usize = 10;
    /// Room for bookkeeping a store keeps beside the locks themselves.
    const SLACK: u64 = 8;
    let case = "store_state_is_bounded";
    let client = h.client().await;
    let caps = client.capabilities();
    let prefix = key(case, "").as_str().to_owned();
    let held_owner = OwnerToken::generate();
    for i in 0..HELD {
        acquired(
            &*client,
            &key(case, &format!("held/{i}")),
            &held_owner,
            LONG_TTL,
        )
        .await?;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let workers = (0..16).map(|_| {
        let (client, next) = (client.clone(), next.clone());
        async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= NAMES {
                    return Ok::<(), anyhow::Error>(());
                }
                let k = key(case, &format!("once/{i}"));
                let owner = OwnerToken::generate();
                acquired(&*client, &k, &owner, LONG_TTL).await?;
                ensure!(
                    client.release(&k, &owner).await? == Release::Freed,
                    "release of {k:?} did not free it"
                );
            }
        }
    });
    futures::future::try_join_all(workers).await?;
    let slack = Duration::from_secs(5);
    collected(
        h,
        &*client,
        &prefix,
        HELD as u64 + SLACK,
        caps.retention + slack,
    )
    .await
    .context("after releasing 10,000 names")?;
    for i in 0..HELD {
        client
            .release(&key(case, &format!("held/{i}")), &held_owner)
            .await?;
    }

    // Holders that vanish without releasing: leases run out, or sessions end.
    let gone = h.client().await;
    let ttl = short_ttl(&caps);
    let owner = OwnerToken::generate();
    for i in 0..20 {
        acquired(&*gone, &key(case, &format!("abandoned/{i}")), &owner, ttl).await?;
    }
    end_hold(h, &gone, ttl).await?;
    drop(gone);
    collected(h, &*client, &prefix, SLACK, caps.retention + slack)
        .await
        .context("after 20 holders vanished without releasing")?;
    Ok(())
}

/// A name whose state was collected and is then locked again gets a fence
/// above the one before: fences rise through the collection too.
pub async fn fencing_rises_after_state_is_collected(h: &dyn Harness) -> Result<()> {
    let case = "fencing_rises_after_state_is_collected";
    let k = key(case, "k");
    let client = h.client().await;
    let caps = client.capabilities();
    let owner = OwnerToken::generate();
    let first = acquired(&*client, &k, &owner, LONG_TTL).await?.fence;
    ensure!(
        client.release(&k, &owner).await? == Release::Freed,
        "release did not free the key"
    );
    collected(
        h,
        &*client,
        k.as_str(),
        0,
        caps.retention + Duration::from_secs(5),
    )
    .await?;
    let second = acquired(&*h.client().await, &k, &OwnerToken::generate(), LONG_TTL)
        .await?
        .fence;
    match (caps.fencing, first, second) {
        (false, None, None) => Ok(()),
        (true, Some(a), Some(b)) if a < b => Ok(()),
        (true, Some(a), Some(b)) => {
            bail!(
                "fence went from {} to {} across the collection of the name's state",
                a.0,
                b.0
            )
        }
        _ => bail!(
            "fences {first:?} then {second:?} do not match fencing = {}",
            caps.fencing
        ),
    }
}

/// `lock_all` is all or nothing: if one key stays held, every key it took is
/// released before it returns.
pub async fn multi_lock_all_or_nothing(h: &dyn Harness) -> Result<()> {
    let [k1, k2, k3] = ["k1", "k2", "k3"].map(|n| key("multi_lock_all_or_nothing", n));
    let (a, b, c) = (
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
        Locker::from_arc(h.client().await),
    );
    let g2 = a.lock_with(&k2, &long()).await?;
    let e = b
        .lock_all(
            [&k3, &k1, &k2],
            &long().wait_for(Duration::from_millis(400)),
        )
        .await
        .err()
        .context("lock_all got a held key")?;
    ensure!(e.kind() == ErrorKind::Timeout, "expected Timeout, got {e}");
    for k in [&k1, &k3] {
        let g = c
            .try_lock(k)
            .await?
            .with_context(|| format!("{k:?} left held by a failed lock_all"))?;
        g.release().await?;
    }
    g2.release().await?;
    let all = b.lock_all([&k3, &k1, &k2, &k1], &long().no_wait()).await?;
    let got: Vec<&LockKey> = all.guards().iter().map(|g| g.key()).collect();
    ensure!(got == vec![&k1, &k2, &k3], "lock_all order {got:?}");
    ensure!(c.try_lock(&k2).await?.is_none(), "lock_all did not hold k2");
    all.release().await?;
    Ok(())
}

/// Two clients locking the same keys in opposite orders never deadlock.
pub async fn multi_lock_opposite_orders_do_not_deadlock(h: &dyn Harness) -> Result<()> {
    let [ka, kb] = ["a", "b"].map(|n| key("multi_lock_opposite_orders_do_not_deadlock", n));
    let mut tasks = Vec::new();
    for order in [[ka.clone(), kb.clone()], [kb.clone(), ka.clone()]] {
        let l = Locker::from_arc(h.client().await);
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let g = l
                    .lock_all(order.clone(), &long().wait_for(Duration::from_secs(20)))
                    .await?;
                tokio::task::yield_now().await;
                g.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}
