//! What `check` reads of a memcached lock server's memory before it runs:
//! a server that evicts (no `-M`) drops held locks silently when full, its
//! slab page mover can drop items too, and a full one refuses new locks and
//! renewals.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Above this share of `limit_maxbytes` in use, `check` warns.
const NEARLY_FULL: f64 = 0.8;

/// One server's memory, from `stats`, `stats settings`, `stats slabs` and
/// `stats items`.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Memory {
    /// Memory handed out to slab classes, a 1 MB page at a time
    /// (`total_malloced`): once it reaches the limit, a class with no free
    /// chunk refuses writes, whatever `bytes` says.
    pub(crate) malloced: u64,
    /// The server's memory limit (`limit_maxbytes`, its `-m`).
    pub(crate) limit: u64,
    /// Live items dropped since the server started: evicted, or lost by
    /// the slab page mover for want of room (`evictions`,
    /// `slab_reassign_evictions_nomem`).
    pub(crate) dropped: u64,
    /// Writes refused for want of memory since it started (the slab
    /// classes' `outofmemory`).
    pub(crate) refused: u64,
    /// Whether the server evicts when full (`evictions on`: run without `-M`).
    pub(crate) evicts: bool,
    /// Whether the slab page mover runs (`slab_reassign yes`).
    pub(crate) moves_pages: bool,
}

/// The four `END`-terminated answers asked for.
const ANSWERS: usize = 4;

impl Memory {
    /// Reads the server's statistics from `addr`; `None` if it does not
    /// answer them within a second.
    pub(crate) async fn read(addr: SocketAddr) -> Option<Memory> {
        let ask = async {
            let mut s = BufReader::new(TcpStream::connect(addr).await.ok()?);
            s.get_mut()
                .write_all(b"stats\r\nstats settings\r\nstats slabs\r\nstats items\r\n")
                .await
                .ok()?;
            let mut m = Memory::default();
            let mut ends = 0;
            let mut line = String::new();
            while ends < ANSWERS {
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
        let n = || value.parse::<u64>().unwrap_or(0);
        match name {
            "total_malloced" => self.malloced = n(),
            "limit_maxbytes" => self.limit = n(),
            "evictions" if value == "on" || value == "off" => self.evicts = value == "on",
            "slab_reassign" => self.moves_pages = value == "yes",
            "evictions" | "slab_reassign_evictions_nomem" => self.dropped += n(),
            _ if name.starts_with("items:") && name.ends_with(":outofmemory") => {
                self.refused += n();
            }
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
        if self.dropped > 0 {
            out.push(format!(
                "memcached {name} has dropped {} live items since it started (evicted, or lost \
                 moving slab pages): a held lock can be among them",
                self.dropped
            ));
        }
        if self.moves_pages {
            out.push(format!(
                "memcached {name} moves slab pages between size classes (slab_reassign), which \
                 drops items it cannot relocate even under -M; run the lock server with \
                 -o no_slab_reassign"
            ));
        }
        if self.refused > 0 {
            out.push(format!(
                "memcached {name} has refused {} writes for want of memory since it started; \
                 give it more memory (-m)",
                self.refused
            ));
        }
        let used = self.malloced as f64 / self.limit.max(1) as f64;
        if used >= 1.0 {
            out.push(format!(
                "memcached {name} has handed out all its memory to slab classes (limit {} \
                 bytes): a lock's class with no free chunk refuses new locks and renewals; \
                 give it more memory (-m)",
                self.limit
            ));
        } else if used >= NEARLY_FULL {
            out.push(format!(
                "memcached {name} has handed out {:.0}% of its memory ({} of {} bytes): when \
                 a lock's slab class has no free chunk left, it refuses new locks and renewals; \
                 give it more memory (-m)",
                used * 100.0,
                self.malloced,
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
    fn every_answer_is_read() {
        let m = of(&[
            "STAT bytes 10",
            "STAT limit_maxbytes 1000",
            "STAT evictions 3",
            "STAT slab_reassign_evictions_nomem 2",
            "END",
            "STAT evictions on",
            "STAT slab_reassign yes",
            "END",
            "STAT 1:chunk_size 96",
            "STAT total_malloced 900",
            "END",
            "STAT items:1:outofmemory 4",
            "STAT items:5:outofmemory 1",
            "END",
        ]);
        assert_eq!(
            m,
            Memory {
                malloced: 900,
                limit: 1000,
                dropped: 5,
                refused: 5,
                evicts: true,
                moves_pages: true,
            }
        );
        let w = m.warnings("h:1");
        assert_eq!(w.len(), 5, "{w:?}");
        assert!(
            w[0].contains("without -M") && w[2].contains("no_slab_reassign"),
            "{w:?}"
        );
        assert!(w[4].contains("90%"), "{w:?}");
        let full = of(&["STAT limit_maxbytes 1000", "STAT total_malloced 1120"]);
        assert!(full.warnings("h:1")[0].contains("all its memory"));
        let quiet = of(&[
            "STAT limit_maxbytes 1000",
            "STAT evictions 0",
            "STAT evictions off",
            "STAT slab_reassign no",
            "STAT total_malloced 100",
            "STAT items:1:outofmemory 0",
        ]);
        assert!(quiet.warnings("h:1").is_empty());
    }
}
