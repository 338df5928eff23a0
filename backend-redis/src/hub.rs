//! The shared pub/sub connection of one backend: its waiters hear on it
//! that a lock was handed to them, and its election observers that a lock
//! with a leader value changed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use lockwright_core::backend::{lock_unpoisoned, Grant, Watch};
use lockwright_core::{Error, FencingToken, OwnerToken, Result};
use redis::aio::PubSubSink;
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::map_err;
use crate::sentinel::Sentinel;

/// Where the hub connects: a server (the first of the seeds that answers:
/// a Cluster's nodes each pass on every message published on any of
/// them), or the primary the sentinels name now (the hub moves with it:
/// see [`Hub::listening`]).
// One per backend, made once and never moved about: its size is no cost.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub(crate) enum Source {
    Seeds(Vec<redis::Client>),
    Sentinel(Arc<Sentinel>),
}

impl Source {
    /// A subscriber's connection to the server to subscribe on, and its
    /// generation.
    async fn pubsub(&self) -> Result<(redis::aio::PubSub, u64)> {
        match self {
            Source::Seeds(seeds) => {
                let mut last = None;
                for c in seeds {
                    match c.get_async_pubsub().await {
                        Ok(p) => return Ok((p, 0)),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.map_or_else(|| Error::backend("no server to subscribe on"), map_err))
            }
            Source::Sentinel(s) => {
                let p = s.primary().await?;
                let pubsub = p.client.get_async_pubsub().await.map_err(map_err)?;
                Ok((pubsub, p.generation))
            }
        }
    }

    /// Whether a connection made for `generation` is still on the server
    /// in use.
    fn is_current(&self, generation: u64) -> bool {
        match self {
            Source::Seeds(_) => true,
            Source::Sentinel(s) => s.is_current(generation),
        }
    }
}

/// The waiters of one backend by ticket, each told its grant on its
/// own channel: shared by the [`Hub`] and a Cluster's `Shards`
/// (`shards.rs`).
#[derive(Debug, Default, Clone)]
pub(crate) struct Tickets(Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Grant>>>>);

impl Tickets {
    /// A watch on the grants to `ticket`; dropping it unregisters it.
    pub(crate) fn register(&self, ticket: &OwnerToken) -> Watch {
        let (tx, rx) = mpsc::unbounded_channel();
        lock_unpoisoned(&self.0).insert(ticket.as_str().to_owned(), tx);
        let registration = Registration {
            ticket: ticket.as_str().to_owned(),
            tickets: Arc::downgrade(&self.0),
        };
        Watch::grants(rx, Some(Box::new(registration)))
    }

    /// Hands a grant message, `<ticket> <fence> <lease ms>`, to the
    /// waiter it names, if it is one of ours.
    pub(crate) fn granted(&self, payload: &str) {
        let mut fields = payload.split(' ');
        let (Some(ticket), Some(Ok(fence)), lease) = (
            fields.next(),
            fields.next().map(str::parse::<u64>),
            fields.next().and_then(|l| l.parse::<u64>().ok()),
        ) else {
            return;
        };
        let sender = lock_unpoisoned(&self.0).get(ticket).cloned();
        if let Some(s) = sender {
            let _ = s.send(Grant {
                fence: Some(FencingToken(fence)),
                holds: 1,
                lease: lease.map(Duration::from_millis),
            });
        }
    }
}

/// Observers' subscriptions, by lock channel: the connection (by number)
/// that subscribed it, and the counter its messages bump.
type Changes = Mutex<HashMap<String, (u64, watch::Sender<u64>)>>;

/// The shared pub/sub connection of one backend. It listens on a channel of
/// its own, on which the scripts publish `<ticket> <fence> <lease ms>` when
/// they hand a lock to one of this backend's waiters; each message wakes
/// that waiter only. It also subscribes to the channels of the locks its
/// election observers watch, on which the scripts announce each change of
/// a lock that carries a value. A message sent while the connection was
/// down is lost: a waiter finds its grant on its next refresh; an
/// observer's subscription ends with the connection, and the observer
/// reads the lock again and subscribes anew (on a new connection).
#[derive(Debug)]
pub(crate) struct Hub {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    source: Source,
    connect_timeout: Duration,
    channel: String,
    /// Held while connecting and while subscribing to or leaving a lock's
    /// channel, so those happen one at a time, in order.
    conn: tokio::sync::Mutex<Option<HubConn>>,
    /// How many connections were made, which numbers each.
    connections: AtomicU64,
    tickets: Tickets,
    changes: Changes,
    /// Bumped when the connection ends unasked and when it is made again
    /// (see [`Hub::alarm`]).
    alarm: watch::Sender<u64>,
    /// A lock was granted or waited for through this backend: the
    /// connection is kept up (made again after it ends), so that a server
    /// that goes away is noticed at once rather than at the next renewal.
    kept: AtomicBool,
}

struct HubConn {
    sink: PubSubSink,
    number: u64,
    /// The source's generation it was made for.
    generation: u64,
    alive: Arc<AtomicBool>,
    /// Dropped with the hub: stops the reader, which closes the connection.
    _stop: oneshot::Sender<()>,
}

impl std::fmt::Debug for HubConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubConn")
            .field("number", &self.number)
            .field("alive", &self.alive.load(Ordering::Relaxed))
            .finish()
    }
}

/// Unregisters a ticket when its watch is dropped.
struct Registration {
    ticket: String,
    tickets: Weak<Mutex<HashMap<String, mpsc::UnboundedSender<Grant>>>>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(t) = self.tickets.upgrade() {
            lock_unpoisoned(&t).remove(&self.ticket);
        }
    }
}

/// Leaves a lock's channel when its last observer's watch is dropped.
struct Observing {
    channel: String,
    shared: Weak<Shared>,
}

impl Drop for Observing {
    fn drop(&mut self) {
        let (Some(shared), Ok(rt)) = (self.shared.upgrade(), tokio::runtime::Handle::try_current())
        else {
            // Outside a runtime the subscription stays until the
            // connection goes; its messages wake nobody.
            return;
        };
        let channel = std::mem::take(&mut self.channel);
        rt.spawn(async move { shared.leave(&channel).await });
    }
}

impl Hub {
    pub(crate) fn new(source: Source, connect_timeout: Duration) -> Self {
        Hub {
            shared: Arc::new(Shared {
                source,
                connect_timeout,
                channel: format!("lockwright:hub:{}", OwnerToken::generate().as_str()),
                conn: tokio::sync::Mutex::new(None),
                connections: AtomicU64::new(0),
                tickets: Tickets::default(),
                changes: Mutex::default(),
                alarm: watch::channel(0).0,
                kept: AtomicBool::new(false),
            }),
        }
    }

    /// Bumped whenever the server may have forgotten this backend's locks:
    /// the pub/sub connection ended without being asked to (the server
    /// died, restarted, or dropped it), and again when it is made anew.
    /// Redis run without persistence comes back from a restart empty, so
    /// the watchdog re-verifies every lease on either (see
    /// `LockBackend::alarm`).
    pub(crate) fn alarm(&self) -> watch::Receiver<u64> {
        self.shared.alarm.subscribe()
    }

    /// From the first grant or wait on, keeps the connection up: made now in the
    /// background if it is not, and again whenever it ends. A holder that
    /// never waited then still hears at once that its server went away.
    /// Costs the first grant one spawned task, later grants an atomic load.
    pub(crate) fn keep(&self) {
        if !self.shared.kept.load(Ordering::Relaxed)
            && !self.shared.kept.swap(true, Ordering::SeqCst)
        {
            rejoin(Arc::downgrade(&self.shared), Duration::ZERO);
        }
    }

    /// Subscribes (again, after a dropped connection, or on the new
    /// primary after a failover) if need be; returns the channel once the
    /// server confirmed it.
    pub(crate) async fn listening(&self) -> Result<&str> {
        let mut conn = self.shared.conn.lock().await;
        self.shared.live(&mut conn).await?;
        Ok(&self.shared.channel)
    }

    pub(crate) fn register(&self, ticket: &OwnerToken) -> Watch {
        self.shared.tickets.register(ticket)
    }

    /// A watch on `channel`, a lock's change channel, once the server
    /// confirmed the subscription. It ends with the connection.
    pub(crate) async fn changes(&self, channel: String) -> Result<Watch> {
        let shared = &self.shared;
        let mut conn = shared.conn.lock().await;
        let c = shared.live(&mut conn).await?;
        let number = c.number;
        let existing = lock_unpoisoned(&shared.changes)
            .get(&channel)
            .filter(|(n, _)| *n == number)
            .map(|(_, tx)| tx.subscribe());
        // Made before subscribing: an observer dropped while the server
        // confirms (its task aborted) or a failed subscribe leaves the
        // channel again rather than keep it subscribed unseen.
        let observing = Observing {
            channel: channel.clone(),
            shared: Arc::downgrade(shared),
        };
        let rx = match existing {
            Some(rx) => rx,
            None => {
                let mut sink = c.sink.clone();
                match tokio::time::timeout(shared.connect_timeout, sink.subscribe(&channel)).await {
                    Ok(r) => r.map_err(map_err)?,
                    Err(_) => return Err(Error::unavailable("pub/sub subscribe timed out")),
                }
                let (tx, rx) = watch::channel(0);
                lock_unpoisoned(&shared.changes).insert(channel.clone(), (number, tx));
                // The reader clears a dead connection's channels after
                // marking it dead: one inserted since is cleared here.
                if !c.alive.load(Ordering::SeqCst) {
                    shared.forget(number);
                    return Err(Error::unavailable("pub/sub connection lost"));
                }
                rx
            }
        };
        Ok(Watch::new(rx, Some(Box::new(observing))))
    }
}

impl Shared {
    /// The live connection, made anew if there is none, it died, or its
    /// server is no longer the one in use (a failover: grants are
    /// published on the new primary).
    async fn live<'a>(self: &Arc<Self>, conn: &'a mut Option<HubConn>) -> Result<&'a HubConn> {
        if !conn
            .as_ref()
            .is_some_and(|c| c.alive.load(Ordering::SeqCst) && self.source.is_current(c.generation))
        {
            // The old connection goes first: its reader ends, and its
            // observers subscribe again, on the new one.
            *conn = None;
            *conn = Some(self.connect().await?);
        }
        conn.as_ref()
            .ok_or_else(|| Error::backend("pub/sub connection missing"))
    }

    /// Drops the lock channels subscribed on connection `number`, which
    /// ends their observers' watches.
    fn forget(&self, number: u64) {
        lock_unpoisoned(&self.changes).retain(|_, (n, _)| *n != number);
    }

    /// Leaves `channel` if nobody observes it any more: no observer's
    /// watch is left, or none was ever made (a subscribe that failed or
    /// was abandoned may still have reached the server).
    async fn leave(&self, channel: &str) {
        let conn = self.conn.lock().await;
        let idle = {
            let mut changes = lock_unpoisoned(&self.changes);
            let idle = changes
                .get(channel)
                .is_none_or(|(_, tx)| tx.receiver_count() == 0);
            if idle {
                changes.remove(channel);
            }
            idle
        };
        if let Some(c) = conn
            .as_ref()
            .filter(|c| idle && c.alive.load(Ordering::SeqCst))
        {
            let mut sink = c.sink.clone();
            // Best effort: a channel left subscribed wakes nobody.
            let _ = tokio::time::timeout(self.connect_timeout, sink.unsubscribe(channel)).await;
        }
    }

    async fn connect(self: &Arc<Self>) -> Result<HubConn> {
        let connecting = async {
            let (pubsub, generation) = self.source.pubsub().await?;
            let (mut sink, stream) = pubsub.split();
            sink.subscribe(&self.channel).await.map_err(map_err)?;
            Ok::<_, Error>((sink, stream, generation))
        };
        // Finding the primary may take the sentinels' round trips too.
        let limit = self.connect_timeout * 2;
        let (sink, mut stream, generation) = match tokio::time::timeout(limit, connecting).await {
            Ok(r) => r?,
            Err(_) => return Err(Error::unavailable("pub/sub connect timed out")),
        };
        let number = self.connections.fetch_add(1, Ordering::SeqCst);
        if number > 0 {
            // Made again: the server may be a new one, or restarted empty.
            self.alarm.send_modify(|n| *n = n.wrapping_add(1));
        }
        // No lock channel of an earlier connection is subscribed on this
        // one (and none is subscribed anew without the lock held here).
        lock_unpoisoned(&self.changes).clear();
        let alive = Arc::new(AtomicBool::new(true));
        let flag = alive.clone();
        let (stop, mut stopped) = oneshot::channel::<()>();
        let own = self.channel.clone();
        let shared = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut asked = false;
            loop {
                let msg = tokio::select! {
                    msg = stream.next() => msg,
                    _ = &mut stopped => {
                        asked = true;
                        None
                    }
                };
                let Some(msg) = msg else {
                    break;
                };
                let Some(shared) = shared.upgrade() else {
                    break;
                };
                if msg.get_channel_name() == own {
                    let payload: String = msg.get_payload().unwrap_or_default();
                    shared.tickets.granted(&payload);
                } else if let Some((_, tx)) =
                    lock_unpoisoned(&shared.changes).get(msg.get_channel_name())
                {
                    tx.send_modify(|v| *v = v.wrapping_add(1));
                }
            }
            // Waiters fall back to their refresh, observers subscribe
            // again; the next request reconnects.
            flag.store(false, Ordering::SeqCst);
            if let Some(strong) = shared.upgrade() {
                strong.forget(number);
                if !asked {
                    // The server went away, or dropped us: its locks may be
                    // gone with it.
                    strong.alarm.send_modify(|n| *n = n.wrapping_add(1));
                    if strong.kept.load(Ordering::SeqCst) {
                        rejoin(shared, REJOIN_PAUSE.0);
                    }
                }
            }
        });
        Ok(HubConn {
            sink,
            number,
            generation,
            alive,
            _stop: stop,
        })
    }
}

/// The first and the longest pause between attempts to make a kept
/// connection again.
const REJOIN_PAUSE: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));

/// Makes a kept hub connection again, after `first`, then with a doubling
/// pause, until it is up or the backend is gone. Once up, the connection's
/// reader calls this again when it ends.
fn rejoin(shared: Weak<Shared>, first: Duration) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    rt.spawn(async move {
        let mut pause = first;
        loop {
            tokio::time::sleep(pause).await;
            let Some(strong) = shared.upgrade() else {
                return;
            };
            let mut conn = strong.conn.lock().await;
            match strong.live(&mut conn).await {
                Ok(_) => return,
                Err(e) => tracing::debug!("the pub/sub connection is not back yet: {e}"),
            }
            pause = (pause * 2).clamp(REJOIN_PAUSE.0, REJOIN_PAUSE.1);
        }
    });
}
