//! The ZooKeeper test servers and a conformance harness over them.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use lockwright_conformance::kit::clients::Clients;
use lockwright_conformance::kit::hosts_of;
use lockwright_conformance::kit::servers::{loopback, zk_ensemble_ports, zk_url};
use lockwright_conformance::Harness;
use lockwright_core::backend::LockBackend;
use lockwright_zk::internals::{self, zookeeper_client as zk};
use lockwright_zk::ZkBackend;

/// The standalone server's `host:port` list.
pub fn server_hosts() -> String {
    hosts_of(&zk_url())
}

/// The private 3-node ensemble's connection string.
pub fn ensemble_hosts() -> String {
    loopback(&zk_ensemble_ports()).join(",")
}

/// A raw client of `hosts`, for reading the tree and making foreign nodes.
pub async fn raw_client(hosts: &str) -> zk::Client {
    zk::Client::connector()
        .with_session_timeout(Duration::from_secs(5))
        .connect(hosts)
        .await
        .unwrap_or_else(|e| panic!("cannot reach ZooKeeper at {hosts}: {e}"))
}

/// Ends the session `info` names from the server's side, as a crash would:
/// a second connection takes the session over and closes it. The victim's
/// client may take the session back first (each new connection drops the
/// one before), so this repeats until the server refuses the session.
pub async fn end_session(hosts: &str, info: zk::SessionInfo) -> anyhow::Result<()> {
    for _ in 0..20 {
        let killer = match zk::Client::connector()
            .with_session(info.clone())
            .with_connection_timeout(Duration::from_secs(2))
            .connect(hosts)
            .await
        {
            Ok(k) => k,
            Err(zk::Error::SessionExpired) => return Ok(()),
            // The victim took the session back while we connected.
            Err(_) => continue,
        };
        let mut states = killer.state_watcher();
        drop(killer.into_session());
        let _ = tokio::time::timeout(Duration::from_millis(500), async {
            while !matches!(
                states.changed().await,
                zk::SessionState::Closed | zk::SessionState::Expired
            ) {}
        })
        .await;
    }
    anyhow::bail!(
        "the session {:?} survived 20 attempts to close it",
        info.id()
    )
}

pub struct ZkHarness {
    pub url: String,
    hosts: String,
    root: String,
    clients: Clients<ZkBackend>,
}

impl ZkHarness {
    /// Clients on `root` of the standalone server, with a 2 s session and
    /// the server's 1 s container reaping.
    pub fn new(root: &str) -> Self {
        let hosts = server_hosts();
        ZkHarness {
            url: format!(
                "zk://{hosts}{root}?session_timeout=2s&retention=2s&connect_timeout=1s&timeout=1s"
            ),
            hosts,
            root: root.to_owned(),
            clients: Clients::new(),
        }
    }

    pub fn typed(&self) -> Arc<ZkBackend> {
        self.clients
            .add(Arc::new(ZkBackend::connect(&self.url).expect("valid URL")))
    }
}

#[async_trait::async_trait]
impl Harness for ZkHarness {
    async fn client(&self) -> Arc<dyn LockBackend> {
        self.typed()
    }

    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            ZkBackend::connect("zk://127.0.0.1:1/x?connect_timeout=300ms&timeout=300ms")
                .expect("valid URL"),
        )
    }

    async fn end_sessions(&self, client: &Arc<dyn LockBackend>) -> anyhow::Result<()> {
        let typed = self
            .clients
            .find(client)
            .ok_or_else(|| anyhow::anyhow!("not a client of this harness"))?;
        let info = internals::session(&typed)
            .await
            .ok_or_else(|| anyhow::anyhow!("the client has no session to end"))?;
        let ended = info.id();
        end_session(&self.hosts, info).await?;
        // Each takeover above drops the victim's connection, and its client
        // reconnects with a growing backoff (up to about a second after a
        // few rounds): wait until it has learnt that its session ended, so
        // that cases time the backend, not this harness's tug of war.
        let start = std::time::Instant::now();
        // A session made since by a request of the client's is not the one
        // that ended.
        while internals::session(&typed)
            .await
            .is_some_and(|s| s.id() == ended)
        {
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(5),
                "the victim's client did not learn within 5 s that its session ended"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        let raw = raw_client(&self.hosts).await;
        let dirs = match raw.list_children(&self.root).await {
            Ok(d) => d,
            Err(zk::Error::NoNode) => return Ok(0),
            Err(e) => return Err(e.into()),
        };
        Ok(dirs
            .iter()
            .filter(|d| internals::key_of(d).is_none_or(|k| k.starts_with(prefix)))
            .count() as u64)
    }
}
