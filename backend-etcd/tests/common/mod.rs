//! What the etcd tests share: the harness over the single member, and a
//! raw client of the cluster.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use lockwright_conformance::kit::clients::Clients;
use lockwright_conformance::kit::hosts_of;
use lockwright_conformance::kit::servers::etcd_url;
use lockwright_conformance::Harness;
use lockwright_core::backend::LockBackend;
use lockwright_etcd::internals::{self, etcd_client};
use lockwright_etcd::EtcdBackend;

/// The single member's `host:port`.
pub fn server_hosts() -> String {
    hosts_of(&etcd_url())
}

/// A plain client of `hosts`.
pub async fn raw_client(hosts: &str) -> etcd_client::Client {
    let eps: Vec<&str> = hosts.split(',').collect();
    let opts = etcd_client::ConnectOptions::new()
        .with_timeout(Duration::from_secs(5))
        .with_connect_timeout(Duration::from_secs(5));
    etcd_client::Client::connect(eps, Some(opts))
        .await
        .unwrap_or_else(|e| panic!("cannot reach etcd at {hosts}: {e}"))
}

pub struct EtcdHarness {
    pub url: String,
    hosts: String,
    root: String,
    clients: Clients<EtcdBackend>,
}

impl EtcdHarness {
    pub fn new(root: &str) -> Self {
        let hosts = server_hosts();
        EtcdHarness {
            url: format!("etcd://{hosts}{root}?lease_ttl=2s&connect_timeout=1s&timeout=1s"),
            hosts,
            root: root.to_owned(),
            clients: Clients::new(),
        }
    }

    pub fn typed(&self) -> Arc<EtcdBackend> {
        self.clients.add(Arc::new(
            EtcdBackend::connect(&self.url).expect("valid URL"),
        ))
    }
}

#[async_trait::async_trait]
impl Harness for EtcdHarness {
    async fn client(&self) -> Arc<dyn LockBackend> {
        self.typed()
    }

    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        Arc::new(
            EtcdBackend::connect("etcd://127.0.0.1:1/x?connect_timeout=300ms&timeout=300ms")
                .expect("valid URL"),
        )
    }

    /// Revokes the client's lease from another client, as the cluster
    /// would let it expire after a crash or a cut.
    async fn end_sessions(&self, client: &Arc<dyn LockBackend>) -> anyhow::Result<()> {
        let typed = self
            .clients
            .find(client)
            .ok_or_else(|| anyhow::anyhow!("not a client of this harness"))?;
        let lease = internals::lease(&typed)
            .await
            .ok_or_else(|| anyhow::anyhow!("the client has no lease to end"))?;
        let mut raw = raw_client(&self.hosts).await;
        match raw.lease_revoke(lease).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains("requested lease not found") => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        let mut raw = raw_client(&self.hosts).await;
        let opts = etcd_client::GetOptions::new()
            .with_prefix()
            .with_keys_only();
        let got = raw.get(format!("{}/", self.root), Some(opts)).await?;
        let mut names = std::collections::HashSet::new();
        for kv in got.kvs() {
            let key = kv.key_str()?;
            if let Some(name) = internals::name_of(&self.root, key) {
                if name.starts_with(prefix) {
                    names.insert(name);
                }
            }
        }
        Ok(names.len() as u64)
    }
}
