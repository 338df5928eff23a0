//! The fast paths: the CAS value this client's own last write of a lock
//! left, so that a release (`md … C<cas>`) and a renewal (`cas`) need not
//! read the item first. A CAS value names one version of one item: a
//! write over it succeeds only if nobody changed the item since, so the
//! owner need not be checked again. Anything else (the item changed, a
//! connection opened since, a re-entrant hold) takes the read-then-write
//! path, which checks the owner.
//!
//! memcached restarts its CAS counter with the server, and a new process
//! could give another owner's item the number we remember. So a value is
//! used only over a connection opened before the write that returned it
//! ([`Server::exchange_within`](crate::wire::Server::exchange_within)):
//! a restart breaks every such connection.

use std::collections::HashMap;
use std::sync::Mutex;

use lockwright_core::backend::{Acquire, Grant, Renew, RenewRequest};
use lockwright_core::{Claim, Error, OwnerToken, Result};

use crate::error;
use crate::layout::{encode, store_ttl, Body, Item};
use crate::node::Node;
use crate::wire::{Commands, Reply};

/// A grant of a lock's `holds`th hold (no fences here).
pub(crate) fn grant(holds: u32) -> Acquire {
    Acquire::Acquired(Grant {
        fence: None,
        holds,
        lease: None,
    })
}

/// What this client last wrote of one lock it holds.
#[derive(Debug, Clone)]
pub(crate) struct Known {
    pub(crate) cas: u64,
    pub(crate) holds: u32,
    pub(crate) value: Option<Vec<u8>>,
    /// The connections opened when it was written (see the module docs).
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
        self.0.lock().unwrap_or_else(|e| e.into_inner())
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

impl Node {
    /// A lone hold's release in one round trip: `md` over the version we
    /// wrote last. `None`: nothing known, the item changed, or no
    /// connection old enough was free; the caller reads and checks.
    pub(crate) async fn release_known(&self, k: &str, owner: &OwnerToken) -> Result<Option<bool>> {
        let Some(known) = self.known.take(k, owner) else {
            return Ok(None);
        };
        if known.holds != 1 {
            return Ok(None);
        }
        let mut c = Commands::default();
        c.delete(k, known.cas);
        let Some((replies, _)) = self.send_within(&c, known.opened).await? else {
            return Ok(None);
        };
        match replies.into_iter().next() {
            Some(Reply::Stored) => Ok(Some(true)),
            // No such item: nobody holds it.
            Some(Reply::NotFound) => Ok(Some(false)),
            _ => Ok(None),
        }
    }
}

impl Node {
    /// Renews, in one round trip, every mutex lease in `requests` whose
    /// last version we know (and that `results` has no answer for yet):
    /// a `cas` over it, and an `mg` after it for the next time. Those it
    /// could not renew so are left for the read-then-write path.
    pub(crate) async fn renew_known(
        &self,
        requests: &[RenewRequest],
        keys: &[String],
        results: &mut [Option<Result<Renew>>],
    ) {
        let picked: Vec<(usize, Known)> = requests
            .iter()
            .enumerate()
            .filter(|(i, r)| results[*i].is_none() && r.owner.claim() == Claim::MUTEX)
            .filter_map(|(i, r)| self.known.take(&keys[i], &r.owner).map(|k| (i, k)))
            .collect();
        let Some(bound) = picked.iter().map(|(_, k)| k.opened).min() else {
            return;
        };
        let mut c = Commands::default();
        for (i, k) in &picked {
            let r = &requests[*i];
            let data = encode(&r.owner, k.holds, k.value.as_deref());
            c.cas(&keys[*i], &data, store_ttl(r.ttl), k.cas)
                .get(&keys[*i]);
        }
        // A failure here is met again, and reported, on the slower path.
        let Ok(Some((replies, opened))) = self.bounded(self.send_within(&c, bound)).await else {
            return;
        };
        let mut replies = replies.into_iter();
        for (i, k) in picked {
            let (Some(stored), Some(read)) = (replies.next(), replies.next()) else {
                break;
            };
            if matches!(stored, Reply::Stored) {
                let (key, owner) = (&keys[i], &requests[i].owner);
                let read = self.item(key, read).ok().flatten();
                self.known.note(key, owner, k.holds, read.as_ref(), opened);
                results[i] = Some(Ok(Renew::Renewed));
            }
        }
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
    /// if one is free (see the module docs); `None` if not.
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
}

impl Node {
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
