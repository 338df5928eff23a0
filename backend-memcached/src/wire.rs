//! The memcached text protocol, as this backend speaks it: a bounded set of
//! connections to one server, each carrying one exchange at a time, and
//! exchanges that send many commands in one write (pipelined).
//!
//! Each connection keeps its place in the order they were opened, so a
//! CAS value a server process answered is used again only over
//! connections that a restart of it would have broken (`known.rs`).
//!
//! Only the commands whose failure cannot remove a live lock are sent
//! (see the crate docs, "A full server"): `add` and `cas` (classic
//! commands, which leave the item alone when they cannot allocate; the meta
//! `ms` unlinks it), `mg`, `md` and `stats` (which allocate nothing; the
//! last reads the server's clock for groups, see `clock.rs`) and `mn`.

use std::io;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockwright_core::backend::lock_unpoisoned;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::tls::{ServerTls, Stream};

/// memcached takes an expiry above 30 days as a Unix time, not seconds.
const RELATIVE_LIMIT: u64 = 30 * 24 * 3600;
/// The longest reply line read: a line never holds a value.
const MAX_LINE: u64 = 8 * 1024;
/// The largest value read back (memcached's default item limit).
const MAX_VALUE: usize = 1024 * 1024;

/// One command's answer.
#[derive(Debug)]
pub(crate) enum Reply {
    /// `VA`: the item, its CAS, and whole seconds left (`None`: no expiry).
    Value {
        data: Vec<u8>,
        cas: u64,
        ttl: Option<u64>,
    },
    /// `EN`: no such item.
    Miss,
    /// `STORED`, or `HD` from `md`.
    Stored,
    /// `NOT_STORED`: `add` found the key taken.
    NotStored,
    /// `EXISTS`/`EX`: the CAS did not match.
    Exists,
    /// `NOT_FOUND`/`NF`.
    NotFound,
    /// `MN`.
    Noop,
    /// The `time` line of a `stats` reply: the server's clock, as the
    /// Unix time it compares absolute expiries with.
    Time(u64),
    /// The `cas_enabled` line of a `stats settings` reply.
    CasEnabled(bool),
    /// `SERVER_ERROR out of memory …`: a write refused for want of memory.
    OutOfMemory(String),
    /// Any other error line the server sent for this command.
    Refused(String),
}

/// Why an exchange with a server failed (`error::wire` says what it
/// means for a lock).
#[derive(Debug)]
pub(crate) enum Failure {
    /// The connection could not be opened (TCP, or the TLS handshake).
    Dial(io::Error),
    /// No connection within the connect timeout.
    DialTimeout(Duration),
    /// The exchange failed midway: the connection broke, or the server
    /// sent what the protocol does not allow (a `CLIENT_ERROR` included).
    Broken(io::Error),
    /// No whole answer within the timeout.
    Timeout(Duration),
    /// The pool was closed.
    Closed,
}

/// Commands to send in one write.
#[derive(Debug, Default)]
pub(crate) struct Commands {
    buf: Vec<u8>,
    count: usize,
}

impl Commands {
    /// How many commands, and so replies.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// `mg <key> v c t`: the value, its CAS and seconds left.
    pub(crate) fn get(&mut self, key: &str) -> &mut Self {
        self.line(format_args!("mg {key} v c t"))
    }

    /// `add <key> 0 <exptime> <len>`: store only if absent.
    pub(crate) fn add(&mut self, key: &str, value: &[u8], ttl: Duration) -> &mut Self {
        self.line(format_args!("add {key} 0 {} {}", exptime(ttl), value.len()));
        self.data(value)
    }

    /// `cas <key> 0 <exptime> <len> <cas>`: store only over that version.
    pub(crate) fn cas(&mut self, key: &str, value: &[u8], ttl: Duration, cas: u64) -> &mut Self {
        self.line(format_args!(
            "cas {key} 0 {} {} {cas}",
            exptime(ttl),
            value.len()
        ));
        self.data(value)
    }

    /// `cas` keeping the item's expiry as `mg … t` read it (`left`, in
    /// seconds; `None`: it has none). The seconds left, counted from the
    /// server's clock as the write arrives, end no sooner than the read
    /// said: later only by the clock's ticks between read and write.
    pub(crate) fn cas_keeping(
        &mut self,
        key: &str,
        value: &[u8],
        left: Option<u64>,
        cas: u64,
    ) -> &mut Self {
        let exptime = left.map_or(0, |s| exptime(Duration::from_secs(s)));
        self.line(format_args!("cas {key} 0 {exptime} {} {cas}", value.len()));
        self.data(value)
    }

    /// `add` with an absolute expiry: a time on the server's clock (see
    /// [`Reply::Time`]), past 30 days and so read as one.
    pub(crate) fn add_at(&mut self, key: &str, value: &[u8], at: u64) -> &mut Self {
        self.line(format_args!("add {key} 0 {at} {}", value.len()));
        self.data(value)
    }

    /// `cas` with an absolute expiry, as [`add_at`](Self::add_at).
    pub(crate) fn cas_at(&mut self, key: &str, value: &[u8], at: u64, cas: u64) -> &mut Self {
        self.line(format_args!("cas {key} 0 {at} {} {cas}", value.len()));
        self.data(value)
    }

    /// `stats`: the server's figures, of which its clock is read.
    pub(crate) fn stats(&mut self) -> &mut Self {
        self.line(format_args!("stats"))
    }

    /// `stats settings`: how the server runs, of which `cas_enabled` is read.
    pub(crate) fn settings(&mut self) -> &mut Self {
        self.line(format_args!("stats settings"))
    }

    /// `md <key> C<cas>`: delete only that version.
    pub(crate) fn delete(&mut self, key: &str, cas: u64) -> &mut Self {
        self.line(format_args!("md {key} C{cas}"))
    }

    /// `mn`: a no-op, answered `MN`.
    pub(crate) fn noop(&mut self) -> &mut Self {
        self.line(format_args!("mn"))
    }

    fn line(&mut self, text: std::fmt::Arguments<'_>) -> &mut Self {
        use std::io::Write;
        let _ = write!(self.buf, "{text}\r\n");
        self.count += 1;
        self
    }

    fn data(&mut self, value: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(value);
        self.buf.extend_from_slice(b"\r\n");
        self
    }
}

/// The expiry field for `ttl`: whole seconds rounded up, and as a Unix
/// time past 30 days, as memcached requires (exactly 30 days is still
/// relative). The Unix time is by this host's clock, whose error is
/// nothing beside 30 days.
fn exptime(ttl: Duration) -> u64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    if secs <= RELATIVE_LIMIT {
        return secs.max(1);
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    now.saturating_add(secs)
}

/// Whether memcached can store an expiry of `ttl`: it reads the field
/// into 32 bits, and past 30 days it is a Unix time.
pub(crate) fn fits(ttl: Duration) -> bool {
    exptime(ttl) <= i32::MAX as u64
}

/// One open connection.
struct Conn {
    stream: BufReader<Stream>,
    /// Its place in the order connections to this server were opened.
    serial: u64,
}

impl Conn {
    /// Whether a pooled connection can carry another exchange: nothing
    /// unread, and the server has not closed it (a restart, an idle
    /// timeout). No round trip: a non-blocking read.
    fn reusable(&mut self) -> bool {
        self.stream.buffer().is_empty() && self.stream.get_mut().quiet()
    }

    async fn exchange(&mut self, commands: &Commands) -> io::Result<Vec<Reply>> {
        self.stream.get_mut().write_all(&commands.buf).await?;
        // TLS may keep the end of a write buffered until flushed.
        self.stream.get_mut().flush().await?;
        let mut replies = Vec::with_capacity(commands.count);
        for _ in 0..commands.count {
            replies.push(self.reply().await?);
        }
        Ok(replies)
    }

    async fn reply(&mut self) -> io::Result<Reply> {
        let mut line = Vec::new();
        (&mut self.stream)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .await?;
        let Some(line) = line.strip_suffix(b"\r\n") else {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the connection ended inside a reply",
            ));
        };
        let text = std::str::from_utf8(line).map_err(|_| bad("a reply that is not text"))?;
        let (word, rest) = text.split_once(' ').unwrap_or((text, ""));
        Ok(match word {
            "VA" => {
                let mut fields = rest.split(' ');
                let size: usize = fields
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|&s| s <= MAX_VALUE)
                    .ok_or_else(|| bad("a VA reply without a size"))?;
                let (mut cas, mut ttl) = (None, None);
                for f in fields {
                    if let Some(c) = f.strip_prefix('c') {
                        cas = c.parse().ok();
                    } else if let Some(t) = f.strip_prefix('t') {
                        ttl = t.parse::<i64>().ok();
                    }
                }
                let mut data = vec![0; size + 2];
                self.stream.read_exact(&mut data).await?;
                if !data.ends_with(b"\r\n") {
                    return Err(bad("a value not ended by CRLF"));
                }
                data.truncate(size);
                Reply::Value {
                    data,
                    cas: cas.ok_or_else(|| bad("a VA reply without its CAS"))?,
                    ttl: ttl.and_then(|t| u64::try_from(t).ok()),
                }
            }
            "EN" => Reply::Miss,
            "STORED" | "HD" => Reply::Stored,
            "NOT_STORED" | "NS" => Reply::NotStored,
            "EXISTS" | "EX" => Reply::Exists,
            "NOT_FOUND" | "NF" => Reply::NotFound,
            "MN" => Reply::Noop,
            "STAT" => self.stats(rest).await?,
            "SERVER_ERROR" if rest.contains("out of memory") => Reply::OutOfMemory(rest.to_owned()),
            // Storage commands' data is skipped by the server on these, so
            // the stream stays in step.
            "SERVER_ERROR" => Reply::Refused(text.to_owned()),
            // Not so for these: the server may read a value line as a
            // command and answer it, and every reply after this one could
            // belong to another command. The exchange ends here, and the
            // connection is closed.
            "CLIENT_ERROR" | "ERROR" => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("memcached refused a command ({text}); the connection is closed"),
                ))
            }
            _ => return Err(bad("a reply memcached does not send")),
        })
    }
}

impl Conn {
    /// The rest of a `stats` reply, from its first line's `rest` to `END`.
    async fn stats(&mut self, rest: &str) -> io::Result<Reply> {
        let (mut time, mut cas) = (None, None);
        let mut line = format!("STAT {rest}");
        // A bound on the lines, as on their length: memcached sends about 90.
        for _ in 0..1024 {
            if line == "END" {
                return time
                    .map(Reply::Time)
                    .or(cas.map(Reply::CasEnabled))
                    .ok_or_else(|| bad("stats without the time"));
            }
            if let Some(t) = line.strip_prefix("STAT time ") {
                time = t.parse().ok();
            }
            if let Some(c) = line.strip_prefix("STAT cas_enabled ") {
                cas = Some(c != "no");
            }
            let mut next = Vec::new();
            (&mut self.stream)
                .take(MAX_LINE)
                .read_until(b'\n', &mut next)
                .await?;
            line = std::str::from_utf8(&next)
                .ok()
                .and_then(|l| l.strip_suffix("\r\n"))
                .ok_or_else(|| bad("a stats line that is not text"))?
                .to_owned();
        }
        Err(bad("stats without an end"))
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("memcached sent {what}"))
}

/// At most `connections` connections to one server, opened as needed and
/// kept; an exchange waits for a free one rather than opening more, in one
/// queue served in order.
pub(crate) struct Server {
    addr: String,
    timeout: Duration,
    connect_timeout: Duration,
    /// `memcaches://`: every connection is TLS, never plain text.
    tls: Option<ServerTls>,
    permits: Semaphore,
    idle: std::sync::Mutex<Vec<Conn>>,
    /// Connections opened so far.
    dials: std::sync::atomic::AtomicU64,
}

impl Server {
    pub(crate) fn new(
        addr: &str,
        timeout: Duration,
        connect_timeout: Duration,
        connections: usize,
        tls: Option<ServerTls>,
    ) -> Self {
        Server {
            addr: addr.to_owned(),
            timeout,
            connect_timeout,
            tls,
            permits: Semaphore::new(connections.max(1)),
            idle: std::sync::Mutex::new(Vec::new()),
            dials: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// `host:port`.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    async fn dial(&self) -> std::result::Result<Conn, Failure> {
        // The TLS handshake is part of opening: within the same timeout.
        let connect = async {
            let tcp = TcpStream::connect(self.addr.as_str()).await?;
            let _ = tcp.set_nodelay(true);
            match &self.tls {
                Some(tls) => tls.connect(tcp).await,
                None => Ok(Stream::Plain(tcp)),
            }
        };
        let stream = match tokio::time::timeout(self.connect_timeout, connect).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(Failure::Dial(e)),
            Err(_) => return Err(Failure::DialTimeout(self.connect_timeout)),
        };
        let serial = self.dials.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        Ok(Conn {
            stream: BufReader::new(stream),
            serial,
        })
    }

    /// An idle connection still fit for use, if any, opened no later than
    /// the `bound`th.
    fn idle(&self, bound: u64) -> Option<Conn> {
        let mut idle = lock_unpoisoned(&self.idle);
        while let Some(at) = idle.iter().rposition(|c| c.serial <= bound) {
            let mut c = idle.swap_remove(at);
            if c.reusable() {
                return Some(c);
            }
        }
        None
    }

    /// Sends `commands` in one write and reads one reply each, in order,
    /// and says how many connections had been opened when it was sent.
    /// The connection is kept only after a whole exchange: one that failed,
    /// timed out or was cancelled midway may hold half a reply, and is
    /// closed. Of the connections counted, any still open later reaches this
    /// same server process, or one that came before it and is gone, never
    /// one started since. What the server answered (a CAS value) may be
    /// relied on over those connections only ([`exchange_within`](Self::exchange_within)).
    pub(crate) async fn exchange_noting(
        &self,
        commands: &Commands,
    ) -> std::result::Result<(Vec<Reply>, u64), Failure> {
        let _permit = self.permits.acquire().await.map_err(|_| Failure::Closed)?;
        let conn = match self.idle(u64::MAX) {
            Some(c) => c,
            None => self.dial().await?,
        };
        let opened = self.dials.load(std::sync::atomic::Ordering::SeqCst);
        self.run(conn, commands).await.map(|r| (r, opened))
    }

    /// [`exchange_noting`](Self::exchange_noting) over a connection among
    /// the first `bound` opened, if one is idle; `None` (nothing sent)
    /// if not. A server restarted since breaks such a connection, so a
    /// CAS value it answered before cannot meet the same number given to
    /// another item by the new server process.
    pub(crate) async fn exchange_within(
        &self,
        commands: &Commands,
        bound: u64,
    ) -> std::result::Result<Option<(Vec<Reply>, u64)>, Failure> {
        let _permit = self.permits.acquire().await.map_err(|_| Failure::Closed)?;
        let Some(conn) = self.idle(bound) else {
            return Ok(None);
        };
        let opened = self.dials.load(std::sync::atomic::Ordering::SeqCst);
        self.run(conn, commands).await.map(|r| Some((r, opened)))
    }

    async fn run(
        &self,
        mut conn: Conn,
        commands: &Commands,
    ) -> std::result::Result<Vec<Reply>, Failure> {
        match tokio::time::timeout(self.timeout, conn.exchange(commands)).await {
            Ok(Ok(replies)) => {
                lock_unpoisoned(&self.idle).push(conn);
                Ok(replies)
            }
            Ok(Err(e)) => Err(Failure::Broken(e)),
            Err(_) => Err(Failure::Timeout(self.timeout)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiries_round_up_and_switch_to_unix_time_past_30_days() {
        assert_eq!(exptime(Duration::from_millis(2000)), 2);
        assert_eq!(exptime(Duration::from_millis(2001)), 3);
        assert_eq!(exptime(Duration::from_millis(1)), 1);
        assert_eq!(exptime(Duration::from_secs(RELATIVE_LIMIT)), RELATIVE_LIMIT);
        let far = exptime(Duration::from_secs(RELATIVE_LIMIT + 1));
        assert!(far > 1_700_000_000, "{far}");
    }

    #[test]
    fn commands_are_framed_as_the_protocol_says() {
        let mut c = Commands::default();
        c.get("k").add("k", b"o 1", Duration::from_secs(3));
        c.cas("k", b"o 2", Duration::from_secs(3), 7)
            .delete("k", 7)
            .noop();
        c.add_at("k", b"g", 1_800_000_000)
            .cas_at("k", b"g", 1_800_000_001, 9)
            .stats();
        assert_eq!(c.len(), 8);
        assert_eq!(
            String::from_utf8(c.buf).unwrap(),
            "mg k v c t\r\nadd k 0 3 3\r\no 1\r\ncas k 0 3 3 7\r\no 2\r\nmd k C7\r\nmn\r\n\
             add k 0 1800000000 1\r\ng\r\ncas k 0 1800000001 1 9\r\ng\r\nstats\r\n"
        );
        let mut c = Commands::default();
        c.cas_keeping("k", b"o 1\nv", Some(5), 8)
            .cas_keeping("k", b"o 1", None, 9);
        assert_eq!(
            String::from_utf8(c.buf).unwrap(),
            "cas k 0 5 5 8\r\no 1\nv\r\ncas k 0 0 3 9\r\no 1\r\n"
        );
    }
}
