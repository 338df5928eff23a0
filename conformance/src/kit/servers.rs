//! Where the test servers are. One rule for every store:
//!
//! 1. `LOCKWRIGHT_TEST_<STORE>` from the environment, if set (a URL, or a
//!    list of ports for the servers that come in groups);
//! 2. else the server `scripts/servers.sh` starts: on 127.0.0.1, on the
//!    port `LOCKWRIGHT_<NAME>` says if set, else the one in
//!    `scripts/ports.env` (the file the script sources, read here at
//!    compile time), with the role and database the script creates
//!    (`lockwright`/`lockwright`, `lockwright_test`).
//!
//! So a test finds the server wherever `scripts/test` put it, with or
//! without its exports. A server that is not running is not skipped: the
//! test that needs it fails.

/// `scripts/ports.env`, the one list of the test servers' ports.
const PORTS_ENV: &str = include_str!("../../../scripts/ports.env");

/// The ports `scripts/servers.sh` uses for `name` (`PG_PORT`,
/// `REDLOCK_PORTS`): `LOCKWRIGHT_<name>` if set, else `scripts/ports.env`.
///
/// # Panics
/// If `name` is not in `scripts/ports.env`, or a port is not a number.
pub fn script_ports(name: &str) -> Vec<u16> {
    let value = std::env::var(format!("LOCKWRIGHT_{name}"))
        .ok()
        .or_else(|| default_of(name))
        .unwrap_or_else(|| panic!("{name} is not in scripts/ports.env"));
    parse_ports(name, &value)
}

/// The one port `scripts/servers.sh` uses for `name` (see [`script_ports`]).
///
/// # Panics
/// As [`script_ports`], and if `name` lists several ports.
pub fn script_port(name: &str) -> u16 {
    match script_ports(name)[..] {
        [port] => port,
        ref ports => panic!("{name} is {ports:?}, not one port"),
    }
}

/// `name`'s value in `scripts/ports.env`, quotes removed.
fn default_of(name: &str) -> Option<String> {
    PORTS_ENV
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.trim_matches('"').to_owned())
}

fn parse_ports(what: &str, value: &str) -> Vec<u16> {
    value
        .split_whitespace()
        .map(|p| {
            p.parse()
                .unwrap_or_else(|_| panic!("{what}: {p:?} is not a port"))
        })
        .collect()
}

/// `var` if set, else `fallback()`.
fn env_or(var: &str, fallback: impl FnOnce() -> String) -> String {
    std::env::var(var).unwrap_or_else(|_| fallback())
}

/// Ports from `var` if set, else `scripts/servers.sh`'s for `name`.
fn ports_from(var: &str, name: &str) -> Vec<u16> {
    match std::env::var(var) {
        Ok(v) => parse_ports(var, &v),
        Err(_) => script_ports(name),
    }
}

/// The SQL URL the script's role and database have on `port`.
fn sql_url(scheme: &str, port: u16) -> String {
    format!("{scheme}://lockwright:lockwright@127.0.0.1:{port}/lockwright_test")
}

/// The shared PostgreSQL server: `LOCKWRIGHT_TEST_POSTGRES_URL`, else `PG_PORT`.
pub fn postgres_url() -> String {
    env_or("LOCKWRIGHT_TEST_POSTGRES_URL", || {
        sql_url("postgres", script_port("PG_PORT"))
    })
}

/// The shared MariaDB server: `LOCKWRIGHT_TEST_MYSQL_URL`, else `MY_PORT`.
pub fn mysql_url() -> String {
    env_or("LOCKWRIGHT_TEST_MYSQL_URL", || {
        sql_url("mysql", script_port("MY_PORT"))
    })
}

/// The private PostgreSQL server the outage test stops (`pg_fault`):
/// `LOCKWRIGHT_TEST_PG_FAULT_URL`, else `PG_FAULT_PORT`.
pub fn postgres_fault_url() -> String {
    env_or("LOCKWRIGHT_TEST_PG_FAULT_URL", || {
        sql_url("postgres", script_port("PG_FAULT_PORT"))
    })
}

/// The private MariaDB server the outage test stops (`my_fault`):
/// `LOCKWRIGHT_TEST_MY_FAULT_URL`, else `MY_FAULT_PORT`.
pub fn mysql_fault_url() -> String {
    env_or("LOCKWRIGHT_TEST_MY_FAULT_URL", || {
        sql_url("mysql", script_port("MY_FAULT_PORT"))
    })
}

/// The private Redis server the outage tests stop (`redis_fault`):
/// `LOCKWRIGHT_TEST_REDIS_FAULT_URL`, else `REDIS_FAULT_PORT`.
pub fn redis_fault_url() -> String {
    env_or("LOCKWRIGHT_TEST_REDIS_FAULT_URL", || {
        format!("redis://127.0.0.1:{}", script_port("REDIS_FAULT_PORT"))
    })
}

/// The shared Redis server: `LOCKWRIGHT_TEST_REDIS_URL`, else `REDIS_PORT`.
pub fn redis_url() -> String {
    env_or("LOCKWRIGHT_TEST_REDIS_URL", || {
        format!("redis://127.0.0.1:{}", script_port("REDIS_PORT"))
    })
}

/// The five independent Redis masters of the Redlock tests, on 127.0.0.1:
/// `LOCKWRIGHT_TEST_REDLOCK_PORTS`, else `REDLOCK_PORTS`.
pub fn redlock_ports() -> Vec<u16> {
    ports_from("LOCKWRIGHT_TEST_REDLOCK_PORTS", "REDLOCK_PORTS")
}

/// The data nodes of the Redis under Sentinel, on 127.0.0.1 (the first
/// was the primary when started; a failover may have moved it):
/// `LOCKWRIGHT_TEST_REDIS_SENTINEL_DATA_PORTS`, else `REDIS_SENTINEL_DATA_PORTS`.
pub fn redis_sentinel_data_ports() -> Vec<u16> {
    ports_from(
        "LOCKWRIGHT_TEST_REDIS_SENTINEL_DATA_PORTS",
        "REDIS_SENTINEL_DATA_PORTS",
    )
}

/// The three sentinels watching them as the master `lockwright`:
/// `LOCKWRIGHT_TEST_REDIS_SENTINEL_PORTS`, else `REDIS_SENTINEL_PORTS`.
pub fn redis_sentinel_ports() -> Vec<u16> {
    ports_from(
        "LOCKWRIGHT_TEST_REDIS_SENTINEL_PORTS",
        "REDIS_SENTINEL_PORTS",
    )
}

/// The master the sentinels watch, as `scripts/test` names it.
pub const REDIS_SENTINEL_MASTER: &str = "lockwright";

/// A `redis+sentinel://` URL over the three sentinels, for the master
/// `lockwright`.
pub fn redis_sentinel_url() -> String {
    let sentinels: Vec<String> = redis_sentinel_ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    format!(
        "redis+sentinel://{}/{REDIS_SENTINEL_MASTER}",
        sentinels.join(",")
    )
}

/// The six nodes of the Redis Cluster (three primaries, a replica each):
/// `LOCKWRIGHT_TEST_REDIS_CLUSTER_PORTS`, else `REDIS_CLUSTER_PORTS`.
pub fn redis_cluster_ports() -> Vec<u16> {
    ports_from("LOCKWRIGHT_TEST_REDIS_CLUSTER_PORTS", "REDIS_CLUSTER_PORTS")
}

/// A `redis+cluster://` URL over the Cluster's six nodes.
pub fn redis_cluster_url() -> String {
    let nodes: Vec<String> = redis_cluster_ports()
        .iter()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect();
    format!("redis+cluster://{}", nodes.join(","))
}

/// The shared memcached server: `LOCKWRIGHT_TEST_MEMCACHED_URL`, else `MC_PORT`.
pub fn memcached_url() -> String {
    env_or("LOCKWRIGHT_TEST_MEMCACHED_URL", || {
        format!("memcache://127.0.0.1:{}", script_port("MC_PORT"))
    })
}

/// The three private memcached servers of the quorum tests, on 127.0.0.1:
/// `LOCKWRIGHT_TEST_MEMCACHED_QUORUM_PORTS`, else `MC_QUORUM_PORTS`.
pub fn memcached_quorum_ports() -> Vec<u16> {
    ports_from("LOCKWRIGHT_TEST_MEMCACHED_QUORUM_PORTS", "MC_QUORUM_PORTS")
}

/// The private memcached server the outage test stops (`mc_fault`), on
/// 127.0.0.1: `LOCKWRIGHT_TEST_MEMCACHED_FAULT_PORT`, else `MC_FAULT_PORT`.
pub fn memcached_fault_port() -> u16 {
    match ports_from("LOCKWRIGHT_TEST_MEMCACHED_FAULT_PORT", "MC_FAULT_PORT")[..] {
        [port] => port,
        ref ports => panic!("LOCKWRIGHT_TEST_MEMCACHED_FAULT_PORT is {ports:?}, not one port"),
    }
}

/// The standalone ZooKeeper server: `LOCKWRIGHT_TEST_ZK_URL`, else `ZK_PORT`.
pub fn zk_url() -> String {
    env_or("LOCKWRIGHT_TEST_ZK_URL", || {
        format!("zk://127.0.0.1:{}", script_port("ZK_PORT"))
    })
}

/// The client ports of the private 3-node ZooKeeper ensemble, on
/// 127.0.0.1 (`zk1`, `zk2`, `zk3` in that order):
/// `LOCKWRIGHT_TEST_ZK_ENSEMBLE_PORTS`, else `ZK_ENSEMBLE_PORTS`.
pub fn zk_ensemble_ports() -> Vec<u16> {
    ports_from("LOCKWRIGHT_TEST_ZK_ENSEMBLE_PORTS", "ZK_ENSEMBLE_PORTS")
}

/// The single etcd member: `LOCKWRIGHT_TEST_ETCD_URL`, else `ETCD_PORT`.
pub fn etcd_url() -> String {
    env_or("LOCKWRIGHT_TEST_ETCD_URL", || {
        format!("etcd://127.0.0.1:{}", script_port("ETCD_PORT"))
    })
}

/// The client ports of the private 3-member etcd cluster, on 127.0.0.1
/// (`etcd1`, `etcd2`, `etcd3` in that order; each member's peer port is
/// its client port + 1): `LOCKWRIGHT_TEST_ETCD_CLUSTER_PORTS`, else
/// `ETCD_CLUSTER_PORTS`.
pub fn etcd_cluster_ports() -> Vec<u16> {
    ports_from("LOCKWRIGHT_TEST_ETCD_CLUSTER_PORTS", "ETCD_CLUSTER_PORTS")
}

/// `127.0.0.1:<port>` for each port.
pub fn loopback(ports: &[u16]) -> Vec<String> {
    ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_port_of_the_script_is_read() {
        for name in [
            "PG_PORT",
            "MY_PORT",
            "PG_FAULT_PORT",
            "MY_FAULT_PORT",
            "REDIS_PORT",
            "REDIS_FAULT_PORT",
            "ZK_PORT",
            "MC_PORT",
            "MC_FAULT_PORT",
            "ETCD_PORT",
        ] {
            assert!(default_of(name).is_some(), "{name}");
            assert_eq!(parse_ports(name, &default_of(name).unwrap()).len(), 1);
        }
        assert_eq!(
            default_of("REDLOCK_PORTS").map(|v| v.split(' ').count()),
            Some(5)
        );
        assert_eq!(
            default_of("ZK_ENSEMBLE_PORTS").map(|v| v.split(' ').count()),
            Some(3)
        );
        assert_eq!(
            default_of("MC_QUORUM_PORTS").map(|v| v.split(' ').count()),
            Some(3)
        );
        assert_eq!(
            default_of("ETCD_CLUSTER_PORTS").map(|v| v.split(' ').count()),
            Some(3)
        );
        assert_eq!(default_of("NO_SUCH_PORT"), None);
    }
}
