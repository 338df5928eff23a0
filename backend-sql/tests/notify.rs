//! PostgreSQL wakes waiters in other processes: a release notifies the
//! name's channel, and the process's listening connection wakes its
//! waiters, who would otherwise find the lock free only at their next poll.
//! Two backends on differently written URLs of one database stand for two
//! processes here: they share no in-process notification, so a watch of
//! one hears the other's release only through the database.
#![cfg(feature = "postgres")]

use std::time::Duration;

use lockwright_conformance::kit::servers::postgres_url;
use lockwright_conformance::kit::with_params;
use lockwright_core::backend::{LockBackend, LockBackendExt, Release, Watch};
use lockwright_core::{LockKey, LockOptions, Locker, OwnerToken};
use lockwright_sql::SqlBackend;

fn backend(tag: &str) -> SqlBackend {
    // The tag makes the URL, and so the process-wide scope, distinct.
    let url = with_params(&postgres_url(), &format!("application_name={tag}"));
    SqlBackend::connect(&url).unwrap()
}

async fn watch(b: &SqlBackend, key: &str) -> Watch {
    b.watch(&LockKey::new(key).unwrap(), &OwnerToken::generate())
        .await
        .unwrap()
        .expect("SQL backends watch")
}

async fn heard(w: &mut Watch, within: Duration) -> bool {
    let r = tokio::time::timeout(within, w.notice()).await.is_ok();
    eprintln!("{:?} heard {r}", std::time::SystemTime::now());
    r
}

/// Releases `key` until `w` hears it: the listener is up and listening.
async fn listening(a: &Locker, w: &mut Watch, key: &str) {
    for _ in 0..20 {
        a.lock(key).await.unwrap().release().await.unwrap();
        if heard(w, Duration::from_secs(1)).await {
            drain(w).await;
            return;
        }
    }
    panic!("no release of {key} was heard");
}

/// Takes whatever notices are pending (a listener that just connected
/// wakes everyone once).
async fn drain(w: &mut Watch) {
    while heard(w, Duration::from_millis(300)).await {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_heard_by_a_waiter_in_another_process() {
    let (a, b) = (Locker::new(backend("notify-a")), backend("notify-b"));
    let key = format!("notify/{}", std::process::id());
    let mut w = watch(&b, &key).await;
    listening(&a, &mut w, &key).await;
    // A re-entrant hold's release frees nothing: no one is told.
    let raw = backend("notify-a");
    let k = LockKey::new(key.as_str()).unwrap();
    let (owner, ttl) = (OwnerToken::generate(), Duration::from_secs(30));
    for _ in 0..2 {
        raw.try_lock(&k, &owner, ttl).await.unwrap();
    }
    assert_eq!(raw.unlock(&k, &owner).await.unwrap(), Release::StillHeld(1));
    assert!(
        !heard(&mut w, Duration::from_millis(500)).await,
        "a release that freed nothing was announced"
    );
    assert_eq!(raw.unlock(&k, &owner).await.unwrap(), Release::Freed);
    assert!(
        heard(&mut w, Duration::from_secs(5)).await,
        "the release was not heard"
    );

    // A read hold's release goes through the holders table.
    let r = a
        .rwlock(key.as_str())
        .unwrap()
        .read_with(&LockOptions::new())
        .await
        .unwrap();
    drain(&mut w).await;
    r.release().await.unwrap();
    assert!(
        heard(&mut w, Duration::from_secs(5)).await,
        "a read hold's release was not heard"
    );
}

/// The listening connection killed by the server: the waiters look at
/// once, and it listens again, so later releases are still heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_comes_back_after_its_connection_is_killed() {
    let (a, b) = (Locker::new(backend("notify-c")), backend("notify-d"));
    let key = format!("notify-kill/{}", std::process::id());
    let mut w = watch(&b, &key).await;
    listening(&a, &mut w, &key).await;
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE application_name = 'notify-d'
           AND (query LIKE 'LISTEN%' OR query LIKE '%pg_advisory_lock_shared%')
           AND datname = current_database()",
    )
    .fetch_all(&sqlx::PgPool::connect(&postgres_url()).await.unwrap())
    .await
    .unwrap();
    assert!(!killed.is_empty(), "no listening connection found");
    assert!(
        heard(&mut w, Duration::from_secs(10)).await,
        "a lost listener woke nobody"
    );
    drain(&mut w).await;
    let g = a.lock(key.as_str()).await.unwrap();
    g.release().await.unwrap();
    assert!(
        heard(&mut w, Duration::from_secs(10)).await,
        "not heard after the listener came back"
    );
}
