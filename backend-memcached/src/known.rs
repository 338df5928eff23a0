//! The fast paths: the CAS value this client's own last write of a lock
//! left (kept per node in [`KnownCas`](crate::node::KnownCas)), so that a
//! release (`md … C<cas>`) and a renewal (`cas`) need not read the item
//! first. A CAS value names one version of one item: a
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

use lockwright_core::backend::{Renew, RenewRequest};
use lockwright_core::{Claim, OwnerToken, Result};

use crate::layout::{encode, store_ttl};
use crate::node::{Known, Node};
use crate::wire::{Commands, Reply};

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
            .filter(|(i, r)| results[*i].is_none() && r.hold.claim() == Claim::MUTEX)
            .filter_map(|(i, r)| self.known.take(&keys[i], r.owner()).map(|k| (i, k)))
            .collect();
        let Some(bound) = picked.iter().map(|(_, k)| k.opened).min() else {
            return;
        };
        let mut c = Commands::default();
        for (i, k) in &picked {
            let r = &requests[*i];
            let data = encode(r.owner(), k.holds, k.value.as_deref());
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
                let (key, owner) = (&keys[i], requests[i].owner());
                let read = self.item(key, read).ok().flatten();
                self.known.note(key, owner, k.holds, read.as_ref(), opened);
                results[i] = Some(Ok(Renew::Renewed));
            }
        }
    }
}
