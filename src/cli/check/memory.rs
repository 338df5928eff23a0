//! What `check` reads of a memcached lock server's memory before it runs:
//! a server that evicts (no `-M`) drops held locks silently when full, and
//! one that is full refuses new locks and renewals.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Above this share of `limit_maxbytes` in use, `check` warns.
const NEARLY_FULL: f64 = 0.8;

/// One server's memory, from `stats` and `stats settings`.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Memory {
    /// Bytes the items take (`bytes`).
    pub(crate) bytes: u64,
    /// The server's memory limit (`limit_maxbytes`, its `-m`).
    pub(crate) limit: u64,
    /// Items evicted since the server started (`evictions`).
    pub(crate) evicted: u64,
    /// Whether the server evicts when full (`evictions on`: run without `-M`).
    pub(crate) evicts: bool,
}

impl Memory {
    /// Reads `stats` and `stats settings` from `addr`; `None` if the server
    /// does not answer them within a second.
    pub(crate) async fn read(addr: SocketAddr) -> Option<Memory> {
        let ask = async {
            let mut s = BufReader::new(TcpStream::connect(addr).await.ok()?);
            s.get_mut()
                .write_all(b"stats\r\nstats settings\r\n")
                .await
                .ok()?;
            let mut m = Memory::default();
            let mut ends = 0;
            let mut line = String::new();
            while ends < 2 {
                line.clear();
                if s.read_line(&mut line).await.ok()? == 0 {
                    return None;
                }
                m.take(line.trim_end());
                if line.trim_end() == "END" {
                    ends += 1;
                }
            }
            Some(m)
        };
        tokio::time::timeout(Duration::from_secs(1), ask)
            .await
            .ok()
            .flatten()
    }

    fn take(&mut self, line: &str) {
        let mut words = line.split(' ');
        let (Some("STAT"), Some(name), Some(value)) = (words.next(), words.next(), words.next())
        else {
            return;
        };
        match name {
            "bytes" => self.bytes = value.parse().unwrap_or(0),
            "limit_maxbytes" => self.limit = value.parse().unwrap_or(0),
            "evictions" if value == "on" || value == "off" => self.evicts = value == "on",
            "evictions" => self.evicted = value.parse().unwrap_or(0),
            _ => {}
        }
    }

    /// The warnings this server deserves, about `name`.
    pub(crate) fn warnings(&self, name: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.evicts {
            out.push(format!(
                "memcached {name} evicts items when full (it runs without -M): held locks can \
                 vanish silently; run the lock server with -M"
            ));
        }
        if self.evicted > 0 {
            out.push(format!(
                "memcached {name} has evicted {} items since it started",
                self.evicted
            ));
        }
        let used = self.bytes as f64 / self.limit.max(1) as f64;
        if used >= NEARLY_FULL {
            out.push(format!(
                "memcached {name} is {:.0}% full ({} of {} bytes): when full it refuses new \
                 locks and renewals; give it more memory (-m)",
                used * 100.0,
                self.bytes,
                self.limit
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(lines: &[&str]) -> Memory {
        let mut m = Memory::default();
        for l in lines {
            m.take(l);
        }
        m
    }

    #[test]
    fn stats_and_settings_read_apart() {
        let m = of(&[
            "STAT bytes 900",
            "STAT limit_maxbytes 1000",
            "STAT evictions 3",
            "END",
            "STAT evictions on",
            "END",
        ]);
        assert_eq!(
            m,
            Memory {
                bytes: 900,
                limit: 1000,
                evicted: 3,
                evicts: true
            }
        );
        let w = m.warnings("h:1");
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(
            w[0].contains("without -M") && w[2].contains("90% full"),
            "{w:?}"
        );
        let quiet = of(&[
            "STAT bytes 10",
            "STAT limit_maxbytes 1000",
            "STAT evictions 0",
            "STAT evictions off",
        ]);
        assert!(quiet.warnings("h:1").is_empty());
    }
}
