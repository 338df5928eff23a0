//! `lockwright-bench zookeeper`: our ZooKeeper locks beside Python kazoo's
//! `Lock` (run as a subprocess, `bench/zk_kazoo.py`) and the floor: the
//! same requests (create an ephemeral sequential node and list the
//! directory, pipelined; delete) sent raw through the same client. Then
//! a semaphore's permit and read and write holds beside our lock and
//! kazoo's `Semaphore`, `ReadLock` and `WriteLock`.

use std::time::Duration;

use lockwright::backend::LockBackend;
use lockwright::zookeeper::internals::zookeeper_client as zk;
use lockwright::zookeeper::ZkBackend;
use lockwright::{Locker, OwnerToken};

use crate::baseline::{contention, python, uncontended_table};
use crate::claims_bench::claim_pairs;
use crate::redis_bench::{median, our_pairs, pairs_per_sec};

const TTL: Duration = Duration::from_secs(30);
const KAZOO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/zk_kazoo.py");

fn kazoo(args: &[&str]) -> Result<serde_json::Value, String> {
    python(KAZOO, "pip install kazoo==2.11.0", args)
}

/// kazoo's uncontended pairs of `recipe` (lock, semaphore, read, write).
fn kazoo_uncontended(
    hosts: &str,
    iterations: u32,
    recipe: &str,
) -> Result<serde_json::Value, String> {
    let n = iterations.to_string();
    kazoo(&[
        "--hosts",
        hosts,
        "--mode",
        "uncontended",
        "--iterations",
        &n,
        "--recipe",
        recipe,
    ])
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
    let root = format!("/lockwright-bench-{tag}");
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

    let mut figures: [Vec<f64>; 4] = Default::default();
    let mut kazoo_version = String::from("kazoo");
    for round in 0..rounds {
        for step in 0..4 {
            let path = (step + round as usize) % 4;
            let r = match path {
                0 => pairs_per_sec(iterations, || raw_pairs(&raw, &dir, iterations)).await,
                1 => {
                    let v = kazoo_uncontended(hosts, iterations, "lock")?;
                    if let Some(ver) = v["kazoo"].as_str() {
                        kazoo_version = format!("kazoo {ver}");
                    }
                    v["pairs_per_s"].as_f64().ok_or("kazoo: no pairs_per_s")?
                }
                _ => our_pairs(&backend, &locker, iterations, TTL, path > 2).await,
            };
            figures[path].push(r);
        }
    }
    println!(
        "\nZooKeeper: uncontended acquire+release, 1 client x {iterations} pairs, median of {rounds} rounds"
    );
    uncontended_table(
        "kazoo",
        &[
            "raw create+list, delete (floor)",
            kazoo_version.as_str(),
            "ZkBackend",
            "Locker",
        ],
        &mut figures,
    );
    println!(
        "\nZooKeeper: {contenders} clients contending on one key, own session each; \
         {seconds} s per library per round, 2 rounds in alternating order"
    );
    let (c, s) = (contenders.to_string(), seconds.to_string());
    contention(
        contenders,
        seconds,
        TTL,
        || ZkBackend::connect(&url).expect("url"),
        "kazoo",
        || {
            kazoo(&[
                "--hosts",
                hosts,
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
    claims_table(hosts, &locker, iterations, rounds).await?;
    drop((backend, locker));
    let _ = raw.delete(&dir, None).await;
    let _ = raw.delete(&root, None).await;
    Ok(())
}

/// What one uncontended pair takes through a `Locker`, and kazoo's recipe
/// for the same.
const CLAIMS: [(&str, &str); 4] = [
    ("lock", "Lock"),
    ("semaphore", "Semaphore (of 3)"),
    ("read", "ReadLock"),
    ("write", "WriteLock"),
];

/// A semaphore's permit and read and write holds, uncontended, beside our
/// lock and kazoo's recipes, rounds in alternating order.
async fn claims_table(
    hosts: &str,
    locker: &Locker,
    iterations: u32,
    rounds: u32,
) -> Result<(), String> {
    let mut ours: [Vec<f64>; 4] = Default::default();
    let mut theirs: [Vec<f64>; 4] = Default::default();
    for round in 0..rounds {
        for step in 0..8 {
            let i = (step + round as usize) % 8;
            let (what, _) = CLAIMS[i % 4];
            if i < 4 {
                let key = format!("claims-{what}");
                let r = pairs_per_sec(iterations, || claim_pairs(locker, &key, what, iterations));
                ours[i].push(r.await);
            } else {
                let v = kazoo_uncontended(hosts, iterations, what)?;
                let r = v["pairs_per_s"].as_f64().ok_or("kazoo: no pairs_per_s")?;
                theirs[i % 4].push(r);
            }
        }
    }
    println!(
        "\nZooKeeper: semaphore and read-write holds, uncontended acquire+release, 1 client x \
         {iterations} pairs, median of {rounds} rounds"
    );
    println!(
        "  {:<22} {:>10}  {:>11}  {:<18} {:>10}  {:>9}",
        "Locker", "pairs/s", "vs our lock", "kazoo", "pairs/s", "ours/kazoo"
    );
    let lock = median(&mut ours[0]);
    for (i, (what, peer)) in CLAIMS.iter().enumerate() {
        let (o, t) = (median(&mut ours[i]), median(&mut theirs[i]));
        println!(
            "  {:<22} {:>10.0}  {:>11.2}  {:<18} {:>10.0}  {:>9.2}",
            what,
            o,
            o / lock,
            peer,
            t,
            o / t
        );
    }
    Ok(())
}
