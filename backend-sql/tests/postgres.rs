//! The whole conformance suite on PostgreSQL, in lease and in session mode.
#![cfg(feature = "postgres")]

mod common;

use common::ServerHarness;
use lockwright_sql::Dialect;

mod lease {
    lockwright_conformance::conformance_tests!(super::ServerHarness::new(
        super::Dialect::Postgres,
        ""
    ));
}

mod session {
    lockwright_conformance::conformance_tests!(super::ServerHarness::new(
        super::Dialect::Postgres,
        "mode=session"
    ));
}

/// PostgreSQL session mode's readers and writers, beyond the shared cases:
/// the turnstile a waiting writer holds keeps new readers out only while
/// the writer keeps asking.
mod turnstile {
    use std::time::{Duration, Instant};

    use lockwright_conformance::kit::servers::postgres_url;
    use lockwright_conformance::kit::with_params;
    use lockwright_core::backend::{
        Acquire, AcquireRequest, HoldId, HoldKind, LockBackend, MARK_LIFE,
    };
    use lockwright_core::{LockKey, OwnerToken};
    use lockwright_sql::SqlSessionBackend;

    fn client() -> SqlSessionBackend {
        SqlSessionBackend::connect(&with_params(&postgres_url(), "mode=session"))
            .expect("valid URL")
    }

    /// A new owner's read hold of `k`.
    fn reader(k: &LockKey) -> HoldId {
        HoldId::new(
            k.clone(),
            OwnerToken::generate(),
            HoldKind::Reader { beside: None },
        )
    }

    async fn got(b: &SqlSessionBackend, hold: &HoldId) -> bool {
        let ttl = Duration::from_secs(30);
        matches!(
            b.try_acquire(&AcquireRequest::new(hold.clone(), ttl))
                .await
                .expect("an answer"),
            Acquire::Acquired(_)
        )
    }

    /// A writer refused by a reader keeps later readers out; once it stops
    /// asking (a caller that never gave up through the `Locker`), its
    /// turnstile lapses within a few `MARK_LIFE`s, not with the process.
    #[tokio::test]
    async fn a_quiet_writers_turnstile_lapses() {
        let k = LockKey::new(format!("turnstile/{}", OwnerToken::generate().as_str())).unwrap();
        let (a, b, c) = (client(), client(), client());
        let first = reader(&k);
        assert!(got(&a, &first).await, "the first reader was refused");
        let writer = HoldId::new(k.clone(), OwnerToken::generate(), HoldKind::Writer);
        assert!(!got(&b, &writer).await, "a writer got in beside a reader");
        assert!(
            !got(&c, &reader(&k)).await,
            "a new reader got in while a writer waited"
        );
        let start = Instant::now();
        let late = reader(&k);
        loop {
            if got(&c, &late).await {
                break;
            }
            assert!(
                start.elapsed() < MARK_LIFE * 4,
                "a writer that stopped asking kept readers out for {:?}",
                start.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            start.elapsed() >= MARK_LIFE / 2,
            "the turnstile lapsed after only {:?}",
            start.elapsed()
        );
        // The writer comes back once the readers leave.
        a.release(&first).await.unwrap();
        c.release(&late).await.unwrap();
        assert!(
            got(&b, &writer).await,
            "the writer was refused on a free name"
        );
        b.release(&writer).await.unwrap();
    }

    /// `status` counts each session's hold, shared or not.
    #[tokio::test]
    async fn status_shows_readers() {
        let k = LockKey::new(format!("turnstile/{}", OwnerToken::generate().as_str())).unwrap();
        let (a, b) = (client(), client());
        let (r1, r2) = (reader(&k), reader(&k));
        assert!(got(&a, &r1).await && got(&b, &r2).await);
        let s = a.inspect(&k).await.unwrap();
        assert!(s.is_shared() && s.holder_count() == 2, "{s:?}");
        a.release(&r1).await.unwrap();
        b.release(&r2).await.unwrap();
        assert!(!a.inspect(&k).await.unwrap().held);
    }
}

#[tokio::test]
async fn a_lone_permit_moves_out_when_the_group_grows() {
    let url = common::server_url(Dialect::Postgres);
    common::a_lone_permit_moves_out_when_the_group_grows(&url).await;
}
