//! The Redis topologies `scripts/test` starts for the Sentinel and
//! Cluster work: a primary with two replicas that three sentinels agree
//! on, and a Cluster of three primaries with a replica each, serving.

use std::process::{Command, Stdio};

use lockwright_conformance::kit::servers::{
    redis_cluster_ports, redis_sentinel_data_ports, redis_sentinel_ports,
};

/// `redis-cli` on `port` with `args`: its output, trimmed.
fn cli(port: u16, args: &[&str]) -> String {
    let o = Command::new("timeout")
        .args([
            "10",
            "redis-cli",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("redis-cli runs (scripts/test installs redis-tools)");
    assert!(
        o.status.success(),
        "redis-cli -p {port} {args:?}: {}",
        o.status
    );
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

#[test]
fn the_sentinels_agree_on_a_primary_with_two_replicas() {
    let data = redis_sentinel_data_ports();
    let sentinels = redis_sentinel_ports();
    assert_eq!((data.len(), sentinels.len()), (3, 3));
    let named: Vec<String> = sentinels
        .iter()
        .map(|&p| cli(p, &["sentinel", "get-master-addr-by-name", "lockwright"]))
        .collect();
    assert!(named.windows(2).all(|w| w[0] == w[1]), "{named:?}");
    let port: u16 = named[0]
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no primary named: {named:?}"));
    assert!(
        data.contains(&port),
        "the primary {port} is one of {data:?}"
    );
    let role = cli(port, &["role"]);
    assert!(role.starts_with("master"), "{role}");
    let info = cli(port, &["info", "replication"]);
    assert!(info.contains("connected_slaves:2"), "{info}");
}

#[test]
fn the_cluster_serves_with_three_primaries_and_three_replicas() {
    let ports = redis_cluster_ports();
    assert_eq!(ports.len(), 6);
    let info = cli(ports[0], &["cluster", "info"]);
    assert!(info.contains("cluster_state:ok"), "{info}");
    assert!(info.contains("cluster_known_nodes:6"), "{info}");
    assert!(info.contains("cluster_size:3"), "{info}");
    // A key lands on its slot's primary, redirects followed (-c).
    let key = format!("lockwright-servers-{}", std::process::id());
    let set = Command::new("redis-cli")
        .args(["-c", "-h", "127.0.0.1", "-p", &ports[0].to_string()])
        .args(["set", &key, "1", "px", "10000"])
        .output()
        .expect("redis-cli");
    assert_eq!(String::from_utf8_lossy(&set.stdout).trim(), "OK");
}
