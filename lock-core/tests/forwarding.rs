//! The forwarding check knows every method of the trait, and the core's
//! own combinator, `Quorum`, sends each to its nodes or answers it as its
//! docs say. (`Arc`, `Box` and the conformance crate's wrappers are checked
//! in that crate's `tests/forwarding.rs`.)

use std::time::Duration;

use lockwright_conformance::kit::forwarding::{check, Expect, Method, Recorder};
use lockwright_core::backend::Quorum;

/// The methods `pub trait LockBackend` declares, read from its source.
fn trait_methods() -> Vec<String> {
    let source = include_str!("../src/backend.rs");
    let start = source
        .find("pub trait LockBackend")
        .expect("backend.rs declares LockBackend");
    let body = &source[start..];
    let end = body.find("\n}\n").expect("the trait's closing brace");
    body[..end]
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//"))
        .filter_map(|l| l.split_once("fn ").map(|(_, rest)| rest))
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

/// A method added to the trait fails here until the forwarding check
/// (`Method`, its recorder, every wrapper's table) knows it.
#[test]
fn the_forwarding_check_names_every_method_of_the_trait() {
    let declared = trait_methods();
    let known: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
    assert_eq!(
        declared, known,
        "LockBackend's methods and the forwarding check's `Method::ALL` differ: \
         add the new method to `Method`, the recorder and `forward_backend!`"
    );
}

/// What a quorum does with each call: every node gets the store's own
/// methods (a waiter's attempt as a plain one, a writer's give-up
/// included); the change notices, the release watch and the alarm are its
/// own (no notification, queue or alarm across independent nodes).
fn quorum(m: Method) -> Expect {
    match m {
        Method::Capabilities
        | Method::Verify
        | Method::TryAcquire
        | Method::Release
        | Method::Renew
        | Method::Inspect
        | Method::Proclaim
        // A writer giving up takes its marks away on every node.
        | Method::Abandon
        // Every node's names, together.
        | Method::List => Expect::Forwarded,
        Method::Changes | Method::Watch | Method::Alarm => Expect::Answered,
        // Broken as any wrapper breaks a hold: by the owner its own
        // `inspect` names, released on every node.
        Method::ForceRelease => Expect::Answered,
    }
}

#[tokio::test]
async fn a_quorum_sends_each_call_to_every_node_or_answers_it_itself() {
    let nodes = [Recorder::new(), Recorder::new(), Recorder::new()];
    let q = Quorum::new("test", nodes.to_vec(), Duration::from_millis(10)).unwrap();
    let inner: Vec<&Recorder> = nodes.iter().map(|n| &**n).collect();
    check(&q, &inner, quorum).await.unwrap();
}
