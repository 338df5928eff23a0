//! Semaphores and read-write locks on memcached, as only memcached keeps
//! them: the group's one item, each holder's end on the server's clock,
//! and the clock item that reads that clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use common::{raw, server};
use lockwright_conformance::kit::unique_prefix;
use lockwright_core::backend::{
    renew_one, Acquire, AcquireRequest, HoldId, HoldKind, LockBackend, Release, Renew, RenewRequest,
};
use lockwright_core::{Claim, ErrorKind, LockKey, LockOptions, Locker, OwnerToken};
use lockwright_memcached::MemcachedBackend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// A client of the shared server, its keys under `prefix`.
fn backend(prefix: &str) -> MemcachedBackend {
    let url = format!("memcache://{}?prefix={prefix}", server());
    MemcachedBackend::connect(&url).expect("valid URL")
}

fn locker(prefix: &str) -> Locker {
    Locker::from_arc(Arc::new(backend(prefix)))
}

fn now() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(10)).no_wait()
}

/// A hold of `key` of `kind` by a new owner.
fn hold(key: &LockKey, kind: HoldKind) -> HoldId {
    HoldId::new(key.clone(), OwnerToken::generate(), kind)
}

/// One attempt at `hold` for `ttl`.
async fn attempt(
    backend: &MemcachedBackend,
    hold: &HoldId,
    ttl: Duration,
) -> lockwright_core::Result<Acquire> {
    backend
        .try_acquire(&AcquireRequest::new(hold.clone(), ttl))
        .await
}

/// The server's clock as `stats` reports it.
async fn stats_time(server: &str) -> Result<u64> {
    let mut s = BufReader::new(TcpStream::connect(server).await?);
    s.get_mut().write_all(b"stats\r\n").await?;
    let mut time = None;
    loop {
        let mut line = String::new();
        s.read_line(&mut line).await?;
        match line.trim_end() {
            "END" => return time.context("stats without the time"),
            l => {
                if let Some(t) = l.strip_prefix("STAT time ") {
                    time = Some(t.parse()?);
                }
            }
        }
    }
}

/// A `mg <key> v t` reply: the value and the seconds left.
async fn value_and_left(key: &str) -> Result<Option<(String, u64)>> {
    let mut s = BufReader::new(TcpStream::connect(server()).await?);
    s.get_mut()
        .write_all(format!("mg {key} v t\r\n").as_bytes())
        .await?;
    let mut head = String::new();
    s.read_line(&mut head).await?;
    if head.starts_with("EN") {
        return Ok(None);
    }
    let fields: Vec<&str> = head.trim_end().split(' ').collect();
    let (size, left) = match fields[..] {
        ["VA", size, t] => (size.parse::<usize>()?, t.trim_start_matches('t').parse()?),
        _ => bail!("mg {key}: {head:?}"),
    };
    let mut value = vec![0; size + 2];
    tokio::io::AsyncReadExt::read_exact(&mut s, &mut value).await?;
    value.truncate(size);
    Ok(Some((String::from_utf8(value)?, left)))
}

/// The clock item holds its own absolute expiry, a day after the
/// server's clock when it was added, so that expiry less its seconds left
/// is the server's clock; once deleted, the next group comes back with it.
#[tokio::test]
async fn the_clock_item_reads_the_servers_clock_and_comes_back() -> Result<()> {
    let prefix = unique_prefix();
    let clock = format!("{prefix}#clock");
    let l = locker(&prefix);
    let sem = l.semaphore("backups", 3)?;
    let first = sem.acquire_with(&now()).await?;
    let (e, left) = value_and_left(&clock).await?.context("no clock item")?;
    let server_now = stats_time(&server()).await?;
    let read = e.parse::<u64>()? - left;
    ensure!(
        read.abs_diff(server_now) <= 1,
        "the clock item reads {read}, the server {server_now}"
    );
    ensure!(
        (86_398..=86_401).contains(&left),
        "the clock item has {left} s left, not a day"
    );

    let reply = raw(&server(), format!("delete {clock}\r\n").as_bytes()).await?;
    ensure!(reply == "DELETED\r\n", "{reply:?}");
    let second = sem.acquire_with(&now()).await?;
    ensure!(value_and_left(&clock).await?.is_some(), "no clock again");
    ensure!(
        sem.status().await?.holder_count() == 2,
        "two permits out after the clock came back"
    );
    first.release().await?;
    second.release().await?;
    Ok(())
}

/// Each holder's end is a time on the server's clock, its TTL rounded up
/// and two seconds on, and the group's item expires, as an absolute time,
/// with its last holder.
#[tokio::test]
async fn each_holder_ends_on_the_servers_clock() -> Result<()> {
    let prefix = unique_prefix();
    let l = locker(&prefix);
    let rw = l.rwlock("catalogue")?;
    let long = rw
        .read_with(&LockOptions::new().ttl(Duration::from_secs(20)).no_wait())
        .await?;
    let short = rw.read_with(&now()).await?;
    let server_now = stats_time(&server()).await?;
    let (group, left) = value_and_left(&format!("{prefix}catalogue"))
        .await?
        .context("no group item")?;
    let mut lines = group.split('\n');
    ensure!(lines.next() == Some("#g s 0"), "{group:?}");
    let ends: Vec<u64> = lines
        .map(|l| match l.split(' ').collect::<Vec<_>>()[..] {
            ["h", _, "1", end, "r"] => Ok(end.parse()?),
            _ => bail!("not a reader's line: {l:?}"),
        })
        .collect::<Result<_>>()?;
    let lasts: Vec<u64> = ends.iter().map(|e| e.saturating_sub(server_now)).collect();
    ensure!(
        (21..=22).contains(&lasts[0]) && (11..=12).contains(&lasts[1]),
        "the readers end {lasts:?} s from now, not 22 and 12"
    );
    ensure!(
        left.abs_diff(lasts[0]) <= 1,
        "the item expires in {left} s, not with its last reader ({} s)",
        lasts[0]
    );
    long.release().await?;
    let (_, left) = value_and_left(&format!("{prefix}catalogue"))
        .await?
        .context("the group went with a reader still in")?;
    ensure!(
        left.abs_diff(lasts[1]) <= 1,
        "after the longer reader left, the item expires in {left} s, not {} s",
        lasts[1]
    );
    short.release().await?;
    ensure!(
        value_and_left(&format!("{prefix}catalogue"))
            .await?
            .is_none(),
        "the group's item stayed after its last reader left"
    );
    Ok(())
}

/// A clock item that is not lockwright's (no expiry, or not a number)
/// fails a group's acquire with a typed error, and grants nothing.
#[tokio::test]
async fn a_clock_item_not_ours_is_an_error_not_a_grant() -> Result<()> {
    let prefix = unique_prefix();
    let clock = format!("{prefix}#clock");
    let l = locker(&prefix);
    for value in ["1800000000", "soon"] {
        let set = format!("set {clock} 0 0 {}\r\n{value}\r\n", value.len());
        ensure!(raw(&server(), set.as_bytes()).await? == "STORED\r\n");
        match l.semaphore("jobs", 2)?.acquire_with(&now()).await {
            Err(e) if e.kind() == ErrorKind::Backend && e.to_string().contains("clock") => {}
            other => bail!(
                "a foreign clock item {value:?}: {:?}",
                other.map(|g| g.holds())
            ),
        }
        ensure!(
            value_and_left(&format!("{prefix}jobs")).await?.is_none(),
            "a permit was stored beside a foreign clock"
        );
    }
    raw(&server(), format!("delete {clock}\r\n").as_bytes()).await?;
    l.semaphore("jobs", 2)?
        .acquire_with(&now())
        .await?
        .release()
        .await?;
    Ok(())
}

/// Several holders of one group renewed in one batch (a `Locker` holding
/// several of a semaphore's permits) are all renewed: one write for the
/// group, not one each over the same version, which would undo each other.
#[tokio::test]
async fn a_batch_renews_every_holder_of_one_group() -> Result<()> {
    let backend = backend(&unique_prefix());
    let key = LockKey::new("pool")?;
    let ttl = Duration::from_secs(10);
    let mut requests = Vec::new();
    for _ in 0..6 {
        let owner = hold(&key, HoldKind::of_claim(Claim::permits(8)?));
        match attempt(&backend, &owner, ttl).await? {
            Acquire::Acquired(_) => {}
            other => bail!("a free permit: {other:?}"),
        }
        requests.push(RenewRequest::new(owner, Duration::from_secs(20)));
    }
    let stranger = hold(&key, HoldKind::of_claim(Claim::permits(8)?));
    requests.push(RenewRequest::new(stranger, ttl));
    let results = backend.renew(&requests).await;
    for (i, r) in results.iter().enumerate().take(6) {
        ensure!(
            matches!(r, Ok(Renew::Renewed)),
            "holder {i} of the batch: {r:?}"
        );
    }
    ensure!(
        matches!(results[6], Ok(Renew::NotHeld)),
        "a stranger renewed: {:?}",
        results[6]
    );
    let status = backend.inspect(&key).await?;
    ensure!(
        status
            .holders
            .iter()
            .all(|h| h.remaining >= Some(Duration::from_secs(19))),
        "not every holder has its new lease: {status:?}"
    );
    for r in &requests[..6] {
        backend.release(&r.hold).await?;
    }
    Ok(())
}

/// A writer served while another writer's mark is out holds as a member,
/// keeping that mark (readers still wait when it goes), and a semaphore's
/// claim on it is refused as another N, never granted beside it.
#[tokio::test]
async fn a_writer_served_beside_marks_keeps_them_and_excludes_permits() -> Result<()> {
    let backend = backend(&unique_prefix());
    let key = LockKey::new("catalogue")?;
    let ttl = Duration::from_secs(10);
    let reader = hold(&key, HoldKind::Reader { beside: None });
    let (a, b) = (hold(&key, HoldKind::Writer), hold(&key, HoldKind::Writer));
    let granted = |r: &Acquire| matches!(r, Acquire::Acquired(_));
    ensure!(granted(&attempt(&backend, &reader, ttl).await?));
    for w in [&a, &b] {
        ensure!(!granted(&attempt(&backend, w, ttl).await?));
    }
    backend.release(&reader).await?;
    ensure!(
        granted(&attempt(&backend, &b, ttl).await?),
        "the writer was not served once the reader left"
    );
    let permit = hold(&key, HoldKind::of_claim(Claim::permits(3)?));
    match attempt(&backend, &permit, ttl).await {
        Err(e) if e.kind() == ErrorKind::InvalidOptions => {}
        other => bail!("a permit beside a writer: {other:?}"),
    }
    let late = hold(&key, HoldKind::Reader { beside: None });
    ensure!(!granted(&attempt(&backend, &late, ttl).await?));
    ensure!(matches!(backend.release(&b).await?, Release::Freed));
    ensure!(
        !granted(&attempt(&backend, &late, ttl).await?),
        "a reader got in ahead of the writer whose mark was out"
    );
    ensure!(
        granted(&attempt(&backend, &a, ttl).await?),
        "the marked writer was not served"
    );
    ensure!(matches!(backend.release(&a).await?, Release::Freed));
    ensure!(granted(&attempt(&backend, &late, ttl).await?));
    backend.release(&late).await?;
    Ok(())
}

/// memcached's waiters poll, so without a place in line a reader waiting
/// for back-to-back writers could wait for ever: a reader refused by a
/// writer (a mutex's item, which becomes a group for it) leaves a mark,
/// and a writer finding it, with none of its own before it, yields; a
/// writer's mark made while that reader holds keeps later readers out;
/// a reader that gives up takes its mark away.
#[tokio::test]
async fn a_reader_waiting_first_goes_before_later_writers() -> Result<()> {
    let prefix = unique_prefix();
    let backend = backend(&prefix);
    let key = LockKey::new("catalogue")?;
    let ttl = Duration::from_secs(10);
    let reader = || hold(&key, HoldKind::Reader { beside: None });
    let writer = || hold(&key, HoldKind::Writer);
    let (w1, w2, w3) = (writer(), writer(), writer());
    let (r1, r2) = (reader(), reader());
    let granted = |r: &Acquire| matches!(r, Acquire::Acquired(_));
    ensure!(granted(&attempt(&backend, &w1, ttl).await?));
    ensure!(!granted(&attempt(&backend, &r1, ttl).await?));
    ensure!(!granted(&attempt(&backend, &w2, ttl).await?));
    // The writer's item, now a group with the reader's mark, is still its.
    ensure!(matches!(
        renew_one(&backend, RenewRequest::new(w1.clone(), ttl)).await?,
        Renew::Renewed
    ));
    ensure!(matches!(backend.release(&w1).await?, Release::Freed));
    ensure!(
        !granted(&attempt(&backend, &w2, ttl).await?),
        "a writer got in ahead of a reader that waited first"
    );
    ensure!(granted(&attempt(&backend, &r1, ttl).await?));
    ensure!(!granted(&attempt(&backend, &w2, ttl).await?));
    ensure!(
        !granted(&attempt(&backend, &r2, ttl).await?),
        "a reader got in ahead of a waiting writer"
    );
    ensure!(matches!(backend.release(&r1).await?, Release::Freed));
    ensure!(granted(&attempt(&backend, &w2, ttl).await?));
    ensure!(matches!(backend.release(&w2).await?, Release::Freed));
    backend.abandon(&r2, &OwnerToken::generate()).await?;
    ensure!(
        granted(&attempt(&backend, &w3, ttl).await?),
        "a reader that gave up still kept a writer out"
    );
    ensure!(matches!(backend.release(&w3).await?, Release::Freed));
    ensure!(
        value_and_left(&format!("{prefix}catalogue"))
            .await?
            .is_none(),
        "the name's item outlived its last holder and mark"
    );
    Ok(())
}
