//! How a backend hears of grants and changes: one server's or a Sentinel
//! primary's [`Hub`] (ordinary pub/sub, one channel per backend), or on a
//! Cluster its [`Shards`]: sharded pub/sub, each lock's channels in its own
//! slot (`<lock key>:grants`, `<lock key>:changes`), so a message goes to
//! the shard that serves the lock only, not to every node.
//!
//! A Cluster drops a shard channel's subscribers when its slot leaves a
//! node (a failover, a slot's move): the server says so (`sunsubscribe`),
//! and the channel is subscribed again by the next request that needs it.
//! A waiter's place is refreshed every `waiter_refresh` meanwhile, which
//! finds a grant whose message was lost; an observer's watch ends, and it
//! reads the lock again and watches anew.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use lockwright_core::backend::{lock_unpoisoned, Watch};
use lockwright_core::{Error, OwnerToken, Result};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, TlsCertificates, Value};
use tokio::sync::{mpsc, watch};

use crate::error::map_err;
use crate::hub::{Hub, Tickets};
use crate::layout::Keys;

/// What a waiter's entry names as its hub on a Cluster, where grants go to
/// the lock's own channel instead: anything without a space.
const NO_HUB: &str = "-";

/// A grant channel not asked for this long is left, at the least (a
/// waiter asks at each refresh of its place: see [`Shards::new`]).
const IDLE: Duration = Duration::from_secs(30);

/// Where a backend hears of grants and changes.
#[derive(Debug)]
pub(crate) enum Notify {
    Hub(Hub),
    Shards(Shards),
}

impl Notify {
    /// Keeps the hub's connection up from now on (see [`Hub::keep`]); a
    /// Cluster's connections are its driver's.
    pub(crate) fn keep(&self) {
        if let Notify::Hub(h) = self {
            h.keep();
        }
    }

    /// The hub's alarm (see [`Hub::alarm`]); a Cluster raises none: its
    /// nodes fail over rather than come back empty under their clients.
    pub(crate) fn alarm(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match self {
            Notify::Hub(h) => Some(h.alarm()),
            Notify::Shards(_) => None,
        }
    }

    /// Subscribes where `keys`' grants will be published, before a waiter
    /// queues; the hub channel its entry names.
    pub(crate) async fn listening(&self, keys: &Keys) -> Result<String> {
        match self {
            Notify::Hub(h) => h.listening().await.map(str::to_owned),
            Notify::Shards(s) => {
                s.subscribed(keys.grants()).await?;
                Ok(NO_HUB.to_owned())
            }
        }
    }

    /// Where the grants to `ticket`, queued on `keys`, will arrive.
    pub(crate) async fn watch(&self, keys: &Keys, ticket: &OwnerToken) -> Result<Watch> {
        match self {
            Notify::Hub(h) => {
                h.listening().await?;
                Ok(h.register(ticket))
            }
            Notify::Shards(s) => {
                s.subscribed(keys.grants()).await?;
                Ok(s.register(ticket))
            }
        }
    }

    /// A watch on the changes announced on `keys`' change channel.
    pub(crate) async fn changes(&self, keys: &Keys) -> Result<Watch> {
        match self {
            Notify::Hub(h) => h.changes(keys.changes()).await,
            Notify::Shards(s) => s.changes(keys.changes()).await,
        }
    }
}

/// A Cluster's sharded subscriptions, on a connection of their own.
#[derive(Debug, Clone)]
pub(crate) struct Shards {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct State {
    /// Grant channels subscribed, and when each was last asked for.
    grants: HashMap<String, Instant>,
    /// Change channels subscribed, and the counter their messages bump.
    changes: HashMap<String, watch::Sender<u64>>,
}

struct Shared {
    client: ClusterClient,
    tickets: Tickets,
    connect_timeout: Duration,
    /// How long a grant channel nobody asked for is kept.
    idle: Duration,
    conn: tokio::sync::Mutex<Option<ClusterConnection>>,
    /// The pushes, taken by the reader once connected.
    pushes: Mutex<Option<mpsc::UnboundedReceiver<PushInfo>>>,
    state: Mutex<State>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards").finish_non_exhaustive()
    }
}

impl Shards {
    /// Sharded subscriptions on the Cluster at `seeds`, on RESP3 (the
    /// driver delivers a Cluster's pushes only so), over TLS with `tls`
    /// when given, as the backend's requests are. A grant channel is
    /// kept while asked for within `refresh` (the waiters' refresh period)
    /// four times over, and 30 s at the least.
    pub(crate) fn new(
        seeds: &[&str],
        tls: Option<&TlsCertificates>,
        connect_timeout: Duration,
        refresh: Duration,
    ) -> redis::RedisResult<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let builder = ClusterClient::builder(seeds.to_vec())
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(tx)
            .retries(3)
            .min_retry_wait(20)
            .max_retry_wait(200)
            .connection_timeout(connect_timeout)
            .response_timeout(connect_timeout);
        let client = crate::tls::cluster(builder, tls).build()?;
        Ok(Shards {
            shared: Arc::new(Shared {
                client,
                tickets: Tickets::default(),
                connect_timeout,
                idle: IDLE.max(refresh.saturating_mul(4)),
                conn: tokio::sync::Mutex::new(None),
                pushes: Mutex::new(Some(rx)),
                state: Mutex::default(),
            }),
        })
    }

    fn register(&self, ticket: &OwnerToken) -> Watch {
        self.shared.tickets.register(ticket)
    }

    /// The subscription connection, made (and its reader started) on first use.
    async fn conn(&self) -> Result<ClusterConnection> {
        let mut conn = self.shared.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            return Ok(c.clone());
        }
        let connecting = self.shared.client.get_async_connection();
        let c = match tokio::time::timeout(self.shared.connect_timeout * 2, connecting).await {
            Ok(r) => r.map_err(map_err)?,
            Err(_) => return Err(Error::unavailable("Cluster pub/sub: connect timed out")),
        };
        if let Some(rx) = lock_unpoisoned(&self.shared.pushes).take() {
            tokio::spawn(read(rx, Arc::downgrade(&self.shared)));
        }
        *conn = Some(c.clone());
        Ok(c)
    }

    /// Subscribes to the grant channel `channel` unless it is; leaves the
    /// ones nobody asked for lately.
    async fn subscribed(&self, channel: String) -> Result<()> {
        let now = Instant::now();
        let idle: Vec<String> = {
            let mut st = lock_unpoisoned(&self.shared.state);
            if let Some(at) = st.grants.get_mut(&channel) {
                *at = now;
                return Ok(());
            }
            let idle = st
                .grants
                .iter()
                .filter(|(_, at)| now.duration_since(**at) > self.shared.idle)
                .map(|(c, _)| c.clone())
                .collect::<Vec<_>>();
            for c in &idle {
                st.grants.remove(c);
            }
            // Recorded before it is subscribed: a `sunsubscribe` of an
            // earlier subscription, read meanwhile, then removes it, and
            // the next request subscribes again.
            st.grants.insert(channel.clone(), now);
            idle
        };
        let mut c = match self.conn().await {
            Ok(c) => c,
            Err(e) => {
                lock_unpoisoned(&self.shared.state).grants.remove(&channel);
                return Err(e);
            }
        };
        self.leave(&mut c, &idle).await;
        if let Err(e) = self.subscribe(&mut c, &channel).await {
            lock_unpoisoned(&self.shared.state).grants.remove(&channel);
            return Err(e);
        }
        Ok(())
    }

    /// Leaves `channels`, one command each (they are in different slots,
    /// on different shards). Best effort: a channel left subscribed wakes
    /// nobody.
    async fn leave(&self, c: &mut ClusterConnection, channels: &[String]) {
        for channel in channels {
            let _ =
                tokio::time::timeout(self.shared.connect_timeout, c.sunsubscribe(channel)).await;
        }
    }

    async fn subscribe(&self, c: &mut ClusterConnection, channel: &str) -> Result<()> {
        match tokio::time::timeout(self.shared.connect_timeout, c.ssubscribe(channel)).await {
            Ok(r) => r.map_err(map_err),
            Err(_) => Err(Error::unavailable("Cluster pub/sub: subscribe timed out")),
        }
    }

    /// A watch on the change channel `channel`, once subscribed. It ends
    /// when the Cluster drops the subscription. Change channels no
    /// observer watches any more are left on the way.
    async fn changes(&self, channel: String) -> Result<Watch> {
        let unwatched: Vec<String> = {
            let mut st = lock_unpoisoned(&self.shared.state);
            if let Some(tx) = st.changes.get(&channel) {
                return Ok(Watch::new(tx.subscribe(), None));
            }
            let unwatched: Vec<String> = st
                .changes
                .iter()
                .filter(|(_, tx)| tx.receiver_count() == 0)
                .map(|(c, _)| c.clone())
                .collect();
            for c in &unwatched {
                st.changes.remove(c);
            }
            unwatched
        };
        let mut c = self.conn().await?;
        self.leave(&mut c, &unwatched).await;
        self.subscribe(&mut c, &channel).await?;
        let mut st = lock_unpoisoned(&self.shared.state);
        let tx = st
            .changes
            .entry(channel)
            .or_insert_with(|| watch::channel(0).0);
        Ok(Watch::new(tx.subscribe(), None))
    }
}

/// The text of a push's `i`th value.
fn text(info: &PushInfo, i: usize) -> Option<String> {
    match info.data.get(i)? {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// Hands each grant to its waiter and each change to its observers, and
/// forgets the channels the Cluster dropped.
async fn read(mut rx: mpsc::UnboundedReceiver<PushInfo>, shared: Weak<Shared>) {
    while let Some(info) = rx.recv().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let mut st = lock_unpoisoned(&shared.state);
        match info.kind {
            PushKind::SMessage => {
                let (Some(channel), Some(payload)) = (text(&info, 0), text(&info, 1)) else {
                    continue;
                };
                if let Some(tx) = st.changes.get(&channel) {
                    tx.send_modify(|v| *v = v.wrapping_add(1));
                } else {
                    shared.tickets.granted(&payload);
                }
            }
            PushKind::SUnsubscribe => {
                if let Some(channel) = text(&info, 0) {
                    st.grants.remove(&channel);
                    // Its observers' watches end: they read and watch anew.
                    st.changes.remove(&channel);
                }
            }
            PushKind::Disconnection => {
                st.grants.clear();
                st.changes.clear();
            }
            _ => {}
        }
    }
}
