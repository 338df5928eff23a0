//! `locksmith-bench memcached`: our memcached locks beside Python sherlock's
//! `MCLock` and pymemcache's bare `add`/`delete` (run as subprocesses,
//! `bench/mc_sherlock.py`), and the floor: the same meta commands our
//! backend sends (`ms ME` to take, `mg v c` then `md C` to give back),
//! sent raw through the same client.

use std::process::Command;
use std::time::Duration;

use locksmith::backend::LockBackend;
use locksmith::memcached::MemcachedBackend;
use locksmith::{LockKey, Locker, OwnerToken};
use memcache::exp::{AsyncMetaClient, Meta, Ttl};

use crate::redis_bench::{
    backend_pairs, contended, locker_contender, median, pairs_per_sec, Contention,
};

const TTL: Duration = Duration::from_secs(30);
const SHERLOCK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/mc_sherlock.py");

/// Runs `bench/mc_sherlock.py` with `args`; its one JSON line, or why not.
fn python(args: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new("python3")
        .arg(SHERLOCK)
        .args(args)
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "sherlock baseline failed (pip install sherlock==0.4.1 pymemcache==4.0.0 pylibmc?): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("sherlock output: {e}"))
}

async fn raw_pairs(client: &AsyncMetaClient, key: &str, iterations: u32) {
    let owner = OwnerToken::generate();
    let value = format!("{} 1", owner.as_str());
    for _ in 0..iterations {
        let added = client
            .set(key, &value)
            .add()
            .ttl(Ttl::secs(31))
            .send()
            .await
            .expect("add");
        assert!(added.applied(), "uncontended");
        let got = client
            .get(key)
            .meta(Meta::NONE.cas())
            .send()
            .await
            .expect("mg");
        let cas = got.item.cas.expect("cas");
        assert_eq!(got.value.as_deref(), Some(value.as_bytes()));
        let gone = client
            .delete(key)
            .compare_cas(cas)
            .send()
            .await
            .expect("md");
        assert!(gone.applied());
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
    let raw = AsyncMetaClient::connect(server)
        .await
        .map_err(|e| format!("cannot reach memcached at {server}: {e}"))?;
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
                    pairs_per_sec(iterations, || raw_pairs(&raw, &key, iterations)).await
                }
                1 | 2 => {
                    let mode = if path == 1 { "uncontended" } else { "raw" };
                    let v = python(&["--server", server, "--mode", mode, "--iterations", &n])?;
                    if path == 1 {
                        versions = format!(
                            "sherlock {}, pylibmc {}",
                            v["sherlock"].as_str().unwrap_or("?"),
                            v["pylibmc"].as_str().unwrap_or("?")
                        );
                    }
                    v["pairs_per_s"].as_f64().ok_or("python: no pairs_per_s")?
                }
                3 => {
                    let key = LockKey::new("uncontended-backend").expect("key");
                    pairs_per_sec(iterations, || {
                        backend_pairs(&backend, &key, iterations, TTL)
                    })
                    .await
                }
                _ => {
                    pairs_per_sec(iterations, || async {
                        for _ in 0..iterations {
                            let g = locker
                                .try_lock("uncontended-locker")
                                .await
                                .expect("acquire")
                                .expect("uncontended");
                            g.release().await.expect("release");
                        }
                    })
                    .await
                }
            };
            figures[path].push(r);
        }
    }
    let floor = median(&mut figures[0].clone());
    let sherlock = median(&mut figures[1].clone());
    println!(
        "\nmemcached: uncontended acquire+release, 1 client x {iterations} pairs, median of {rounds} rounds ({versions})"
    );
    println!(
        "  {:<36} {:>10}  {:>8}  {:>11}  {:>14}",
        "path", "pairs/s", "vs raw", "vs sherlock", "min..max"
    );
    for (i, label) in [
        "raw ms ME; mg v c + md C (floor)",
        "sherlock MCLock",
        "pymemcache add/delete (unsafe)",
        "MemcachedBackend",
        "Locker",
    ]
    .iter()
    .enumerate()
    {
        let v = &mut figures[i];
        let r = median(v);
        println!(
            "  {label:<36} {r:>10.0}  {:>8.2}  {:>11.2}  {:>6.0}..{:<6.0}",
            r / floor,
            r / sherlock,
            v.first().copied().unwrap_or_default(),
            v.last().copied().unwrap_or_default(),
        );
    }

    println!(
        "\nmemcached: {contenders} clients contending on one key, own client each; \
         {seconds} s per library per round, 2 rounds in alternating order"
    );
    println!(
        "  {:<14} {:>9} {:>12} {:>12} {:>22}",
        "library", "locks/s", "hand-off p50", "hand-off p99", "share per client min..max"
    );
    let mut ours = Contention::default();
    let mut theirs = Vec::new();
    let (c, s) = (contenders.to_string(), seconds.to_string());
    for round in 0..2 {
        for step in 0..2 {
            if (round + step) % 2 == 0 {
                ours.add(
                    contended(contenders, seconds, |_| {
                        let l = Locker::new(MemcachedBackend::connect(&url).expect("url"));
                        locker_contender(l, "contended".to_owned(), TTL)
                    })
                    .await,
                );
            } else {
                theirs.push(python(&[
                    "--server",
                    server,
                    "--mode",
                    "contended",
                    "--contenders",
                    &c,
                    "--seconds",
                    &s,
                ])?);
            }
        }
    }
    ours.print("locksmith", seconds * 2);
    for row in theirs {
        let counts: Vec<u64> = row["counts"]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
            .unwrap_or_default();
        let total: u64 = counts.iter().sum();
        let share = |c: Option<&u64>| 100.0 * c.copied().unwrap_or(0) as f64 / total.max(1) as f64;
        let ms = |k: &str| {
            row[k]
                .as_f64()
                .map_or("n/a".to_owned(), |us| format!("{:.2} ms", us / 1000.0))
        };
        println!(
            "  {:<14} {:>9.0} {:>12} {:>12} {:>12.1}%..{:.1}%",
            "sherlock (1)",
            total as f64 / seconds.max(1) as f64,
            ms("handoff_p50_us"),
            ms("handoff_p99_us"),
            share(counts.iter().min()),
            share(counts.iter().max())
        );
    }
    Ok(())
}
