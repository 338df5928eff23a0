//! Redis under Sentinel: the node the sentinels name is written to only
//! once `ROLE` on its connection says `master`. A fake sentinel (a few
//! lines of RESP in this file) names a real replica as the primary, as a
//! sentinel does mid-failover before the replica is promoted, or one that
//! is simply wrong.

use std::time::{Duration, Instant};

use lockwright_conformance::kit::process::redis_server;
use lockwright_core::backend::{Acquire, LockBackend, LockBackendExt, Release};
use lockwright_core::{ErrorKind, LockKey, OwnerToken};
use lockwright_redis::RedisBackend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const MASTER: &str = "mymaster";

/// A fake Redis Sentinel on a free loopback port that names
/// `127.0.0.1:<named>` as the primary of [`MASTER`]; its port. It answers
/// what `sentinel.rs` asks (`SENTINEL MASTER` and
/// `SENTINEL get-master-addr-by-name`, pipelined), confirms the failover
/// listeners' `SUBSCRIBE` (and never publishes), answers `PING`, and `+OK`
/// to anything else (the driver's `CLIENT SETINFO` on connect).
async fn fake_sentinel(named: u16) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            tokio::spawn(serve(conn, named));
        }
    });
    port
}

async fn serve(mut conn: TcpStream, named: u16) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some((args, used)) = parse(&buf) {
            buf.drain(..used);
            if conn.write_all(&answer(&args, named)).await.is_err() {
                return;
            }
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The line starting at `from` (without its CRLF), and where the next
/// one starts; `None` until it is whole.
fn line(buf: &[u8], from: usize) -> Option<(String, usize)> {
    let end = from + buf.get(from..)?.windows(2).position(|w| w == b"\r\n")?;
    Some((
        String::from_utf8_lossy(&buf[from..end]).into_owned(),
        end + 2,
    ))
}

/// One command (an array of bulk strings, as the driver sends every one)
/// from the front of `buf`, and how many bytes it took; `None` until it
/// is whole.
fn parse(buf: &[u8]) -> Option<(Vec<String>, usize)> {
    let (head, mut at) = line(buf, 0)?;
    let n: usize = head.strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        let (len, start) = line(buf, at)?;
        let len: usize = len.strip_prefix('$')?.parse().ok()?;
        let end = start + len;
        if buf.len() < end + 2 {
            return None;
        }
        args.push(String::from_utf8_lossy(&buf[start..end]).into_owned());
        at = end + 2;
    }
    Some((args, at))
}

/// An array of bulk strings.
fn array(items: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", items.len());
    for item in items {
        out.push_str(&format!("${}\r\n{item}\r\n", item.len()));
    }
    out.into_bytes()
}

fn answer(args: &[String], named: u16) -> Vec<u8> {
    let word = |i: usize| args.get(i).map(|a| a.to_ascii_uppercase());
    let port = named.to_string();
    match (word(0).as_deref(), word(1).as_deref()) {
        (Some("SENTINEL"), Some("MASTER" | "GET-MASTER-ADDR-BY-NAME"))
            if args.get(2).map(String::as_str) != Some(MASTER) =>
        {
            b"-ERR No such master with that name\r\n".to_vec()
        }
        // The fields `sentinel.rs` reads (ip, port, flags, config-epoch)
        // among some others a real sentinel sends: a live master, as far
        // as this sentinel knows.
        (Some("SENTINEL"), Some("MASTER")) => array(&[
            "name",
            MASTER,
            "ip",
            "127.0.0.1",
            "port",
            port.as_str(),
            "runid",
            "0123456789abcdef0123456789abcdef01234567",
            "flags",
            "master",
            "role-reported",
            "master",
            "config-epoch",
            "1",
            "num-slaves",
            "0",
            "num-other-sentinels",
            "0",
            "quorum",
            "1",
        ]),
        (Some("SENTINEL"), Some("GET-MASTER-ADDR-BY-NAME")) => array(&["127.0.0.1", port.as_str()]),
        // One confirmation per channel, as RESP2 has them.
        (Some("SUBSCRIBE"), _) => {
            let mut out = String::new();
            for (i, channel) in args[1..].iter().enumerate() {
                out.push_str(&format!(
                    "*3\r\n$9\r\nsubscribe\r\n${}\r\n{channel}\r\n:{}\r\n",
                    channel.len(),
                    i + 1
                ));
            }
            out.into_bytes()
        }
        (Some("PING"), _) => b"+PONG\r\n".to_vec(),
        _ => b"+OK\r\n".to_vec(),
    }
}

/// `cmd` on the Redis at `port`, on a connection of its own.
async fn query<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    cmd.query_async(&mut conn).await
}

/// Waits until the Redis at `port` is a replica in sync with its primary
/// (`ROLE`: `slave`, link `connected`): its full sync, which empties it,
/// is over before the test looks at its keys.
async fn wait_replicating(port: u16) {
    let start = Instant::now();
    loop {
        let role: Vec<redis::Value> = query(port, &redis::cmd("ROLE")).await.unwrap_or_default();
        let text = |i: usize| match role.get(i) {
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        };
        if text(0) == "slave" && text(3) == "connected" {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the replica on {port} never synced: ROLE {role:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every key on the Redis at `port`.
async fn keys(port: u16) -> Vec<String> {
    query(port, redis::cmd("KEYS").arg("*")).await.unwrap()
}

/// A sentinel names a replica as the primary: no lock is taken, nothing is
/// written anywhere, and `verify` says so too, each `Unavailable` ("a
/// failover is under way").
///
/// Remove the check in backend-redis/src/sentinel.rs, `Sentinel::resolve`
/// (line 328):
///     if role_name(&role).as_deref() != Some("master") {
///         return Err(Error::unavailable(... "a failover is under way" ...));
///     }
/// to see this fail. The replica here takes writes
/// (`replica-read-only no`), so nothing else stops the scripts: a
/// read-only replica would refuse them with `READONLY` (which already
/// moves the client on, and would hide the missing check). Without the
/// check the acquire script runs on the replica and the grant is
/// `Acquired` (a key written there), and `verify` (`PING`, then `ROLE`,
/// which only refuses a sentinel) succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_the_sentinels_name_as_the_primary_is_never_written_to() {
    let (_primary, primary_port) = redis_server(&[]);
    let primary_arg = primary_port.to_string();
    let (_replica, replica_port) = redis_server(&[
        "--replicaof",
        "127.0.0.1",
        &primary_arg,
        "--replica-read-only",
        "no",
    ]);
    wait_replicating(replica_port).await;

    let sentinel = fake_sentinel(replica_port).await;
    let url = format!(
        "redis+sentinel://127.0.0.1:{sentinel}/{MASTER}?timeout=500ms&connect_timeout=500ms"
    );
    let backend = RedisBackend::connect(&url).unwrap();
    let key = LockKey::new("sentinel-role/replica").unwrap();
    let owner = OwnerToken::generate();
    let replica = format!("127.0.0.1:{replica_port}");

    let e = backend
        .try_lock(&key, &owner, Duration::from_secs(10))
        .await
        .expect_err("a grant on a node whose ROLE says it is a replica");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let said = e.to_string();
    assert!(
        said.contains(&replica) && said.contains("is not the primary"),
        "{said}"
    );

    let e = backend
        .verify()
        .await
        .expect_err("verify of a node whose ROLE says it is a replica");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.to_string().contains("is not the primary"), "{e}");

    for (node, port) in [("replica", replica_port), ("primary", primary_port)] {
        let left = keys(port).await;
        assert!(left.is_empty(), "the {node} holds {left:?}");
    }

    // The same fake, naming the primary, is enough for a lock: what was
    // refused above was the node, not the sentinel's answer.
    let sentinel = fake_sentinel(primary_port).await;
    let url = format!(
        "redis+sentinel://127.0.0.1:{sentinel}/{MASTER}?timeout=500ms&connect_timeout=500ms"
    );
    let backend = RedisBackend::connect(&url).unwrap();
    backend.verify().await.unwrap();
    let got = backend
        .try_lock(&key, &owner, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(matches!(got, Acquire::Acquired(_)), "{got:?}");
    assert_eq!(backend.unlock(&key, &owner).await.unwrap(), Release::Freed);
}
