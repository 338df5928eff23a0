//! A `Locker` holding thousands of locks keeps a bounded number of
//! connections to its server (the URL's `connections`, 4 by default) and
//! renews them in pipelined batches, losing none.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::OwnServer;
use futures::stream::{self, StreamExt};
use lockwright_conformance::kit::{free_port, unique_prefix};
use lockwright_core::{LockOptions, Locker};
use lockwright_memcached::MemcachedBackend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The server's `curr_connections`, asked on one connection kept open
/// (so it counts the same in every figure).
struct Stats(BufReader<TcpStream>);

impl Stats {
    async fn open(server: &str) -> Stats {
        Stats(BufReader::new(TcpStream::connect(server).await.unwrap()))
    }

    async fn connections(&mut self) -> u64 {
        self.0.get_mut().write_all(b"stats\r\n").await.unwrap();
        let mut found = None;
        let mut line = String::new();
        loop {
            line.clear();
            self.0.read_line(&mut line).await.unwrap();
            if let Some(n) = line.strip_prefix("STAT curr_connections ") {
                found = n.trim().parse().ok();
            }
            if line == "END\r\n" || line.is_empty() {
                return found.expect("curr_connections");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_held_locks_use_a_bounded_number_of_connections() {
    let server = OwnServer::start(free_port(), 64);
    let addr = server.addr();
    // One connection counts all along (its own included in `before`), from
    // before the first lock: a pool that opened many and trimmed them
    // later must not pass.
    let mut stats = Stats::open(&addr).await;
    let before = stats.connections().await;
    let (now, most) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sampler = tokio::spawn({
        let (now, most) = (now.clone(), most.clone());
        async move {
            loop {
                let n = stats.connections().await.saturating_sub(before);
                now.store(n, Ordering::Relaxed);
                most.fetch_max(n, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    });
    for limit in [None, Some(2)] {
        // The last round's connections are closed first.
        for _ in 0..500 {
            if now.load(Ordering::Relaxed) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        most.store(0, Ordering::Relaxed);
        let url = format!(
            "memcache://{addr}?prefix={}{}",
            unique_prefix(),
            limit.map_or(String::new(), |n| format!("&connections={n}"))
        );
        let locker = Locker::new(MemcachedBackend::connect(&url).unwrap());
        // Renewed every second: a few rounds of 2,000 renewals while held.
        let opts = LockOptions::new().ttl(Duration::from_secs(3));
        let guards: Vec<_> = stream::iter(0..2000)
            .map(|i| {
                let (locker, opts) = (&locker, &opts);
                async move { locker.lock_with(format!("held-{i}"), opts).await }
            })
            .buffer_unordered(256)
            .collect()
            .await;
        let guards: Vec<_> = guards.into_iter().map(|g| g.expect("lock")).collect();
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let most = most.load(Ordering::Relaxed);
        let bound = limit.unwrap_or(4) as u64;
        assert!(
            most <= bound,
            "{most} connections open (the bound is {bound})"
        );
        let lost = guards.iter().filter(|g| g.is_lost()).count();
        assert_eq!(lost, 0, "{lost} of {} locks lost", guards.len());
        for g in guards {
            g.release().await.expect("release");
        }
        locker.close().await.expect("close");
    }
    sampler.abort();
}
