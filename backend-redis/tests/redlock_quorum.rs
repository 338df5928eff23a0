//! Redlock over 5 masters: for every subset of nodes that is down, or held
//! by another owner, acquire succeeds exactly when a quorum (3) is free, and
//! a failed acquire leaves nothing of ours on any node: no key of any
//! kind, fencing counters included.

mod common;

use std::time::Duration;

use locksmith_core::backend::{Acquire, LockBackend, Release};
use locksmith_core::{ErrorKind, LockKey, OwnerToken};
use locksmith_redis::{RedisBackend, RedlockBackend};

const TTL: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    Down,
    HeldByAnother,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_succeeds_iff_a_quorum_is_free() {
    let ports = common::redlock_ports();
    assert_eq!(ports.len(), 5, "the test wants five Redlock nodes");
    let direct: Vec<RedisBackend> = ports
        .iter()
        .map(|p| RedisBackend::connect(&format!("redis://127.0.0.1:{p}")).unwrap())
        .collect();
    let run = OwnerToken::generate();
    for fault in [Fault::Down, Fault::HeldByAnother] {
        for mask in 0u32..32 {
            let key = LockKey::new(format!(
                "redlock-quorum/{}/{fault:?}/{mask}",
                &run.as_str()[..8]
            ))
            .unwrap();
            let faulty: Vec<usize> = (0..5).filter(|i| mask & (1 << i) != 0).collect();
            let stranger = OwnerToken::generate();
            let mut url_ports = ports.clone();
            for &i in &faulty {
                match fault {
                    Fault::Down => url_ports[i] = 1,
                    Fault::HeldByAnother => {
                        let got = direct[i].try_acquire(&key, &stranger, TTL).await.unwrap();
                        assert!(matches!(got, Acquire::Acquired(_)));
                    }
                }
            }
            let redlock = RedlockBackend::connect(&common::redlock_url(&url_ports)).unwrap();
            let me = OwnerToken::generate();
            let outcome = redlock.try_acquire(&key, &me, TTL).await;
            let free = 5 - faulty.len();
            let case = format!("{fault:?} on nodes {faulty:?}");
            if free >= 3 {
                assert!(
                    matches!(outcome, Ok(Acquire::Acquired(Grant { fence: None, .. }))),
                    "{case}: expected a grant without a fence, got {outcome:?}"
                );
                assert_eq!(
                    redlock.release(&key, &me).await.unwrap(),
                    Release::Freed,
                    "{case}"
                );
            } else {
                match fault {
                    Fault::Down => assert_eq!(
                        outcome.as_ref().err().map(|e| e.kind()),
                        Some(ErrorKind::Unavailable),
                        "{case}: {outcome:?}"
                    ),
                    Fault::HeldByAnother => assert!(
                        matches!(outcome, Ok(Acquire::Contended { .. })),
                        "{case}: {outcome:?}"
                    ),
                }
            }
            // Nothing of ours anywhere: an owner-checked release on each
            // reachable node finds no hold (and would have removed one).
            for (i, node) in direct.iter().enumerate() {
                assert_eq!(
                    node.release(&key, &me).await.unwrap(),
                    Release::NotHeld,
                    "{case}: our key was left on node {i}"
                );
            }
            // The other owner's holds are untouched.
            for &i in &faulty {
                if fault == Fault::HeldByAnother {
                    assert_eq!(
                        direct[i].release(&key, &stranger).await.unwrap(),
                        Release::Freed,
                        "{case}"
                    );
                }
            }
            // And no key of any kind under this name on any node: Redlock
            // writes no fencing counter, and a failed acquire leaves no
            // queue or lock behind.
            for (i, port) in ports.iter().enumerate() {
                let url = format!("redis://127.0.0.1:{port}");
                let left = common::scan(&url, &format!("*{{{}}}*", key.as_str())).await;
                assert!(left.is_empty(), "{case}: node {i} kept {left:?}");
            }
        }
    }
}

use locksmith_core::backend::Grant;

/// Redlock's status counts a quorum per owner, and says `Unavailable` when
/// the nodes that did not answer could make or break it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_needs_a_quorum_of_one_owner() {
    let ports = common::redlock_ports();
    let direct: Vec<RedisBackend> = ports
        .iter()
        .map(|p| RedisBackend::connect(&format!("redis://127.0.0.1:{p}")).unwrap())
        .collect();
    let run = OwnerToken::generate();
    let (a, b, c) = (
        OwnerToken::generate(),
        OwnerToken::generate(),
        OwnerToken::generate(),
    );
    // (holders per node, nodes down) -> held, free, or unknowable (None).
    type Case<'a> = (&'a [Option<&'a OwnerToken>], &'a [usize], Option<bool>);
    let cases: [Case; 6] = [
        (&[Some(&a), Some(&a), Some(&a), None, None], &[], Some(true)),
        (
            &[Some(&a), Some(&b), Some(&c), None, None],
            &[],
            Some(false),
        ),
        (
            &[Some(&a), Some(&a), Some(&b), Some(&b), None],
            &[],
            Some(false),
        ),
        (&[Some(&a), Some(&a), None, None, None], &[3, 4], None),
        // a could hold the two nodes that are down as well.
        (&[Some(&a), None, None, None, None], &[3, 4], None),
        (&[None, None, None, None, None], &[3, 4], Some(false)),
    ];
    for (n, (holders, down, want)) in cases.iter().enumerate() {
        let key = LockKey::new(format!("redlock-status/{}/{n}", &run.as_str()[..8])).unwrap();
        for (i, h) in holders.iter().enumerate() {
            if let Some(owner) = h {
                let got = direct[i].try_acquire(&key, owner, TTL).await.unwrap();
                assert!(matches!(got, Acquire::Acquired(_)));
            }
        }
        let mut url_ports = ports.clone();
        for &i in *down {
            url_ports[i] = 1;
        }
        let redlock = RedlockBackend::connect(&common::redlock_url(&url_ports)).unwrap();
        let got = redlock.inspect(&key).await;
        match want {
            Some(held) => {
                let s = got.unwrap_or_else(|e| panic!("case {n}: {e}"));
                assert_eq!(s.held, *held, "case {n}: {s:?}");
                if *held {
                    assert!(s.remaining.is_some_and(|r| r <= TTL), "case {n}: {s:?}");
                }
            }
            None => assert_eq!(
                got.map(|s| s.held).unwrap_err().kind(),
                ErrorKind::Unavailable,
                "case {n}"
            ),
        }
        for (i, h) in holders.iter().enumerate() {
            if let Some(owner) = h {
                let _ = direct[i].release(&key, owner).await;
            }
        }
    }
}
