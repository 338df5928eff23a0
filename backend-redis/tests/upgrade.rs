//! A keyspace written by the previous version (a lock hash without a fence
//! field, and a per-name counter key `…:fence` kept for ever) keeps working:
//! a lock held across the upgrade stays held and its holder can renew and
//! release it, and the next fence is above the old counter.

mod common;

use std::time::Duration;

use lockwright_conformance::kit::servers::redis_url;
use lockwright_core::backend::{Acquire, LockBackendExt, Release, Renew};
use lockwright_core::{LockKey, OwnerToken};
use lockwright_redis::RedisBackend;

#[tokio::test]
async fn a_lock_of_the_previous_version_is_respected_and_fences_go_on_above_it() {
    let url = redis_url();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let run = OwnerToken::generate();
    let name = format!("upgrade/{}", &run.as_str()[..10]);
    let key = LockKey::new(name.as_str()).unwrap();
    let old_owner = OwnerToken::generate();
    // What the previous version wrote: its counter was seeded from the
    // server clock in µs and counted one per grant since.
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.unwrap();
    let old_fence = secs * 1_000_000 + micros + 3;
    let _: () = redis::pipe()
        .cmd("HSET")
        .arg(format!("lockwright:{{{name}}}:lock"))
        .arg(old_owner.as_str())
        .arg(1)
        .ignore()
        .cmd("PEXPIRE")
        .arg(format!("lockwright:{{{name}}}:lock"))
        .arg(30_000)
        .ignore()
        .cmd("SET")
        .arg(format!("lockwright:{{{name}}}:fence"))
        .arg(old_fence)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();

    let b = RedisBackend::connect(&url).unwrap();
    let ttl = Duration::from_secs(30);
    let stranger = b
        .try_lock(&key, &OwnerToken::generate(), ttl)
        .await
        .unwrap();
    assert!(
        matches!(stranger, Acquire::Contended { .. }),
        "{stranger:?}"
    );
    assert_eq!(
        b.renew_lock(&key, &old_owner, ttl).await.unwrap(),
        Renew::Renewed
    );
    assert_eq!(b.unlock(&key, &old_owner).await.unwrap(), Release::Freed);

    let owner = OwnerToken::generate();
    let Acquire::Acquired(g) = b.try_lock(&key, &owner, ttl).await.unwrap() else {
        panic!("free key was contended");
    };
    let fence = g.fence.unwrap().0;
    assert!(fence > old_fence, "fence {fence} after the old {old_fence}");
    assert_eq!(b.unlock(&key, &owner).await.unwrap(), Release::Freed);

    // The old counter is neither read nor written; only it is left.
    let left = common::scan(&url, &common::names_pattern(&name)).await;
    assert_eq!(left, vec![format!("lockwright:{{{name}}}:fence")]);
    let _: i64 = redis::cmd("DEL")
        .arg(format!("lockwright:{{{name}}}:fence"))
        .query_async(&mut conn)
        .await
        .unwrap();
}
