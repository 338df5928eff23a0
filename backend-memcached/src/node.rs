//! [`Node`]: locks on one memcached server, as a lease backend (alone, or
//! one vote of a quorum).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use locksmith_core::backend::{Acquire, Capabilities, Grant, LockBackend, Release, Renew};
use locksmith_core::{Error, LockKey, LockStatus, OwnerToken, Result};
use memcache::exp::{AsyncMetaClient, Meta, MutationStatus, Ttl};
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

/// The shortest TTL: memcached counts whole seconds, and an item stored
/// for N seconds may expire after N − 1 of them.
pub(crate) const MIN_TTL: Duration = Duration::from_secs(2);
/// memcached's clock ticks once a second.
pub(crate) const RESOLUTION: Duration = Duration::from_secs(1);
/// memcached's longest key.
const MAX_KEY: usize = 250;
/// How often a read-then-compare-and-write is tried again when the item
/// changed in between (a re-entry or renewal racing another of ours).
const CAS_TRIES: usize = 4;

/// One memcached server.
pub(crate) struct Node {
    server: String,
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    client: OnceCell<AsyncMetaClient>,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("server", &self.server)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The item's value: whose lock it is, and how many holds.
struct Holder {
    owner: String,
    holds: u32,
}

impl Holder {
    fn parse(value: &[u8]) -> Option<Holder> {
        let text = std::str::from_utf8(value).ok()?;
        let (owner, holds) = text.rsplit_once(' ')?;
        Some(Holder {
            owner: owner.to_owned(),
            holds: holds.parse().ok()?,
        })
    }
}

fn value(owner: &OwnerToken, holds: u32) -> String {
    format!("{} {holds}", owner.as_str())
}

/// The TTL sent: whole seconds rounded up, plus one, because the server
/// may expire an item stored for N seconds after N − 1 (its clock ticks
/// once a second). The lease then lasts at least the TTL asked for and at
/// most two seconds more. Above 30 days the client sends the absolute time
/// memcached requires.
fn store_ttl(ttl: Duration) -> Ttl {
    Ttl::from(ttl.saturating_add(RESOLUTION))
}

pub(crate) fn map_err(e: memcache::exp::Error) -> Error {
    use memcache::exp::Error as E;
    match e {
        E::Io(_) | E::Timeout { .. } | E::Ambiguous { .. } | E::Server(_) => {
            Error::unavailable("cannot reach memcached").with_source(e)
        }
        _ => Error::backend("memcached answered with an error").with_source(e),
    }
}

impl Node {
    pub(crate) fn new(
        server: &str,
        prefix: &str,
        timeout: Duration,
        connect_timeout: Duration,
    ) -> Self {
        Node {
            server: server.to_owned(),
            prefix: prefix.to_owned(),
            timeout,
            connect_timeout,
            client: OnceCell::new(),
        }
    }

    /// The memcached key of a lock: `<prefix><key>` when the key is
    /// printable ASCII without spaces, does not start with `#` and fits in
    /// 250 bytes; otherwise `<prefix>#` and the SHA-256 of the key in hex.
    /// A plain key never starts with `#`, so no two keys share an item.
    pub(crate) fn item_key(prefix: &str, key: &LockKey) -> String {
        let k = key.as_str();
        let plain = !k.starts_with('#')
            && prefix.len() + k.len() <= MAX_KEY
            && k.bytes().all(|b| (0x21..=0x7e).contains(&b));
        if plain {
            format!("{prefix}{k}")
        } else {
            format!("{prefix}#{}", hex::encode(Sha256::digest(k.as_bytes())))
        }
    }

    fn key(&self, key: &LockKey) -> String {
        Self::item_key(&self.prefix, key)
    }

    async fn client(&self) -> Result<&AsyncMetaClient> {
        self.client
            .get_or_try_init(|| async {
                AsyncMetaClient::builder()
                    .connect_timeout(Some(self.connect_timeout))
                    .io_timeout(Some(self.timeout))
                    .connect_async(self.server.as_str())
                    .await
                    .map_err(|e| {
                        Error::unavailable(format!("cannot reach memcached at {}", self.server))
                            .with_source(e)
                    })
            })
            .await
    }

    /// `fut` within the per-request timeout: the client's own deadline
    /// covers one exchange, this one a redial too.
    async fn bounded<T>(&self, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        let budget = self.timeout + self.connect_timeout;
        match tokio::time::timeout(budget, fut).await {
            Ok(r) => r,
            Err(_) => Err(Error::unavailable(format!(
                "no answer from memcached at {} within {budget:?}",
                self.server
            ))),
        }
    }

    /// The item: its holder, CAS and seconds left; `None` on a miss.
    async fn read(
        &self,
        c: &AsyncMetaClient,
        k: &str,
    ) -> Result<Option<(Holder, u64, Option<i64>)>> {
        let got = c
            .get(k)
            .meta(Meta::NONE.cas().ttl())
            .send()
            .await
            .map_err(map_err)?;
        if !got.hit() {
            return Ok(None);
        }
        let holder = got
            .value
            .as_deref()
            .and_then(Holder::parse)
            .ok_or_else(|| Error::backend(format!("the item {k:?} is not a locksmith lock")))?;
        let cas = got
            .item
            .cas
            .ok_or_else(|| Error::backend("memcached returned no CAS"))?;
        Ok(Some((holder, cas, got.item.ttl)))
    }
}

#[async_trait]
impl LockBackend for Node {
    fn capabilities(&self) -> Capabilities {
        // No fences: items can be evicted and the CAS counter restarts
        // with the server (see the crate docs).
        Capabilities::default()
            .with_min_ttl(MIN_TTL)
            .with_ttl_resolution(RESOLUTION)
    }

    async fn verify(&self) -> Result<()> {
        self.bounded(async {
            let c = self.client().await?;
            c.noop().await.map_err(map_err)
        })
        .await
    }

    async fn try_acquire(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        ttl: Duration,
    ) -> Result<Acquire> {
        let k = self.key(key);
        self.bounded(async {
            let c = self.client().await?;
            for _ in 0..CAS_TRIES {
                let added = c
                    .set(&k, value(owner, 1))
                    .add()
                    .ttl(store_ttl(ttl))
                    .send()
                    .await
                    .map_err(map_err)?;
                if added.applied() {
                    return Ok(Acquire::Acquired(Grant {
                        fence: None,
                        holds: 1,
                        lease: None,
                    }));
                }
                let Some((holder, cas, left)) = self.read(c, &k).await? else {
                    // Released (or expired) since our add found it held:
                    // under contention it is taken again at once, so this
                    // attempt's answer is "held", and the caller comes back.
                    return Ok(Acquire::Contended { retry_after: None });
                };
                if holder.owner != owner.as_str() {
                    let retry_after = left
                        .and_then(|s| u64::try_from(s).ok())
                        .map(Duration::from_secs);
                    return Ok(Acquire::Contended { retry_after });
                }
                // Re-entry: one more hold, and the lease extended.
                let holds = holder.holds.saturating_add(1);
                let set = c
                    .set(&k, value(owner, holds))
                    .compare_cas(cas)
                    .ttl(store_ttl(ttl))
                    .send()
                    .await
                    .map_err(map_err)?;
                if set.applied() {
                    return Ok(Acquire::Acquired(Grant {
                        fence: None,
                        holds,
                        lease: None,
                    }));
                }
            }
            Err(Error::unavailable(format!(
                "the lock {key} kept changing under {CAS_TRIES} attempts"
            )))
        })
        .await
    }

    async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        let k = self.key(key);
        self.bounded(async {
            let c = self.client().await?;
            for _ in 0..CAS_TRIES {
                let Some((holder, cas, left)) = self.read(c, &k).await? else {
                    return Ok(Release::NotHeld);
                };
                if holder.owner != owner.as_str() {
                    return Ok(Release::NotHeld);
                }
                let status = if holder.holds <= 1 {
                    c.delete(&k)
                        .compare_cas(cas)
                        .send()
                        .await
                        .map_err(map_err)?
                        .status
                } else {
                    // One hold fewer; the lease left is kept, never shortened.
                    let left = left.and_then(|s| u64::try_from(s).ok()).unwrap_or(0);
                    c.set(&k, value(owner, holder.holds - 1))
                        .compare_cas(cas)
                        .ttl(store_ttl(Duration::from_secs(left)))
                        .send()
                        .await
                        .map_err(map_err)?
                        .status
                };
                match status {
                    MutationStatus::Applied if holder.holds <= 1 => return Ok(Release::Freed),
                    MutationStatus::Applied => return Ok(Release::StillHeld(holder.holds - 1)),
                    MutationStatus::NotFound => return Ok(Release::NotHeld),
                    _ => {} // changed in between: look again
                }
            }
            Err(Error::unavailable(format!(
                "the lock {key} kept changing under {CAS_TRIES} attempts"
            )))
        })
        .await
    }

    async fn renew(&self, key: &LockKey, owner: &OwnerToken, ttl: Duration) -> Result<Renew> {
        let k = self.key(key);
        self.bounded(async {
            let c = self.client().await?;
            for _ in 0..CAS_TRIES {
                let Some((holder, cas, _)) = self.read(c, &k).await? else {
                    return Ok(Renew::NotHeld);
                };
                if holder.owner != owner.as_str() {
                    return Ok(Renew::NotHeld);
                }
                // `mg … T` would touch without checking the CAS: store the
                // same value again, compared.
                let set = c
                    .set(&k, value(owner, holder.holds))
                    .compare_cas(cas)
                    .ttl(store_ttl(ttl))
                    .send()
                    .await
                    .map_err(map_err)?;
                match set.status {
                    MutationStatus::Applied => return Ok(Renew::Renewed),
                    MutationStatus::NotFound => return Ok(Renew::NotHeld),
                    _ => {}
                }
            }
            Err(Error::unavailable(format!(
                "the lock {key} kept changing under {CAS_TRIES} attempts"
            )))
        })
        .await
    }

    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        let k = self.key(key);
        self.bounded(async {
            let c = self.client().await?;
            Ok(match self.read(c, &k).await? {
                None => LockStatus::free(),
                Some((holder, _, left)) => {
                    // `t` seconds left means somewhere in (t − 1, t].
                    let left = left
                        .and_then(|s| u64::try_from(s).ok())
                        .map(|s| Duration::from_secs(s.saturating_sub(1)));
                    LockStatus::held(holder.holds)
                        .with_remaining(left)
                        .with_owner(OwnerToken::from_string(holder.owner).ok())
                }
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_injectively_within_250_bytes() {
        let k = |s: &str| Node::item_key("ls:", &LockKey::new(s).unwrap());
        assert_eq!(k("orders/42"), "ls:orders/42");
        let hashed = [
            k("a b"),
            k("#x"),
            k("ключ"),
            k(&"x".repeat(248)),
            k("tab\t"),
        ];
        for h in &hashed {
            assert!(h.starts_with("ls:#") && h.len() == 3 + 1 + 64, "{h}");
        }
        let distinct: std::collections::HashSet<_> = hashed.iter().collect();
        assert_eq!(distinct.len(), hashed.len());
        assert_eq!(k(&"x".repeat(247)).len(), 250);
    }

    #[test]
    fn ttls_round_up_and_add_a_tick() {
        assert_eq!(store_ttl(Duration::from_millis(2000)), Ttl::secs(3));
        assert_eq!(store_ttl(Duration::from_millis(2001)), Ttl::secs(4));
    }
}
