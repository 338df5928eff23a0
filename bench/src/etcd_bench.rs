//! `lockwright-bench etcd`: our etcd locks beside etcd's own lock service
//! (`v3lock`, whose server runs Go's `concurrency.Mutex` on a session of
//! the lease it is given: the Go recipe, one RPC per lock and unlock) and
//! the floor: the same requests our attempt sends (the put-if-absent
//! transaction that reads the first contender, then a delete), raw through
//! the same client.

use std::time::Duration;

use lockwright::backend::LockBackend;
use lockwright::etcd::internals::etcd_client as etcd;
use lockwright::etcd::EtcdBackend;
use lockwright::{Locker, OwnerToken};

use crate::baseline::uncontended_table;
use crate::redis_bench::{
    contended, locker_contender, our_pairs, pairs_per_sec, Acquiring, Contention, Release, Releaser,
};

const TTL: Duration = Duration::from_secs(30);

async fn client(hosts: &str) -> Result<etcd::Client, String> {
    let eps: Vec<&str> = hosts.split(',').collect();
    etcd::Client::connect(eps, None)
        .await
        .map_err(|e| format!("cannot reach etcd at {hosts}: {e}"))
}

/// The floor: our attempt's transaction and our release's delete, raw.
async fn raw_pairs(c: &etcd::Client, prefix: &str, lease: i64, iterations: u32) {
    let key = format!("{prefix}{lease:x}");
    let first = etcd::GetOptions::new()
        .with_prefix()
        .with_sort(etcd::SortTarget::Create, etcd::SortOrder::Ascend)
        .with_limit(1);
    for _ in 0..iterations {
        let put = etcd::PutOptions::new().with_lease(lease);
        let txn = etcd::Txn::new()
            .when([etcd::Compare::create_revision(
                key.as_str(),
                etcd::CompareOp::Equal,
                0,
            )])
            .and_then([
                etcd::TxnOp::put(key.as_str(), "", Some(put)),
                etcd::TxnOp::get(prefix, Some(first.clone())),
            ]);
        let resp = c.clone().txn(txn).await.expect("txn");
        assert!(resp.succeeded(), "uncontended");
        c.clone().delete(key.as_str(), None).await.expect("delete");
    }
}

/// The peer: etcd's lock service (Go's `Mutex` in the server), on `lease`.
async fn peer_pairs(c: &etcd::Client, name: &str, lease: i64, iterations: u32) {
    for _ in 0..iterations {
        let opts = etcd::LockOptions::new().with_lease(lease);
        let got = c.clone().lock(name, Some(opts)).await.expect("lock");
        c.clone().unlock(got.key()).await.expect("unlock");
    }
}

/// One contender through etcd's lock service, on a lease of its own.
fn peer_contender(c: etcd::Client, name: String, lease: i64) -> impl Fn() -> Acquiring + Send {
    move || {
        let (mut c, name) = (c.clone(), name.clone());
        Box::pin(async move {
            let opts = etcd::LockOptions::new().with_lease(lease);
            let key = c.lock(name, Some(opts)).await.expect("lock").key().to_vec();
            Box::new(move || {
                Box::pin(async move {
                    c.unlock(key).await.expect("unlock");
                }) as Release
            }) as Releaser
        }) as Acquiring
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
    let url = format!("etcd://{hosts}{root}");
    let raw = client(hosts).await?;
    let lease = raw
        .clone()
        .lease_grant(60, None)
        .await
        .map_err(|e| e.to_string())?
        .id();
    let (_keeper, _stream) = raw
        .clone()
        .lease_keep_alive(lease)
        .await
        .map_err(|e| e.to_string())?;
    let backend = EtcdBackend::connect(&url).map_err(|e| e.to_string())?;
    backend.verify().await.map_err(|e| e.chain())?;
    let locker = Locker::new(EtcdBackend::connect(&url).map_err(|e| e.to_string())?);
    let (raw_prefix, peer_name) = (format!("{root}/raw/"), format!("{root}/peer"));

    let mut figures: [Vec<f64>; 4] = Default::default();
    for round in 0..rounds {
        for step in 0..4 {
            let path = (step + round as usize) % 4;
            let r = match path {
                0 => {
                    pairs_per_sec(iterations, || {
                        raw_pairs(&raw, &raw_prefix, lease, iterations)
                    })
                    .await
                }
                1 => {
                    pairs_per_sec(iterations, || {
                        peer_pairs(&raw, &peer_name, lease, iterations)
                    })
                    .await
                }
                _ => our_pairs(&backend, &locker, iterations, TTL, path > 2).await,
            };
            figures[path].push(r);
        }
    }
    println!(
        "\netcd: uncontended acquire+release, 1 client x {iterations} pairs, median of {rounds} rounds"
    );
    uncontended_table(
        "v3lock",
        &[
            "raw txn, delete (floor)",
            "etcd lock service (Go Mutex)",
            "EtcdBackend",
            "Locker",
        ],
        &mut figures,
    );

    println!(
        "\netcd: {contenders} clients contending on one key, own lease each; \
         {seconds} s per library per round, 2 rounds in alternating order"
    );
    println!(
        "  {:<14} {:>9} {:>12} {:>12} {:>22}",
        "library", "locks/s", "hand-off p50", "hand-off p99", "share per client min..max"
    );
    let (mut ours, mut theirs) = (Contention::default(), Contention::default());
    let mut leases = Vec::new();
    for _ in 0..contenders {
        let id = raw
            .clone()
            .lease_grant(60, None)
            .await
            .map_err(|e| e.to_string())?
            .id();
        leases.push((
            id,
            raw.clone()
                .lease_keep_alive(id)
                .await
                .map_err(|e| e.to_string())?,
        ));
    }
    for round in 0..2 {
        for step in 0..2 {
            if (round + step) % 2 == 0 {
                let u = url.clone();
                ours.add(
                    contended(contenders, seconds, |_| {
                        let b = EtcdBackend::connect(&u).expect("url");
                        locker_contender(Locker::new(b), "contended".to_owned(), TTL)
                    })
                    .await,
                );
            } else {
                let ids: Vec<i64> = leases.iter().map(|(id, _)| *id).collect();
                let name = format!("{root}/peer-contended");
                theirs.add(
                    contended(contenders, seconds, |i| {
                        peer_contender(raw.clone(), name.clone(), ids[i])
                    })
                    .await,
                );
            }
        }
    }
    ours.print("lockwright", seconds * 2);
    theirs.print("v3lock", seconds * 2);
    for (id, _) in leases {
        let _ = raw.clone().lease_revoke(id).await;
    }
    let _ = raw.clone().lease_revoke(lease).await;
    drop((backend, locker));
    Ok(())
}
