//! [`MemcachedBackend`]: one server, or a quorum of several.

use std::sync::Arc;
use std::time::Duration;

use lockwright_core::backend::{LockBackend, Quorum};
use lockwright_core::Result;
use tokio::sync::watch;

use crate::config::MemcachedConfig;
use crate::node::Node;
use crate::tls::Tls;
use crate::wire::Server;

/// Locks in memcached (see the crate docs): on one server, or on a quorum
/// of several when the URL names more than one. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MemcachedBackend {
    config: Arc<MemcachedConfig>,
    store: Arc<dyn LockBackend>,
    /// Shared by every server's node: any one out of memory alarms all
    /// (a quorum's lock may be on any of them).
    alarm: Arc<watch::Sender<u64>>,
}

impl MemcachedBackend {
    /// Opens a backend for a `memcache://` or `memcaches://` URL (see
    /// [`MemcachedConfig::from_url`]). Connects lazily.
    ///
    /// # Errors
    /// `Config`/`InvalidOptions` for a bad URL; `Config` for a TLS file
    /// that cannot be read or used.
    pub fn connect(url: &str) -> Result<Self> {
        Self::with_config(MemcachedConfig::from_url(url)?)
    }

    /// Opens a backend from a parsed configuration; for `memcaches://`,
    /// reads its TLS files now.
    ///
    /// # Errors
    /// `Config` for no server, or a TLS file that cannot be read or used.
    pub fn with_config(config: MemcachedConfig) -> Result<Self> {
        let alarm = Arc::new(watch::channel(0).0);
        // Built once: every server shares the settings, and a bad file is
        // an error here rather than an outage at the first request.
        let tls = match &config.tls {
            Some(files) => Some(Tls::new(files, &config.url)?),
            None => None,
        };
        let mut nodes = Vec::with_capacity(config.servers.len());
        for s in &config.servers {
            let tls = match &tls {
                Some(t) => Some(t.for_server(s, &config.url)?),
                None => None,
            };
            let server = Server::new(
                s,
                config.timeout,
                config.connect_timeout,
                config.connections,
                tls,
            );
            nodes.push(Node::new(
                server,
                &config.prefix,
                config.timeout,
                config.connect_timeout,
                alarm.clone(),
            ));
        }
        let store: Arc<dyn LockBackend> = if nodes.len() == 1 {
            Arc::new(nodes.remove(0))
        } else {
            // A TTL must leave room for a slow round of requests and the drift.
            let min_ttl = (config.timeout * 4).max(Duration::from_millis(100));
            Arc::new(Quorum::new("memcached", nodes, min_ttl)?)
        };
        Ok(MemcachedBackend {
            config: Arc::new(config),
            store,
            alarm,
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &MemcachedConfig {
        &self.config
    }
}

// Everything is the store's (one node, or the quorum over them), but the
// alarm: every node shares one sender, and a quorum merges no alarms, so
// the backend hands out that sender's receiver itself.
lockwright_core::forward_backend! {
    (self) => self.store;
    impl LockBackend for MemcachedBackend {
        fn alarm(&self) -> Option<watch::Receiver<u64>> {
            Some(self.alarm.subscribe())
        }
    }
}

#[cfg(test)]
mod tests {
    use lockwright_conformance::kit::forwarding::{check, Expect, Method, Recorder};

    use super::*;

    /// Every call reaches the node or quorum behind the backend, but the
    /// alarm, which the backend answers from its nodes' shared sender.
    #[tokio::test]
    async fn every_call_but_the_alarm_reaches_the_store() {
        let store = Recorder::new();
        let mut backend = MemcachedBackend::connect("memcache://127.0.0.1:1").unwrap();
        backend.store = store.clone();
        let expect = |m| match m {
            Method::Alarm => Expect::Answered,
            Method::Capabilities
            | Method::Verify
            | Method::TryAcquire
            | Method::Release
            | Method::Renew
            | Method::Inspect
            | Method::Proclaim
            | Method::Changes
            | Method::Watch
            | Method::Abandon
            | Method::ForceRelease
            | Method::List => Expect::Forwarded,
        };
        check(&backend, &[&store], expect).await.unwrap();
    }
}
