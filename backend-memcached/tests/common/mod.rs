//! The memcached test servers and conformance harnesses over them.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use lockwright_conformance::kit::process::ServerProcess;
use lockwright_conformance::kit::servers::{loopback, memcached_quorum_ports, memcached_url};
use lockwright_conformance::kit::{hosts_of, unique_prefix};
use lockwright_conformance::Harness;
use lockwright_core::backend::{percent_decode, LockBackend};
use lockwright_memcached::MemcachedBackend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The shared server's `host:port`.
pub fn server() -> String {
    hosts_of(&memcached_url())
}

/// The three private servers of the quorum tests.
pub fn quorum_servers() -> Vec<String> {
    loopback(&memcached_quorum_ports())
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

/// A memcached server of a test's own (`-M`, `megabytes` of memory),
/// restartable at will, killed when dropped.
pub struct OwnServer {
    pub port: u16,
    megabytes: u32,
    extra: Vec<String>,
    process: ServerProcess,
}

impl OwnServer {
    pub fn start(port: u16, megabytes: u32) -> OwnServer {
        OwnServer::start_with(port, megabytes, &[])
    }

    /// As [`start`](Self::start), with `extra` arguments (`-C`).
    pub fn start_with(port: u16, megabytes: u32, extra: &[&str]) -> OwnServer {
        use std::process::Command;
        let user = if Command::new("id")
            .arg("memcache")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            "memcache"
        } else {
            "nobody"
        };
        let process = ServerProcess::start(
            Command::new("memcached")
                .args([
                    "-l",
                    "127.0.0.1",
                    "-U",
                    "0",
                    "-M",
                    "-o",
                    "no_slab_reassign",
                    "-u",
                    user,
                    "-m",
                ])
                .arg(megabytes.to_string())
                .arg("-p")
                .arg(port.to_string())
                .args(extra),
            port,
        );
        OwnServer {
            port,
            megabytes,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            process,
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills it and starts it again, empty, as a restart leaves it.
    pub fn restart(&mut self) {
        self.process.kill();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        *self = OwnServer::start_with(self.port, self.megabytes, &extra);
    }
}

/// One raw command and its first reply line (and the value line after a
/// `VA`), on a connection of its own.
pub async fn raw(server: &str, command: &[u8]) -> anyhow::Result<String> {
    let mut s = BufReader::new(TcpStream::connect(server).await?);
    s.get_mut().write_all(command).await?;
    let mut line = String::new();
    s.read_line(&mut line).await?;
    if line.starts_with("VA ") {
        s.read_line(&mut line).await?;
    }
    Ok(line)
}

/// Fills `server` with never-expiring items of the size of a lock item
/// (keys of `key_len` bytes, values of `value_len`), in the lock's slab
/// class, until a fresh `add` of that size is refused for want of memory.
/// Returns how many items it stored.
pub async fn fill_until_full(
    server: &str,
    key_len: usize,
    value_len: usize,
) -> anyhow::Result<usize> {
    let mut s = BufReader::new(TcpStream::connect(server).await?);
    let value = "f".repeat(value_len);
    let key = |i: usize| {
        let n = format!("{i}");
        format!("fill{}{n}", "-".repeat(key_len.saturating_sub(4 + n.len())))
    };
    // Each call its own keys: a second fill must not overwrite the first.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let base = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 100_000_000;
    let mut stored = 0;
    while stored < 5_000_000 {
        let mut batch = String::new();
        for i in base + stored..base + stored + 1000 {
            batch.push_str(&format!(
                "set {} 0 0 {value_len} noreply\r\n{value}\r\n",
                key(i)
            ));
        }
        stored += 1000;
        let probe = key(base + stored + 10_000_000);
        batch.push_str(&format!("add {probe} 0 0 {value_len}\r\n{value}\r\n"));
        s.get_mut().write_all(batch.as_bytes()).await?;
        let mut line = String::new();
        s.read_line(&mut line).await?;
        if line.contains("out of memory") {
            return Ok(stored);
        }
        anyhow::ensure!(line == "STORED\r\n", "filling {server}: {line:?}");
    }
    anyhow::bail!("{server} took 5 million items without filling up: is it running with -M?")
}
