//! One Redis server: the scripts run on a self-reconnecting connection, and
//! release notifications arrive on one shared pub/sub connection.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use locksmith_core::{
    Acquire, Error, FencingToken, Grant, LockKey, OwnerToken, RedactedUrl, Release, RenewRequest,
    Result, Watch,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig, PubSubSink};
use redis::RedisError;
use tokio::sync::{watch, OnceCell};

use crate::scripts;

/// The Redis keys of one lock. The lock name sits inside `{…}`, so the lock,
/// its fencing counter and its channel share a hash tag and stay in one
/// cluster slot. The mapping is injective: fixed prefix and suffixes around
/// the name itself.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) channel: String,
}

impl Keys {
    pub(crate) fn new(prefix: &str, key: &LockKey) -> Self {
        let base = format!("{prefix}{{{}}}", key.as_str());
        Keys {
            lock: format!("{base}:lock"),
            fence: format!("{base}:fence"),
            channel: format!("{base}:released"),
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis().max(1)).unwrap_or(u64::MAX / 4)
}

/// Maps driver errors onto the contract's kinds, in one place.
pub(crate) fn map_err(e: RedisError) -> Error {
    let transient_code = matches!(
        e.code(),
        Some("LOADING" | "MASTERDOWN" | "READONLY" | "BUSY" | "TRYAGAIN" | "CLUSTERDOWN")
    );
    let msg = e.to_string();
    if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_connection_dropped()
        || transient_code
    {
        Error::unavailable(format!("redis unavailable: {msg}")).with_source(e)
    } else {
        Error::backend(msg).with_source(e)
    }
}

#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) url: RedactedUrl,
    client: redis::Client,
    conn: OnceCell<ConnectionManager>,
    timeout: Duration,
    connect_timeout: Duration,
    hub: Hub,
}

impl Node {
    pub(crate) fn new(
        url: &RedactedUrl,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Result<Self> {
        let client =
            redis::Client::open(url.expose()).map_err(|e| Error::config(format!("{url}: {e}")))?;
        Ok(Node {
            url: url.clone(),
            hub: Hub::new(client.clone(), connect_timeout),
            client,
            conn: OnceCell::new(),
            timeout,
            connect_timeout,
        })
    }

    /// The connection, made on first use; a server that is down now is
    /// `Unavailable` now and tried again on the next call.
    async fn conn(&self) -> Result<ConnectionManager> {
        let conn = self
            .conn
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(200));
                match tokio::time::timeout(
                    self.connect_timeout * 2,
                    ConnectionManager::new_with_config(self.client.clone(), config),
                )
                .await
                {
                    Ok(r) => r.map_err(map_err),
                    Err(_) => Err(Error::unavailable(format!(
                        "{}: connect timed out",
                        self.url
                    ))),
                }
            })
            .await?;
        Ok(conn.clone())
    }

    /// Bounds a request by the per-node timeout (the driver's own timeout
    /// does not cover every path, e.g. a reconnect in progress).
    async fn bounded<T>(&self, f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(Error::unavailable(format!(
                "{}: no answer within {:?}",
                self.url, self.timeout
            ))),
        }
    }

    pub(crate) async fn acquire(
        &self,
        keys: &Keys,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        self.bounded(async {
            let mut c = self.conn().await?;
            let reply: Vec<i64> = scripts::acquire()
                .key(&keys.lock)
                .key(&keys.fence)
                .arg(owner.as_str())
                .arg(ms(ttl))
                .invoke_async(&mut c)
                .await
                .map_err(map_err)?;
            Ok(match reply.as_slice() {
                [1, fence, holds] => Acquire::Acquired(Grant {
                    fence: Some(FencingToken(u64::try_from(*fence).unwrap_or(0))),
                    holds: u32::try_from(*holds).unwrap_or(u32::MAX),
                }),
                [0, pttl] => Acquire::Contended {
                    retry_after: u64::try_from(*pttl).ok().map(Duration::from_millis),
                },
                other => {
                    return Err(Error::backend(format!(
                        "unexpected acquire reply {other:?}"
                    )))
                }
            })
        })
        .await
    }

    pub(crate) async fn release(&self, keys: &Keys, owner: &OwnerToken) -> Result<Release> {
        self.bounded(async {
            let mut c = self.conn().await?;
            let left: i64 = scripts::release()
                .key(&keys.lock)
                .key(&keys.channel)
                .arg(owner.as_str())
                .invoke_async(&mut c)
                .await
                .map_err(map_err)?;
            Ok(match left {
                n if n < 0 => Release::NotHeld,
                0 => Release::Freed,
                n => Release::StillHeld(u32::try_from(n).unwrap_or(u32::MAX)),
            })
        })
        .await
    }

    /// Renews many leases in one script call; `true` where renewed.
    pub(crate) async fn renew_many(
        &self,
        prefix: &str,
        requests: &[RenewRequest],
    ) -> Result<Vec<bool>> {
        self.bounded(async {
            let mut c = self.conn().await?;
            let script = scripts::renew();
            let mut call = script.prepare_invoke();
            for r in requests {
                call.key(Keys::new(prefix, &r.key).lock)
                    .arg(r.owner.as_str())
                    .arg(ms(r.ttl));
            }
            let out: Vec<i64> = call.invoke_async(&mut c).await.map_err(map_err)?;
            if out.len() != requests.len() {
                return Err(Error::backend(
                    "renew script answered for the wrong number of keys",
                ));
            }
            Ok(out.into_iter().map(|r| r == 1).collect())
        })
        .await
    }

    pub(crate) async fn watch(&self, channel: &str) -> Result<Watch> {
        self.hub.watch(channel).await
    }
}

/// The shared pub/sub connection: subscribes to a lock's channel while
/// anyone waits on it, and wakes those waiters when a release is published.
#[derive(Debug)]
struct Hub {
    client: redis::Client,
    connect_timeout: Duration,
    conn: tokio::sync::Mutex<Option<HubConn>>,
    channels: Arc<Mutex<HashMap<String, Weak<watch::Sender<u64>>>>>,
}

struct HubConn {
    sink: PubSubSink,
    subscribed: HashSet<String>,
    alive: Arc<AtomicBool>,
}

impl std::fmt::Debug for HubConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubConn")
            .field("subscribed", &self.subscribed.len())
            .finish()
    }
}

impl Hub {
    fn new(client: redis::Client, connect_timeout: Duration) -> Self {
        Hub {
            client,
            connect_timeout,
            conn: tokio::sync::Mutex::new(None),
            channels: Arc::default(),
        }
    }

    async fn watch(&self, channel: &str) -> Result<Watch> {
        let sender = {
            let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
            channels.retain(|_, w| w.strong_count() > 0);
            match channels.get(channel).and_then(Weak::upgrade) {
                Some(s) => s,
                None => {
                    let s = Arc::new(watch::channel(0u64).0);
                    channels.insert(channel.to_owned(), Arc::downgrade(&s));
                    s
                }
            }
        };
        let mut conn = self.conn.lock().await;
        if !conn
            .as_ref()
            .is_some_and(|c| c.alive.load(Ordering::SeqCst))
        {
            *conn = Some(self.connect().await?);
        }
        let hub = conn.as_mut().expect("connected above");
        // Drop channels nobody waits on any more before adding one.
        let stale: Vec<String> = {
            let channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
            hub.subscribed
                .iter()
                .filter(|c| channels.get(*c).and_then(Weak::upgrade).is_none())
                .cloned()
                .collect()
        };
        for c in stale {
            hub.subscribed.remove(&c);
            let _ = hub.sink.unsubscribe(&c).await;
        }
        if !hub.subscribed.contains(channel) {
            // Returns once the server confirmed: any later release reaches us.
            if let Err(e) = hub.sink.subscribe(channel).await {
                *conn = None;
                return Err(map_err(e));
            }
            hub.subscribed.insert(channel.to_owned());
        }
        let rx = sender.subscribe();
        Ok(Watch::new(rx, Some(Box::new(sender))))
    }

    async fn connect(&self) -> Result<HubConn> {
        let pubsub = match tokio::time::timeout(
            self.connect_timeout,
            self.client.get_async_pubsub(),
        )
        .await
        {
            Ok(r) => r.map_err(map_err)?,
            Err(_) => return Err(Error::unavailable("pub/sub connect timed out")),
        };
        let (sink, mut stream) = pubsub.split();
        let alive = Arc::new(AtomicBool::new(true));
        let (channels, flag) = (Arc::downgrade(&self.channels), alive.clone());
        tokio::spawn(async move {
            while let Some(msg) = stream.next().await {
                let Some(channels) = channels.upgrade() else {
                    break;
                };
                let sender = channels
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(msg.get_channel_name())
                    .and_then(Weak::upgrade);
                if let Some(s) = sender {
                    s.send_modify(|v| *v += 1);
                }
            }
            // Waiters fall back to their timers; the next watch reconnects.
            flag.store(false, Ordering::SeqCst);
        });
        Ok(HubConn {
            sink,
            subscribed: HashSet::new(),
            alive,
        })
    }
}
