//! What the Redis tests share beyond the kit: Redlock URLs with nodes
//! down, and reading the keys a server holds.

#![allow(dead_code, unreachable_pub)]

/// A Redlock URL over these ports; port 1 stands for a node that is down.
/// Each down node gets a loopback address of its own (127.0.0.2, …), since
/// Redlock refuses the same node twice.
pub fn redlock_url(ports: &[u16]) -> String {
    let hosts: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, &p)| match p {
            1 => format!("127.0.0.{}:1", i + 2),
            p => format!("127.0.0.1:{p}"),
        })
        .collect();
    format!("redis+redlock://{}", hosts.join(","))
}

/// Every key on the server at `url` that matches the glob `pattern`.
pub async fn scan(url: &str, pattern: &str) -> Vec<String> {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut iter: redis::AsyncIter<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(1000)
        .clone()
        .iter_async(&mut conn)
        .await
        .unwrap();
    let mut out = Vec::new();
    while let Some(k) = futures::StreamExt::next(&mut iter).await {
        out.push(k.unwrap_or_default());
    }
    out
}

/// The glob matching every key of the lock names starting with `prefix`,
/// under the default key prefix.
pub fn names_pattern(prefix: &str) -> String {
    format!("lockwright:{{{prefix}*")
}

/// The Redis under Sentinel that `scripts/test` starts: who is primary,
/// and failovers that wait until the setup is whole again.
pub mod sentinel {
    use std::time::{Duration, Instant};

    use lockwright_conformance::kit::servers::{
        redis_sentinel_data_ports, redis_sentinel_ports, REDIS_SENTINEL_MASTER,
    };

    /// How long a failover, and the setup becoming whole after it, may take
    /// on a loaded host.
    pub const PATIENCE: Duration = Duration::from_secs(90);

    async fn conn(port: u16) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(5)));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// `cmd` on the server at `port`.
    pub async fn query<T: redis::FromRedisValue>(
        port: u16,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        cmd.query_async(&mut conn(port).await?).await
    }

    /// The port every sentinel names as the primary, once they agree.
    pub async fn agreed_primary() -> Option<u16> {
        let mut named = None;
        for s in redis_sentinel_ports() {
            let addr: Option<(String, String)> = query(
                s,
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(REDIS_SENTINEL_MASTER),
            )
            .await
            .ok()?;
            let port: u16 = addr?.1.parse().ok()?;
            if named.is_some_and(|n| n != port) {
                return None;
            }
            named = Some(port);
        }
        named
    }

    /// The primary's port, and whether the setup is whole: the sentinels
    /// agree, it says it is a master, and both replicas are online.
    pub async fn whole() -> Option<u16> {
        let primary = agreed_primary().await?;
        let role: Vec<redis::Value> = query(primary, &redis::cmd("ROLE")).await.ok()?;
        let is_master = matches!(role.first(), Some(redis::Value::BulkString(b)) if b == b"master");
        let info: String = query(primary, redis::cmd("INFO").arg("replication"))
            .await
            .ok()?;
        (is_master && info.contains("connected_slaves:2")).then_some(primary)
    }

    /// Waits until the setup is whole; its primary.
    pub async fn wait_whole() -> u16 {
        let start = Instant::now();
        loop {
            if let Some(p) = whole().await {
                return p;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the Redis under Sentinel did not become whole within {PATIENCE:?} \
                 (data nodes {:?})",
                redis_sentinel_data_ports()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until the sentinels agree on a primary other than `old`; it.
    pub async fn wait_moved_from(old: u16) -> u16 {
        let start = Instant::now();
        loop {
            if let Some(p) = agreed_primary().await.filter(|p| *p != old) {
                return p;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "no new primary named within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `SENTINEL FAILOVER` once the setup is whole (retried while a
    /// sentinel answers that none of the replicas is ready yet); the old
    /// primary and the new one, once the sentinels agree on it.
    pub async fn failover() -> (u16, u16) {
        let old = wait_whole().await;
        let start = Instant::now();
        let sentinel = redis_sentinel_ports()[0];
        loop {
            let r: redis::RedisResult<()> = query(
                sentinel,
                redis::cmd("SENTINEL")
                    .arg("FAILOVER")
                    .arg(REDIS_SENTINEL_MASTER),
            )
            .await;
            match r {
                Ok(()) => break,
                Err(e) => assert!(
                    start.elapsed() < PATIENCE,
                    "SENTINEL FAILOVER kept failing: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        (old, wait_moved_from(old).await)
    }

    /// The process id of the server at `port`.
    pub async fn pid(port: u16) -> u32 {
        let info: String = query(port, redis::cmd("INFO").arg("server")).await.unwrap();
        info.lines()
            .find_map(|l| l.trim().strip_prefix("process_id:"))
            .and_then(|p| p.parse().ok())
            .expect("INFO server has process_id")
    }
}

/// The Redis Cluster that `scripts/test` starts: which node serves a key,
/// failovers and slot moves that wait until the Cluster is whole again.
pub mod cluster {
    use std::time::{Duration, Instant};

    use lockwright_conformance::kit::servers::redis_cluster_ports;

    use super::sentinel::query;

    /// How long a failover or a slot's move may take on a loaded host.
    pub const PATIENCE: Duration = Duration::from_secs(90);

    /// One node as `CLUSTER NODES` lists it.
    #[derive(Debug, Clone)]
    pub struct Node {
        pub id: String,
        pub port: u16,
        pub primary: bool,
        /// The primary it replicates (`-` for a primary).
        pub of: String,
        /// Its slots, as written (`0-5460`).
        pub slots: Vec<String>,
    }

    /// The nodes, as the first node that answers lists them.
    pub async fn nodes() -> Vec<Node> {
        for p in redis_cluster_ports() {
            let Ok(text) = query::<String>(p, redis::cmd("CLUSTER").arg("NODES")).await else {
                continue;
            };
            return text
                .lines()
                .filter_map(|l| {
                    let f: Vec<&str> = l.split(' ').collect();
                    let port = f
                        .get(1)?
                        .split('@')
                        .next()?
                        .rsplit(':')
                        .next()?
                        .parse()
                        .ok()?;
                    Some(Node {
                        id: f[0].to_owned(),
                        port,
                        primary: f.get(2)?.contains("master"),
                        of: f.get(3)?.to_string(),
                        slots: f.iter().skip(8).map(|s| s.to_string()).collect(),
                    })
                })
                .collect();
        }
        panic!("no Cluster node answered");
    }

    /// The slot of `key`.
    pub async fn slot(key: &str) -> u16 {
        query(
            redis_cluster_ports()[0],
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
        )
        .await
        .unwrap()
    }

    fn serves(n: &Node, slot: u16) -> bool {
        n.primary
            && n.slots.iter().any(|r| {
                let mut ends = r.split('-').filter_map(|x| x.parse::<u16>().ok());
                match (ends.next(), ends.next()) {
                    (Some(a), Some(b)) => (a..=b).contains(&slot),
                    (Some(a), None) => a == slot,
                    _ => false,
                }
            })
    }

    /// The primary serving `slot`.
    pub async fn primary_of(slot: u16) -> Node {
        nodes()
            .await
            .into_iter()
            .find(|n| serves(n, slot))
            .unwrap_or_else(|| panic!("no primary serves slot {slot}"))
    }

    /// Waits until every node says the Cluster is ok and every primary has
    /// a replica online.
    pub async fn wait_whole() {
        let start = Instant::now();
        loop {
            let mut ok = true;
            for p in redis_cluster_ports() {
                let info: String = query(p, redis::cmd("CLUSTER").arg("INFO"))
                    .await
                    .unwrap_or_default();
                ok &= info.contains("cluster_state:ok");
            }
            let nodes = nodes().await;
            for n in nodes.iter().filter(|n| n.primary && !n.slots.is_empty()) {
                let info: String = query(n.port, redis::cmd("INFO").arg("replication"))
                    .await
                    .unwrap_or_default();
                ok &= info.contains("connected_slaves:1");
            }
            if ok {
                return;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "the Cluster did not become whole within {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `CLUSTER FAILOVER` on the replica of the primary serving `slot`;
    /// the old primary's port and the new one's, once every node agrees.
    pub async fn failover(slot: u16) -> (u16, u16) {
        failover_as(slot, None).await
    }

    /// `CLUSTER FAILOVER FORCE` (no handshake with the old primary, which
    /// unblocks what its clients were blocked in, `WAIT` included), as
    /// [`failover`] otherwise.
    pub async fn force_failover(slot: u16) -> (u16, u16) {
        failover_as(slot, Some("FORCE")).await
    }

    async fn failover_as(slot: u16, how: Option<&str>) -> (u16, u16) {
        wait_whole().await;
        // Right after a forced failover a node's view may still name the
        // old primary: read again until a replica of the primary shows.
        let start = Instant::now();
        let (old, replica) = loop {
            let old = primary_of(slot).await;
            if let Some(r) = nodes().await.into_iter().find(|n| n.of == old.id) {
                break (old, r);
            }
            assert!(start.elapsed() < PATIENCE, "the primary has no replica");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("FAILOVER");
        if let Some(how) = how {
            cmd.arg(how);
        }
        let _: () = query(replica.port, &cmd).await.unwrap();
        let start = Instant::now();
        loop {
            let mut agreed = true;
            for p in redis_cluster_ports() {
                let text: String = query(p, redis::cmd("CLUSTER").arg("NODES"))
                    .await
                    .unwrap_or_default();
                agreed &= text.lines().any(|l| {
                    l.starts_with(&replica.id)
                        && l.split(' ').nth(2).is_some_and(|f| f.contains("master"))
                });
            }
            if agreed {
                break;
            }
            assert!(start.elapsed() < PATIENCE, "the failover did not finish");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        wait_whole().await;
        (old.port, replica.port)
    }

    /// Moves `slot`, keys and all, from its primary to another one (as
    /// `redis-cli --cluster reshard` does); the old and the new primary's
    /// ports.
    pub async fn move_slot(slot: u16) -> (u16, u16) {
        wait_whole().await;
        let from = primary_of(slot).await;
        let to = nodes()
            .await
            .into_iter()
            .find(|n| n.primary && n.id != from.id && !n.slots.is_empty())
            .expect("another primary");
        let setslot = |what: &str, id: &str| {
            let mut c = redis::cmd("CLUSTER");
            c.arg("SETSLOT").arg(slot).arg(what).arg(id);
            c
        };
        let _: () = query(to.port, &setslot("IMPORTING", &from.id))
            .await
            .unwrap();
        let _: () = query(from.port, &setslot("MIGRATING", &to.id))
            .await
            .unwrap();
        loop {
            let keys: Vec<String> = query(
                from.port,
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(100),
            )
            .await
            .unwrap();
            if keys.is_empty() {
                break;
            }
            let _: () = query(
                from.port,
                redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(to.port)
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(&keys),
            )
            .await
            .unwrap();
        }
        for p in [to.port, from.port] {
            let _: () = query(p, &setslot("NODE", &to.id)).await.unwrap();
        }
        for n in nodes().await.iter().filter(|n| n.primary) {
            let _: redis::RedisResult<()> = query(n.port, &setslot("NODE", &to.id)).await;
        }
        wait_whole().await;
        (from.port, to.port)
    }
}
