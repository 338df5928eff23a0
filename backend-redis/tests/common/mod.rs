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
