//! `lockwright-bench`: throughput measured side by side in one run, reported
//! as ratios. Not a test: nothing here asserts a speed.
//!
//! `lockwright-bench sql` compares, per database, an uncontended
//! acquire+release loop through:
//! * `raw sqlx`: the backend's own two statements run directly on a sqlx pool
//!   (key hash and owner precomputed): the floor;
//! * `backend`: `SqlBackend::try_acquire` + `release` (a fresh owner token
//!   each time, as the Locker uses);
//! * `Locker`: `try_lock` + `guard.release()`, with the watchdog and cancel
//!   safety;
//! * `Locker, session mode`: the same on advisory locks / `GET_LOCK`.
//!
//! Rounds are interleaved and the median of each is reported.

use lockwright::backend::LockBackendExt;
use std::time::{Duration, Instant};

use clap::Parser;

mod baseline;
mod claims_bench;
mod etcd_bench;
mod mc_bench;
mod metrics_bench;
mod redis_bench;
mod zk_bench;
use lockwright::sql::{internals, LeaseStatements, SqlBackend, SqlSessionBackend};
use lockwright::{LockKey, Locker, OwnerToken};

#[derive(Parser, Debug)]
#[command(about = "lockwright throughput, side by side with its baselines")]
enum Cli {
    /// SQL backends against raw sqlx running the same statements.
    Sql {
        /// PostgreSQL URL ("" to skip).
        #[arg(
            long,
            default_value = "postgres://lockwright:lockwright@127.0.0.1:5432/lockwright_test"
        )]
        postgres: String,
        /// MySQL/MariaDB URL ("" to skip).
        #[arg(
            long,
            default_value = "mysql://lockwright:lockwright@127.0.0.1:3306/lockwright_test"
        )]
        mysql: String,
        /// Acquire+release pairs per client per round.
        #[arg(long, default_value_t = 1000)]
        iterations: u32,
        /// Concurrent clients, each on its own key.
        #[arg(long, default_value_t = 4)]
        clients: u32,
        /// Interleaved rounds; the median is reported.
        #[arg(long, default_value_t = 3)]
        rounds: u32,
    },
    /// Redis: our backend and Locker beside rslock and bare SET NX PX + DEL.
    Redis {
        /// Redis URL.
        #[arg(long, default_value = "redis://127.0.0.1:6379")]
        url: String,
        #[command(flatten)]
        load: Load,
    },
    /// memcached: our backend and Locker beside Python sherlock and the raw commands.
    Memcached {
        /// The server's host:port.
        #[arg(long, default_value = "127.0.0.1:11211")]
        server: String,
        #[command(flatten)]
        load: Load,
    },
    /// Any store: a semaphore's permit and read and write holds beside the lock.
    Claims {
        /// The store's URL, as `lockwright run --url` takes it.
        #[arg(long)]
        url: String,
        /// Uncontended pairs per kind per round.
        #[arg(long, default_value_t = 2000)]
        iterations: u32,
        /// Rotating rounds; the median is reported.
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// Seconds of each contended run (6 clients on a semaphore of 3,
        /// then 3 readers and 3 writers); 0 skips them.
        #[arg(long, default_value_t = 5)]
        contended: u64,
    },
    /// etcd: our backend and Locker beside etcd's lock service (Go's Mutex) and the raw requests.
    Etcd {
        /// The cluster's host:port list.
        #[arg(long, default_value = "127.0.0.1:12379")]
        hosts: String,
        #[command(flatten)]
        load: Load,
    },
    /// What recording metrics costs: Locker pairs with a Prometheus recorder and without.
    Metrics {
        /// Store URLs, each measured in turn.
        #[arg(long, num_args = 1.., default_values_t = ["redis://127.0.0.1:6379".to_owned(), "sqlite://bench-metrics.db".to_owned()])]
        url: Vec<String>,
        /// Uncontended pairs per block.
        #[arg(long, default_value_t = 50)]
        iterations: u32,
        /// Alternating blocks of each mode.
        #[arg(long, default_value_t = 400)]
        rounds: u32,
    },
    /// ZooKeeper: our backend and Locker beside Python kazoo and the raw requests.
    Zookeeper {
        /// The ensemble's host:port list.
        #[arg(long, default_value = "127.0.0.1:2181")]
        hosts: String,
        #[command(flatten)]
        load: Load,
    },
}

/// How long and how hard a store's comparison runs.
#[derive(clap::Args, Debug)]
struct Load {
    /// Uncontended pairs per round [default: Redis 5000, memcached 3000, ZooKeeper and etcd 2000].
    #[arg(long)]
    iterations: Option<u32>,
    /// Interleaved rounds; the median is reported [default: Redis 5, others 3].
    #[arg(long)]
    rounds: Option<u32>,
    /// Clients contending on one key.
    #[arg(long, default_value_t = 8)]
    contenders: usize,
    /// Seconds of contention per library.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
}

const TTL_MS: i64 = 30_000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    match Cli::parse() {
        Cli::Sql {
            postgres,
            mysql,
            iterations,
            clients,
            rounds,
        } => {
            for (name, url) in [("PostgreSQL", postgres), ("MariaDB", mysql)] {
                if url.is_empty() {
                    continue;
                }
                exit_on_error(name, sql(name, &url, iterations, clients, rounds).await);
            }
        }
        Cli::Redis { url, load } => {
            let (i, r) = (load.iterations.unwrap_or(5000), load.rounds.unwrap_or(5));
            let run = redis_bench::run(&url, i, r, load.contenders, load.seconds);
            exit_on_error("Redis", run.await);
        }
        Cli::Memcached { server, load } => {
            let (i, r) = (load.iterations.unwrap_or(3000), load.rounds.unwrap_or(3));
            let run = mc_bench::run(&server, i, r, load.contenders, load.seconds);
            exit_on_error("memcached", run.await);
        }
        Cli::Claims {
            url,
            iterations,
            rounds,
            contended,
        } => {
            exit_on_error("claims", claims_bench::run(&url, iterations, rounds).await);
            if contended > 0 {
                let secs = std::time::Duration::from_secs(contended);
                exit_on_error("claims", claims_bench::contended(&url, secs).await);
            }
        }
        Cli::Etcd { hosts, load } => {
            let (i, r) = (load.iterations.unwrap_or(2000), load.rounds.unwrap_or(3));
            let run = etcd_bench::run(&hosts, i, r, load.contenders, load.seconds);
            exit_on_error("etcd", run.await);
        }
        Cli::Metrics {
            url,
            iterations,
            rounds,
        } => {
            exit_on_error(
                "metrics",
                metrics_bench::run(&url, iterations, rounds).await,
            );
        }
        Cli::Zookeeper { hosts, load } => {
            let (i, r) = (load.iterations.unwrap_or(2000), load.rounds.unwrap_or(3));
            let run = zk_bench::run(&hosts, i, r, load.contenders, load.seconds);
            exit_on_error("ZooKeeper", run.await);
        }
    }
}

/// Ends the process with status 1 after a comparison that could not run.
fn exit_on_error(store: &str, result: Result<(), String>) {
    if let Err(e) = result {
        eprintln!("{store}: {e}");
        std::process::exit(1);
    }
}

/// Runs `clients` copies of `work` at once; returns pairs per second.
async fn rate<F, Fut>(clients: u32, iterations: u32, work: F) -> f64
where
    F: Fn(u32) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let start = Instant::now();
    futures::future::join_all((0..clients).map(&work)).await;
    f64::from(clients * iterations) / start.elapsed().as_secs_f64()
}

async fn raw_pairs(pool: &RawPool, s: &LeaseStatements, key: &str, iterations: u32) {
    let (h, owner) = (
        internals::key_hash(&LockKey::new(key).expect("key")),
        OwnerToken::generate().as_str().to_owned(),
    );
    for _ in 0..iterations {
        match pool {
            RawPool::Pg(p) => {
                let got: Option<(i64, i64)> = sqlx::query_as(&s.acquire)
                    .bind(&h)
                    .bind(key)
                    .bind(&owner)
                    .bind(TTL_MS)
                    .bind(None::<Vec<u8>>)
                    .fetch_optional(p)
                    .await
                    .expect("acquire");
                assert!(got.is_some(), "uncontended acquire failed");
                let left: Option<i64> = sqlx::query_scalar(&s.release)
                    .bind(&h)
                    .bind(&owner)
                    .bind("lockwright_bench")
                    .bind(0i64)
                    .fetch_optional(p)
                    .await
                    .expect("release");
                assert_eq!(left, Some(0));
            }
            RawPool::My(p) => {
                let done = sqlx::query(&s.acquire)
                    .bind(&h)
                    .bind(key)
                    .bind(&owner)
                    .bind(TTL_MS)
                    .bind(None::<Vec<u8>>)
                    .execute(p)
                    .await
                    .expect("acquire");
                assert_ne!(done.last_insert_id(), 0, "uncontended acquire failed");
                let done = sqlx::query(&s.release)
                    .bind(&h)
                    .bind(&owner)
                    .execute(p)
                    .await
                    .expect("release");
                assert_eq!(done.rows_affected(), 1);
            }
        }
    }
}

enum RawPool {
    Pg(sqlx::PgPool),
    My(sqlx::MySqlPool),
}

async fn sql(
    name: &str,
    url: &str,
    iterations: u32,
    clients: u32,
    rounds: u32,
) -> Result<(), String> {
    let sep = if url.contains('?') { '&' } else { '?' };
    let lease_url = format!("{url}{sep}pool_max={clients}");
    let session_url = format!("{url}{sep}pool_max={clients}&mode=session");
    let backend = SqlBackend::connect(&lease_url).map_err(|e| e.to_string())?;
    backend.migrate().await.map_err(|e| e.to_string())?;
    let statements = backend.lease_statements();
    let opts = |u: &str| u.to_owned();
    let raw = if url.starts_with("postgres") {
        RawPool::Pg(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(clients)
                .connect(&opts(url))
                .await
                .map_err(|e| e.to_string())?,
        )
    } else {
        RawPool::My(
            sqlx::mysql::MySqlPoolOptions::new()
                .max_connections(clients)
                .connect(&opts(url))
                .await
                .map_err(|e| e.to_string())?,
        )
    };
    let locker = Locker::new(backend.clone());
    let session = Locker::new(SqlSessionBackend::connect(&session_url).map_err(|e| e.to_string())?);
    let key = |c: u32| format!("bench/{}/{c}", std::process::id());

    let mut figures: [Vec<f64>; 4] = Default::default();
    for _ in 0..rounds {
        figures[0].push(
            rate(clients, iterations, |c| {
                let (raw, s, k) = (&raw, &statements, key(c));
                async move { raw_pairs(raw, s, &k, iterations).await }
            })
            .await,
        );
        figures[1].push(
            rate(clients, iterations, |c| {
                let (b, k) = (&backend, LockKey::new(key(c)).unwrap());
                async move {
                    for _ in 0..iterations {
                        let owner = OwnerToken::generate();
                        let got = b
                            .try_lock(&k, &owner, Duration::from_secs(30))
                            .await
                            .expect("acquire");
                        assert!(matches!(got, lockwright::backend::Acquire::Acquired(_)));
                        b.unlock(&k, &owner).await.expect("release");
                    }
                }
            })
            .await,
        );
        for (i, l) in [(2, &locker), (3, &session)] {
            figures[i].push(
                rate(clients, iterations, |c| {
                    let k = key(c);
                    async move {
                        for _ in 0..iterations {
                            let g = l
                                .try_lock(k.as_str())
                                .await
                                .expect("acquire")
                                .expect("uncontended");
                            g.release().await.expect("release");
                        }
                    }
                })
                .await,
            );
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let floor = median(&mut figures[0]);
    println!("\n{name}: uncontended acquire+release, {clients} clients x {iterations} pairs, median of {rounds} rounds");
    println!("  {:<24} {:>10}  {:>8}", "path", "pairs/s", "vs raw");
    for (i, label) in [
        "raw sqlx (same SQL)",
        "SqlBackend",
        "Locker (lease)",
        "Locker (session mode)",
    ]
    .iter()
    .enumerate()
    {
        let r = median(&mut figures[i]);
        println!("  {label:<24} {r:>10.0}  {:>8.2}", r / floor);
    }
    Ok(())
}
