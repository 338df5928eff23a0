//! Where the test servers are: from the environment `scripts/test` sets,
//! else the ports it uses.

#![allow(dead_code, unreachable_pub)]

pub fn redis_url() -> String {
    std::env::var("LOCKSMITH_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

pub fn redlock_ports() -> Vec<u16> {
    std::env::var("LOCKSMITH_TEST_REDLOCK_PORTS")
        .unwrap_or_else(|_| "16380 16381 16382 16383 16384".into())
        .split_whitespace()
        .map(|p| p.parse().expect("a port number"))
        .collect()
}

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
