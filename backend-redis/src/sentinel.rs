//! Redis under Sentinel: the primary the sentinels name, found again after
//! a failover, and known to be the primary on the very connection that
//! carries the scripts.
//!
//! The sentinels are asked together (`SENTINEL MASTER <name>`), and the
//! answer with the highest config epoch wins, so a sentinel that has not
//! heard of the last failover yet is outvoted by one that has. The node it
//! names is then connected to and asked `ROLE` on that connection: a node
//! that is not (or no longer) a primary is never written to. The epoch
//! also shifts the fencing tokens (see the crate docs), which is why it
//! comes with the address from the same answer.
//!
//! A failover is heard of as it ends: a task listens for `+switch-master`
//! on one sentinel (the next one, when that one goes away) and drops the
//! primary in use, so every request after it resolves again. That matters
//! more than it seems: the old primary keeps taking writes until the
//! sentinels get round to demoting it, seconds later, and a client still
//! on it would hold locks the new primary knows nothing of. A message
//! can be missed while no sentinel is listened to: the primary is then
//! dropped again once a subscription is made.
//!
//! A target also goes stale on anything that says the primary may have moved:
//! an I/O error, a timeout, a dropped connection, `READONLY` (a demoted
//! primary refusing a write, which therefore did not happen), `MASTERDOWN`
//! or `LOADING`. The next request resolves again. A write whose reply was
//! lost stays the caller's to undo, as on one server.
//!
//! Under `rediss+sentinel://` every connection is TLS with the URL's one
//! set of files: to the sentinels (asked, and listened to) and to the data
//! nodes they name, whose certificates must therefore name the address
//! the sentinels give for them. The sentinels' own credentials
//! (`sentinel_password`, `sentinel_username`) go to the sentinels only;
//! the URL's user and password, to the data nodes only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use lockwright_core::backend::{lock_unpoisoned, HostPort};
use lockwright_core::{Error, Result};
use redis::aio::MultiplexedConnection;
use redis::{RedisError, RedisResult, TlsCertificates};

use crate::config::SentinelConfig;
use crate::error::map_err;
use crate::tls;

/// Seconds added to the fencing tokens' clock per config epoch: a
/// promoted replica's clock may be behind the old primary's by up to this
/// much and its tokens still rise. An hour, so 2^53 µs holds two million
/// epochs beyond today's clock.
pub(crate) const EPOCH_SHIFT_SECS: i64 = 3600;

/// The primary in use: its connection, its address, the config epoch the
/// sentinels named it in, and a number that tells it from the ones
/// before it.
pub(crate) struct Primary {
    /// A plain connection, not one that reconnects by itself: once it
    /// breaks, the next request asks the sentinels again.
    pub(crate) conn: MultiplexedConnection,
    pub(crate) client: redis::Client,
    pub(crate) addr: HostPort,
    pub(crate) epoch: u64,
    pub(crate) generation: u64,
}

/// The sentinels of one master, and the primary they last named.
pub(crate) struct Sentinel {
    config: SentinelConfig,
    /// TLS for every connection, sentinels' and data nodes' alike
    /// (`rediss+sentinel://`); `None`: plain TCP.
    tls: Option<TlsCertificates>,
    timeout: Duration,
    connect_timeout: Duration,
    current: Mutex<Option<Arc<Primary>>>,
    /// One resolution at a time: a failover seen by many requests at once
    /// asks the sentinels once.
    resolving: tokio::sync::Mutex<()>,
    generations: AtomicU64,
    /// How many listeners have tried to subscribe once.
    listening: tokio::sync::watch::Sender<usize>,
    /// Bumped each time the primary in use is dropped: a lookup that saw
    /// it move under it looks again rather than install what it found.
    forgets: AtomicU64,
    /// The highest config epoch resolved so far: a sentinel that answers
    /// alone and late cannot move the tokens' shift back.
    highest: AtomicU64,
    /// Ends the `+switch-master` listener when the node goes; set once it
    /// runs.
    listener: std::sync::OnceLock<tokio::sync::oneshot::Sender<()>>,
    me: Weak<Sentinel>,
}

impl std::fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let current = lock_unpoisoned(&self.current)
            .as_ref()
            .map(|p| (p.addr.to_string(), p.epoch));
        f.debug_struct("Sentinel")
            .field("config", &self.config)
            .field("current", &current)
            .finish_non_exhaustive()
    }
}

/// Whether `e` says the primary may have moved (see the module docs).
pub(crate) fn moved(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

/// A sentinel's `SENTINEL MASTER` fields and its
/// `get-master-addr-by-name` answer.
type MasterAnswer = (Vec<String>, Option<(String, u16)>);

/// What one sentinel says of the master: its address, whether it holds
/// it for down, and the config epoch of that answer.
struct Named {
    addr: HostPort,
    down: bool,
    epoch: u64,
}

impl Sentinel {
    pub(crate) fn new(
        config: SentinelConfig,
        tls: Option<TlsCertificates>,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| Sentinel {
            config,
            tls,
            timeout,
            connect_timeout,
            current: Mutex::new(None),
            resolving: tokio::sync::Mutex::new(()),
            generations: AtomicU64::new(1),
            forgets: AtomicU64::new(0),
            listening: tokio::sync::watch::channel(0).0,
            highest: AtomicU64::new(0),
            listener: std::sync::OnceLock::new(),
            me: me.clone(),
        })
    }

    /// A client of the sentinel at `at`: the sentinels' own credentials,
    /// and TLS when the URL asks for it.
    fn sentinel_client(&self, at: &HostPort) -> RedisResult<redis::Client> {
        let auth = tls::credentials(
            self.config.sentinel_user.as_deref(),
            self.config.sentinel_password.as_deref(),
        );
        tls::client(at, auth, self.tls.as_ref())
    }

    /// The primary in use, resolved if there is none.
    pub(crate) async fn primary(&self) -> Result<Arc<Primary>> {
        if let Some(p) = lock_unpoisoned(&self.current).clone() {
            return Ok(p);
        }
        self.listen();
        let _one = self.resolving.lock().await;
        // The listeners first: a failover between a lookup and their
        // subscriptions would go unheard. (A sentinel that cannot be
        // reached is waited for no longer than its connect.)
        let mut listening = self.listening.subscribe();
        let all = self.config.sentinels.len();
        let _ = tokio::time::timeout(
            self.connect_timeout + self.timeout,
            listening.wait_for(|n| *n >= all),
        )
        .await;
        if let Some(p) = lock_unpoisoned(&self.current).clone() {
            return Ok(p);
        }
        // A failover announced while the sentinels were asked may have
        // been answered with the old primary (not demoted yet, so its ROLE
        // still says master): then ask again.
        for _ in 0..3 {
            let seen = self.forgets.load(Ordering::SeqCst);
            let p = Arc::new(self.resolve().await?);
            let mut current = lock_unpoisoned(&self.current);
            if self.forgets.load(Ordering::SeqCst) == seen {
                *current = Some(p.clone());
                return Ok(p);
            }
        }
        Err(Error::unavailable(format!(
            "the primary of {:?} kept moving while it was looked up",
            self.config.master
        )))
    }

    /// Whether `generation` is the primary in use.
    pub(crate) fn is_current(&self, generation: u64) -> bool {
        lock_unpoisoned(&self.current)
            .as_ref()
            .is_some_and(|p| p.generation == generation)
    }

    /// Drops the primary of `generation` if it is still the one in use:
    /// the next request asks the sentinels again.
    pub(crate) fn forget(&self, generation: u64) {
        let mut current = lock_unpoisoned(&self.current);
        if current.as_ref().is_some_and(|p| p.generation == generation) {
            *current = None;
            self.forgets.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Drops the primary in use, whichever it is.
    fn forget_any(&self) {
        let mut current = lock_unpoisoned(&self.current);
        *current = None;
        self.forgets.fetch_add(1, Ordering::SeqCst);
    }

    /// Starts the failover listeners, once: one per sentinel, since only
    /// the sentinel that leads a failover announces the promotion (see the
    /// module docs).
    fn listen(&self) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        if self.listener.set(stop).is_err() {
            return;
        }
        let listeners =
            (0..self.config.sentinels.len()).map(|i| Self::switches(self.me.clone(), i));
        let all = futures::future::join_all(listeners);
        tokio::spawn(async move {
            tokio::select! {
                _ = all => {}
                _ = stopped => {}
            }
        });
    }

    /// Listens on sentinel `at` for the promotion of a replica of our
    /// master (`+promoted-slave`, sent by the sentinel leading the
    /// failover as soon as the replica is a primary) and for the end of a
    /// failover (`+switch-master`, sent by every sentinel), for ever.
    async fn switches(me: Weak<Sentinel>, at: usize) {
        let mut first = true;
        loop {
            let Some(s) = me.upgrade() else {
                return;
            };
            let client = s.sentinel_client(&s.config.sentinels[at]);
            let master = s.config.master.clone();
            let limit = s.connect_timeout + s.timeout;
            drop(s);
            let subscribing = async {
                let mut pubsub = client?.get_async_pubsub().await?;
                pubsub
                    .subscribe(&["+switch-master", "+promoted-slave"])
                    .await?;
                Ok::<_, RedisError>(pubsub)
            };
            let subscribed = tokio::time::timeout(limit, subscribing).await;
            if let Some(s) = me.upgrade() {
                if first {
                    // The first lookup waits for this (see `primary`).
                    s.listening.send_modify(|n| *n += 1);
                } else if matches!(subscribed, Ok(Ok(_))) {
                    // A failover may have come while nobody listened.
                    s.forget_any();
                }
            }
            first = false;
            if let Ok(Ok(pubsub)) = subscribed {
                let mut messages = pubsub.into_on_message();
                while let Some(msg) = messages.next().await {
                    let payload: String = msg.get_payload().unwrap_or_default();
                    // `<master> <old ip> <old port> <new ip> <new port>`, or
                    // `slave <name> <ip> <port> @ <master> <ip> <port>`.
                    let name = match payload.split_once(" @ ") {
                        Some((_, m)) => m.split(' ').next(),
                        None => payload.split(' ').next(),
                    };
                    if name != Some(master.as_str()) {
                        continue;
                    }
                    let Some(s) = me.upgrade() else {
                        return;
                    };
                    tracing::info!(
                        master = %master,
                        "{}: {payload}",
                        msg.get_channel_name()
                    );
                    s.forget_any();
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Asks every sentinel, takes the freshest answer, connects to the
    /// node it names and checks it is the primary.
    async fn resolve(&self) -> Result<Primary> {
        let asked = self.config.sentinels.iter().map(|s| self.ask(s));
        let answers = futures::future::join_all(asked).await;
        let mut best: Option<Named> = None;
        let mut unknown = 0;
        let mut last_error = None;
        for a in answers {
            match a {
                Ok(Some(n)) if best.as_ref().is_none_or(|b| n.epoch > b.epoch) => {
                    best = Some(n);
                }
                Ok(Some(_)) => {}
                Ok(None) => unknown += 1,
                // A refusal (a certificate, the sentinels' password) wins
                // over an outage, whatever the order the URL lists them
                // in: every sentinel takes the same settings, and a
                // waiter would otherwise retry a refusal for ever.
                Err(e) => {
                    let refused = |e: &Error| e.kind() == lockwright_core::ErrorKind::Config;
                    if !last_error.as_ref().is_some_and(refused) {
                        last_error = Some(e);
                    }
                }
            }
        }
        let master = &self.config.master;
        let Some(named) = best else {
            if unknown > 0 && last_error.is_none() {
                return Err(Error::config(format!(
                    "the sentinels watch no master named {master:?}"
                )));
            }
            let e = last_error.unwrap_or_else(|| Error::unavailable("no sentinel answered"));
            return Err(about(
                format!("no sentinel named the primary of {master:?}"),
                e,
            ));
        };
        if named.down {
            return Err(Error::unavailable(format!(
                "the sentinels hold the primary of {master:?} ({}) for down; a failover may be under way",
                named.addr
            )));
        }
        let (client, conn) = self.connect(&named.addr).await?;
        let mut check = conn.clone();
        let role: redis::Value = redis::cmd("ROLE")
            .query_async(&mut check)
            .await
            .map_err(map_err)?;
        if role_name(&role).as_deref() != Some("master") {
            return Err(Error::unavailable(format!(
                "{} is not the primary of {master:?} (yet): a failover is under way",
                named.addr
            )));
        }
        let epoch = named
            .epoch
            .max(self.highest.fetch_max(named.epoch, Ordering::SeqCst));
        Ok(Primary {
            conn,
            client,
            addr: named.addr,
            epoch,
            generation: self.generations.fetch_add(1, Ordering::SeqCst),
        })
    }

    /// One sentinel's answer, `None` if it watches no such master.
    async fn ask(&self, sentinel: &HostPort) -> Result<Option<Named>> {
        let client = self.sentinel_client(sentinel).map_err(map_err)?;
        let asking = async {
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(self.connect_timeout))
                .set_response_timeout(Some(self.timeout));
            let mut c = client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(map_err)?;
            let mut pipe = redis::pipe();
            pipe.cmd("SENTINEL")
                .arg("MASTER")
                .arg(&self.config.master)
                .cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&self.config.master);
            let reply: redis::RedisResult<MasterAnswer> = pipe.query_async(&mut c).await;
            match reply {
                Ok(answer) => Ok(Some(answer)),
                Err(e) if e.to_string().contains("No such master") => Ok(None),
                Err(e) => Err(map_err(e)),
            }
        };
        let fields = match tokio::time::timeout(self.connect_timeout + self.timeout, asking).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(Error::unavailable(format!(
                    "sentinel {sentinel}: no answer in time"
                )))
            }
        };
        let Some((fields, promoted)) = fields else {
            return Ok(None);
        };
        let field = |name: &str| {
            fields
                .chunks(2)
                .find(|kv| kv[0] == name)
                .and_then(|kv| kv.get(1))
                .cloned()
        };
        let (Some(ip), Some(Ok(port))) = (field("ip"), field("port").map(|p| p.parse::<u16>()))
        else {
            return Err(Error::backend(format!(
                "sentinel {sentinel}: SENTINEL MASTER answered without an address"
            )));
        };
        let flags = field("flags").unwrap_or_default();
        let epoch = field("config-epoch")
            .and_then(|e| e.parse().ok())
            .unwrap_or(0);
        let addr = HostPort::new(ip, port);
        // Mid-failover, once the replica is promoted and the others are
        // being moved to it, the leading sentinel names it here while its
        // master record still has the old address (its epoch is already
        // the new one's).
        if let Some((ip, port)) = promoted {
            let named = HostPort::new(ip, port);
            if named != addr {
                return Ok(Some(Named {
                    addr: named,
                    down: false,
                    epoch,
                }));
            }
        }
        Ok(Some(Named {
            addr,
            down: flags.split(',').any(|f| f == "s_down" || f == "o_down"),
            epoch,
        }))
    }

    /// A connection to the data node at `addr`, with the URL's user,
    /// password and database, over TLS when the URL asks for it.
    async fn connect(&self, addr: &HostPort) -> Result<(redis::Client, MultiplexedConnection)> {
        let settings =
            tls::credentials(self.config.user.as_deref(), self.config.password.as_deref())
                .set_db(self.config.db);
        let client = tls::client(addr, settings, self.tls.as_ref()).map_err(map_err)?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.timeout));
        let connecting = client.get_multiplexed_async_connection_with_config(&config);
        match tokio::time::timeout(self.connect_timeout * 2, connecting).await {
            Ok(Ok(conn)) => Ok((client, conn)),
            Ok(Err(e)) => Err(about(format!("the primary at {addr}"), map_err(e))),
            Err(_) => Err(Error::unavailable(format!(
                "the primary at {addr}: connect timed out"
            ))),
        }
    }
}

/// `e` under a message of its own kind saying what was being done.
fn about(what: String, e: Error) -> Error {
    Error::new(e.kind(), what).with_source(e)
}

/// The role a `ROLE` reply names (`master`, `slave`, `sentinel`).
pub(crate) fn role_name(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::Array(items) => match items.first()? {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}
