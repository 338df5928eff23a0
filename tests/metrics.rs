//! Every metric in the README's "Metrics" table moves as documented: a
//! recording recorder watches acquire, contend, hand off, time out,
//! cancel, renew, fail to renew, lose and lead, on the in-memory store and
//! on SQLite (and on Redis when built with it). Faults come from a wrapper
//! over the real store that fails its requests on demand.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lockwright::backend::{Acquire, AcquireRequest, LockBackend, Renew, RenewRequest};
use lockwright::{meter, Error, ErrorKind, LockOptions, Locker, Result};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

/// A real store whose acquires and renewals fail while told to.
#[derive(Debug)]
struct Faulty {
    inner: Arc<dyn LockBackend>,
    fail_acquire: AtomicBool,
    fail_renew: AtomicBool,
    /// Renewals answer that someone else holds the lock.
    renew_not_held: AtomicBool,
}

fn refused() -> Error {
    Error::unavailable("the test cut the store off")
}

lockwright_core::forward_backend! {
    (self) => self.inner;
    impl LockBackend for Faulty {
        // Fail on demand, a waiter's attempts too; otherwise the store's.
        async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
            if self.fail_acquire.load(Ordering::SeqCst) {
                return Err(refused());
            }
            self.inner.try_acquire(request).await
        }
        // Fail on demand; otherwise the store's.
        async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
            if self.fail_renew.load(Ordering::SeqCst) {
                return requests.iter().map(|_| Err(refused())).collect();
            }
            if self.renew_not_held.load(Ordering::SeqCst) {
                return requests.iter().map(|_| Ok(Renew::NotHeld)).collect();
            }
            self.inner.renew(requests).await
        }
    }
}

/// One series: its kind, name and labels.
type Series = (String, String, Vec<(String, String)>);

/// What the recorder saw, summed over snapshots (each snapshot hands out
/// what moved since the last one).
struct Seen {
    snapshotter: Snapshotter,
    totals: Mutex<BTreeMap<Series, (f64, usize)>>,
}

fn seen() -> &'static Seen {
    static SEEN: OnceLock<Seen> = OnceLock::new();
    SEEN.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this test binary");
        Seen {
            snapshotter,
            totals: Mutex::default(),
        }
    })
}

impl Seen {
    /// Folds in what moved since the last look.
    fn update(&self) {
        let mut totals = self.totals.lock().unwrap();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let kind = match key.kind() {
                MetricKind::Counter => "counter",
                MetricKind::Gauge => "gauge",
                MetricKind::Histogram => "histogram",
            };
            let mut labels: Vec<(String, String)> = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let entry = totals
                .entry((kind.to_owned(), key.key().name().to_owned(), labels))
                .or_default();
            match value {
                DebugValue::Counter(n) => entry.0 += n as f64,
                DebugValue::Gauge(g) => entry.0 += g.into_inner(),
                DebugValue::Histogram(v) => {
                    entry.0 += v.iter().map(|x| x.into_inner()).sum::<f64>();
                    entry.1 += v.len();
                }
            }
        }
    }

    /// The total (counters, gauges) or the sample count (histograms) of
    /// `name` over the series whose labels include every one of `labels`.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.update();
        let totals = self.totals.lock().unwrap();
        totals
            .iter()
            .filter(|((_, n, l), _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|((kind, _, _), (v, count))| {
                if kind == "histogram" {
                    *count as f64
                } else {
                    *v
                }
            })
            .sum()
    }

    /// True if some series of `name` on `store` carries the label `key`.
    fn labelled(&self, name: &str, store: &str, key: &str) -> bool {
        self.update();
        let totals = self.totals.lock().unwrap();
        totals.keys().any(|(_, n, l)| {
            n == name
                && l.iter().any(|(k, v)| k == "store" && v == store)
                && l.iter().any(|(k, _)| k == key)
        })
    }
}

/// Polls `f` until it holds, for at most 10 s.
async fn eventually(what: &str, f: impl Fn() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never happened: {what}");
}

async fn exercise(url: &str, store: &'static str) {
    let m = seen();
    let inner = lockwright::backend::open(url)
        .await
        .expect("the store opens");
    inner.verify().await.expect("the test store is up");
    let faulty = Arc::new(Faulty {
        inner: inner.clone(),
        fail_acquire: AtomicBool::new(false),
        fail_renew: AtomicBool::new(false),
        renew_not_held: AtomicBool::new(false),
    });
    let a = Locker::from_arc(faulty.clone()).with_store_label(store);
    let b = Locker::from_arc(inner)
        .with_store_label(store)
        .with_name_label(true);
    let s = ("store", store);
    let name = format!("metrics-{}", lockwright_conformance::kit::unique_id());
    let outcome = |o| m.get(meter::ACQUIRE_WAIT, &[s, ("outcome", o)]);
    let lock = ("primitive", "lock");
    let wait = |d| LockOptions::new().wait_for(d);

    // Acquired; held; another client contends and finds it busy.
    let held = m.get(meter::HELD, &[s, lock]);
    let (acquired, busy, contended) = (outcome("acquired"), outcome("busy"), 0.0);
    let contended = contended + m.get(meter::CONTENDED, &[s, lock]);
    let handoffs = m.get(meter::HANDOFFS, &[s, lock]);
    assert!(
        !m.labelled(meter::ACQUIRE_WAIT, store, "name"),
        "no name label unless asked for"
    );
    let g = a.lock(name.as_str()).await.expect("a free lock");
    assert_eq!(outcome("acquired"), acquired + 1.0);
    assert_eq!(
        m.get(meter::HANDOFFS, &[s, lock]),
        handoffs,
        "a free lock is no hand-off"
    );
    assert_eq!(m.get(meter::HELD, &[s, lock]), held + 1.0);
    assert!(b.try_lock(name.as_str()).await.unwrap().is_none());
    assert_eq!(outcome("busy"), busy + 1.0);
    assert!(m.get(meter::CONTENDED, &[s, lock]) > contended);
    assert!(
        m.labelled(meter::ACQUIRE_WAIT, store, "name"),
        "opted in: series by name"
    );

    // A waiter is handed the lock at its release; the hold was timed.
    let (handoffs, held_times) = (
        m.get(meter::HANDOFFS, &[s, lock]),
        m.get(meter::HELD_TIME, &[s, lock]),
    );
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move {
            b.lock_with(name.as_str(), &wait(Duration::from_secs(30)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    g.release().await.unwrap();
    let g = waiter.await.unwrap().expect("handed over");
    assert_eq!(m.get(meter::HANDOFFS, &[s, lock]), handoffs + 1.0);
    assert_eq!(m.get(meter::HELD_TIME, &[s, lock]), held_times + 1.0);

    // A wait that runs out, and one the caller gives up (cancelled).
    let (timed_out, cancelled) = (outcome("timed_out"), outcome("cancelled"));
    let e = a
        .lock_with(name.as_str(), &wait(Duration::from_millis(200)))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout);
    assert_eq!(outcome("timed_out"), timed_out + 1.0);
    let gave_up = tokio::time::timeout(
        Duration::from_millis(200),
        a.lock_with(name.as_str(), &wait(Duration::from_secs(30))),
    )
    .await;
    assert!(gave_up.is_err());
    assert_eq!(outcome("cancelled"), cancelled + 1.0);
    g.release().await.unwrap();

    // Renewed by the watchdog; then its renewals fail, the callback hears
    // each, and the lock is lost at its deadline.
    let renewed = |o| m.get(meter::RENEWALS, &[s, ("outcome", o)]);
    let (ok, failed) = (renewed("renewed"), renewed("failed"));
    let (errors, lost) = (
        m.get(meter::STORE_ERRORS, &[s, ("kind", "unavailable")]),
        m.get(meter::LOST, &[s, ("reason", "expired")]),
    );
    let opts = LockOptions::new().ttl(Duration::from_secs(1));
    let g = a.lock_with(name.as_str(), &opts).await.unwrap();
    let heard = Arc::new(AtomicU32::new(0));
    let told = Arc::new(AtomicBool::new(false));
    {
        let heard = heard.clone();
        g.on_renewal_failure(move |f| {
            assert_eq!(f.kind(), ErrorKind::Unavailable);
            heard.fetch_add(1, Ordering::SeqCst);
        });
        let told = told.clone();
        g.on_lost(move |_| told.store(true, Ordering::SeqCst));
    }
    eventually("a renewal", || renewed("renewed") > ok).await;
    faulty.fail_renew.store(true, Ordering::SeqCst);
    eventually("a failed renewal", || renewed("failed") > failed).await;
    assert!(m.get(meter::STORE_ERRORS, &[s, ("kind", "unavailable")]) > errors);
    eventually("the renewal-failure callback", || {
        heard.load(Ordering::SeqCst) > 0
    })
    .await;
    eventually("the loss", || {
        m.get(meter::LOST, &[s, ("reason", "expired")]) > lost
    })
    .await;
    eventually("the lost callback", || told.load(Ordering::SeqCst)).await;
    drop(g);
    faulty.fail_renew.store(false, Ordering::SeqCst);
    assert_eq!(
        m.get(meter::HELD, &[s, lock]),
        held,
        "nothing held any more"
    );

    // The store says someone else holds it: lost, `not_held`.
    let (not_held, lost_not_held) = (
        renewed("not_held"),
        m.get(meter::LOST, &[s, ("reason", "not_held")]),
    );
    let g = a.lock_with(name.as_str(), &opts).await.unwrap();
    faulty.renew_not_held.store(true, Ordering::SeqCst);
    eventually("a renewal answered not held", || {
        renewed("not_held") > not_held
    })
    .await;
    eventually("the loss, not held", || {
        m.get(meter::LOST, &[s, ("reason", "not_held")]) == lost_not_held + 1.0
    })
    .await;
    faulty.renew_not_held.store(false, Ordering::SeqCst);
    drop(g);

    // The other primitives carry their own label.
    let sem = a.semaphore(format!("{name}-sem").as_str(), 2).unwrap();
    let permits = m.get(meter::ACQUIRE_WAIT, &[s, ("primitive", "semaphore")]);
    let p = sem
        .try_acquire_with(&LockOptions::new())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        m.get(meter::ACQUIRE_WAIT, &[s, ("primitive", "semaphore")]),
        permits + 1.0
    );
    p.release().await.unwrap();
    if a.capabilities().shared {
        let rw = a.rwlock(format!("{name}-rw").as_str()).unwrap();
        for (primitive, write) in [("read", false), ("write", true)] {
            let before = m.get(meter::ACQUIRE_WAIT, &[s, ("primitive", primitive)]);
            let opts = LockOptions::new();
            let g = if write {
                rw.try_write_with(&opts).await
            } else {
                rw.try_read_with(&opts).await
            };
            g.unwrap().unwrap().release().await.unwrap();
            let after = m.get(meter::ACQUIRE_WAIT, &[s, ("primitive", primitive)]);
            assert_eq!(after, before + 1.0, "{primitive}");
        }
    }

    // A store cut off for a whole wait: `unavailable`.
    let unavailable = outcome("unavailable");
    faulty.fail_acquire.store(true, Ordering::SeqCst);
    let e = a
        .lock_with(
            format!("{name}-cut").as_str(),
            &wait(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    faulty.fail_acquire.store(false, Ordering::SeqCst);
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert_eq!(outcome("unavailable"), unavailable + 1.0);

    // Leading: the leader gauge is up while this process leads.
    if a.capabilities().values {
        let leading = m.get(meter::LEADER, &[s]);
        let election = a.election(format!("{name}-leader").as_str()).unwrap();
        let l = election
            .campaign_with("me", &LockOptions::new().no_wait())
            .await
            .unwrap();
        assert_eq!(m.get(meter::LEADER, &[s]), leading + 1.0);
        assert!(m.get(meter::ACQUIRE_WAIT, &[s, ("primitive", "election")]) > 0.0);
        l.resign().await.unwrap();
        assert_eq!(m.get(meter::LEADER, &[s]), leading);
    }
    // Closing the locker under a hold: lost, `closed`; nothing held after.
    let closed = m.get(meter::LOST, &[s, ("reason", "closed")]);
    let g = a.lock(name.as_str()).await.unwrap();
    a.close().await.unwrap();
    assert_eq!(m.get(meter::LOST, &[s, ("reason", "closed")]), closed + 1.0);
    drop(g);
    b.close().await.unwrap();
    assert_eq!(m.get(meter::HELD, &[s]), 0.0, "every hold ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_as_documented() {
    exercise("memory://", "memory").await;
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("metrics.db").display());
    exercise(&sqlite, "sqlite").await;
    #[cfg(feature = "redis")]
    exercise(&lockwright_conformance::kit::servers::redis_url(), "redis").await;
    // `connect` labels by the URL's scheme.
    let locker = lockwright::connect(&sqlite).await.unwrap();
    let before = seen().get(meter::ACQUIRE_WAIT, &[("store", "sqlite")]);
    drop(locker.try_lock("labelled-by-scheme").await.unwrap());
    assert_eq!(
        seen().get(meter::ACQUIRE_WAIT, &[("store", "sqlite")]),
        before + 1.0
    );
    locker.close().await.unwrap();
}
