//! The shared conformance suite: one list of cases every lockwright backend
//! runs against a real store.
//!
//! A backend provides a [`Harness`] (how to make independent clients of the
//! store under test, and one of a store that is down) and calls
//! [`conformance_tests!`] once; every case then shows up as its own test:
//!
//! ```ignore
//! mod conformance {
//!     lockwright_conformance::conformance_tests!(crate::MyHarness::start().await);
//! }
//! ```
//!
//! [`CASES`] lists every case by the contract rule it proves; a rule's
//! cases live in its module under [`cases`], whose docs state the rule.
//!
//! Cases read the backend's [`Capabilities`](lockwright_core::backend::Capabilities) to
//! adapt expectations (fencing or not, TTL resolution), never to skip a
//! safety property. The suite itself is tested: [`broken`] holds
//! deliberately broken backends, and this crate's tests prove each one fails.
//!
//! With the `kit` feature, `kit` holds what backends' tests share beside
//! the suite: where the test servers are, the outage tests' private
//! servers, and the check that a wrapper forwards every method.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod broken;
pub mod cases;
pub mod faults;
mod harness;
#[cfg(feature = "kit")]
pub mod kit;
mod memory;
pub mod quorum;

use std::time::Duration;

use futures::future::BoxFuture;

pub use cases::Rule;
pub use harness::Harness;
pub use memory::{MemoryHarness, QuorumHarness};

/// How long one case may run before it counts as failed (a broken backend
/// must fail the suite, not hang it).
pub const CASE_TIMEOUT: Duration = Duration::from_secs(90);

/// The one list of cases, by the contract rule each proves (a rule's
/// cases live in `cases/<rule>.rs`). `__expand_cases!` turns it into
/// [`CASES`] and into one `#[tokio::test]` per case for
/// [`conformance_tests!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __case_list {
    ($($mode:tt)*) => {
        $crate::__expand_cases! { [$($mode)*]
            Exclusion exclusion {
                exclusion_between_clients,
                exclusion_shared_counter,
            }
            Waiting waiting {
                try_lock_never_waits,
                wait_acquires_after_release,
                wait_times_out_near_deadline,
                waiter_is_woken_by_release,
                cancelled_acquire_leaves_nothing_held,
                cancelled_acquire_with_a_grant_in_flight_is_undone,
                fair_waiters_served_in_order,
            }
            Expiry expiry {
                expired_lease_can_be_taken,
                still_exclusive_near_expiry,
                at_least_keeps_the_name_after_a_short_run,
                at_most_ends_a_hung_runs_hold,
            }
            Renewal renewal {
                renew_extends_lease,
                renewal_watchdog_keeps_lock,
                a_renewal_batch_answers_for_each_lease,
                a_renewal_never_reaches_another_owners_lease,
            }
            Ownership ownership {
                stale_owner_cannot_renew_or_release,
                release_checks_owner,
            }
            Loss loss {
                abandoned_lock_frees_at_ttl,
                dropped_guard_releases_in_background,
                lost_signal_fires_before_takeover,
            }
            Outage outage {
                unavailable_is_an_error_not_contention,
            }
            Names names {
                keys_are_case_sensitive,
                tricky_keys_are_distinct,
            }
            Input input {
                invalid_input_is_typed,
            }
            Reentrancy reentrancy {
                reentrant_same_owner,
            }
            Status status {
                status_reads_without_changing,
            }
            Fencing fencing {
                fencing_strictly_increases,
                fencing_rises_after_state_is_collected,
            }
            StoreState store_state {
                store_state_is_bounded,
            }
            MultiLock multi_lock {
                multi_lock_all_or_nothing,
                multi_lock_opposite_orders_do_not_deadlock,
            }
            Election election {
                one_leader_at_a_time,
                leader_agrees_with_the_holder,
                observe_reports_each_reign_in_order,
                resign_hands_over_at_once,
                former_leader_cannot_proclaim,
                a_leadership_without_its_lease_cannot_proclaim,
                cancelled_campaign_leaves_no_leader,
                announced_changes_wake_observers,
                leader_of_a_down_store_is_unavailable,
                a_stander_leads_again_after_losing,
            }
            Permits permits {
                n_plus_one_clients_never_hold_n_plus_one_permits,
                expired_permit_is_reclaimed,
                mismatched_permits_are_refused,
                a_refused_claim_leaves_nothing,
                stale_permit_holder_cannot_release_or_renew,
                readers_share,
                writer_excludes_readers_and_writers,
                waiting_writer_is_not_starved,
                writer_downgrades_reader_never_upgrades,
                abandoned_permit_acquire_leaves_nothing,
                permit_state_is_bounded,
                available_counts_the_permits_held_and_free,
            }
            ClaimRules claim_rules {
                claims_answer_as_the_model_does,
            }
            Breaking breaking {
                a_broken_holder_loses_the_lock_and_the_next_fence_is_higher,
                breaking_one_permit_leaves_the_others,
            }
            Listing listing {
                list_shows_every_held_name_and_changes_nothing,
                status_and_list_show_who_holds,
            }
            Scoped scoped {
                scoped_work_frees_the_name_before_it_returns,
                scoped_work_is_stopped_when_its_hold_is_broken,
            }
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __expand_cases {
    ([runner] $($rule:ident $module:ident { $($name:ident),* $(,)? })*) => {
        /// Every case of the suite, by the contract rule it proves, in the
        /// order [`failing_cases`] runs them:
        ///
        $(
            #[doc = concat!(
                "- [", stringify!($module), "](crate::cases::", stringify!($module), "):"
            )]
            $(
                #[doc = concat!(
                    "  - [`", stringify!($name), "`](crate::cases::",
                    stringify!($module), "::", stringify!($name), ")"
                )]
            )*
        )*
        pub static CASES: &[Case] = &[
            $($(
                Case {
                    name: stringify!($name),
                    rule: $crate::cases::Rule::$rule,
                    start: |h| Box::pin($crate::cases::$module::$name(h)),
                    module: stringify!($module),
                    source: include_str!(concat!("cases/", stringify!($module), ".rs")),
                },
            )*)*
        ];

        /// Every case's name, in suite order (the names of [`CASES`]).
        pub const CASE_NAMES: &[&str] = &[$($(stringify!($name),)*)*];
    };
    ([tests $harness:expr] $($rule:ident $module:ident { $($name:ident),* $(,)? })*) => {
        $($(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let harness = $harness;
                if let Err(e) = $crate::run_case(stringify!($name), &harness).await {
                    panic!("conformance case {} failed: {e:#}", stringify!($name));
                }
            }
        )*)*
    };
}

/// One conformance case: a check of one contract rule against a store.
#[derive(Clone, Copy)]
pub struct Case {
    /// Its name, which is also the name of its test and its function.
    pub name: &'static str,
    /// The contract rule it proves.
    pub rule: Rule,
    start: for<'a> fn(&'a dyn Harness) -> BoxFuture<'a, anyhow::Result<()>>,
    /// The module it lives in, `cases/<module>.rs`.
    module: &'static str,
    /// That module's source, where its doc comment is read from.
    source: &'static str,
}

impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("rule", &self.rule)
            .field("module", &self.module)
            .finish_non_exhaustive()
    }
}

impl Case {
    /// What it checks: its function's doc comment, one line per line.
    pub fn doc(&self) -> String {
        cases::doc_comment(self.source, self.name).unwrap_or_default()
    }

    /// Runs it against `harness`, failing it after [`CASE_TIMEOUT`].
    ///
    /// # Errors
    /// The promise it found broken, or the timeout.
    pub async fn run(&self, harness: &dyn Harness) -> anyhow::Result<()> {
        match tokio::time::timeout(CASE_TIMEOUT, (self.start)(harness)).await {
            Ok(result) => result,
            Err(_) => anyhow::bail!("case {} did not finish within {CASE_TIMEOUT:?}", self.name),
        }
    }
}

__case_list!(runner);

/// The case named `name`.
pub fn case(name: &str) -> Option<&'static Case> {
    CASES.iter().find(|c| c.name == name)
}

/// Runs one case by name under [`CASE_TIMEOUT`].
///
/// # Errors
/// The case's failure, a timeout, or an unknown name.
pub async fn run_case(name: &str, harness: &dyn Harness) -> anyhow::Result<()> {
    match case(name) {
        Some(c) => c.run(harness).await,
        None => anyhow::bail!("no conformance case named {name:?}"),
    }
}

/// Generates one `#[tokio::test]` per conformance case. The argument is an
/// expression (it may `.await`) evaluated in each test to build the harness.
/// The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) as a
/// dev-dependency.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::__case_list!(tests $harness);
    };
}

/// Runs every case and returns the names of those that failed, with why.
pub async fn failing_cases(harness: &dyn Harness) -> Vec<(&'static str, String)> {
    let mut failed = Vec::new();
    for case in CASES {
        if let Err(e) = case.run(harness).await {
            failed.push((case.name, format!("{e:#}")));
        }
    }
    failed
}
