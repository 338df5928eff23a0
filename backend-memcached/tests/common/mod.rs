//! The memcached test servers and conformance harnesses over them.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use locksmith_conformance::Harness;
use locksmith_core::backend::{percent_decode, LockBackend};
use locksmith_memcached::MemcachedBackend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The shared server (`scripts/test` starts it). Missing: the test fails.
pub fn server() -> String {
    let url = std::env::var("LOCKSMITH_TEST_MEMCACHED_URL").expect(
        "LOCKSMITH_TEST_MEMCACHED_URL is not set: run scripts/test, which starts memcached \
         on 127.0.0.1:11211 and sets it",
    );
    url.trim_start_matches("memcache://").to_owned()
}

/// The three private servers of the quorum tests.
pub fn quorum_servers() -> Vec<String> {
    let ports = std::env::var("LOCKSMITH_TEST_MEMCACHED_QUORUM_PORTS").expect(
        "LOCKSMITH_TEST_MEMCACHED_QUORUM_PORTS is not set: run scripts/test, which starts \
         three memcached servers for the quorum tests",
    );
    ports
        .split_whitespace()
        .map(|p| format!("127.0.0.1:{p}"))
        .collect()
}

/// A prefix no other test run shares.
pub fn unique_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("lst-{}-{nanos}:", std::process::id())
}

/// Every live item key on `server`, from `lru_crawler metadump all`. The
/// server runs one crawler at a time (its own included): a busy one is
/// asked again.
pub async fn item_keys(server: &str) -> anyhow::Result<Vec<String>> {
    for _ in 0..50 {
        match dump(server).await {
            Err(e) if e.to_string().contains("BUSY") => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
    anyhow::bail!("{server}: the LRU crawler stayed busy for 5 s")
}

async fn dump(server: &str) -> anyhow::Result<Vec<String>> {
    let mut s = TcpStream::connect(server).await?;
    s.write_all(b"lru_crawler metadump all\r\n").await?;
    let mut lines = BufReader::new(s).lines();
    let mut keys = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await? {
            if line == "END" {
                break;
            }
            if let Some(k) = line.strip_prefix("key=") {
                let raw = k.split(' ').next().unwrap_or_default();
                keys.push(percent_decode(raw).unwrap_or_else(|| raw.to_owned()));
            } else if line.starts_with("ERROR") || line.starts_with("BUSY") {
                anyhow::bail!("metadump: {line}");
            }
        }
        Ok::<(), anyhow::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(10), read).await??;
    Ok(keys)
}

/// Clients of one server, or of a quorum of the three private servers.
pub struct McHarness {
    servers: Vec<String>,
    prefix: String,
    params: String,
}

impl McHarness {
    pub fn single() -> Self {
        McHarness {
            servers: vec![server()],
            prefix: unique_prefix(),
            params: String::new(),
        }
    }

    pub fn quorum() -> Self {
        McHarness {
            servers: quorum_servers(),
            prefix: unique_prefix(),
            params: "&timeout=250ms".to_owned(),
        }
    }

    pub fn url(&self) -> String {
        format!(
            "memcache://{}?prefix={}{}",
            self.servers.join(","),
            self.prefix,
            self.params
        )
    }
}

#[async_trait::async_trait]
impl Harness for McHarness {
    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(MemcachedBackend::connect(&self.url()).expect("valid URL"))
    }

    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        let down: Vec<String> = (1..=self.servers.len())
            .map(|i| format!("127.0.0.1:{i}"))
            .collect();
        Arc::new(
            MemcachedBackend::connect(&format!(
                "memcache://{}?timeout=300ms&connect_timeout=300ms",
                down.join(",")
            ))
            .expect("valid URL"),
        )
    }

    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        let ours = format!("{}{prefix}", self.prefix);
        let hashed = format!("{}#", self.prefix);
        let mut most = 0;
        for server in &self.servers {
            let n = item_keys(server)
                .await?
                .iter()
                .filter(|k| k.starts_with(&ours) || k.starts_with(&hashed))
                .count() as u64;
            most = most.max(n);
        }
        Ok(most)
    }
}
