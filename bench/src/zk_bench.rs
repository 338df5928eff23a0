//! `locksmith-bench zookeeper`: our ZooKeeper locks beside Python kazoo's
//! `Lock` (run as a subprocess, `bench/zk_kazoo.py`) and the floor: the
//! same requests (create an ephemeral sequential node and list the
//! directory, pipelined; delete) sent raw through the same client.

use std::process::Command;
use std::time::Duration;

use locksmith::backend::LockBackend;
use locksmith::zookeeper::internals::zookeeper_client as zk;
use locksmith::zookeeper::ZkBackend;
use locksmith::{LockKey, LockOptions, Locker, OwnerToken};

use crate::redis_bench::{
    backend_pairs, contended, locker_contender, median, pairs_per_sec, Contention,
};

const TTL: Duration = Duration::from_secs(30);
const KAZOO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/zk_kazoo.py");

/// Runs `bench/zk_kazoo.py` with `args`; its one JSON line, or why not.
fn kazoo(args: &[&str]) -> Result<serde_json::Value, String> {
    let out = Command::new("python3")
        .arg(KAZOO)
        .args(args)
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "kazoo baseline failed (pip install kazoo==2.10.0?): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("kazoo output: {e}"))
}

async fn raw_pairs(client: &zk::Client, dir: &str, iterations: u32) {
    let options = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let prefix = format!("{dir}/_c_00000000-0000-0000-0000-000000000000-lock-");
    let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let mut done = 0;
    while done < iterations {
        let create = client.create(&prefix, b"owner", &options);
        let list = client.list_children(dir);
        let (created, listed) = futures::future::join(create, list).await;
        // The server reaps the empty directory now and then; the backend
        // makes it again, and so does the floor.
        if let Err(zk::Error::NoNode) = created {
            client.mkdir(dir, &container).await.expect("mkdir");
            continue;
        }
        done += 1;
        let (_, seq) = created.expect("create");
        assert_eq!(listed.expect("list").len(), 1, "uncontended");
        client
            .delete(&format!("{prefix}{seq}"), None)
            .await
            .expect("delete");
    }
}

pub(crate) async fn run(
    hosts: &str,
    iterations: u32,
    rounds: u32,
    contenders: usize,
    seconds: u64,
) -> Result<(), String> {
    let tag = OwnerToken::generate().as_str()[..8].to_owned();
    let root = format!("/locksmith-bench-{tag}");
    let url = format!("zk://{hosts}{root}");
    let raw = zk::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(hosts)
        .await
        .map_err(|e| format!("cannot reach ZooKeeper at {hosts}: {e}"))?;
    let dir = format!("{root}/raw");
    // Containers: the server reaps them even if this run is interrupted.
    raw.mkdir(
        &dir,
        &zk::CreateMode::Container.with_acls(zk::Acls::anyone_all()),
    )
    .await
    .map_err(|e| e.to_string())?;
    let backend = ZkBackend::connect(&url).map_err(|e| e.to_string())?;
    backend.verify().await.map_err(|e| e.chain())?;
    let locker = Locker::new(ZkBackend::connect(&url).map_err(|e| e.to_string())?);
    let n = iterations.to_string();
    let kazoo_args = [
        "--hosts",
        hosts,
        "--mode",
        "uncontended",
        "--iterations",
        &n,
    ];

    let mut figures: [Vec<f64>; 4] = Default::default();
    let mut kazoo_version = String::from("kazoo");
    for round in 0..rounds {
        for step in 0..4 {
            let path = (step + round as usize) % 4;
            let r = match path {
                0 => pairs_per_sec(iterations, || raw_pairs(&raw, &dir, iterations)).await,
                1 => {
                    let v = kazoo(&kazoo_args)?;
                    if let Some(ver) = v["kazoo"].as_str() {
                        kazoo_version = format!("kazoo {ver}");
                    }
                    v["pairs_per_s"].as_f64().ok_or("kazoo: no pairs_per_s")?
                }
                2 => {
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
                                .try_lock_with("uncontended-locker", &LockOptions::new().ttl(TTL))
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
    let theirs = median(&mut figures[1].clone());
    println!(
        "\nZooKeeper: uncontended acquire+release, 1 client x {iterations} pairs, median of {rounds} rounds"
    );
    println!(
        "  {:<34} {:>10}  {:>8}  {:>8}  {:>14}",
        "path", "pairs/s", "vs raw", "vs kazoo", "min..max"
    );
    for (i, label) in [
        "raw create+list, delete (floor)",
        kazoo_version.as_str(),
        "ZkBackend",
        "Locker",
    ]
    .iter()
    .enumerate()
    {
        let v = &mut figures[i];
        let r = median(v);
        println!(
            "  {label:<34} {r:>10.0}  {:>8.2}  {:>8.2}  {:>6.0}..{:<6.0}",
            r / floor,
            r / theirs,
            v.first().copied().unwrap_or_default(),
            v.last().copied().unwrap_or_default(),
        );
    }

    println!(
        "\nZooKeeper: {contenders} clients contending on one key, own session each; \
         {seconds} s per library per round, 2 rounds in alternating order"
    );
    println!(
        "  {:<14} {:>9} {:>12} {:>12} {:>22}",
        "library", "locks/s", "hand-off p50", "hand-off p99", "share per client min..max"
    );
    let mut ours = Contention::default();
    let mut kazoo_rows = Vec::new();
    let (c, s) = (contenders.to_string(), seconds.to_string());
    for round in 0..2 {
        for step in 0..2 {
            if (round + step) % 2 == 0 {
                ours.add(
                    contended(contenders, seconds, |_| {
                        let l = Locker::new(ZkBackend::connect(&url).expect("url"));
                        locker_contender(l, "contended".to_owned(), TTL)
                    })
                    .await,
                );
            } else {
                kazoo_rows.push(kazoo(&[
                    "--hosts",
                    hosts,
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
    for row in kazoo_rows {
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
            "kazoo (1 run)",
            total as f64 / seconds.max(1) as f64,
            ms("handoff_p50_us"),
            ms("handoff_p99_us"),
            share(counts.iter().min()),
            share(counts.iter().max())
        );
    }
    drop((backend, locker));
    let _ = raw.delete(&dir, None).await;
    let _ = raw.delete(&root, None).await;
    Ok(())
}
