//! Permits and read holds in the single-node backend's fair queue: a
//! release serves the queue's head whatever its kind, and a group then
//! takes the waiters behind it that join it, up to the first that does
//! not. With the waiters' refresh a minute away, only the release's
//! messages can serve them in time.

use std::time::Duration;

use lockwright_conformance::kit::servers::redis_url;
use lockwright_core::{LockGuard, LockKey, LockOptions, Locker, OwnerToken};
use lockwright_redis::RedisBackend;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

const TTL: Duration = Duration::from_secs(60);
/// Long enough for a message on a loaded host, far short of the refresh.
const SERVED: Duration = Duration::from_secs(5);

fn locker() -> Locker {
    let url = format!("{}?waiter_refresh=60s", redis_url());
    Locker::new(RedisBackend::connect(&url).unwrap())
}

fn key(name: &str) -> LockKey {
    LockKey::new(format!("group:{name}:{}", OwnerToken::generate().as_str())).unwrap()
}

fn waiting() -> LockOptions {
    LockOptions::new()
        .ttl(TTL)
        .wait_for(Duration::from_secs(60))
}

#[derive(Clone, Copy, Debug)]
enum Ask {
    Read,
    Write,
    Permit(u32),
}

/// Starts a waiter on `k` that sends its guard, tagged `tag`, once served.
async fn queue(
    k: &LockKey,
    ask: Ask,
    tag: &'static str,
    served: &mpsc::UnboundedSender<(&'static str, LockGuard)>,
) -> JoinHandle<()> {
    let (k, served) = (k.clone(), served.clone());
    let task = tokio::spawn(async move {
        let l = locker();
        let g = match ask {
            Ask::Read => l.rwlock(&k).unwrap().read_with(&waiting()).await,
            Ask::Write => l.rwlock(&k).unwrap().write_with(&waiting()).await,
            Ask::Permit(n) => l.semaphore(&k, n).unwrap().acquire_with(&waiting()).await,
        }
        .unwrap();
        served.send((tag, g)).unwrap();
    });
    // Queued in this order: each has sent its first attempt before the next.
    tokio::time::sleep(Duration::from_millis(300)).await;
    task
}

/// The next `n` served, within [`SERVED`], sorted by tag.
async fn next(
    rx: &mut mpsc::UnboundedReceiver<(&'static str, LockGuard)>,
    n: usize,
) -> Vec<(&'static str, LockGuard)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let got = tokio::time::timeout(SERVED, rx.recv()).await;
        let served = got.expect("served in time").expect("a waiter");
        out.push(served);
    }
    out.sort_by_key(|(t, _)| *t);
    out
}

async fn nobody_else(rx: &mut mpsc::UnboundedReceiver<(&'static str, LockGuard)>) {
    let more = tokio::time::timeout(Duration::from_millis(700), rx.recv()).await;
    assert!(
        more.is_err(),
        "served out of turn: {:?}",
        more.map(|m| m.map(|(t, _)| t))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_serves_every_reader_queued_before_the_next_writer() {
    let k = key("readers");
    let first = locker().rwlock(&k).unwrap();
    let w1 = first
        .write_with(&LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let w1_fence = w1.fence().unwrap().0;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for tag in ["r1", "r2", "r3"] {
        tasks.push(queue(&k, Ask::Read, tag, &tx).await);
    }
    tasks.push(queue(&k, Ask::Write, "w2", &tx).await);
    for tag in ["r4", "r5"] {
        tasks.push(queue(&k, Ask::Read, tag, &tx).await);
    }
    nobody_else(&mut rx).await;

    w1.release().await.unwrap();
    let readers = next(&mut rx, 3).await;
    let tags: Vec<_> = readers.iter().map(|(t, _)| *t).collect();
    assert_eq!(
        tags,
        ["r1", "r2", "r3"],
        "the readers ahead of the writer, together"
    );
    let fences: Vec<u64> = readers.iter().map(|(_, g)| g.fence().unwrap().0).collect();
    assert!(
        fences.iter().all(|f| *f > w1_fence),
        "{fences:?} after {w1_fence}"
    );
    nobody_else(&mut rx).await;

    for (_, g) in readers {
        g.release().await.unwrap();
    }
    let writer = next(&mut rx, 1).await;
    assert_eq!(
        writer[0].0, "w2",
        "the waiting writer, before the later readers"
    );
    nobody_else(&mut rx).await;

    let (_, w2) = writer.into_iter().next().unwrap();
    w2.release().await.unwrap();
    let late = next(&mut rx, 2).await;
    assert_eq!(
        late.iter().map(|(t, _)| *t).collect::<Vec<_>>(),
        ["r4", "r5"]
    );
    for (_, g) in late {
        g.release().await.unwrap();
    }
    for t in tasks {
        t.await.unwrap();
    }
    let status = locker().status(&k).await.unwrap();
    assert!(!status.held, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_permit_goes_to_the_head_waiter_at_once() {
    let k = key("permits");
    let (a, b) = (locker(), locker());
    let opts = LockOptions::new().ttl(TTL);
    let p1 = a
        .semaphore(&k, 2)
        .unwrap()
        .acquire_with(&opts)
        .await
        .unwrap();
    let p2 = b
        .semaphore(&k, 2)
        .unwrap()
        .acquire_with(&opts)
        .await
        .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let t1 = queue(&k, Ask::Permit(2), "q1", &tx).await;
    let t2 = queue(&k, Ask::Permit(2), "q2", &tx).await;
    nobody_else(&mut rx).await;

    p1.release().await.unwrap();
    let first = next(&mut rx, 1).await;
    assert_eq!(first[0].0, "q1");
    assert!(
        first[0].1.fence() > p2.fence(),
        "a later grant, a higher fence"
    );
    nobody_else(&mut rx).await;

    p2.release().await.unwrap();
    let second = next(&mut rx, 1).await;
    assert_eq!(second[0].0, "q2");
    for (_, g) in first.into_iter().chain(second) {
        g.release().await.unwrap();
    }
    t1.await.unwrap();
    t2.await.unwrap();
}

/// A writer that holds twice and downgrades one of its holds still holds
/// the other alone: no new reader enters until it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downgrade_leaves_a_re_entered_write_hold_exclusive() {
    let k = key("downgrade");
    let l = locker();
    let rw = l.rwlock(&k).unwrap();
    let w = OwnerToken::generate();
    let opts = LockOptions::new().ttl(TTL);
    let g1 = rw.write_as(&opts, &w).await.unwrap();
    let g2 = rw.write_as(&opts, &w).await.unwrap();
    let r = rw.downgrade(g1).await.unwrap();
    let other = locker().rwlock(&k).unwrap();
    let now = LockOptions::new().ttl(TTL).no_wait();
    let entered = other.try_read_with(&now).await.unwrap();
    assert!(entered.is_none(), "a reader entered beside a write hold");
    g2.release().await.unwrap();
    let entered = other
        .try_read_with(&now)
        .await
        .unwrap()
        .expect("readers only now");
    entered.release().await.unwrap();
    r.release().await.unwrap();
}

/// One owner served twice from the queue holds twice, not once: its first
/// release leaves it a permit, and the waiters behind get only what is
/// left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_served_twice_from_the_queue_holds_twice() {
    let k = key("twice");
    let opts = LockOptions::new().ttl(TTL);
    let (a, b) = (locker(), locker());
    let pa = a
        .semaphore(&k, 2)
        .unwrap()
        .acquire_with(&opts)
        .await
        .unwrap();
    let pb = b
        .semaphore(&k, 2)
        .unwrap()
        .acquire_with(&opts)
        .await
        .unwrap();
    let me = OwnerToken::generate();
    let l = locker();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for tag in ["o1", "o2"] {
        let (sem, me, tx) = (l.semaphore(&k, 2).unwrap(), me.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let g = sem.acquire_as(&waiting(), &me).await.unwrap();
            tx.send((tag, g)).unwrap();
        }));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    pa.release().await.unwrap();
    let o1 = next(&mut rx, 1).await;
    pb.release().await.unwrap();
    let o2 = next(&mut rx, 1).await;
    tasks.push(queue(&k, Ask::Permit(2), "c", &tx).await);
    tasks.push(queue(&k, Ask::Permit(2), "d", &tx).await);
    for (_, g) in o1 {
        g.release().await.unwrap();
    }
    // The owner still holds one permit: one of the two may enter, not both.
    let c = next(&mut rx, 1).await;
    assert_eq!(c[0].0, "c");
    nobody_else(&mut rx).await;
    for (_, g) in o2.into_iter().chain(c) {
        g.release().await.unwrap();
    }
    let d = next(&mut rx, 1).await;
    for (_, g) in d {
        g.release().await.unwrap();
    }
    for t in tasks {
        t.await.unwrap();
    }
}
