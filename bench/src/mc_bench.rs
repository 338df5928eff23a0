//! `lockwright-bench memcached`: our memcached locks beside Python sherlock's
//! `MCLock` and pymemcache's bare `add`/`delete` (run as subprocesses,
//! `bench/mc_sherlock.py`), and the floor: the same commands our backend
//! sends (`add` and `mg v c` in one write to take, `md C` to give back),
//! written raw on one socket: two round trips.

use std::time::Duration;

use lockwright::backend::LockBackend;
use lockwright::memcached::MemcachedBackend;
use lockwright::{Locker, OwnerToken};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::baseline::{contention, python, uncontended_table};
use crate::redis_bench::{our_pairs, pairs_per_sec};

const TTL: Duration = Duration::from_secs(30);
const SHERLOCK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/mc_sherlock.py");

fn sherlock(args: &[&str]) -> Result<serde_json::Value, String> {
    python(
        SHERLOCK,
        "pip install sherlock==0.4.1 pymemcache==4.0.0 pylibmc",
        args,
    )
}

/// One command, its reply line, and the value line after a `VA`.
async fn ask(conn: &mut BufReader<TcpStream>, command: &str) -> String {
    conn.get_mut()
        .write_all(command.as_bytes())
        .await
        .expect("write");
    let mut reply = String::new();
    conn.read_line(&mut reply).await.expect("read");
    if reply.starts_with("VA ") {
        conn.read_line(&mut reply).await.expect("read");
    }
    reply
}

/// The floor our owner-checked lock can reach: two round trips, the
/// `add` and a read of its CAS in one write, then `md` over that CAS.
async fn raw_pairs(conn: &mut BufReader<TcpStream>, key: &str, iterations: u32) {
    let owner = OwnerToken::generate();
    let value = format!("{} 1", owner.as_str());
    let add = format!(
        "add {key} 0 31 {}\r\n{value}\r\nmg {key} v c\r\n",
        value.len()
    );
    for _ in 0..iterations {
        assert_eq!(ask(conn, &add).await, "STORED\r\n", "uncontended");
        let mut got = String::new();
        conn.read_line(&mut got).await.expect("read");
        conn.read_line(&mut got).await.expect("read");
        assert!(got.ends_with(&format!("{value}\r\n")), "{got:?}");
        let cas = got
            .split_whitespace()
            .find_map(|w| w.strip_prefix('c'))
            .expect("cas");
        assert_eq!(ask(conn, &format!("md {key} C{cas}\r\n")).await, "HD\r\n");
    }
}

pub(crate) async fn run(
    server: &str,
    iterations: u32,
    rounds: u32,
    contenders: usize,
    seconds: u64,
) -> Result<(), String> {
    let tag = OwnerToken::generate().as_str()[..8].to_owned();
    let url = format!("memcache://{server}?prefix=bench-{tag}:");
    let mut raw = BufReader::new(
        TcpStream::connect(server)
            .await
            .map_err(|e| format!("cannot reach memcached at {server}: {e}"))?,
    );
    let backend = MemcachedBackend::connect(&url).map_err(|e| e.to_string())?;
    backend.verify().await.map_err(|e| e.chain())?;
    let locker = Locker::new(MemcachedBackend::connect(&url).map_err(|e| e.to_string())?);
    let n = iterations.to_string();
    let mut versions = String::new();

    let mut figures: [Vec<f64>; 5] = Default::default();
    for round in 0..rounds {
        for step in 0..5 {
            let path = (step + round as usize) % 5;
            let r = match path {
                0 => {
                    let key = format!("bench-{tag}:raw");
                    pairs_per_sec(iterations, || raw_pairs(&mut raw, &key, iterations)).await
                }
                1 | 2 => {
                    let mode = if path == 1 { "uncontended" } else { "raw" };
                    let v = sherlock(&["--server", server, "--mode", mode, "--iterations", &n])?;
                    if path == 1 {
                        versions = format!(
                            "sherlock {}, pylibmc {}",
                            v["sherlock"].as_str().unwrap_or("?"),
                            v["pylibmc"].as_str().unwrap_or("?")
                        );
                    }
                    v["pairs_per_s"].as_f64().ok_or("python: no pairs_per_s")?
                }
                _ => our_pairs(&backend, &locker, iterations, TTL, path > 3).await,
            };
            figures[path].push(r);
        }
    }
    println!(
        "\nmemcached: uncontended acquire+release, 1 client x {iterations} pairs, median of {rounds} rounds ({versions})"
    );
    uncontended_table(
        "sherlock",
        &[
            "raw add + mg v c; md C (floor)",
            "sherlock MCLock",
            "pymemcache add/delete (unsafe)",
            "MemcachedBackend",
            "Locker",
        ],
        &mut figures,
    );
    println!(
        "\nmemcached: {contenders} clients contending on one key, own client each; \
         {seconds} s per library per round, 2 rounds in alternating order"
    );
    let (c, s) = (contenders.to_string(), seconds.to_string());
    contention(
        contenders,
        seconds,
        TTL,
        || MemcachedBackend::connect(&url).expect("url"),
        "sherlock",
        || {
            sherlock(&[
                "--server",
                server,
                "--mode",
                "contended",
                "--contenders",
                &c,
                "--seconds",
                &s,
            ])
        },
    )
    .await?;
    Ok(())
}
