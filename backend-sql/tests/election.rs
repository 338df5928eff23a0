//! Leader-election values on SQL lease rows, on every store the features
//! build: a value goes into the row with the first grant and comes back
//! from inspect byte for byte; re-entries and renewals leave it alone;
//! proclaim is owner-checked and leaves the lease alone; the last release
//! clears it; a table of the previous release gains the column with its
//! locks still held. Session locks keep no values and say so.

mod common;

use std::time::Duration;

use lockwright_conformance::kit::values::{awkward, every_byte};
use lockwright_conformance::kit::with_params;
use lockwright_core::backend::{
    Acquire, AcquireRequest, LockBackend, LockBackendExt, Release, Renew,
};
use lockwright_core::{ErrorKind, LockKey, LockOptions, Locker, OwnerToken, MAX_VALUE_LEN};
use lockwright_sql::{Dialect, SqlBackend, DEFAULT_TABLE};
use sha2::{Digest, Sha256};

const TTL: Duration = Duration::from_secs(30);
/// Just above the backend's floor (250 ms), to watch a lease run out.
const SHORT: Duration = Duration::from_millis(300);

/// One database: a fresh SQLite file, or a test server.
struct Store {
    dialect: Dialect,
    /// The URL as the driver takes it (none of the backend's parameters).
    url: String,
    _dir: Option<tempfile::TempDir>,
}

impl Store {
    #[cfg(feature = "sqlite")]
    fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Store {
            dialect: Dialect::Sqlite,
            url: format!("sqlite://{}/locks.db", dir.path().display()),
            _dir: Some(dir),
        }
    }

    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn server(dialect: Dialect) -> Self {
        Store {
            dialect,
            url: common::server_url(dialect),
            _dir: None,
        }
    }

    /// A client of the default table (or `table`), keeping free rows 1 s.
    fn backend_of(&self, table: &str) -> SqlBackend {
        let url = with_params(&self.url, &format!("retention=1s&table={table}"));
        SqlBackend::connect(&url).unwrap()
    }

    fn backend(&self) -> SqlBackend {
        self.backend_of(DEFAULT_TABLE)
    }

    /// The `value` column of `key`'s row in the default table, read from
    /// the store itself (`None`: no row).
    async fn stored(&self, key: &LockKey) -> Option<Option<Vec<u8>>> {
        self.stored_in(DEFAULT_TABLE, key).await
    }

    async fn stored_in(&self, table: &str, key: &LockKey) -> Option<Option<Vec<u8>>> {
        common::stored_value(self.dialect, &self.url, table, &hash(key))
            .await
            .unwrap()
    }
}

fn hash(key: &LockKey) -> String {
    hex::encode(Sha256::digest(key.as_str().as_bytes()))
}

fn key(what: &str) -> LockKey {
    LockKey::new(format!(
        "election/{what}/{}",
        OwnerToken::generate().as_str()
    ))
    .unwrap()
}

async fn grant(b: &SqlBackend, k: &LockKey, owner: &OwnerToken, ttl: Duration) -> u64 {
    take(b, &AcquireRequest::mutex(k, owner, ttl)).await
}

/// [`grant`], carrying `value` for the store to write with the grant.
async fn grant_with(
    b: &SqlBackend,
    k: &LockKey,
    owner: &OwnerToken,
    value: impl Into<Vec<u8>>,
    ttl: Duration,
) -> u64 {
    let request = AcquireRequest::mutex(k, owner, ttl)
        .with_value(value)
        .unwrap();
    take(b, &request).await
}

async fn take(b: &SqlBackend, request: &AcquireRequest) -> u64 {
    let k = request.key();
    match b.try_acquire(request).await.unwrap() {
        Acquire::Acquired(g) => g.fence.expect("lease rows give fences").0,
        other => panic!("expected to take {k:?}, got {other:?}"),
    }
}

async fn a_value_round_trips_through_grant_proclaim_and_inspect(s: &Store) {
    let b = s.backend();
    assert!(b.capabilities().values);
    assert_eq!(every_byte().len(), 1024);
    for value in awkward() {
        let k = key("round-trip");
        let owner = OwnerToken::generate();
        let fence = grant_with(&b, &k, &owner, value.clone(), TTL).await;
        let st = b.inspect(&k).await.unwrap();
        assert!(st.held);
        assert_eq!(st.value.as_deref(), Some(value.as_slice()), "{value:?}");
        assert_eq!(st.owner.as_ref(), Some(&owner));
        assert_eq!(st.fence.map(|f| f.0), Some(fence));
        assert_eq!(s.stored(&k).await, Some(Some(value.clone())));
        assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
        // The row stays for the retention; its value goes with the lock.
        assert_eq!(s.stored(&k).await, Some(None), "{value:?} left behind");
        let st = b.inspect(&k).await.unwrap();
        assert_eq!((st.held, st.value, st.owner), (false, None, None));
    }

    // Proclaimed over a plain hold: the value changes, the fence and the
    // lease do not.
    let k = key("proclaim");
    let owner = OwnerToken::generate();
    let fence = grant(&b, &k, &owner, TTL).await;
    assert_eq!(b.inspect(&k).await.unwrap().value, None);
    assert_eq!(s.stored(&k).await, Some(None));
    for value in awkward() {
        let before = b.inspect(&k).await.unwrap().remaining.unwrap();
        assert_eq!(
            b.proclaim_as(&k, &owner, &value).await.unwrap(),
            Renew::Renewed
        );
        let st = b.inspect(&k).await.unwrap();
        assert_eq!(st.value.as_deref(), Some(value.as_slice()));
        assert_eq!(st.fence.map(|f| f.0), Some(fence), "the fence is kept");
        assert!(
            st.remaining.unwrap() <= before,
            "proclaim extended the lease"
        );
        assert_eq!(s.stored(&k).await, Some(Some(value.clone())));
    }
    // The same value again is still a proclaim by the holder (MySQL counts
    // matched rows, not changed ones).
    let last = every_byte();
    assert_eq!(
        b.proclaim_as(&k, &owner, &last).await.unwrap(),
        Renew::Renewed
    );
    let over = vec![b'x'; MAX_VALUE_LEN + 1];
    let err = b.proclaim_as(&k, &owner, &over).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidOptions, "{err}");
    assert_eq!(s.stored(&k).await, Some(Some(last)));
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
}

async fn proclaim_leaves_the_lease_where_it_was(s: &Store) {
    let b = s.backend();
    let k = key("lease");
    let owner = OwnerToken::generate();
    grant(&b, &k, &owner, Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        b.proclaim_as(&k, &owner, b"v").await.unwrap(),
        Renew::Renewed
    );
    let left = b.inspect(&k).await.unwrap().remaining.unwrap();
    assert!(left <= Duration::from_millis(1400), "{left:?} left");
    // It ends when it would have: proclaims do not keep a lease alive.
    tokio::time::sleep(left + Duration::from_millis(200)).await;
    assert!(!b.inspect(&k).await.unwrap().held);
    assert_eq!(
        b.proclaim_as(&k, &owner, b"w").await.unwrap(),
        Renew::NotHeld
    );
}

async fn re_entries_and_renewals_leave_the_value_alone(s: &Store) {
    let b = s.backend();
    let k = key("re-entry");
    let owner = OwnerToken::generate();
    let fence = grant_with(&b, &k, &owner, "first", TTL).await;
    assert_eq!(
        b.proclaim_as(&k, &owner, b"second").await.unwrap(),
        Renew::Renewed
    );
    // The request still carries "first": a re-entry is no new grant.
    assert_eq!(grant_with(&b, &k, &owner, "first", TTL).await, fence);
    let st = b.inspect(&k).await.unwrap();
    assert_eq!((st.holds, st.value.as_deref()), (2, Some(&b"second"[..])));
    assert_eq!(b.renew_lock(&k, &owner, TTL).await.unwrap(), Renew::Renewed);
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::StillHeld(1));
    let st = b.inspect(&k).await.unwrap();
    assert_eq!((st.holds, st.value.as_deref()), (1, Some(&b"second"[..])));
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
    assert_eq!(s.stored(&k).await, Some(None));
}

async fn a_takeover_writes_the_new_owners_value_and_strangers_write_nothing(s: &Store) {
    let b = s.backend();
    let k = key("takeover");
    // Free: nothing held, nothing written.
    let nobody = OwnerToken::generate();
    assert_eq!(
        b.proclaim_as(&k, &nobody, b"x").await.unwrap(),
        Renew::NotHeld
    );
    assert_eq!(s.stored(&k).await, None);

    // Held by someone else: refused, and nothing changes.
    let owner = OwnerToken::generate();
    grant_with(&b, &k, &owner, "mine", SHORT).await;
    assert_eq!(
        b.proclaim_as(&k, &nobody, b"x").await.unwrap(),
        Renew::NotHeld
    );
    assert_eq!(s.stored(&k).await, Some(Some(b"mine".to_vec())));

    // Expired: the former holder cannot write, and a plain owner taking
    // the row over does not inherit the old value.
    tokio::time::sleep(SHORT * 2).await;
    assert_eq!(
        b.proclaim_as(&k, &owner, b"late").await.unwrap(),
        Renew::NotHeld
    );
    assert_eq!(s.stored(&k).await, Some(Some(b"mine".to_vec())));
    assert!(!b.inspect(&k).await.unwrap().held);
    let plain = OwnerToken::generate();
    grant(&b, &k, &plain, SHORT).await;
    let st = b.inspect(&k).await.unwrap();
    assert_eq!((st.owner.as_ref(), st.value), (Some(&plain), None));
    assert_eq!(s.stored(&k).await, Some(None));

    // Expired again and taken over with a value: the new one stands.
    tokio::time::sleep(SHORT * 2).await;
    let next = OwnerToken::generate();
    grant_with(&b, &k, &next, "next", TTL).await;
    assert_eq!(
        b.proclaim_as(&k, &plain, b"stale").await.unwrap(),
        Renew::NotHeld
    );
    let st = b.inspect(&k).await.unwrap();
    assert_eq!(
        (st.owner.as_ref(), st.value.as_deref()),
        (Some(&next), Some(&b"next"[..]))
    );
    assert_eq!(b.unlock(&k, &next).await.unwrap(), Release::Freed);
}

async fn campaign_leader_proclaim_and_resign(s: &Store) {
    let locker = Locker::new(s.backend());
    let k = key("campaign");
    let election = locker.election(k.as_str()).unwrap();
    let opts = LockOptions::new().ttl(TTL);
    assert!(election.leader().await.unwrap().is_none());
    let mut first = election.campaign_with("node-a", &opts).await.unwrap();
    let term_a = first.term().expect("lease rows give terms");
    let leader = election.leader().await.unwrap().expect("a leads");
    assert_eq!(
        (leader.value.as_slice(), leader.term),
        (&b"node-a"[..], Some(term_a))
    );
    assert!(leader.lease_left.unwrap() > TTL - Duration::from_secs(5));

    // Another client's candidate cannot lead meanwhile.
    let other = Locker::new(s.backend()).election(k.as_str()).unwrap();
    let brief = LockOptions::new()
        .ttl(TTL)
        .wait_for(Duration::from_millis(300));
    assert!(other
        .try_campaign_with("node-b", &brief)
        .await
        .unwrap()
        .is_none());

    first.proclaim(every_byte()).await.unwrap();
    let leader = other.leader().await.unwrap().expect("a still leads");
    assert_eq!(leader.value, every_byte());
    assert_eq!(leader.term, Some(term_a));

    // A candidate waiting on this process's backend is woken by the
    // resignation, and leads with its own value.
    let waiting = election.clone();
    let task = tokio::spawn(async move {
        let opts = LockOptions::new()
            .ttl(TTL)
            .wait_for(Duration::from_secs(20));
        waiting.campaign_with("node-b\0\n", &opts).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!task.is_finished(), "b led while a did");
    first.resign().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("b is handed the lead")
        .unwrap()
        .unwrap();
    let leader = other.leader().await.unwrap().expect("b leads");
    assert_eq!(leader.value, b"node-b\0\n");
    assert_eq!(leader.term, second.term());
    assert!(second.term().unwrap() > term_a);
    second.resign().await.unwrap();
    assert!(election.leader().await.unwrap().is_none());
    assert_eq!(s.stored(&k).await, Some(None));
}

async fn a_leader_that_lost_its_lease_cannot_proclaim(s: &Store) {
    let locker = Locker::new(s.backend());
    let election = locker.election(key("lost").as_str()).unwrap();
    let opts = LockOptions::new().ttl(SHORT).auto_renew(false);
    let mut old = election.campaign_with("old", &opts).await.unwrap();
    tokio::time::sleep(SHORT * 2).await;
    let new = election
        .campaign_with("new", &LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    let err = old.proclaim("stale").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Lost, "{err}");
    let leader = election.leader().await.unwrap().expect("new leads");
    assert_eq!(leader.value, b"new");
    new.resign().await.unwrap();
    drop(old);
}

/// A table made by the previous release (no `value` column) holding a live
/// lock: readers see the hold before any writer of this release has set
/// the table up; many clients starting at once add the column once; the
/// hold survives it, and its holder can then proclaim; elections work.
async fn a_table_of_the_previous_release_gains_the_column_with_its_locks_held(s: &Store) {
    let table = format!("el_upgrade_{}", &OwnerToken::generate().as_str()[..12]);
    let ddl = common::legacy_create_table(s.dialect, &table);
    common::execute(s.dialect, &s.url, &ddl).await.unwrap();
    assert!(!has_value(s, &table).await);
    let held = key("held");
    let holder = OwnerToken::generate();
    insert_live_row(s, &table, &held, &holder).await;

    // A reader before any writer: the hold, its owner, no value.
    let reader = s.backend_of(&table);
    let st = reader.inspect(&held).await.unwrap();
    assert!(st.held, "{st:?}");
    assert_eq!((st.owner.as_ref(), st.value), (Some(&holder), None));
    assert_eq!(st.fence.map(|f| f.0), Some(7));
    assert!(!has_value(s, &table).await, "a read altered the table");

    // Many clients start at once on the old table.
    let clients: Vec<SqlBackend> = (0..8).map(|_| s.backend_of(&table)).collect();
    let started = futures::future::join_all(clients.iter().map(|b| b.migrate())).await;
    for r in started {
        r.expect("setting up an old table with 8 clients at once");
    }
    assert!(has_value(s, &table).await);
    // And again, on a table that has it.
    s.backend_of(&table).migrate().await.unwrap();

    // The hold is still there, and still its holder's.
    let b = &clients[0];
    let stranger = b.try_lock(&held, &OwnerToken::generate(), TTL).await;
    assert!(
        matches!(stranger, Ok(Acquire::Contended { .. })),
        "{stranger:?}"
    );
    let st = b.inspect(&held).await.unwrap();
    assert_eq!((st.owner.as_ref(), st.value), (Some(&holder), None));
    assert_eq!(
        b.proclaim_as(&held, &holder, b"now with a value")
            .await
            .unwrap(),
        Renew::Renewed
    );
    assert_eq!(
        b.renew_lock(&held, &holder, TTL).await.unwrap(),
        Renew::Renewed
    );
    let st = reader.inspect(&held).await.unwrap();
    assert_eq!(st.value.as_deref(), Some(&b"now with a value"[..]));
    assert_eq!(st.fence.map(|f| f.0), Some(7));
    assert_eq!(b.unlock(&held, &holder).await.unwrap(), Release::Freed);
    assert_eq!(s.stored_in(&table, &held).await, Some(None));

    // Elections on the upgraded table.
    let election = Locker::new(clients[1].clone())
        .election(key("after").as_str())
        .unwrap();
    let mut leading = election
        .campaign_with("leader", &LockOptions::new().ttl(TTL))
        .await
        .unwrap();
    leading.proclaim("changed").await.unwrap();
    let leader = Locker::new(reader.clone())
        .election(election.name().as_str())
        .unwrap()
        .leader()
        .await
        .unwrap()
        .expect("someone leads");
    assert_eq!(leader.value, b"changed");
    leading.resign().await.unwrap();
    assert!(election.leader().await.unwrap().is_none());
    if s.dialect != Dialect::Sqlite {
        // The holders table goes too, where the dialect has one.
        let drop = format!("DROP TABLE {table}; DROP TABLE IF EXISTS {table}_holders");
        for stmt in drop.split("; ") {
            common::execute(s.dialect, &s.url, stmt).await.unwrap();
        }
    }
}

async fn has_value(s: &Store, table: &str) -> bool {
    common::has_column(s.dialect, &s.url, table, "value")
        .await
        .unwrap()
}

/// A lock held for a minute more, written as the previous release wrote
/// it: owner, one hold, fence 7.
async fn insert_live_row(s: &Store, table: &str, key: &LockKey, owner: &OwnerToken) {
    let expires = match s.dialect {
        Dialect::Postgres => "now() + interval '60 seconds'",
        Dialect::MySql => "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) + 60000",
        _ => "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) + 60000",
    };
    // Hex and a token of [0-9a-f]: nothing to quote.
    let sql = format!(
        "INSERT INTO {table} (key_hash, lock_key, owner, holds, fence, expires_at)
         VALUES ('{}', '{}', '{}', 1, 7, {expires})",
        hash(key),
        key.as_str(),
        owner.as_str()
    );
    common::execute(s.dialect, &s.url, &sql).await.unwrap();
}

/// The tests above, once for each store the features build.
macro_rules! per_store {
    ($($name:ident),* $(,)?) => {
        #[cfg(feature = "sqlite")]
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(&super::Store::sqlite()).await
            })*
        }
        #[cfg(feature = "postgres")]
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(&super::Store::server(super::Dialect::Postgres)).await
            })*
        }
        #[cfg(feature = "mysql")]
        mod mariadb {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(&super::Store::server(super::Dialect::MySql)).await
            })*
        }
    };
}

per_store!(
    a_value_round_trips_through_grant_proclaim_and_inspect,
    proclaim_leaves_the_lease_where_it_was,
    re_entries_and_renewals_leave_the_value_alone,
    a_takeover_writes_the_new_owners_value_and_strangers_write_nothing,
    campaign_leader_proclaim_and_resign,
    a_leader_that_lost_its_lease_cannot_proclaim,
    a_table_of_the_previous_release_gains_the_column_with_its_locks_held,
);

/// Session locks keep nothing beside the lock: no values, `proclaim` is
/// `Unsupported`, and so are elections.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn session_locks_keep_no_values(dialect: Dialect) {
    use lockwright_sql::SqlSessionBackend;
    let url = with_params(&common::server_url(dialect), "mode=session");
    let b = SqlSessionBackend::connect(&url).unwrap();
    assert!(!b.capabilities().values);
    let k = key("session");
    let owner = OwnerToken::generate();
    let request = AcquireRequest::mutex(&k, &owner, TTL)
        .with_value("ignored")
        .unwrap();
    assert!(matches!(
        b.try_acquire(&request).await.unwrap(),
        Acquire::Acquired(_)
    ));
    let err = b.proclaim_as(&k, &owner, b"v").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let st = b.inspect(&k).await.unwrap();
    assert!(st.held);
    assert_eq!(st.value, None);
    let err = Locker::new(b.clone()).election(k.as_str()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert_eq!(b.unlock(&k, &owner).await.unwrap(), Release::Freed);
}

#[cfg(feature = "postgres")]
#[tokio::test]
async fn postgres_session_locks_keep_no_values() {
    session_locks_keep_no_values(Dialect::Postgres).await;
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mariadb_session_locks_keep_no_values() {
    session_locks_keep_no_values(Dialect::MySql).await;
}
