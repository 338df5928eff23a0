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
    format!("locksmith:{{{prefix}*")
}

/// The Redis under Sentinel that `scripts/test` starts: who is primary,
/// and failovers that wait until the setup is whole again.
pub mod sentinel {
    use std::time::{Duration, Instant};

    use locksmith_conformance::kit::servers::{
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
