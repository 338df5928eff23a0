//! [`Node`]: our connection to one memcached server (its pool of
//! connections, the key prefix, the per-request budget) and what we keep
//! of that server between requests: its clock as last read (`clock.rs`)
//! and the CAS values of our own last writes ([`KnownCas`], for the fast
//! paths of `known.rs`). The exchanges every other file builds on are
//! here; what a lock, a group or a fast path does with them is above, in
//! `server.rs`, `claims.rs`, `clock.rs` and `known.rs`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockwright_core::backend::lock_unpoisoned;
use lockwright_core::{Error, LockKey, OwnerToken, Result};
use tokio::sync::watch;

use crate::error::{self, unexpected};
use crate::layout::{item_key, Body, Group, Holder, Item};
use crate::wire::{Commands, Reply, Server};

/// One memcached server.
pub(crate) struct Node {
    pub(crate) server: Server,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    connect_timeout: Duration,
    /// Bumped on every out-of-memory answer (see
    /// [`LockBackend::alarm`](lockwright_core::backend::LockBackend::alarm)).
    pub(crate) alarm: Arc<watch::Sender<u64>>,
    /// The server's clock as last read, and when (see `clock.rs`).
    pub(crate) clock: std::sync::Mutex<Option<(u64, std::time::Instant)>>,
    /// Our locks' last versions (see `known.rs`).
    pub(crate) known: KnownCas,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("server", &self.server.addr())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// A node for `server`, whose own timeouts bound each request.
    pub(crate) fn new(
        server: Server,
        prefix: &str,
        timeout: Duration,
        connect_timeout: Duration,
        alarm: Arc<watch::Sender<u64>>,
    ) -> Self {
        Node {
            server,
            prefix: prefix.to_owned(),
            timeout,
            connect_timeout,
            alarm,
            clock: std::sync::Mutex::new(None),
            known: KnownCas::default(),
        }
    }

    pub(crate) fn key(&self, key: &LockKey) -> String {
        item_key(&self.prefix, key)
    }

    /// `fut` within the per-request budget: waiting for a connection, a
    /// redial, and the exchanges.
    pub(crate) async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let budget = self.timeout + self.connect_timeout;
        match tokio::time::timeout(budget, fut).await {
            Ok(r) => r,
            Err(_) => Err(error::no_answer(self.server.addr(), budget)),
        }
    }

    /// The commands' replies, one each.
    pub(crate) async fn send(&self, commands: &Commands) -> Result<Vec<Reply>> {
        self.send_noting(commands).await.map(|(replies, _)| replies)
    }

    /// One command's reply.
    pub(crate) async fn one(&self, commands: &Commands) -> Result<Reply> {
        self.send(commands)
            .await?
            .pop()
            .ok_or_else(|| Error::backend("memcached sent no reply"))
    }

    /// A full server refused a write ([`error::full`]).
    pub(crate) fn full(&self, message: &str) -> Error {
        error::full(self.server.addr(), message)
    }

    /// [`full`](Self::full), and the alarm: a full server is one where
    /// other writers' failed stores (a meta `ms`, a `set`) unlink what they
    /// meant to replace, so the holders here check their locks now. Not
    /// for a renewal's refusal: it read its lock just before, and the
    /// renewals raising alarms for each other would never rest.
    pub(crate) fn full_alarm(&self, message: &str) -> Error {
        self.alarm.send_modify(|n| *n += 1);
        self.full(message)
    }

    /// An item from a `mg … v c t` reply; `None` on a miss.
    pub(crate) fn item(&self, k: &str, reply: Reply) -> Result<Option<Item>> {
        match reply {
            Reply::Miss => Ok(None),
            Reply::Value { data, cas, ttl } => {
                let body = if Group::is_group(&data) {
                    Group::parse(&data).map(Body::Group)
                } else {
                    Holder::parse(&data).map(Body::Lock)
                };
                let body = body.ok_or_else(|| {
                    Error::backend(format!("the item {k:?} is not a lockwright lock"))
                })?;
                Ok(Some(Item {
                    body,
                    cas,
                    left: ttl,
                }))
            }
            other => Err(unexpected(&other)),
        }
    }

    pub(crate) async fn read(&self, k: &str) -> Result<Option<Item>> {
        let reply = self.one(Commands::default().get(k)).await?;
        self.item(k, reply)
    }

    /// [`Node::send`], and the connections opened when it was sent.
    pub(crate) async fn send_noting(&self, commands: &Commands) -> Result<(Vec<Reply>, u64)> {
        let (replies, opened) = self
            .server
            .exchange_noting(commands)
            .await
            .map_err(|f| error::wire(self.server.addr(), f))?;
        if replies.len() != commands.len() {
            return Err(Error::backend("memcached sent too few replies"));
        }
        Ok((replies, opened))
    }

    /// [`Node::send`] over one of the first `bound` connections opened,
    /// if one is free (see `known.rs`); `None` if not.
    pub(crate) async fn send_within(
        &self,
        commands: &Commands,
        bound: u64,
    ) -> Result<Option<(Vec<Reply>, u64)>> {
        let sent = self
            .server
            .exchange_within(commands, bound)
            .await
            .map_err(|f| error::wire(self.server.addr(), f))?;
        match sent {
            Some((replies, _)) if replies.len() != commands.len() => {
                Err(Error::backend("memcached sent too few replies"))
            }
            other => Ok(other),
        }
    }

    /// A write and the `mg` sent after it in the same exchange: their
    /// replies, and the connections opened when they were sent.
    pub(crate) async fn write_and_read(&self, commands: &Commands) -> Result<(Reply, Reply, u64)> {
        let (replies, opened) = self.send_noting(commands).await?;
        let mut replies = replies.into_iter();
        match (replies.next(), replies.next()) {
            (Some(w), Some(r)) => Ok((w, r, opened)),
            _ => Err(Error::backend("memcached sent too few replies")),
        }
    }

    /// `Config` for a server run with `-C`: it answers 0 for every item's
    /// CAS, so a renewal (a `cas` that must match) can never succeed and
    /// every lock would end at its first TTL. Asked within `limit`, on its
    /// own time: a proxy or an older server that does not answer `stats
    /// settings` (in time) is let through, since no answer proves nothing.
    pub(crate) async fn cas_kept(&self, limit: std::time::Duration) -> Result<()> {
        let mut ask = Commands::default();
        let settings = tokio::time::timeout(limit, self.one(ask.settings())).await;
        if let Ok(Ok(Reply::CasEnabled(false))) = settings {
            return Err(Error::config(format!(
                "{} runs with CAS disabled (-C): a lock could never be renewed \
                 (its renewal must match the item's CAS); start memcached without -C",
                self.server.addr()
            )));
        }
        Ok(())
    }
}

/// What this client last wrote of one lock it holds.
#[derive(Debug, Clone)]
pub(crate) struct Known {
    pub(crate) cas: u64,
    pub(crate) holds: u32,
    pub(crate) value: Option<Vec<u8>>,
    /// The connections opened when it was written (see `known.rs`: a value
    /// is used only over a connection at least that old).
    pub(crate) opened: u64,
}

/// The most locks remembered; past it the map starts again, and the
/// forgotten ones take the read-then-write path.
const MOST: usize = 100_000;

/// [`Known`] per (item key, owner).
#[derive(Debug, Default)]
pub(crate) struct KnownCas(Mutex<HashMap<(String, String), Known>>);

impl KnownCas {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Known>> {
        lock_unpoisoned(&self.0)
    }

    /// Takes what is known of `owner`'s lock at `k`.
    pub(crate) fn take(&self, k: &str, owner: &OwnerToken) -> Option<Known> {
        self.map()
            .remove(&(k.to_owned(), owner.as_str().to_owned()))
    }

    pub(crate) fn put(&self, k: &str, owner: &OwnerToken, known: Known) {
        let mut map = self.map();
        if map.len() >= MOST {
            map.clear();
        }
        map.insert((k.to_owned(), owner.as_str().to_owned()), known);
    }

    /// Remembers `read` (the `mg` sent right after our own write, in the
    /// same exchange) if it is `owner`'s lock with `holds` holds.
    pub(crate) fn note(
        &self,
        k: &str,
        owner: &OwnerToken,
        holds: u32,
        read: Option<&Item>,
        opened: u64,
    ) {
        match read {
            Some(Item {
                body: Body::Lock(h),
                cas,
                ..
            // A server run with CAS off (`-C`) answers 0 for every item: a
            // write over it would match anyone's.
            }) if h.owner == owner.as_str() && h.holds == holds && *cas != 0 => self.put(
                k,
                owner,
                Known {
                    cas: *cas,
                    holds,
                    value: h.value.clone(),
                    opened,
                },
            ),
            _ => {
                self.take(k, owner);
            }
        }
    }
}
