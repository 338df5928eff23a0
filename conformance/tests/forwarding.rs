//! Every wrapper in this crate forwards each method of the trait to the
//! client it wraps, except those it answers or reroutes on purpose, which
//! its table below names. A method added to the trait does not compile
//! here until each table says what happens to it.

use std::sync::Arc;

use async_trait::async_trait;
use lockwright_conformance::broken::{BrokenHarness, Defect};
use lockwright_conformance::faults::{Partition, Stall};
use lockwright_conformance::kit::forwarding::{check, Expect, Method, Recorder};
use lockwright_conformance::Harness;
use lockwright_core::backend::LockBackend;

/// Every method to the same method of the inner client.
fn all_forwarded(m: Method) -> Expect {
    match m {
        Method::Capabilities
        | Method::Verify
        | Method::TryAcquire
        | Method::Release
        | Method::Renew
        | Method::Inspect
        | Method::Proclaim
        | Method::Changes
        | Method::Watch
        | Method::Abandon
        | Method::Alarm
        | Method::ForceRelease
        | Method::List => Expect::Forwarded,
    }
}

#[tokio::test]
async fn arc_and_box_forward_everything() {
    let r = Recorder::new();
    let arc: Arc<dyn LockBackend> = r.clone();
    check(&arc, &[&r], all_forwarded).await.unwrap();
    let boxed: Box<dyn LockBackend> = Box::new(arc);
    check(&boxed, &[&r], all_forwarded).await.unwrap();
}

#[tokio::test]
async fn observed_forwards_everything() {
    let r = Recorder::new();
    let partition = Partition::new(r.clone());
    check(&*partition, &[&r], all_forwarded).await.unwrap();
}

#[tokio::test]
async fn stall_forwards_everything_once_open() {
    let r = Recorder::new();
    let stall = Stall::new(r.clone());
    stall.open();
    check(&*stall, &[&r], all_forwarded).await.unwrap();
}

/// A harness whose one client is the recorder.
struct Recorded(Arc<Recorder>);

#[async_trait]
impl Harness for Recorded {
    async fn client(&self) -> Arc<dyn LockBackend> {
        self.0.clone()
    }
    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        self.0.clone()
    }
}

/// Where a broken client sends each call: through its own defective
/// acquire and renewal, so that a defect shows on every path.
fn broken(defect: Defect, m: Method) -> Expect {
    match m {
        // The defect itself: a subscription that never reaches the store.
        Method::Changes if defect == Defect::SilentChanges => Expect::Answered,
        Method::Capabilities
        | Method::Verify
        | Method::TryAcquire
        | Method::Release
        | Method::Inspect
        | Method::Proclaim
        | Method::Changes
        | Method::Watch
        | Method::Alarm
        | Method::ForceRelease
        | Method::List => Expect::Forwarded,
        // The defect itself: a renewal that releases.
        Method::Renew if defect == Defect::RenewReleases => Expect::As(Method::Release),
        Method::Renew => Expect::Forwarded,
        // The defect itself: a waiter giving up is ignored.
        Method::Abandon if defect == Defect::AbandonIgnored => Expect::Answered,
        // Nothing is ever queued, but a writer's mark is taken away.
        Method::Abandon => Expect::Forwarded,
    }
}

#[tokio::test]
async fn broken_clients_forward_all_but_their_defects() {
    for defect in Defect::ALL {
        let r = Recorder::new();
        let client = BrokenHarness::new(Recorded(r.clone()), defect)
            .client()
            .await;
        check(&client, &[&r], |m| broken(defect, m))
            .await
            .unwrap_or_else(|e| panic!("{defect:?}:\n{e}"));
    }
}
