//! The error table of [`lockwright::ErrorKind`], one test per row that
//! the application API answers: each fact gives the same kind from every
//! primitive it can happen to (a lock, a semaphore's permit, a read-write
//! lock's write hold, an election's leadership). `NotHeld` is a backend's
//! answer (the conformance suite's ownership cases), and `Backend` one no
//! store gives on purpose.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use lockwright::backend::{LockBackend, MemoryBackend};
use lockwright::{Error, ErrorKind, LockOptions, Locker};

/// Two lockers over one in-process store, and the store.
fn two() -> (Locker, Locker, Arc<MemoryBackend>) {
    let store = Arc::new(MemoryBackend::new());
    let backend: Arc<dyn LockBackend> = store.clone();
    (
        Locker::from_arc(backend.clone()),
        Locker::from_arc(backend),
        store,
    )
}

type Taken<'a> = Pin<Box<dyn Future<Output = Result<(), Error>> + 'a>>;

/// Each primitive's waiting acquire of the name `name`, by `locker`
/// with `opts`; what it took is dropped.
fn each_primitive<'a>(
    locker: &'a Locker,
    name: &'a str,
    opts: &'a LockOptions,
) -> Vec<(&'static str, Taken<'a>)> {
    vec![
        (
            "lock",
            Box::pin(async move { locker.lock_with(name, opts).await.map(drop) }),
        ),
        (
            "permit",
            Box::pin(async move {
                let sem = locker.semaphore(format!("{name}/sem"), 1)?;
                sem.acquire_with(opts).await.map(drop)
            }),
        ),
        (
            "write",
            Box::pin(async move {
                let rw = locker.rwlock(format!("{name}/rw"))?;
                rw.write_with(opts).await.map(drop)
            }),
        ),
        (
            "campaign",
            Box::pin(async move {
                let e = locker.election(format!("{name}/election"))?;
                e.campaign_with("x", opts).await.map(drop)
            }),
        ),
    ]
}

/// Holds `name` by every primitive (as `each_primitive` names them).
async fn hold_all(locker: &Locker, name: &str) -> Vec<lockwright::LockGuard> {
    let opts = LockOptions::new();
    let mut held = vec![locker.lock_with(name, &opts).await.unwrap()];
    let sem = locker.semaphore(format!("{name}/sem"), 1).unwrap();
    held.push(sem.acquire_with(&opts).await.unwrap());
    let rw = locker.rwlock(format!("{name}/rw")).unwrap();
    held.push(rw.write_with(&opts).await.unwrap());
    held
}

/// Row "busy": another owner holds it and the attempt was not to wait.
#[tokio::test]
async fn busy_when_held_and_not_waiting() {
    let (a, b, _) = two();
    let _held = hold_all(&a, "busy").await;
    let leading = a.election("busy/election").unwrap();
    let _leading = leading
        .campaign_with("a", &LockOptions::new())
        .await
        .unwrap();
    let opts = LockOptions::new().no_wait();
    for (what, taken) in each_primitive(&b, "busy", &opts) {
        let e = taken.await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy, "{what}: {e}");
        assert!(e.is_retryable(), "{what}");
    }
}

/// Row "timeout": another owner still held it when the wait ran out.
#[tokio::test]
async fn timeout_when_the_wait_runs_out() {
    let (a, b, _) = two();
    let _held = hold_all(&a, "timeout").await;
    let leading = a.election("timeout/election").unwrap();
    let _leading = leading
        .campaign_with("a", &LockOptions::new())
        .await
        .unwrap();
    let opts = LockOptions::new().wait_for(Duration::from_millis(50));
    for (what, taken) in each_primitive(&b, "timeout", &opts) {
        let e = taken.await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{what}: {e}");
    }
}

/// Row "lost": a hold this caller had is gone; its release, renewal,
/// proclaim, resignation and scoped work all say `Lost`.
#[tokio::test]
async fn lost_when_a_hold_had_is_gone() {
    let (a, _, store) = two();
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let gone = async |name: &str| {
        let g = a.lock_with(name, &opts).await.unwrap();
        store.release(&g.lease().hold()).await.unwrap();
        g
    };
    let e = gone("lost/release").await.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "release: {e}");
    let e = gone("lost/renew").await.renew().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "renew: {e}");
    let permit = a.semaphore("lost/sem", 2).unwrap();
    let p = permit.acquire_with(&opts).await.unwrap();
    store.release(&p.lease().hold()).await.unwrap();
    let e = p.release().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "a permit's release: {e}");
    let rw = a.rwlock("lost/rw").unwrap();
    let w = rw.write_with(&opts).await.unwrap();
    store.release(&w.lease().hold()).await.unwrap();
    let e = rw.downgrade(w).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "downgrade: {e}");
    let election = a.election("lost/election").unwrap();
    let mut leading = election.campaign_with("a", &opts).await.unwrap();
    store
        .release(&leading.guard().lease().hold())
        .await
        .unwrap();
    let e = leading.proclaim("still?").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "proclaim: {e}");
    let e = leading.resign().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "resign: {e}");
    let e = a
        .with_lock_with("lost/scoped", &opts, async |g| {
            store.release(&g.lease().hold()).await.unwrap();
            let _ = g.renew().await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        })
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Lost, "scoped work: {e}");
}

/// Row "unavailable": the store cannot be reached, from every primitive,
/// never reported as held or free.
#[tokio::test]
async fn unavailable_when_the_store_is_down() {
    let (a, _, store) = two();
    store.set_available(false);
    let opts = LockOptions::new().no_wait();
    for (what, taken) in each_primitive(&a, "down", &opts) {
        let e = taken.await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{what}: {e}");
    }
    let e = a.status("down").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "status: {e}");
}

/// Row "config": a URL that cannot name a store.
#[tokio::test]
async fn config_for_a_url_that_names_no_store() {
    for url in ["nosuchstore://x", "redis://127.0.0.1:notaport", "memory"] {
        let e = lockwright::connect(url).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{url}: {e}");
    }
}

/// Rows "invalid key" and "invalid options", from every primitive.
#[tokio::test]
async fn invalid_key_and_options_from_every_primitive() {
    let (a, _, _) = two();
    let e = a.lock("").await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidKey, "lock: {e}");
    for e in [
        a.semaphore("", 2).unwrap_err(),
        a.rwlock("").unwrap_err(),
        a.election("").unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::InvalidKey, "{e}");
    }
    let zero = LockOptions::new().ttl(Duration::ZERO);
    for (what, taken) in each_primitive(&a, "options", &zero) {
        let e = taken.await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidOptions, "{what}: {e}");
    }
    let e = a.semaphore("options/none", 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidOptions, "no permits: {e}");
}

/// Row "unsupported": a store that keeps no value with a lock holds no
/// election, and says so before sending anything.
#[cfg(feature = "postgres")]
#[tokio::test]
async fn unsupported_where_the_store_cannot() {
    let url = format!(
        "{}?mode=session",
        lockwright_conformance::kit::servers::postgres_url()
    );
    let locker = lockwright::connect(&url).await.unwrap();
    let e = locker.election("unsupported").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    locker.close().await.unwrap();
}

/// Row "closed": a closed locker takes nothing new, by any primitive.
#[tokio::test]
async fn closed_after_close() {
    let (a, _, _) = two();
    a.close().await.unwrap();
    let opts = LockOptions::new();
    for (what, taken) in each_primitive(&a, "closed", &opts) {
        let e = taken.await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Closed, "{what}: {e}");
    }
}
