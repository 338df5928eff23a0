//! `lockwright-bench redis`: our Redis locks beside rslock, the bare
//! two-command floor and our own two scripts sent raw through the same
//! client, uncontended; and with 8 clients on one key.

use lockwright::backend::LockBackendExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockwright::backend::LockBackend;
use lockwright::redis::{internals, RedisBackend};
use lockwright::{LockKey, LockOptions, Locker, OwnerToken};
use redis::AsyncCommands;

use lockwright_cli_kit::timing::{percentile, HandOffs};

const TTL: Duration = Duration::from_secs(10);

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(crate) async fn pairs_per_sec<Fut: std::future::Future<Output = ()>>(
    n: u32,
    f: impl FnOnce() -> Fut,
) -> f64 {
    let start = Instant::now();
    f().await;
    f64::from(n) / start.elapsed().as_secs_f64()
}

pub(crate) async fn run(
    url: &str,
    iterations: u32,
    rounds: u32,
    contenders: usize,
    seconds: u64,
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let client = redis::Client::open(url).map_err(|e| err(&e))?;
    let mut bare = client.get_connection_manager().await.map_err(|e| err(&e))?;
    let backend = RedisBackend::connect(url).map_err(|e| err(&e))?;
    let locker = Locker::new(backend.clone());
    let rs = rslock::LockManager::new(vec![url.to_owned()]);
    let tag = &OwnerToken::generate().as_str()[..8].to_owned();

    let mut figures: [Vec<f64>; 5] = Default::default();
    let mut server_us: [Vec<f64>; 5] = Default::default();
    // Many short rounds, each running the paths in a rotated order, so a
    // slow spell of the machine lands on every path alike.
    for round in 0..rounds as usize {
        for step in 0..5 {
            let path = (round + step) % 5;
            // Only the commands the path sends itself: Redis counts the
            // calls a script makes under their own names as well, inside
            // the script's own time.
            let top: &[&str] = match path {
                0 => &["set", "del"],
                1 => &["set", "evalsha", "eval", "script"],
                _ => &["evalsha", "eval", "script"],
            };
            let busy_before = server_busy_us(&mut bare, top).await;
            let r = match path {
                0 => {
                    let key = format!("bench:{tag}:bare");
                    pairs_per_sec(iterations, || async {
                        for _ in 0..iterations {
                            let token = OwnerToken::generate();
                            let ok: Option<String> = redis::cmd("SET")
                                .arg(&key)
                                .arg(token.as_str())
                                .arg("NX")
                                .arg("PX")
                                .arg(10_000)
                                .query_async(&mut bare)
                                .await
                                .expect("SET");
                            assert!(ok.is_some());
                            let _: i64 = bare.del(&key).await.expect("DEL");
                        }
                    })
                    .await
                }
                1 => {
                    let key = format!("bench:{tag}:rslock");
                    pairs_per_sec(iterations, || async {
                        for _ in 0..iterations {
                            let l = rs
                                .lock(key.as_bytes(), TTL)
                                .await
                                .expect("rslock uncontended");
                            rs.unlock(&l).await;
                        }
                    })
                    .await
                }
                2 => {
                    let key = LockKey::new(format!("bench:{tag}:backend")).unwrap();
                    pairs_per_sec(iterations, || {
                        backend_pairs(&backend, &key, iterations, TTL)
                    })
                    .await
                }
                4 => {
                    let name = LockKey::new(format!("bench:{tag}:raw")).expect("key");
                    let keys = internals::key_names("lockwright:", &name);
                    pairs_per_sec(iterations, || async {
                        for _ in 0..iterations {
                            let token = OwnerToken::generate();
                            let fence: i64 = internals::acquire_script(true)
                                .key(&keys)
                                .arg(token.as_str())
                                .arg(10_000)
                                .invoke_async(&mut bare)
                                .await
                                .expect("acquire script");
                            assert!(fence > 0, "uncontended");
                            let left: i64 = internals::release_script(true)
                                .key(&keys)
                                .arg(token.as_str())
                                .invoke_async(&mut bare)
                                .await
                                .expect("release script");
                            assert_eq!(left, 0);
                        }
                    })
                    .await
                }
                _ => {
                    let key = format!("bench:{tag}:locker");
                    pairs_per_sec(iterations, || locker_pairs(&locker, &key, iterations)).await
                }
            };
            let busy = server_busy_us(&mut bare, top).await - busy_before;
            server_us[path].push(busy / f64::from(iterations));
            figures[path].push(r);
        }
    }
    let floor = median(&mut figures[0]);
    let rsl = median(&mut figures[1]);
    println!("\nRedis: uncontended acquire+release, 1 client x {iterations} pairs, median of {rounds} rounds");
    println!(
        "  {:<30} {:>10}  {:>8}  {:>9}  {:>16}",
        "path", "pairs/s", "vs bare", "vs rslock", "Redis µs per pair"
    );
    for (i, label) in [
        "bare SET NX PX + DEL",
        "rslock 0.10",
        "RedisBackend",
        "Locker",
        "same scripts, raw",
    ]
    .iter()
    .enumerate()
    {
        let r = median(&mut figures[i]);
        println!(
            "  {label:<30} {r:>10.0}  {:>8.2}  {:>9.2}  {:>16.1}",
            r / floor,
            r / rsl,
            median(&mut server_us[i])
        );
    }

    println!(
        "\nRedis: {contenders} clients contending on one key, own connection each; \
         {seconds} s per library per round, 2 rounds in alternating order"
    );
    println!(
        "  {:<14} {:>9} {:>12} {:>12} {:>22}",
        "library", "locks/s", "hand-off p50", "hand-off p99", "share per client min..max"
    );
    let mut ours = Contention::default();
    let mut theirs = Contention::default();
    for round in 0..2 {
        for step in 0..2 {
            if (round + step) % 2 == 0 {
                ours.add(
                    contended(contenders, seconds, |_| {
                        let l = Locker::new(RedisBackend::connect(url).expect("url"));
                        locker_contender(l, format!("bench:{tag}:contended"), TTL)
                    })
                    .await,
                );
            } else {
                theirs.add(
                    contended(contenders, seconds, |_| {
                        let rs = Arc::new(rslock::LockManager::new(vec![url.to_owned()]));
                        let key = format!("bench:{tag}:contended-rslock");
                        move || {
                            let (rs, key) = (rs.clone(), key.clone());
                            Box::pin(async move {
                                let l = rs
                                    .acquire_no_guard(key.as_bytes(), TTL)
                                    .await
                                    .expect("rslock");
                                Box::new(move || {
                                    Box::pin(async move { rs.unlock(&l).await }) as Release
                                }) as Releaser
                            }) as Acquiring
                        }
                    })
                    .await,
                );
            }
        }
    }
    ours.print("lockwright", seconds * 2);
    theirs.print("rslock", seconds * 2);
    state_left(url, &backend, &mut bare, tag).await;
    Ok(())
}

/// Locks and releases 100,000 distinct names (16 at a time) and reports
/// what that left in Redis: `used_memory` before and after, and the keys
/// under the names' prefix.
async fn state_left(
    url: &str,
    backend: &RedisBackend,
    bare: &mut redis::aio::ConnectionManager,
    tag: &str,
) {
    const NAMES: usize = 100_000;
    let used = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let info = |conn: &mut redis::aio::ConnectionManager| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("INFO")
                .arg("memory")
                .query_async::<String>(&mut conn)
                .await
                .expect("INFO memory")
        }
    };
    let before = used(info(bare).await);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers = (0..16).map(|_| {
        let (backend, next) = (backend.clone(), next.clone());
        let tag = tag.to_owned();
        tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= NAMES {
                    return;
                }
                let key = LockKey::new(format!("bench:{tag}:entity:{i}")).expect("key");
                let owner = OwnerToken::generate();
                backend.try_lock(&key, &owner, TTL).await.expect("acquire");
                backend.unlock(&key, &owner).await.expect("release");
            }
        })
    });
    futures::future::join_all(workers).await;
    let after = used(info(bare).await);
    let pattern = format!("lockwright:{{bench:{tag}:entity:*");
    let client = redis::Client::open(url).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let mut keys: redis::AsyncIter<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg(&pattern)
        .arg("COUNT")
        .arg(10_000)
        .clone()
        .iter_async(&mut conn)
        .await
        .expect("SCAN");
    let mut left = 0;
    while futures::StreamExt::next(&mut keys).await.is_some() {
        left += 1;
    }
    println!(
        "\nRedis: {NAMES} distinct names locked and released: used_memory {before} -> {after} \
         bytes ({:+} bytes), {left} keys left under their names",
        after as i64 - before as i64
    );
}

/// Acquisitions per client and hand-off latencies, summed over rounds.
#[derive(Default)]
pub(crate) struct Contention {
    pub(crate) counts: Vec<u64>,
    pub(crate) handoffs: Vec<Duration>,
}

impl Contention {
    pub(crate) fn add(&mut self, other: Contention) {
        if self.counts.is_empty() {
            self.counts = vec![0; other.counts.len()];
        }
        for (a, b) in self.counts.iter_mut().zip(other.counts) {
            *a += b;
        }
        self.handoffs.extend(other.handoffs);
    }

    pub(crate) fn print(mut self, label: &str, seconds: u64) {
        let total: u64 = self.counts.iter().sum();
        self.handoffs.sort();
        let pct = |p: f64| percentile(&self.handoffs, p);
        let share = |c: u64| 100.0 * c as f64 / total.max(1) as f64;
        let (min, max) = (
            self.counts.iter().min().copied().unwrap_or(0),
            self.counts.iter().max().copied().unwrap_or(0),
        );
        println!(
            "  {label:<14} {:>9.0} {:>12} {:>12} {:>12.1}%..{:.1}%",
            total as f64 / seconds.max(1) as f64,
            pct(0.5),
            pct(0.99),
            share(min),
            share(max)
        );
    }
}

/// Microseconds the server spent so far in the commands named in `top`
/// (from `INFO commandstats`); the difference across a run is its cost.
async fn server_busy_us(conn: &mut redis::aio::ConnectionManager, top: &[&str]) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| {
            let (name, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            // `script|load` counts as `script`.
            let base = name.split('|').next()?;
            top.contains(&base).then_some(rest)
        })
        .filter_map(|rest| rest.split(",usec=").nth(1))
        .filter_map(|rest| rest.split(',').next()?.parse::<f64>().ok())
        .sum()
}

pub(crate) type Release = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
pub(crate) type Releaser = Box<dyn FnOnce() -> Release + Send>;
pub(crate) type Acquiring = std::pin::Pin<Box<dyn std::future::Future<Output = Releaser> + Send>>;

/// `iterations` uncontended acquire+release pairs straight on a backend,
/// a fresh owner each time (as the `Locker` makes them).
pub(crate) async fn backend_pairs(
    backend: &dyn LockBackend,
    key: &LockKey,
    iterations: u32,
    ttl: Duration,
) {
    for _ in 0..iterations {
        let owner = OwnerToken::generate();
        backend.try_lock(key, &owner, ttl).await.expect("acquire");
        backend.unlock(key, &owner).await.expect("release");
    }
}

/// Pairs per second on our two rows of an uncontended table: the bare
/// backend, or (`through_locker`) a `Locker` over another backend of the
/// same store.
pub(crate) async fn our_pairs(
    backend: &dyn LockBackend,
    locker: &Locker,
    iterations: u32,
    ttl: Duration,
    through_locker: bool,
) -> f64 {
    if through_locker {
        pairs_per_sec(iterations, || {
            locker_pairs(locker, "uncontended-locker", iterations)
        })
        .await
    } else {
        let key = LockKey::new("uncontended-backend").expect("key");
        pairs_per_sec(iterations, || backend_pairs(backend, &key, iterations, ttl)).await
    }
}

/// `iterations` uncontended `try_lock` + release pairs through a `Locker`.
pub(crate) async fn locker_pairs(locker: &Locker, key: &str, iterations: u32) {
    for _ in 0..iterations {
        let g = locker
            .try_lock(key)
            .await
            .expect("acquire")
            .expect("uncontended");
        g.release().await.expect("release");
    }
}

/// One contender taking `key` through a `Locker`, waiting as long as it takes.
pub(crate) fn locker_contender(
    l: Locker,
    key: String,
    ttl: Duration,
) -> impl Fn() -> Acquiring + Send + 'static {
    move || {
        let (l, key) = (l.clone(), key.clone());
        Box::pin(async move {
            let g = l
                .lock_with(key.as_str(), &LockOptions::new().ttl(ttl))
                .await
                .expect("lock");
            Box::new(move || {
                Box::pin(async move { g.release().await.expect("release") }) as Release
            }) as Releaser
        }) as Acquiring
    }
}

/// Each client loops acquire, a tiny critical section, release, until time
/// is up; hand-off is measured from one client's release to another's grant.
pub(crate) async fn contended<M, A>(clients: usize, seconds: u64, make: M) -> Contention
where
    M: Fn(usize) -> A,
    A: Fn() -> Acquiring + Send + 'static,
{
    let handoffs: Arc<HandOffs> = Arc::default();
    let stop = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for id in 0..clients {
        let acquire = make(id);
        let handoffs = handoffs.clone();
        tasks.push(tokio::spawn(async move {
            let mut count = 0u64;
            while Instant::now() < stop {
                let release = acquire().await;
                handoffs.granted(id);
                count += 1;
                tokio::task::yield_now().await;
                handoffs.releasing(id);
                release().await;
            }
            count
        }));
    }
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(t.await.expect("client task"));
    }
    Contention {
        counts,
        handoffs: handoffs.take(),
    }
}
