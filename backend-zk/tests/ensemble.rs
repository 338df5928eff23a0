//! Faults on a 3-node ensemble (`scripts/test` starts it, on the kit's
//! `zk_ensemble_ports`): the leader killed while locks are held, then a
//! majority down (the kit's scenario, which every 3-member store runs).

mod common;

use std::time::Duration;

use common::ensemble_hosts;
use lockwright_conformance::kit::members::{self, ThreeMembers};
use lockwright_conformance::kit::servers::zk_ensemble_ports;
use lockwright_core::Locker;
use lockwright_zk::ZkBackend;

/// Node `n`'s name for `scripts/fault-server` (`zk1` …).
fn zk(n: usize) -> String {
    format!("zk{n}")
}

/// Node `n`'s client port (1-based, as the nodes are named).
fn port(n: usize) -> u16 {
    zk_ensemble_ports()[n - 1]
}

/// What the node on `port` says it is (`leader`, `follower`, `standalone`),
/// or `None` if it does not serve.
fn mode(port: u16) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"srvr").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(str::to_owned)
}

/// The ensemble, for the kit's 3-member scenario.
struct Ensemble;

#[async_trait::async_trait]
impl ThreeMembers for Ensemble {
    fn group(&self) -> &'static str {
        "ensemble"
    }

    fn member(&self, n: usize) -> String {
        zk(n)
    }

    async fn role(&self, n: usize) -> Option<bool> {
        match mode(port(n)).as_deref() {
            Some("leader") => Some(true),
            Some("follower") => Some(false),
            _ => None,
        }
    }

    fn locker(&self) -> Locker {
        let url = format!(
            "zk://{}/lockwright-ensemble?session_timeout=8s&connect_timeout=1s&timeout=2s",
            ensemble_hosts()
        );
        Locker::new(ZkBackend::connect(&url).expect("valid URL"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn leader_loss_keeps_locks_and_a_lost_majority_is_unavailable_until_it_returns() {
    members::leader_then_majority_lost(&Ensemble).await;
}
