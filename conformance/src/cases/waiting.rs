//! Waiting: `try_acquire` makes one attempt and answers at once; a waiting
//! acquire gets the lock once it is released (by notification where the
//! store has one), or ends in `Timeout` near its deadline; waiters on a
//! fair store are served in arrival order; and an acquire dropped at any
//! point leaves nothing held.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use lockwright_core::backend::LockBackend;
use lockwright_core::{ErrorKind, Locker};

use super::{contended, eventually_free, key, long};
use crate::faults::Stall;
use crate::Harness;

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
        err.kind() == ErrorKind::Busy,
        "no-wait on a held key should be Busy, got {err}"
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
