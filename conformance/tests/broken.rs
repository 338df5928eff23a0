//! The suite can fail: each deliberately broken backend is caught by the
//! cases that guard the promise it breaks.

use locksmith_conformance::broken::{BrokenHarness, Defect};
use locksmith_conformance::{failing_cases, MemoryHarness};

async fn check(defect: Defect, must_fail: &[&str]) {
    let harness = BrokenHarness::new(MemoryHarness::new(), defect);
    let failed = failing_cases(&harness).await;
    let names: Vec<&str> = failed.iter().map(|(n, _)| *n).collect();
    for case in must_fail {
        assert!(
            names.contains(case),
            "{defect:?} should fail {case}, but only these failed: {failed:#?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_without_owner_check_is_caught() {
    check(Defect::ReleaseWithoutOwnerCheck, &["release_checks_owner"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_expiry_is_caught() {
    check(
        Defect::NoExpiry,
        &["expired_lease_can_be_taken", "abandoned_lock_frees_at_ttl"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renew_that_releases_is_caught() {
    check(
        Defect::RenewReleases,
        &["renew_extends_lease", "renewal_watchdog_keeps_lock"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn repeating_fence_is_caught() {
    check(Defect::RepeatingFence, &["fencing_strictly_increases"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn contended_when_down_is_caught() {
    check(
        Defect::ContendedWhenDown,
        &["unavailable_is_an_error_not_contention"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn false_fairness_is_caught() {
    check(Defect::ClaimsFairness, &["fair_waiters_served_in_order"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn early_takeover_is_caught() {
    check(Defect::EarlyTakeover, &["still_exclusive_near_expiry"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leaked_state_is_caught() {
    check(Defect::LeaksState, &["store_state_is_bounded"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fence_forgotten_on_collection_is_caught() {
    check(
        Defect::FenceForgottenOnCollection,
        &["fencing_rises_after_state_is_collected"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_correct_backend_fails_nothing() {
    let failed = failing_cases(&MemoryHarness::new()).await;
    assert!(failed.is_empty(), "reference backend failed: {failed:#?}");
}
