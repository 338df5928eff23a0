//! The suite can fail: each deliberately broken backend is caught by the
//! cases that guard the promise it breaks.

use std::sync::Arc;
use std::time::Duration;

use lockwright_conformance::broken::{BrokenHarness, Defect, UntimedQuorum};
use lockwright_conformance::quorum::{
    acquire_succeeds_iff_a_majority_is_free, late_answers_do_not_count,
};
use lockwright_conformance::{failing_cases, MemoryHarness};
use lockwright_core::backend::{LockBackend, MemoryBackend, Quorum};

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
async fn a_campaign_that_ignores_the_leader_is_caught() {
    check(Defect::CampaignIgnoresLeader, &["one_leader_at_a_time"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stale_leader_value_is_caught() {
    check(Defect::StaleLeaderValue, &["leader_agrees_with_the_holder"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_expired_leader_shown_is_caught() {
    check(
        Defect::ExpiredLeaderShown,
        &["observe_reports_each_reign_in_order"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resignation_that_keeps_the_lease_is_caught() {
    check(Defect::ResignKeepsLease, &["resign_hands_over_at_once"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_proclaim_without_owner_check_is_caught() {
    check(
        Defect::ProclaimWithoutOwnerCheck,
        &["former_leader_cannot_proclaim"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_campaign_grant_that_lands_late_is_caught() {
    check(
        Defect::CampaignGrantLandsLate,
        &["cancelled_campaign_leaves_no_leader"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_leader_when_down_is_caught() {
    check(
        Defect::NoLeaderWhenDown,
        &["leader_of_a_down_store_is_unavailable"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_changes_are_caught() {
    check(Defect::SilentChanges, &["announced_changes_wake_observers"]).await;
}

/// A defect is caught by `case` and by no other case of the suite.
async fn caught_by_alone(defect: Defect, case: &str) {
    caught_by_these_alone(defect, &[case]).await;
}

/// The case that compares a store's answers to claims with the reference
/// model's: it catches a defect of semaphores or read-write locks that its
/// sequences meet (its fixed opening meets each rule once).
const MODEL: &str = "claims_answer_as_the_model_does";

/// A defect is caught by `case`, the case made for it, by the comparison
/// with the model, and by no other case of the suite.
async fn caught_by_alone_and_the_model(defect: Defect, case: &str) {
    caught_by_these_alone(defect, &[case, MODEL]).await;
}

/// A defect is caught by `cases` (in suite order) and by no other case.
async fn caught_by_these_alone(defect: Defect, cases: &[&str]) {
    let harness = BrokenHarness::new(MemoryHarness::new(), defect);
    let failed = failing_cases(&harness).await;
    let names: Vec<&str> = failed.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names, cases,
        "{defect:?} should fail {cases:?} alone: {failed:#?}"
    );
}

/// The model's opening finds the fourth claim on a full semaphore granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_semaphore_that_over_grants_is_caught() {
    // The break case too: a fourth holder gets in after one of three goes.
    caught_by_these_alone(
        Defect::PermitsOverGrant,
        &[
            "n_plus_one_clients_never_hold_n_plus_one_permits",
            MODEL,
            "breaking_one_permit_leaves_the_others",
        ],
    )
    .await;
}

/// The model's opening counts a re-entered permit as one, and refuses
/// another N where the defect, counting every grant, answers "contended".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expired_permits_counted_are_caught() {
    // The break case too: a broken permit, never released, stays counted.
    caught_by_these_alone(
        Defect::ExpiredPermitsCounted,
        &[
            "expired_permit_is_reclaimed",
            MODEL,
            "breaking_one_permit_leaves_the_others",
        ],
    )
    .await;
}

/// The model's opening finds a semaphore of 3 turned into the N first
/// claimed on the name (a writer's 1); the refusal case's first claim of
/// 2 permits, on a mutex's name, is not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permits_not_kept_are_caught() {
    caught_by_these_alone(
        Defect::PermitsNotKept,
        &[
            "mismatched_permits_are_refused",
            "a_refused_claim_leaves_nothing",
            MODEL,
        ],
    )
    .await;
}

/// The model's opening finds an owner that holds no permit releasing
/// another's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_permit_release_without_owner_check_is_caught() {
    caught_by_alone_and_the_model(
        Defect::PermitReleaseWithoutOwnerCheck,
        "stale_permit_holder_cannot_release_or_renew",
    )
    .await;
}

/// The model's opening finds a third reader refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_that_exclude_are_caught() {
    caught_by_alone_and_the_model(Defect::ReadersExclude, "readers_share").await;
}

/// The model's opening finds a writer granted beside three readers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writer_that_ignores_readers_is_caught() {
    caught_by_alone_and_the_model(
        Defect::WriterIgnoresReaders,
        "writer_excludes_readers_and_writers",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readers_that_ignore_a_waiting_writer_are_caught() {
    caught_by_alone(
        Defect::ReadersIgnoreWaitingWriters,
        "waiting_writer_is_not_starved",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_downgrade_gap_is_caught() {
    caught_by_alone(
        Defect::DowngradeGap,
        "writer_downgrades_reader_never_upgrades",
    )
    .await;
}

/// A reader's second read must add a hold: the downgrade case's writer
/// reads twice, and the model's opening re-enters a read hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_uncounted_reader_reentry_is_caught() {
    caught_by_these_alone(
        Defect::ReaderReentryUncounted,
        &["writer_downgrades_reader_never_upgrades", MODEL],
    )
    .await;
}

/// Only the comparison with the model makes a semaphore's claim on a name
/// that readers hold, which must be refused, not left to wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permits_that_wait_on_readers_are_caught() {
    caught_by_alone(Defect::PermitsWaitOnReaders, MODEL).await;
}

/// The downgrade case's reader asks to write with its own token, and so
/// does the model's opening.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admitted_upgrade_is_caught() {
    caught_by_these_alone(
        Defect::UpgradeAdmitted,
        &["writer_downgrades_reader_never_upgrades", MODEL],
    )
    .await;
}

/// The model's opening finds a new reader kept out by the mark of a
/// writer that gave up.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ignored_abandon_is_caught() {
    caught_by_alone_and_the_model(
        Defect::AbandonIgnored,
        "abandoned_permit_acquire_leaves_nothing",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leaked_permit_names_are_caught() {
    caught_by_alone(Defect::LeaksClaimedNames, "permit_state_is_bounded").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_correct_backend_fails_nothing() {
    let failed = failing_cases(&MemoryHarness::new()).await;
    assert!(failed.is_empty(), "reference backend failed: {failed:#?}");
}

/// Three in-memory servers for the shared quorum tests: the servers
/// themselves, and nodes over them with the ones in `down` switched off.
fn quorum_nodes(servers: &[MemoryBackend], down: &[usize]) -> Vec<Arc<dyn LockBackend>> {
    servers
        .iter()
        .enumerate()
        .map(|(i, s)| -> Arc<dyn LockBackend> {
            if down.contains(&i) {
                let off = MemoryBackend::new();
                off.set_available(false);
                Arc::new(off)
            } else {
                Arc::new(s.clone())
            }
        })
        .collect()
}

fn quorum(nodes: Vec<Arc<dyn LockBackend>>) -> Quorum<Arc<dyn LockBackend>> {
    Quorum::new("in-memory quorum", nodes, Duration::from_millis(10)).expect("three nodes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_correct_quorum_passes_the_shared_quorum_tests() {
    let servers = vec![
        MemoryBackend::new(),
        MemoryBackend::new(),
        MemoryBackend::new(),
    ];
    acquire_succeeds_iff_a_majority_is_free(
        &servers,
        |down| quorum(quorum_nodes(&servers, down)),
        "q",
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    late_answers_do_not_count(quorum_nodes(&servers, &[]), quorum, "q")
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// The quorum that counts late answers passes the subset test and fails
/// the late-answer one: that case alone catches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_untimed_quorum_is_caught_by_the_late_answer_case_alone() {
    let servers = vec![
        MemoryBackend::new(),
        MemoryBackend::new(),
        MemoryBackend::new(),
    ];
    acquire_succeeds_iff_a_majority_is_free(
        &servers,
        |down| UntimedQuorum::new(quorum_nodes(&servers, down)),
        "q",
    )
    .await
    .unwrap_or_else(|e| panic!("the subset test should pass: {e:#}"));
    let e = late_answers_do_not_count(quorum_nodes(&servers, &[]), UntimedQuorum::new, "q")
        .await
        .expect_err("the late-answer case should catch the untimed quorum");
    assert!(format!("{e:#}").contains("past the"), "{e:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_that_renews_any_holder_is_caught() {
    caught_by_these_alone(
        Defect::BatchRenewsAnyHolder,
        &[
            "a_renewal_batch_answers_for_each_lease",
            "a_renewal_never_reaches_another_owners_lease",
        ],
    )
    .await;
}

/// MySQL's batch joined on the name alone: a batch of leases all taken
/// over matches as many rows as it asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_that_renews_by_name_only_is_caught() {
    caught_by_alone(
        Defect::RenewBatchByNameOnly,
        "a_renewal_never_reaches_another_owners_lease",
    )
    .await;
}

/// SQLite's batch without the owner: the answer is right, the holder's
/// lease grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_strangers_renewal_that_extends_the_lease_is_caught() {
    caught_by_alone(
        Defect::StrangerRenewExtends,
        "a_renewal_never_reaches_another_owners_lease",
    )
    .await;
}

/// The case made for it plays a claim right after a refusal, round after
/// round; the model's opening does once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusal_that_lingers_is_caught() {
    caught_by_alone_and_the_model(Defect::RefusalLingers, "a_refused_claim_leaves_nothing").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_break_that_keeps_the_fence_is_caught() {
    caught_by_these_alone(
        Defect::BreakKeepsFence,
        &["a_broken_holder_loses_the_lock_and_the_next_fence_is_higher"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_break_that_takes_every_holder_is_caught() {
    caught_by_these_alone(
        Defect::BreakTakesEveryHolder,
        &["breaking_one_permit_leaves_the_others"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_listing_that_misses_groups_is_caught() {
    caught_by_these_alone(
        Defect::ListMissesGroups,
        &[
            "list_shows_every_held_name_and_changes_nothing",
            // It lists what it shows who holds: a semaphore it missed.
            "status_and_list_show_who_holds",
        ],
    )
    .await;
}
