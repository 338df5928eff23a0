//! `lockwright-bench metrics`: what recording the metrics costs. Uncontended
//! `try_lock` + `release` pairs through a `Locker`, in short alternating
//! blocks with a Prometheus recorder (`metrics-exporter-prometheus`)
//! recording and without one, each mode's time summed.
//!
//! The `metrics` facade takes one global recorder for the life of the
//! process, so the recorder installed here is a switch: off, it hands out
//! the facade's no-op handles, as the facade does with no recorder
//! installed (plus one atomic load per metric call); on, the Prometheus
//! recorder's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use lockwright::{LockOptions, Locker};
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle, PrometheusRecorder};

/// A recorder that records only while switched on.
struct Switch {
    on: Arc<AtomicBool>,
    inner: PrometheusRecorder,
}

impl Recorder for Switch {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_counter(key, unit, description);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_gauge(key, unit, description);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.inner.describe_histogram(key, unit, description);
    }
    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_counter(key, metadata)
        } else {
            Counter::noop()
        }
    }
    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_gauge(key, metadata)
        } else {
            Gauge::noop()
        }
    }
    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        if self.on.load(Ordering::Relaxed) {
            self.inner.register_histogram(key, metadata)
        } else {
            Histogram::noop()
        }
    }
}

/// Installs the switch (off); its flag and the Prometheus handle.
fn install() -> Result<(Arc<AtomicBool>, PrometheusHandle), String> {
    let inner = PrometheusBuilder::new().build_recorder();
    let handle = inner.handle();
    let on = Arc::new(AtomicBool::new(false));
    metrics::set_global_recorder(Switch {
        on: on.clone(),
        inner,
    })
    .map_err(|e| e.to_string())?;
    Ok((on, handle))
}

async fn pairs(locker: &Locker, key: &str, iterations: u32) {
    let now = LockOptions::new().no_wait();
    for _ in 0..iterations {
        let g = locker
            .try_lock_with(key, &now)
            .await
            .expect("acquire")
            .expect("uncontended");
        g.release().await.expect("release");
    }
}

/// Pairs/s on each URL with the recorder off and on, in `rounds`
/// alternating blocks of `iterations` pairs, and their ratio.
pub(crate) async fn run(urls: &[String], iterations: u32, rounds: u32) -> Result<(), String> {
    let (on, handle) = install()?;
    for url in urls {
        let locker = lockwright::connect(url).await.map_err(|e| e.to_string())?;
        let key = format!(
            "bench-metrics-{}",
            lockwright::OwnerToken::generate().as_str()
        );
        // Warm-up: connections made, statements prepared, series registered.
        on.store(true, Ordering::Relaxed);
        pairs(&locker, &key, iterations / 10 + 1).await;
        // Short blocks, alternating, their times summed per mode: a slow
        // spell of this shared host lands on both modes alike.
        let mut spent = [0.0f64; 2];
        for block in 0..rounds {
            for step in 0..2 {
                let recording = (step + block) % 2 == 1;
                on.store(recording, Ordering::Relaxed);
                let start = std::time::Instant::now();
                pairs(&locker, &key, iterations).await;
                spent[usize::from(recording)] += start.elapsed().as_secs_f64();
            }
        }
        on.store(false, Ordering::Relaxed);
        locker.close().await.map_err(|e| e.to_string())?;
        let n = f64::from(iterations) * f64::from(rounds);
        let (off, with) = (n / spent[0], n / spent[1]);
        let scheme = url.split("://").next().unwrap_or("store");
        println!(
            "\n{scheme}: uncontended try_lock+release through a Locker, 1 client, {rounds} \
             alternating blocks of {iterations} pairs each way"
        );
        println!("  {:<24} {:>10}", "", "pairs/s");
        println!("  {:<24} {:>10.0}", "no recorder", off);
        println!("  {:<24} {:>10.0}", "Prometheus recorder", with);
        println!("  {:<24} {:>10.3}", "with / without", with / off);
    }
    // The recorder did record: the acquire histogram's count per store.
    let text = handle.render();
    for line in text
        .lines()
        .filter(|l| l.starts_with("lockwright_acquire_wait_seconds_count"))
    {
        println!("  recorded: {line}");
    }
    Ok(())
}
