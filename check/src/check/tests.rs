//! The fault run's own tests: workers in this process, on the in-memory
//! store, some frozen past their lease inside the critical section. The
//! correct store passes (its fence stops the stale writers); each lock
//! broken on purpose must be caught.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use lockwright::backend::LockBackend;
use lockwright::{LockKey, Locker, OwnerToken};
use lockwright_conformance::broken::{BrokenHarness, Defect};
use lockwright_conformance::{Harness, MemoryHarness};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::history::{check, Verdict};
use super::resource::Resource;
use super::worker::{rand_below, work, Claims};
use lockwright_conformance::faults::{Observed, Observer};

/// Holds every call while frozen: a paused process, seen from the store.
#[derive(Debug)]
struct Frozen(watch::Sender<bool>);

#[async_trait]
impl Observer for Frozen {
    async fn gate(&self) -> lockwright::Result<()> {
        let _ = self.0.subscribe().wait_for(|f| !*f).await;
        Ok(())
    }
}

const TTL: Duration = Duration::from_millis(400);

/// Four workers for `run_for`; one section in four freezes its holder for
/// longer than the TTL between its read and its write.
async fn fault_run(h: &dyn Harness, run_for: Duration) -> Verdict {
    claims_run(h, run_for, Claims::Lock).await
}

/// [`fault_run`], the workers making `claims`.
async fn claims_run(h: &dyn Harness, run_for: Duration, claims: Claims) -> Verdict {
    let key = LockKey::new(format!(
        "check-selftest/{}",
        &OwnerToken::generate().as_str()[..8]
    ))
    .unwrap();
    let resource = match claims {
        Claims::Permits(n) => Resource::with_permits(n),
        _ => Resource::default(),
    };
    let stop = CancellationToken::new();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(Observed::wrap(
            h.client().await,
            Frozen(watch::channel(false).0),
        ));
    }
    let clients = Arc::new(clients);
    let inside = {
        let clients = clients.clone();
        move |id: u32| {
            let c = clients[id as usize].clone();
            async move {
                if rand_below(4) == 0 {
                    c.observer.0.send_replace(true);
                    tokio::time::sleep(TTL * 2).await;
                    c.observer.0.send_replace(false);
                }
            }
            .boxed()
        }
    };
    let mut tasks = Vec::new();
    for id in 0..4u32 {
        let client: Arc<dyn LockBackend> = clients[id as usize].clone();
        let locker = Locker::from_arc(client);
        let (key, stop, inside) = (key.clone(), stop.clone(), inside.clone());
        let mut ch = resource.clone();
        tasks.push(tokio::spawn(async move {
            work(
                &locker,
                &key,
                None,
                claims,
                TTL,
                id,
                &mut ch,
                &stop,
                Some(&inside),
            )
            .await
            .unwrap();
        }));
    }
    tokio::time::sleep(run_for).await;
    stop.cancel();
    for t in tasks {
        t.await.unwrap();
    }
    check(&resource.snapshot().0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_correct_store_passes_and_its_fence_stops_the_stale_writers() {
    // Enough history to mean something, however loaded the host: runs of
    // 4 s until it has it (a speed is never asserted), each judged clean.
    let (mut acquisitions, mut fenced_out) = (0, 0);
    for _ in 0..8 {
        let v = fault_run(&MemoryHarness::new(), Duration::from_secs(4)).await;
        assert_eq!((v.exclusion_violations, v.data_violations), (0, 0), "{v:?}");
        acquisitions += v.acquisitions;
        fenced_out += v.fenced_out;
        if acquisitions > 20 && fenced_out > 0 {
            break;
        }
    }
    assert!(acquisitions > 20, "{acquisitions} acquisitions in 8 runs");
    assert!(fenced_out > 0, "no frozen holder was fenced out in 8 runs");
}

/// Runs a broken lock until the checker catches it (a few seconds at most).
async fn caught(defect: Defect) -> Verdict {
    let h = BrokenHarness::new(MemoryHarness::new(), defect);
    for _ in 0..4 {
        let v = fault_run(&h, Duration::from_secs(3)).await;
        if v.exclusion_violations + v.data_violations > 0 {
            return v;
        }
    }
    panic!("the checker never caught {defect:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_without_owner_check_is_caught() {
    let v = caught(Defect::ReleaseWithoutOwnerCheck).await;
    assert!(v.exclusion_violations > 0, "{v:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_takeover_is_caught() {
    let v = caught(Defect::EarlyTakeover).await;
    assert!(v.exclusion_violations > 0, "{v:?}");
}

/// Permits and read-write locks on the correct store: never more holders
/// than the claims allow, and as many as they allow at some point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_correct_store_passes_with_permits_and_readers() {
    for (claims, most) in [(Claims::Permits(2), 2), (Claims::ReadWrite, 2)] {
        let mut seen = 0;
        for _ in 0..8 {
            let v = claims_run(&MemoryHarness::new(), Duration::from_secs(3), claims).await;
            assert_eq!(
                (v.exclusion_violations, v.data_violations),
                (0, 0),
                "{claims:?}: {v:?}"
            );
            seen = seen.max(v.most_at_once);
            if seen >= most {
                break;
            }
        }
        assert!(
            seen >= most,
            "{claims:?}: at most {seen} holders at once in 8 runs"
        );
    }
}

/// Runs a broken store's `claims` until the checker finds an exclusion
/// violation.
async fn claims_caught(defect: Defect, claims: Claims) {
    let h = BrokenHarness::new(MemoryHarness::new(), defect);
    for _ in 0..4 {
        if claims_run(&h, Duration::from_secs(3), claims)
            .await
            .exclusion_violations
            > 0
        {
            return;
        }
    }
    panic!("the checker never caught {defect:?} with {claims:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_over_grant_is_caught() {
    claims_caught(Defect::PermitsOverGrant, Claims::Permits(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_beside_readers_is_caught() {
    claims_caught(Defect::WriterIgnoresReaders, Claims::ReadWrite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeating_fence_is_caught() {
    let v = caught(Defect::RepeatingFence).await;
    assert!(v.data_violations > 0, "{v:?}");
}

/// `--election` in this process: three candidates campaign on `h` for
/// `run_for` while the two observers watch; then every candidate freezes
/// (a paused process: the leader neither renews nor resigns) until its
/// lease has long run out, while the observers go on watching. The observers' verdict.
async fn election_run(h: &dyn Harness, run_for: Duration) -> super::observers::LeaderVerdict {
    let key = LockKey::new(format!(
        "check-election/{}",
        &OwnerToken::generate().as_str()[..8]
    ))
    .unwrap();
    let resource = Resource::default();
    let stop = CancellationToken::new();
    let watcher = Locker::from_arc(h.client().await);
    let observers = super::observers::Observers::start(watcher.election(&key).unwrap());
    let freeze = watch::channel(false).0;
    let mut tasks = Vec::new();
    for id in 0..3u32 {
        let client: Arc<dyn LockBackend> = Observed::wrap(h.client().await, Frozen(freeze.clone()));
        let locker = Locker::from_arc(client);
        let election = locker.election(&key).unwrap();
        let (key, stop) = (key.clone(), stop.clone());
        let mut ch = resource.clone();
        tasks.push(tokio::spawn(async move {
            work(
                &locker,
                &key,
                Some(&election),
                Claims::Lock,
                TTL,
                id,
                &mut ch,
                &stop,
                None,
            )
            .await
            .unwrap();
        }));
    }
    tokio::time::sleep(run_for).await;
    freeze.send_replace(true);
    tokio::time::sleep(TTL * 5).await;
    freeze.send_replace(false);
    stop.cancel();
    for t in tasks {
        t.await.unwrap();
    }
    let (seen, errors) = observers.stop().await;
    let history = resource.snapshot().0;
    let v = check(&history);
    assert_eq!((v.exclusion_violations, v.data_violations), (0, 0), "{v:?}");
    super::observers::judge(&seen, &history.sections, TTL, errors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_correct_store_elects_one_leader_at_a_time_as_the_observers_see() {
    let v = election_run(&MemoryHarness::new(), Duration::from_secs(3)).await;
    assert_eq!(v.violations, 0, "{v:?}");
    assert!(v.reigns_seen > 2, "{v:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_showing_a_stale_leader_value_is_caught_by_the_observers() {
    let h = BrokenHarness::new(MemoryHarness::new(), Defect::StaleLeaderValue);
    let v = election_run(&h, Duration::from_secs(3)).await;
    assert!(v.violations > 0, "{v:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_showing_an_expired_leader_is_caught_by_the_observers() {
    let h = BrokenHarness::new(MemoryHarness::new(), Defect::ExpiredLeaderShown);
    let v = election_run(&h, Duration::from_secs(3)).await;
    assert!(v.violations > 0, "{v:?}");
}

/// At the cut-off, workers stop of themselves: a section begun after it is
/// refused and not recorded, while one begun before it and still running
/// runs to its end and is judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_section_begins_after_the_cut_off_and_one_begun_before_ends_and_is_judged() {
    use super::history::mono_ns;
    let h = MemoryHarness::new();
    let key = LockKey::new(format!(
        "check-cutoff/{}",
        &OwnerToken::generate().as_str()[..8]
    ))
    .unwrap();
    let resource = Resource::default();
    // The cut-off comes inside the third section, so one section is
    // certainly running across it, however slow the machine.
    let (sections, cut_at) = (
        std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0)),
        std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX)),
    );
    let inside = {
        let (resource, sections, cut_at) = (resource.clone(), sections.clone(), cut_at.clone());
        move |_: u32| {
            if sections.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 2 {
                let t = mono_ns();
                cut_at.store(t, std::sync::atomic::Ordering::SeqCst);
                resource.cut_off(t);
            }
            tokio::time::sleep(Duration::from_millis(150)).boxed()
        }
    };
    let stop = CancellationToken::new();
    let mut tasks = Vec::new();
    for id in 0..3u32 {
        let locker = Locker::from_arc(h.client().await);
        let (key, stop, inside) = (key.clone(), stop.clone(), inside.clone());
        let mut ch = resource.clone();
        tasks.push(tokio::spawn(async move {
            work(
                &locker,
                &key,
                None,
                Claims::Lock,
                TTL,
                id,
                &mut ch,
                &stop,
                Some(&inside),
            )
            .await
            .unwrap();
        }));
    }
    // Never cancelled: the cut-off alone ends the workers.
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("the workers stopped at the cut-off")
            .unwrap();
    }
    let cutoff = cut_at.load(std::sync::atomic::Ordering::SeqCst);
    let history = resource.snapshot().0;
    assert!(history.sections.len() > 2, "{history:?}");
    assert!(history.sections.iter().all(|s| s.start < cutoff));
    let last = history.sections.iter().max_by_key(|s| s.start).unwrap();
    assert!(
        last.end.is_some_and(|e| e > cutoff),
        "no section ran across the cut-off: {last:?}"
    );
    let v = check(&history);
    assert_eq!(v.accepted_writes, v.acquisitions, "{v:?}");
    assert_eq!((v.exclusion_violations, v.data_violations), (0, 0), "{v:?}");
}

/// The cases `check` skips for want of store access are cases of the
/// suite: a renamed case must not start running (and failing) unskipped.
#[test]
fn the_skipped_cases_are_cases_of_the_suite() {
    for name in super::harness::NEEDS_STORE_ACCESS {
        assert!(
            lockwright_conformance::case(name).is_some(),
            "{name} is not a conformance case"
        );
    }
}
