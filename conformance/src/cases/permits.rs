//! Permits: semaphores and read-write locks keep the mutex's promises for
//! more than one holder. At most N holders of a semaphore at once, across
//! clients; an expired permit comes back; every holder agrees on N (another
//! N is `InvalidOptions` naming both); only a permit's owner releases or
//! renews it; readers share, a writer excludes readers and writers, and a
//! waiting writer stops new readers; a writer downgrades, a reader never
//! upgrades; an acquire given up leaves neither a permit nor a writer's
//! mark behind; and the store keeps no state for names nobody holds. A
//! store without permits or shared holds must say `Unsupported`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use lockwright_core::backend::{
    renew_one, HoldId, HoldKind, LockBackend, Release, Renew, RenewRequest, MARK_LIFE,
};
use lockwright_core::{
    Claim, ErrorKind, LockGuard, LockKey, LockOptions, Locker, OwnerToken, ReadWriteLock, Semaphore,
};
use rand::Rng;

use super::{acquired_as, collected, end_hold, key, long, short_ttl, LONG_TTL};
use crate::faults::Stall;
use crate::Harness;

/// A semaphore of `n` on `k` for a new client, or `None` after checking
/// that a store without permits refuses it with `Unsupported`.
async fn semaphore(h: &dyn Harness, k: &LockKey, n: u32) -> Result<Option<Semaphore>> {
    let locker = Locker::from_arc(h.client().await);
    match locker.semaphore(k, n) {
        Ok(s) => Ok(Some(s)),
        Err(e) if !locker.capabilities().permits && e.kind() == ErrorKind::Unsupported => Ok(None),
        Err(e) => bail!("a semaphore of {n} on a store with permits: {e}"),
    }
}

/// A read-write lock on `k` for a new client, or `None` after checking
/// that a store without shared holds refuses it with `Unsupported`.
async fn rwlock(h: &dyn Harness, k: &LockKey) -> Result<Option<ReadWriteLock>> {
    let locker = Locker::from_arc(h.client().await);
    match locker.rwlock(k) {
        Ok(l) => Ok(Some(l)),
        Err(e) if !locker.capabilities().shared && e.kind() == ErrorKind::Unsupported => Ok(None),
        Err(e) => bail!("a read-write lock on a store with shared holds: {e}"),
    }
}

fn now() -> LockOptions {
    long().no_wait()
}

fn waiting(d: Duration) -> LockOptions {
    long().wait_for(d)
}

/// Counts who is inside at once, and the most ever seen.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Inside {
    fn enter(&self) -> usize {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(n, Ordering::SeqCst);
        n
    }
    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// N+1 separate clients never hold N+1 permits at once, and N of them do
/// hold N at once; each grant's fence is above the one before, where the
/// store has fences; the status counts the holders and N.
pub async fn n_plus_one_clients_never_hold_n_plus_one_permits(h: &dyn Harness) -> Result<()> {
    const N: u32 = 3;
    let k = key("n_plus_one_clients_never_hold_n_plus_one_permits", "k");
    let mut sems = Vec::new();
    for _ in 0..=N {
        match semaphore(h, &k, N).await? {
            Some(s) => sems.push(s),
            None => return Ok(()),
        }
    }
    let fencing = h.client().await.capabilities().fencing;
    let mut held = Vec::new();
    for (i, s) in sems.iter().take(N as usize).enumerate() {
        let g = s
            .try_acquire_with(&now())
            .await?
            .with_context(|| format!("client {i} did not get one of {N} free permits"))?;
        if fencing {
            let (prev, this) = (held.last().and_then(LockGuard::fence), g.fence());
            ensure!(
                this.is_some() && this > prev,
                "permit {i}'s fence {this:?} is not above {prev:?}"
            );
        }
        held.push(g);
    }
    if let Some(extra) = sems[N as usize].try_acquire_with(&now()).await? {
        bail!("client {N} got a permit while {N} other clients held all {N}: {extra:?}");
    }
    let status = sems[0].status().await?;
    ensure!(
        status.holder_count() == N as usize || status.holders.is_empty(),
        "the status lists {} holders, not {N}",
        status.holders.len()
    );
    ensure!(
        status.permits.is_none() || status.permits == Some(N),
        "the status says {:?} permits, not {N}",
        status.permits
    );
    held.remove(0).release().await?;
    let last = sems[N as usize]
        .try_acquire_with(&now())
        .await?
        .context("a released permit was not free")?;
    held.push(last);
    for g in held {
        g.release().await?;
    }

    // Under load: 2N clients taking and giving back permits.
    let inside = Arc::new(Inside::default());
    let mut tasks = Vec::new();
    for _ in 0..2 * N {
        let s = semaphore(h, &k, N)
            .await?
            .context("a client without permits")?;
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..8 {
                let g = s.acquire_with(&waiting(Duration::from_secs(60))).await?;
                inside.enter();
                let pause = rand::rng().random_range(0..3000);
                tokio::time::sleep(Duration::from_micros(pause)).await;
                inside.leave();
                g.release().await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let most = inside.most.load(Ordering::SeqCst);
    ensure!(
        most <= N as usize,
        "{most} clients held permits at once, of {N}"
    );
    Ok(())
}

/// A permit whose holder vanished (its lease ran out, or its session
/// ended) comes back: the others are not one permit short for ever.
pub async fn expired_permit_is_reclaimed(h: &dyn Harness) -> Result<()> {
    const N: u32 = 2;
    let k = key("expired_permit_is_reclaimed", "k");
    let Some(other) = semaphore(h, &k, N).await? else {
        return Ok(());
    };
    let gone = h.client().await;
    let ttl = short_ttl(&gone.capabilities());
    for _ in 0..N {
        let kind = HoldKind::of_claim(Claim::permits(N)?);
        let hold = HoldId::new(k.clone(), OwnerToken::generate(), kind);
        acquired_as(&*gone, &hold, ttl).await?;
    }
    end_hold(h, &gone, ttl).await?;
    drop(gone);
    let mut held = Vec::new();
    for i in 0..N {
        let g = other.try_acquire_with(&now()).await?.with_context(|| {
            format!("permit {i} of {N} was not free after its holder's lease ran out")
        })?;
        held.push(g);
    }
    for g in held {
        g.release().await?;
    }
    Ok(())
}

/// Every holder agrees on N: while a semaphore of 3 is held, a claim of 2
/// (or a mutex's, of 1) on the name is `InvalidOptions` naming both
/// numbers, never a silent grant, and a read hold is `InvalidOptions` too
/// (a name is a semaphore or a read-write lock); once nobody holds it,
/// any N may start.
pub async fn mismatched_permits_are_refused(h: &dyn Harness) -> Result<()> {
    let k = key("mismatched_permits_are_refused", "k");
    let Some(three) = semaphore(h, &k, 3).await? else {
        return Ok(());
    };
    let two = semaphore(h, &k, 2).await?.context("a second client")?;
    let g = three.acquire_with(&now()).await?;
    match two.try_acquire_with(&now()).await {
        Err(e) if e.kind() == ErrorKind::InvalidOptions => {
            let text = e.to_string();
            ensure!(
                text.contains("3 permits") && text.contains("2 permits"),
                "the refusal does not name both numbers: {text}"
            );
        }
        other => bail!(
            "a claim of 2 permits while 3 are kept ended with {:?}, not InvalidOptions",
            other.map(|g| g.is_some())
        ),
    }
    if let Some(readers) = rwlock(h, &k).await? {
        match readers.try_read_with(&now()).await {
            Err(e) if e.kind() == ErrorKind::InvalidOptions => {}
            other => bail!(
                "a read hold on a held semaphore's name ended with {:?}, not InvalidOptions",
                other.map(|g| g.is_some())
            ),
        }
    }
    let mutex = Locker::from_arc(h.client().await);
    match mutex.try_lock_with(&k, &now()).await {
        Err(e) if e.kind() == ErrorKind::InvalidOptions => {}
        other => bail!(
            "a mutex on a held semaphore's name ended with {:?}, not InvalidOptions",
            other.map(|g| g.is_some())
        ),
    }
    g.release().await?;
    let g = two
        .try_acquire_with(&now())
        .await?
        .context("a semaphore of 2 could not start on a name nobody holds")?;
    g.release().await?;
    Ok(())
}

/// How many times [`a_refused_claim_leaves_nothing`] plays its rounds: a
/// trace deleted in the background is met only when the next claim
/// outruns the delete.
const REFUSAL_ROUNDS: usize = 12;

/// A refused claim leaves nothing behind, by the time its refusal is
/// told: right after a claim of 2 permits is refused on a name a mutex
/// holds, another client's mutex claim there is contended (it meets the
/// holder, not the refused claim); right after a mutex's claim is refused
/// on a name a semaphore of 3 holds, another client's permit of 3 there
/// is granted. Each owner asks through a client of its own.
pub async fn a_refused_claim_leaves_nothing(h: &dyn Harness) -> Result<()> {
    let case = "a_refused_claim_leaves_nothing";
    let holder = Locker::from_arc(h.client().await);
    let refused = Locker::from_arc(h.client().await);
    let next = Locker::from_arc(h.client().await);
    if !holder.capabilities().permits {
        return Ok(());
    }
    for round in 0..REFUSAL_ROUNDS {
        let k = key(case, &format!("mutex-{round}"));
        let held = holder
            .try_lock_with(&k, &now())
            .await?
            .context("a mutex on a free name")?;
        match refused.semaphore(&k, 2)?.try_acquire_with(&now()).await {
            Err(e) if e.kind() == ErrorKind::InvalidOptions => {}
            other => bail!(
                "round {round}: a claim of 2 permits on a held mutex's name ended with {:?}, \
                 not InvalidOptions",
                other.map(|g| g.is_some())
            ),
        }
        match next.try_lock_with(&k, &now()).await {
            Ok(None) => {}
            Ok(Some(_)) => bail!("round {round}: a second mutex holder"),
            Err(e) => bail!(
                "round {round}: right after a claim of 2 permits was refused on a held \
                 mutex's name, another client's mutex claim there ended with `{e}`, not \
                 contended: the refused claim was still in the store"
            ),
        }
        held.release().await?;

        let k = key(case, &format!("semaphore-{round}"));
        let held = holder
            .semaphore(&k, 3)?
            .try_acquire_with(&now())
            .await?
            .context("a permit of 3 on a free name")?;
        match refused.try_lock_with(&k, &now()).await {
            Err(e) if e.kind() == ErrorKind::InvalidOptions => {}
            other => bail!(
                "round {round}: a mutex claim on a held semaphore's name ended with {:?}, \
                 not InvalidOptions",
                other.map(|g| g.is_some())
            ),
        }
        match next.semaphore(&k, 3)?.try_acquire_with(&now()).await {
            Ok(Some(g)) => g.release().await?,
            Ok(None) => bail!(
                "round {round}: a permit of 3 with one of 3 held was contended, right \
                 after a mutex claim there was refused"
            ),
            Err(e) => bail!(
                "round {round}: right after a mutex claim was refused on a semaphore's \
                 name, another client's permit of the same N ended with `{e}`: the \
                 refused claim was still in the store"
            ),
        }
        held.release().await?;
    }
    Ok(())
}

/// A permit's owner alone releases or renews it: after its lease ran out,
/// the former owner's release and renewal are `NotHeld`, as is a
/// stranger's release, and neither takes the permit of a live holder.
pub async fn stale_permit_holder_cannot_release_or_renew(h: &dyn Harness) -> Result<()> {
    const N: u32 = 2;
    let k = key("stale_permit_holder_cannot_release_or_renew", "k");
    let Some(others) = semaphore(h, &k, N).await? else {
        return Ok(());
    };
    let live = others.acquire_with(&now()).await?;
    let a = h.client().await;
    let ttl = short_ttl(&a.capabilities());
    let claim = Claim::permits(N)?;
    let stale = HoldId::new(k.clone(), OwnerToken::generate(), HoldKind::of_claim(claim));
    acquired_as(&*a, &stale, ttl).await?;
    end_hold(h, &a, ttl).await?;
    let a = h.client().await;
    ensure!(
        renew_one(&*a, RenewRequest::new(stale.clone(), LONG_TTL)).await? == Renew::NotHeld,
        "a stale permit holder renewed"
    );
    ensure!(
        a.release(&stale).await? == Release::NotHeld,
        "a stale permit holder released"
    );
    let stranger = HoldId {
        owner: OwnerToken::generate(),
        ..stale.clone()
    };
    ensure!(
        a.release(&stranger).await? == Release::NotHeld,
        "a stranger's release of a permit was accepted"
    );
    live.renew()
        .await
        .context("a live permit was lost to a stale holder's or a stranger's release")?;
    let status = others.status().await?;
    ensure!(
        !status.held || status.holder_count() == 1,
        "{} holders listed where one live permit is held",
        status.holder_count()
    );
    live.release().await?;
    Ok(())
}

/// Readers share: readers on separate clients hold at once, and the
/// status shows them as shared holders.
pub async fn readers_share(h: &dyn Harness) -> Result<()> {
    let k = key("readers_share", "k");
    let mut locks = Vec::new();
    for _ in 0..4 {
        match rwlock(h, &k).await? {
            Some(l) => locks.push(l),
            None => return Ok(()),
        }
    }
    let mut readers = Vec::new();
    for (i, l) in locks.iter().take(3).enumerate() {
        readers.push(
            l.try_read_with(&now())
                .await?
                .with_context(|| format!("reader {i} was refused beside other readers"))?,
        );
    }
    let status = locks[0].status().await?;
    ensure!(
        status.holders.is_empty() || (status.holder_count() == 3 && status.is_shared()),
        "the status does not show 3 readers: {status:?}"
    );
    let fourth = locks[3]
        .try_read_with(&now())
        .await?
        .context("a fourth reader was refused beside three")?;
    for r in readers {
        r.release().await?;
    }
    fourth.release().await?;
    Ok(())
}

/// A writer excludes readers and other writers, and readers exclude a
/// writer: under load, readers never see a writer inside, and writers'
/// non-atomic increments are never lost.
pub async fn writer_excludes_readers_and_writers(h: &dyn Harness) -> Result<()> {
    const WRITERS: u64 = 3;
    const ROUNDS: u64 = 8;
    let k = key("writer_excludes_readers_and_writers", "k");
    let Some(first) = rwlock(h, &k).await? else {
        return Ok(());
    };
    let w = first.write_with(&now()).await?;
    let other = rwlock(h, &k).await?.context("a second client")?;
    if let Some(r) = other.try_read_with(&now()).await? {
        bail!("a reader got in beside a writer: {r:?}");
    }
    if let Some(w2) = other.try_write_with(&now()).await? {
        bail!("a second writer got in beside a writer: {w2:?}");
    }
    w.release().await?;
    let third = rwlock(h, &k).await?.context("a third client")?;
    let (r1, r2) = (
        other.read_with(&now()).await?,
        third.read_with(&now()).await?,
    );
    if let Some(w) = first.try_write_with(&now()).await? {
        bail!("a writer got in beside two readers: {w:?}");
    }
    r1.release().await?;
    r2.release().await?;

    let counter = Arc::new(AtomicU64::new(0));
    let writing = Arc::new(AtomicUsize::new(0));
    let broken = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let l = rwlock(h, &k).await?.context("a client")?;
        let (counter, writing, broken) = (counter.clone(), writing.clone(), broken.clone());
        let writer = i < WRITERS;
        tasks.push(tokio::spawn(async move {
            let opts = waiting(Duration::from_secs(60));
            for _ in 0..ROUNDS {
                let pause = Duration::from_micros(rand::rng().random_range(0..2000));
                if writer {
                    let g = l.write_with(&opts).await?;
                    if writing.fetch_add(1, Ordering::SeqCst) != 0 {
                        broken.store(true, Ordering::SeqCst);
                    }
                    let v = counter.load(Ordering::SeqCst);
                    tokio::time::sleep(pause).await;
                    counter.store(v + 1, Ordering::SeqCst);
                    writing.fetch_sub(1, Ordering::SeqCst);
                    g.release().await?;
                } else {
                    let g = l.read_with(&opts).await?;
                    for _ in 0..3 {
                        if writing.load(Ordering::SeqCst) != 0 {
                            broken.store(true, Ordering::SeqCst);
                        }
                        tokio::time::sleep(pause / 3).await;
                    }
                    g.release().await?;
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    ensure!(
        !broken.load(Ordering::SeqCst),
        "a writer was inside beside a reader or another writer"
    );
    let total = counter.load(Ordering::SeqCst);
    ensure!(
        total == WRITERS * ROUNDS,
        "lost increments: {total} of {}",
        WRITERS * ROUNDS
    );
    Ok(())
}

/// A stream of readers that always overlap does not starve a waiting
/// writer: once it waits, new readers stay out, and it gets in as soon as
/// the readers inside leave.
pub async fn waiting_writer_is_not_starved(h: &dyn Harness) -> Result<()> {
    let k = key("waiting_writer_is_not_starved", "k");
    let Some(writer) = rwlock(h, &k).await? else {
        return Ok(());
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for i in 0..4u64 {
        let l = rwlock(h, &k).await?.context("a reader's client")?;
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            // Staggered, so some reader is always inside.
            tokio::time::sleep(Duration::from_millis(i * 40)).await;
            while !stop.load(Ordering::SeqCst) {
                match l
                    .try_read_with(&waiting(Duration::from_millis(200)))
                    .await?
                {
                    Some(g) => {
                        tokio::time::sleep(Duration::from_millis(160)).await;
                        g.release().await?;
                    }
                    None => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
            anyhow::Ok(())
        }));
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let start = Instant::now();
    let w = writer
        .try_write_with(&waiting(Duration::from_secs(8)))
        .await;
    let waited = start.elapsed();
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.await??;
    }
    match w? {
        Some(g) => g.release().await?,
        None => bail!("a writer waited {waited:?} while readers kept entering: starved"),
    }
    Ok(())
}

/// A writer downgrades: a read hold is granted beside its write hold even
/// while another writer waits, and that writer stays out until the reader
/// leaves. The same owner re-enters its read or write hold, and a
/// reader's owner asking to write is `InvalidOptions` (no upgrade). A
/// writer whose hold ran out cannot downgrade.
pub async fn writer_downgrades_reader_never_upgrades(h: &dyn Harness) -> Result<()> {
    let k = key("writer_downgrades_reader_never_upgrades", "k");
    let Some(l) = rwlock(h, &k).await? else {
        return Ok(());
    };
    let other = rwlock(h, &k).await?.context("a second client")?;
    let w = l.write_with(&now()).await?;
    let fence_w = w.fence();
    let waiter = tokio::spawn(async move {
        other
            .try_write_with(&waiting(Duration::from_secs(30)))
            .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = l
        .downgrade(w)
        .await
        .context("a writer could not downgrade while another writer waited")?;
    ensure!(
        fence_w.is_none() || r.fence() > fence_w,
        "the read hold's fence {:?} is not above the writer's {fence_w:?}",
        r.fence()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        !waiter.is_finished(),
        "the waiting writer got in beside the downgraded reader"
    );
    r.release().await?;
    let w2 = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .context("the waiting writer was not served after the reader left")???
        .context("the waiting writer timed out after the reader left")?;
    w2.release().await?;

    let me = OwnerToken::generate();
    let r1 = l.read_as(&now(), &me).await?;
    let r2 = l.read_as(&now(), &me).await?;
    ensure!(
        r2.holds() == 2,
        "a re-entered read hold counts {}",
        r2.holds()
    );
    match l.write_as(&now(), &me).await {
        Err(e) if e.kind() == ErrorKind::InvalidOptions => {}
        other => bail!(
            "a reader asking to write ended with {:?}, not InvalidOptions",
            other.map(|g| g.fence())
        ),
    }
    r2.release().await?;
    r1.release().await?;
    let writer = OwnerToken::generate();
    let w1 = l.write_as(&now(), &writer).await?;
    let w2 = l.write_as(&now(), &writer).await?;
    ensure!(
        w2.holds() == 2,
        "a re-entered write hold counts {}",
        w2.holds()
    );
    w2.release().await?;
    w1.release().await?;

    // A writer whose hold ran out downgrades to nothing: a read hold
    // granted now would follow a gap in which anyone could have written.
    let wc = h.client().await;
    let ttl = short_ttl(&wc.capabilities());
    let stale = Locker::from_arc(wc.clone()).rwlock(&k)?;
    let w = stale
        .write_with(&LockOptions::new().ttl(ttl).auto_renew(false).no_wait())
        .await?;
    end_hold(h, &wc, ttl).await?;
    if let Ok(r) = stale.downgrade(w).await {
        bail!("a writer whose hold had run out downgraded to a read hold: {r:?}");
    }
    let after = l
        .try_write_with(&waiting(Duration::from_secs(5)))
        .await?
        .context("a failed downgrade left a read hold behind")?;
    after.release().await?;
    Ok(())
}

/// A waiting acquire given up (dropped, or timed out) leaves nothing: no
/// permit held, and no writer's mark keeping readers out until its TTL.
pub async fn abandoned_permit_acquire_leaves_nothing(h: &dyn Harness) -> Result<()> {
    let k = key("abandoned_permit_acquire_leaves_nothing", "rw");
    if let Some(reader) = rwlock(h, &k).await? {
        let (writer, late) = (
            rwlock(h, &k).await?.context("a writer's client")?,
            rwlock(h, &k).await?.context("a late reader's client")?,
        );
        let r = reader.read_with(&now()).await?;
        let cut =
            tokio::time::timeout(Duration::from_millis(300), writer.write_with(&long())).await;
        ensure!(cut.is_err(), "the writer got in beside a reader");
        let timed_out = writer
            .try_write_with(&waiting(Duration::from_millis(300)))
            .await?;
        ensure!(timed_out.is_none(), "the writer got in beside a reader");
        // Dropped before it heard its first "no": the refusal, and the
        // mark it left, come back to nobody.
        let stall = Stall::refusing(h.client().await);
        let stalled = Locker::from_arc(stall.clone()).rwlock(&k)?;
        let opts = long();
        tokio::select! {
            w = stalled.write_with(&opts) => bail!("a stalled writer returned: {:?}", w.map(|g| g.fence())),
            () = stall.granted() => {}
        }
        stall.open();
        // The reader leaves too: only a writer's mark left behind could
        // keep the next reader out now.
        r.release().await?;
        // Sooner than a mark left behind would lapse by itself.
        let late_read = late
            .try_read_with(&waiting(MARK_LIFE / 2))
            .await?
            .with_context(|| {
                format!(
                    "a reader stayed out for {:?} after the only writer gave up",
                    MARK_LIFE / 2
                )
            })?;
        late_read.release().await?;
    }
    let k = key("abandoned_permit_acquire_leaves_nothing", "sem");
    let Some(s) = semaphore(h, &k, 2).await? else {
        return Ok(());
    };
    let check = semaphore(h, &k, 2).await?.context("a checking client")?;
    for i in 0..20u64 {
        let cut = Duration::from_micros(i * i * 40);
        if let Ok(g) = tokio::time::timeout(cut, s.acquire_with(&long())).await {
            g?.release().await?;
        }
    }
    let start = Instant::now();
    loop {
        let a = check.try_acquire_with(&now()).await?;
        let b = check.try_acquire_with(&now()).await?;
        let both = a.is_some() && b.is_some();
        for g in [a, b].into_iter().flatten() {
            g.release().await?;
        }
        if both {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(5) {
            bail!("acquires dropped mid-flight left a permit held 5 s later");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A semaphore's count of permits held and free follows its holders:
/// none held, two of three held by two clients (one of them re-entered,
/// still counted once), one given back.
pub async fn available_counts_the_permits_held_and_free(h: &dyn Harness) -> Result<()> {
    let k = key("available_counts_the_permits", "k");
    let Some(reader) = semaphore(h, &k, 3).await? else {
        return Ok(());
    };
    let count = async || -> Result<(u32, u32)> {
        let p = reader.available().await?;
        Ok((p.held, p.free))
    };
    ensure!(
        count().await? == (0, 3),
        "no permit held, but available says {:?}",
        count().await?
    );
    let (Some(a), Some(b)) = (semaphore(h, &k, 3).await?, semaphore(h, &k, 3).await?) else {
        bail!("a store with permits refused a second semaphore");
    };
    let first = a.acquire_with(&long()).await?;
    let again = a.acquire_as(&long(), first.owner()).await?;
    let second = b.acquire_with(&long()).await?;
    let now = count().await?;
    ensure!(
        now == (2, 1),
        "two holders of three permits, one re-entered, but available says {now:?}"
    );
    second.release().await?;
    let now = count().await?;
    ensure!(
        now == (1, 2),
        "one holder of three permits left, but available says {now:?}"
    );
    again.release().await?;
    first.release().await?;
    let now = count().await?;
    ensure!(
        now == (0, 3),
        "every permit given back, but available says {now:?}"
    );
    Ok(())
}

/// Semaphores and read-write locks taken once each and released, or left
/// to expire, leave no state behind beyond the store's stated retention,
/// writers that gave up waiting included.
pub async fn permit_state_is_bounded(h: &dyn Harness) -> Result<()> {
    const NAMES: usize = 300;
    const SLACK: u64 = 8;
    let case = "permit_state_is_bounded";
    let client = h.client().await;
    let caps = client.capabilities();
    if !caps.permits && !caps.shared {
        return Ok(());
    }
    let prefix = key(case, "").as_str().to_owned();
    let locker = Locker::from_arc(client.clone());
    for i in 0..NAMES {
        if caps.permits {
            let s = locker.semaphore(key(case, &format!("sem/{i}")), 3)?;
            let (a, b) = (s.acquire_with(&now()).await?, s.acquire_with(&now()).await?);
            a.release().await?;
            b.release().await?;
        }
        if caps.shared && i % 10 == 0 {
            let l = locker.rwlock(key(case, &format!("rw/{i}")))?;
            let r = l.read_with(&now()).await?;
            // A writer that gives up; its mark, if one is left, runs out
            // with its short TTL.
            let give_up = LockOptions::new()
                .ttl(short_ttl(&caps))
                .wait_for(Duration::from_millis(50));
            ensure!(
                l.try_write_with(&give_up).await?.is_none(),
                "a writer got in beside a reader"
            );
            r.release().await?;
        }
    }
    // Holders that vanish without releasing.
    let gone = h.client().await;
    let ttl = short_ttl(&caps);
    for i in 0..10 {
        let claim = if caps.permits && i % 2 == 0 {
            Claim::permits(3)?
        } else if caps.shared {
            Claim::Shared
        } else {
            Claim::permits(3)?
        };
        let k = key(case, &format!("abandoned/{i}"));
        let hold = HoldId::new(k, OwnerToken::generate(), HoldKind::of_claim(claim));
        acquired_as(&*gone, &hold, ttl).await?;
    }
    end_hold(h, &gone, ttl).await?;
    drop(gone);
    collected(
        h,
        &*client,
        &prefix,
        SLACK,
        caps.retention + Duration::from_secs(5),
    )
    .await
    .context("after semaphores and read-write locks were released or left to expire")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Inside;

    #[test]
    fn inside_counts_the_most_at_once() {
        let i = Inside::default();
        assert_eq!(i.enter(), 1);
        assert_eq!(i.enter(), 2);
        i.leave();
        assert_eq!(i.enter(), 2);
        i.leave();
        i.leave();
        assert_eq!(i.most.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}
