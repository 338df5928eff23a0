//! Release notifications: a waiter hears a release made by another client
//! of the same database and table at once, not at its next poll. Within
//! one process through a channel per name; on PostgreSQL across processes
//! too, through `LISTEN`/`NOTIFY`: the listening connection's types are
//! here, as this file's waiters hold them, and what it does is in
//! `listen.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use lockwright_core::backend::{lock_unpoisoned, Watch};
use lockwright_core::LockKey;
use sha2::{Digest, Sha256};
#[cfg(feature = "postgres")]
use tokio::sync::mpsc;
use tokio::sync::watch;

/// The notification channel of `key` in `table`: a PostgreSQL identifier
/// (at most 63 bytes), the same in every process, and the map key of this
/// process's waiters. Two names sharing one would only wake each other's
/// waiters for nothing.
pub(crate) fn channel(table: &str, key: &LockKey) -> String {
    let mut h = Sha256::new();
    h.update(table.as_bytes());
    h.update([0]);
    h.update(key.as_str().as_bytes());
    format!("lockwright_{}", &hex::encode(h.finalize())[..40])
}

/// The advisory lock key that marks `channel` as waited on: a listening
/// connection holds it shared while anyone in its process waits, and a
/// release notifies only if it cannot take it exclusively (someone
/// waits), so a lock nobody waits for costs no `NOTIFY`, whose commit
/// PostgreSQL serializes database-wide.
/// Hashed apart from the channel (and so from session locks' keys, which
/// hash the same table and name): a waiter's mark must never be a lock.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn waited_key(channel: &str) -> i64 {
    let mut h = Sha256::new();
    h.update(b"lockwright-waited\0");
    h.update(channel.as_bytes());
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    i64::from_be_bytes(first)
}

/// One name's waiters in this process; it goes with the last of them.
#[derive(Debug)]
struct Waiters {
    sender: watch::Sender<u64>,
    /// Listening on the database's channel while anyone here waits.
    #[cfg(feature = "postgres")]
    _listening: Option<Listening>,
}

/// Release notifications between backends of one process that share a
/// database and table: a waiter here hears a release made here at once,
/// instead of at its next poll; on PostgreSQL, one made anywhere.
/// Channels are dropped with their last watcher.
#[derive(Debug)]
pub(crate) struct LocalReleases {
    table: String,
    channels: Mutex<HashMap<String, Weak<Waiters>>>,
    /// PostgreSQL: the one connection that listens for this scope.
    #[cfg(feature = "postgres")]
    remote: Option<Remote>,
}

impl LocalReleases {
    /// The scope's notifier, shared by every backend of this process on
    /// `scope` (the database) and `table`. `remote` listens on PostgreSQL;
    /// the first backend's is kept.
    pub(crate) fn for_scope(
        scope: &str,
        table: &str,
        #[cfg(feature = "postgres")] remote: Option<Remote>,
    ) -> Arc<Self> {
        static SCOPES: OnceLock<Mutex<HashMap<String, Weak<LocalReleases>>>> = OnceLock::new();
        let mut scopes = lock_unpoisoned(SCOPES.get_or_init(Default::default));
        scopes.retain(|_, w| w.strong_count() > 0);
        let id = format!("{scope}\u{0}{table}");
        if let Some(existing) = scopes.get(&id).and_then(Weak::upgrade) {
            return existing;
        }
        let fresh = Arc::new(LocalReleases {
            table: table.to_owned(),
            channels: Mutex::default(),
            #[cfg(feature = "postgres")]
            remote,
        });
        #[cfg(feature = "postgres")]
        if let Some(r) = &fresh.remote {
            r.serve(Arc::downgrade(&fresh));
        }
        scopes.insert(id, Arc::downgrade(&fresh));
        fresh
    }

    /// `key`'s notification channel here.
    pub(crate) fn channel(&self, key: &LockKey) -> String {
        channel(&self.table, key)
    }

    pub(crate) fn watch(&self, key: &LockKey) -> Watch {
        let name = self.channel(key);
        let mut channels = lock_unpoisoned(&self.channels);
        channels.retain(|_, w| w.strong_count() > 0);
        let waiters = match channels.get(&name).and_then(Weak::upgrade) {
            Some(w) => w,
            None => {
                let w = Arc::new(Waiters {
                    sender: watch::channel(0u64).0,
                    #[cfg(feature = "postgres")]
                    _listening: self.remote.as_ref().and_then(|r| r.listen(&name)),
                });
                channels.insert(name, Arc::downgrade(&w));
                w
            }
        };
        Watch::new(waiters.sender.subscribe(), Some(Box::new(waiters)))
    }

    pub(crate) fn released(&self, key: &LockKey) {
        self.wake(&self.channel(key));
    }

    /// Wakes the waiters of channel `name`, if any wait here.
    pub(crate) fn wake(&self, name: &str) {
        let channels = lock_unpoisoned(&self.channels);
        if let Some(w) = channels.get(name).and_then(Weak::upgrade) {
            w.sender.send_modify(|v| *v += 1);
        }
    }

    /// Wakes every waiter here: notifications may have been missed (the
    /// listening connection was lost).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn wake_all(&self) {
        let channels = lock_unpoisoned(&self.channels);
        for w in channels.values().filter_map(Weak::upgrade) {
            w.sender.send_modify(|v| *v += 1);
        }
    }
}

// PostgreSQL's listening connection: its types live here because this
// file's waiters and scopes hold them; what it does is in `listen.rs`,
// which builds on this file (never the other way round).

/// What the listening task is asked to do.
#[cfg(feature = "postgres")]
#[derive(Debug)]
pub(crate) enum Ask {
    Listen(String),
    Unlisten(String),
}

/// The listening connection of one scope: started on the first waiter,
/// and again if the runtime that ran it has gone.
#[cfg(feature = "postgres")]
#[derive(Debug)]
pub(crate) struct Remote {
    pub(crate) opts: sqlx::postgres::PgConnectOptions,
    pub(crate) connect_timeout: std::time::Duration,
    pub(crate) task: Mutex<Option<mpsc::UnboundedSender<Ask>>>,
    pub(crate) scope: Mutex<Weak<LocalReleases>>,
}

/// Listening on one channel; dropping it stops (once no one else here waits
/// on that channel).
#[cfg(feature = "postgres")]
#[derive(Debug)]
pub(crate) struct Listening {
    pub(crate) channel: String,
    pub(crate) task: mpsc::UnboundedSender<Ask>,
}

#[cfg(feature = "postgres")]
impl Drop for Listening {
    fn drop(&mut self) {
        let _ = self
            .task
            .send(Ask::Unlisten(std::mem::take(&mut self.channel)));
    }
}
