//! Redlock over 5 masters: for every subset of nodes that is down, or held
//! by another owner, acquire succeeds exactly when a quorum (3) is free, and
//! a failed acquire leaves nothing of ours on any node: no key of any
//! kind, fencing counters included. Grants and renewals that come back
//! after their TTL do not count.

mod common;

use std::time::Duration;

use lockwright_conformance::kit::servers::redlock_ports;
use lockwright_conformance::quorum::{
    acquire_succeeds_iff_a_majority_is_free, late_answers_do_not_count,
};
use lockwright_core::backend::{Acquire, LockBackend, LockBackendExt};
use lockwright_core::{ErrorKind, LockKey, OwnerToken};
use lockwright_redis::{internals, RedisBackend, RedlockBackend};

const TTL: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_succeeds_iff_a_quorum_is_free() {
    let ports = redlock_ports();
    assert_eq!(ports.len(), 5, "the test wants five Redlock nodes");
    let direct: Vec<RedisBackend> = ports
        .iter()
        .map(|p| RedisBackend::connect(&format!("redis://127.0.0.1:{p}")).unwrap())
        .collect();
    let run = OwnerToken::generate();
    let keys = acquire_succeeds_iff_a_majority_is_free(
        &direct,
        |down| {
            let mut url_ports = ports.clone();
            for &i in down {
                url_ports[i] = 1;
            }
            RedlockBackend::connect(&common::redlock_url(&url_ports)).unwrap()
        },
        &format!("redlock-quorum/{}", &run.as_str()[..8]),
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    // And no key of any kind under these names on any node: Redlock writes
    // no fencing counter, and a failed acquire leaves no queue or lock.
    for key in &keys {
        for (i, port) in ports.iter().enumerate() {
            let url = format!("redis://127.0.0.1:{port}");
            let left = common::scan(&url, &format!("*{{{}}}*", key.as_str())).await;
            assert!(left.is_empty(), "{key:?}: node {i} kept {left:?}");
        }
    }
}

/// The shared late-answer test over Redlock's own nodes (the masters'
/// quorum scripts), each behind a gate that holds one request back past
/// the TTL: such a grant or renewal does not count, and the late grants are
/// undone on every master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_renewals_that_come_back_after_the_ttl_do_not_count() {
    let url = common::redlock_url(&redlock_ports());
    let run = OwnerToken::generate();
    late_answers_do_not_count(
        internals::redlock_nodes(&url).unwrap(),
        |nodes| internals::redlock_over(&url, nodes).unwrap(),
        &format!("redlock-late/{}", &run.as_str()[..8]),
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

/// Redlock's status counts a quorum per owner, and says `Unavailable` when
/// the nodes that did not answer could make or break it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_needs_a_quorum_of_one_owner() {
    let ports = redlock_ports();
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
                let got = direct[i].try_lock(&key, owner, TTL).await.unwrap();
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
                let _ = direct[i].unlock(&key, owner).await;
            }
        }
    }
}
