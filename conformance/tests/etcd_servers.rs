//! The etcd servers `scripts/test` starts, and the facts about Go's
//! `concurrency` package that an etcd backend must interoperate with, as
//! the real `etcdctl lock` shows them: a single member that serves, a
//! 3-member cluster whose members all serve, and a lock named `name` that
//! is the key `name/<lease id in hex>`, attached to that lease, with later
//! contenders waiting until it goes.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use lockwright_conformance::kit::etcdctl::EtcdctlLock;
use lockwright_conformance::kit::servers::{etcd_cluster_ports, etcd_url, loopback};

/// `host:port` of the single member, from its `etcd://` URL.
fn single() -> String {
    let url = etcd_url();
    let rest = url.strip_prefix("etcd://").expect("an etcd:// URL");
    rest.split('/').next().unwrap_or(rest).to_owned()
}

/// `etcdctl` (v3 API) on `endpoints`, with a bounded wait.
fn etcdctl(endpoints: &str) -> Command {
    let mut c = Command::new("timeout");
    c.args(["20", "etcdctl", "--endpoints", endpoints])
        .args(["--dial-timeout", "5s", "--command-timeout", "10s"])
        .env("ETCDCTL_API", "3")
        .stdin(Stdio::null());
    c
}

fn run(mut c: Command) -> Output {
    let o = c
        .output()
        .expect("etcdctl runs (scripts/test installs etcd-client)");
    assert!(
        o.status.success(),
        "{c:?}: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A name no other run uses.
fn unique(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "lockwright-servers-test/{what}-{}-{nanos}",
        std::process::id()
    )
}

#[test]
fn the_single_member_serves_and_etcdctl_lock_holds_name_slash_lease_hex() {
    let ep = single();
    let mut health = etcdctl(&ep);
    health.args(["endpoint", "health"]);
    run(health);

    let name = unique("lock");
    let first = EtcdctlLock::start(&ep, &name, 3);
    let key = first
        .held(Duration::from_secs(20))
        .expect("the holder's key");
    let key = key.trim().to_owned();
    let lease_hex = key
        .strip_prefix(&format!("{name}/"))
        .unwrap_or_else(|| panic!("{key:?} is not {name:?}/<lease>"));
    let lease = u64::from_str_radix(lease_hex, 16).expect("the lease id in hex");

    // The key is attached to that lease; it is the name's only contender.
    let mut get = etcdctl(&ep);
    get.args(["get", "--prefix", &format!("{name}/"), "-w", "json"]);
    let json = text(&run(get));
    assert!(json.contains(&format!("\"lease\":{lease}")), "{json}");
    assert!(json.contains("\"count\":1"), "{json}");

    // A second contender waits while the first holds, and holds once it
    // is gone: killed, its lease ends at its 3 s TTL.
    let second = EtcdctlLock::start(&ep, &name, 3);
    let early = second.held(Duration::from_millis(1500));
    assert!(early.is_none(), "a second holder at once: {early:?}");
    drop(first);
    let start = Instant::now();
    let key2 = second
        .held(Duration::from_secs(20))
        .expect("the second holds");
    assert!(key2.trim().starts_with(&format!("{name}/")), "{key2}");
    assert_ne!(key2.trim(), key);
    assert!(
        start.elapsed() < Duration::from_secs(15),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn the_three_member_cluster_has_three_started_members_that_all_serve() {
    let ports = etcd_cluster_ports();
    assert_eq!(ports.len(), 3, "{ports:?}");
    let all = loopback(&ports).join(",");
    let mut members = etcdctl(&all);
    members.args(["member", "list"]);
    let list = text(&run(members));
    assert_eq!(
        list.lines().filter(|l| l.contains(", started, ")).count(),
        3,
        "{list}"
    );
    for ep in loopback(&ports) {
        let mut health = etcdctl(&ep);
        health.args(["endpoint", "health"]);
        run(health);
    }
}
