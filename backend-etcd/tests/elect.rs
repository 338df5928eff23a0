//! Our election and Go's `concurrency.Election`, as the real `etcdctl
//! elect` runs it: we read its leader (value and term), campaign behind
//! it and lead once it resigns, and its observer (`etcdctl elect
//! --listen`) sees our leader's value.

mod common;

use std::process::{Child, Command};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::{raw_client, server_hosts};
use lockwright_conformance::kit::etcdctl;
use lockwright_core::{LockOptions, Locker};
use lockwright_etcd::EtcdBackend;

/// `etcdctl elect` with `args`, its output's lines on the receiver;
/// stopped by SIGTERM (it resigns) and then killed on drop.
struct Elect {
    child: Child,
    lines: Receiver<String>,
}

impl Elect {
    fn start(args: &[&str]) -> Elect {
        let args: Vec<&str> = std::iter::once("elect")
            .chain(args.iter().copied())
            .collect();
        let (child, lines) = etcdctl::spawn(&server_hosts(), &args);
        Elect { child, lines }
    }

    /// Waits (blocking the thread) for a line equal to `want`.
    fn saw(&self, want: &str, limit: Duration) -> bool {
        let start = Instant::now();
        while let Some(left) = limit.checked_sub(start.elapsed()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line == want => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        false
    }

    /// SIGTERM: etcdctl resigns, deleting its key, and exits.
    fn stop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Elect {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_and_our_election_see_and_follow_each_other() {
    let root = format!("/lockwright-elect-{}", std::process::id());
    let name = format!("{root}/e");
    let url = format!("etcd://{}{root}?lease_ttl=5s", server_hosts());
    let ours = Locker::new(EtcdBackend::connect(&url).unwrap());
    let election = ours.election("e").unwrap();

    // Go's candidate leads: we read its value, and its key's create
    // revision as its term.
    let mut theirs = Elect::start(&[&name, "theirs"]);
    assert!(
        tokio::task::block_in_place(|| theirs.saw("theirs", Duration::from_secs(10))),
        "etcdctl elect never led"
    );
    let leader = election.leader().await.unwrap().expect("a leader");
    assert_eq!(leader.value, b"theirs");
    let mut raw = raw_client(&server_hosts()).await;
    let opts = lockwright_etcd::internals::etcd_client::GetOptions::new().with_prefix();
    let keys = raw.get(format!("{name}/"), Some(opts)).await.unwrap();
    let rev = keys.kvs()[0].create_revision();
    assert_eq!(leader.term.map(|t| t.0), u64::try_from(rev).ok());

    // We campaign behind it, and lead once it resigns.
    let campaign = {
        let election = election.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new().wait_for(Duration::from_secs(30));
            election.campaign_with("ours", &opts).await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!campaign.is_finished(), "we led beside etcdctl's leader");
    tokio::task::block_in_place(|| theirs.stop());
    let leading = tokio::time::timeout(Duration::from_secs(10), campaign)
        .await
        .expect("we lead once etcdctl resigned")
        .unwrap()
        .unwrap();
    assert!(leading.term().map(|t| t.0) > u64::try_from(rev).ok());

    // Go's observer sees our leader's value.
    let listener = Elect::start(&["--listen", &name]);
    assert!(
        tokio::task::block_in_place(|| listener.saw("ours", Duration::from_secs(10))),
        "etcdctl elect --listen did not see our leader"
    );
    leading.resign().await.unwrap();
}
