//! Renewals: every hold of a batch confirmed at once, with one
//! keep-alive of the lease and one read of every key.

use etcd_client::{KeyValue, Txn, TxnOp};
use lockwright_core::backend::{lock_unpoisoned, Renew, RenewRequest};
use lockwright_core::Result;

use crate::node::got;
use crate::state::{Hold, Inner};

impl Inner {
    /// Every renewal of a batch in two round trips at once: one keep-alive
    /// of the lease, and one read of every key.
    pub(crate) async fn renew_many(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        let holds: Vec<Option<Hold>> = {
            let held = lock_unpoisoned(&self.held);
            requests
                .iter()
                .map(|r| held.get(&(r.key().clone(), r.owner().clone())).cloned())
                .collect()
        };
        let live: Vec<&Hold> = holds
            .iter()
            .flatten()
            .filter(|h| !h.session.is_dead())
            .collect();
        let Some(session) = live.first().map(|h| h.session.clone()) else {
            return self.settle(requests, &holds, &[]);
        };
        let txn = Txn::new().and_then(
            live.iter()
                .map(|h| TxnOp::get(h.key.as_str(), None))
                .collect::<Vec<_>>(),
        );
        let (alive, read) = futures::join!(session.keep_alive(), session.read(txn));
        let found = match (alive, read) {
            (Ok(true), Ok(resp)) => (0..live.len())
                .filter_map(|i| got(&resp, i).first().cloned())
                .collect::<Vec<_>>(),
            (Ok(false), _) => Vec::new(),
            (Err(e), _) | (_, Err(e)) => return requests.iter().map(|_| Err(e.clone())).collect(),
        };
        self.settle(requests, &holds, &found)
    }

    /// Each request `Renewed` when its hold's key is among `found` as this
    /// grant made it on a live lease, else `NotHeld` (and forgotten).
    fn settle(
        &self,
        requests: &[RenewRequest],
        holds: &[Option<Hold>],
        found: &[KeyValue],
    ) -> Vec<Result<Renew>> {
        requests
            .iter()
            .zip(holds)
            .map(|(r, h)| {
                let ours = h.as_ref().is_some_and(|h| {
                    !h.session.is_dead()
                        && found.iter().any(|kv| {
                            kv.key() == h.key.as_bytes()
                                && kv.create_revision() == h.rev
                                && kv.lease() == h.session.id
                        })
                });
                if let (false, Some(h)) = (ours, h) {
                    self.forget(&(r.key().clone(), r.owner().clone()), h);
                }
                Ok(if ours { Renew::Renewed } else { Renew::NotHeld })
            })
            .collect()
    }
}
