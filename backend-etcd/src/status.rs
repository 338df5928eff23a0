//! What `status` reads of a name's line: its first key (a mutex's, a
//! writer's or a leader's, with the value it advertises), or the holders
//! of a semaphore or of readers at its head; and each holder's lease left,
//! as the cluster counts it.

use std::collections::HashMap;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp};
use lockwright_core::backend::lock_unpoisoned;
use lockwright_core::identity::{is_record_name, is_tag, RECORD_PREFIX};
use lockwright_core::{Claim, Holder, LockKey, LockStatus, Result};

use crate::claims;
use crate::layout::{first_created, name_of, names_starting};
use crate::node::{got, within};
use crate::state::{fence, Inner};

impl Inner {
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        let prefix = self.prefix(key);
        // The holder with its value (a leader's proposal), and how many
        // contenders there are, in one read.
        let txn = Txn::new().and_then([
            TxnOp::get(prefix.as_str(), Some(first_created())),
            TxnOp::get(
                prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ),
        ]);
        let resp = self.node.txn(txn).await?;
        let Some(first) = got(&resp, 0).into_iter().next() else {
            return Ok(LockStatus::free());
        };
        if claims::claim_of(first.value()) != Claim::MUTEX {
            return self.group_status(key, &prefix).await;
        }
        let count = match resp.op_responses().into_iter().nth(1) {
            Some(etcd_client::TxnOpResponse::Get(g)) => g.count(),
            _ => 1,
        };
        let rev = first.create_revision();
        let waiters = u32::try_from(count.saturating_sub(1)).unwrap_or(u32::MAX);
        // Side by side: the record read adds no round trip.
        let lease = [first.lease()];
        let (left, tags) = futures::join!(
            self.lease_left(first.lease()),
            self.tags_by_lease(key, &lease)
        );
        let left = left?;
        Ok(LockStatus::held(self.holds_of(key, rev))
            .with_id(id_of(&prefix, &first))
            .with_tag(tags.get(&first.lease()).cloned())
            .with_fence(fence(rev))
            .with_remaining(left)
            .with_waiters(Some(waiters))
            .with_value(Some(first.value().to_vec())))
    }

    /// The tags of the identity records on `leases`: a locker that
    /// records who holds keeps its record on its backend's session lease,
    /// as its holds, so a record's key on a holder's lease names the
    /// holder's tag. Best effort: a failed read names none, and a lease
    /// with two records (two lockers sharing one backend) names neither.
    async fn tags_by_lease(&self, key: &LockKey, leases: &[i64]) -> HashMap<i64, String> {
        if is_record_name(key.as_str()) || leases.iter().all(|l| *l == 0) {
            return HashMap::new();
        }
        let root = &self.node.config.root;
        let range = names_starting(root, RECORD_PREFIX);
        let opts = GetOptions::new().with_prefix().with_keys_only();
        let Ok(got) = self.node.get(&range, Some(opts)).await else {
            return HashMap::new();
        };
        let mut tags: HashMap<i64, Option<String>> = HashMap::new();
        for kv in got.kvs().iter().filter(|kv| leases.contains(&kv.lease())) {
            let Some(tag) = kv
                .key_str()
                .ok()
                .and_then(|k| name_of(root, k))
                .and_then(|n| n.strip_prefix(RECORD_PREFIX).map(str::to_owned))
                .filter(|t| is_tag(t))
            else {
                continue;
            };
            // Two lockers on one backend share its lease: whose hold it
            // is cannot be told, so neither is named.
            tags.entry(kv.lease())
                .and_modify(|seen| *seen = None)
                .or_insert(Some(tag));
        }
        tags.into_iter()
            .filter_map(|(lease, tag)| Some((lease, tag?)))
            .collect()
    }

    /// What the cluster says `lease` has left, in whole seconds (as etcd
    /// counts them); `None` for a key on no lease, or a lease just gone.
    async fn lease_left(&self, lease: i64) -> Result<Option<Duration>> {
        if lease == 0 {
            return Ok(None);
        }
        let client = self.node.client().await?;
        let asked = within(self.node.config.timeout, async move {
            let mut c = client;
            c.lease_time_to_live(lease, None).await
        })
        .await?;
        Ok(u64::try_from(asked.ttl()).ok().map(Duration::from_secs))
    }

    /// A semaphore's or readers' holders, each with its fence, and the
    /// rest of the line as waiters.
    async fn group_status(&self, key: &LockKey, prefix: &str) -> Result<LockStatus> {
        let read = claims::line_read(Claim::Shared);
        let got = self.node.get(prefix, Some(read)).await?;
        let line = got.kvs();
        let holding = claims::holders(line);
        let leases: Vec<i64> = holding.iter().map(|kv| kv.lease()).collect();
        let (lefts, tags) = futures::join!(
            futures::future::try_join_all(leases.iter().map(|l| self.lease_left(*l))),
            self.tags_by_lease(key, &leases)
        );
        let lefts = lefts?;
        let holders = holding
            .iter()
            .zip(lefts)
            .map(|(kv, left)| {
                let shared = claims::claim_of(kv.value()).is_shared();
                Holder::new(shared, self.holds_of(key, kv.create_revision()))
                    .with_id(id_of(prefix, kv))
                    .with_tag(tags.get(&kv.lease()).cloned())
                    .with_fence(fence(kv.create_revision()))
                    .with_remaining(left)
            })
            .collect();
        let waiting = u32::try_from(line.len() - holding.len()).unwrap_or(u32::MAX);
        let permits = line
            .first()
            .and_then(|kv| claims::claim_of(kv.value()).exclusive_permits());
        Ok(LockStatus::of_holders(holders)
            .with_waiters(Some(waiting))
            .with_permits(permits))
    }

    /// The holds this backend has on the key made at `rev` (1 for
    /// another's).
    fn holds_of(&self, key: &LockKey, rev: i64) -> u32 {
        lock_unpoisoned(&self.held)
            .iter()
            .filter(|((k, _), h)| k == key && h.rev == rev)
            .map(|(_, h)| h.holds)
            .max()
            .unwrap_or(1)
    }

    /// The names of the contenders' keys under the root starting with
    /// `name_prefix`, from one keys-only range read.
    pub(crate) async fn list(&self, name_prefix: &str) -> Result<Vec<LockKey>> {
        let root = &self.node.config.root;
        let range = names_starting(root, name_prefix);
        let opts = GetOptions::new().with_prefix().with_keys_only();
        let got = self.node.get(&range, Some(opts)).await?;
        let mut names: Vec<LockKey> = got
            .kvs()
            .iter()
            .filter_map(|kv| kv.key_str().ok())
            .filter_map(|k| name_of(root, k))
            .filter_map(|n| LockKey::new(n).ok())
            .collect();
        names.dedup();
        Ok(names)
    }

    /// Deletes the key of the holder `inspect` lists as `holder` (only a
    /// listed holder's, so no other key can be named), and only as it was
    /// listed: its create revision is the fence it was listed with, so a
    /// hold made again on the same key since (the id names the backend's
    /// lease, which a later acquire by the same process reuses) is not
    /// touched. Its backend's next renewal reads the key gone; a holder
    /// queued after it was created later and has a higher fence. (A
    /// downgrade's read hold has a fence from the downgrade, above a writer
    /// queued before it: see the crate docs.) A Go or `etcdctl` holder
    /// never reads its key again, as with `etcdctl del`.
    pub(crate) async fn force_release(&self, key: &LockKey, holder: &str) -> Result<bool> {
        let status = self.inspect(key).await?;
        let Some(rev) = status
            .holder(holder)
            .and_then(|h| h.fence)
            .and_then(|f| i64::try_from(f.0).ok())
        else {
            return Ok(false);
        };
        let contender = format!("{}{holder}", self.prefix(key));
        let txn = Txn::new()
            .when([Compare::create_revision(
                contender.as_str(),
                CompareOp::Equal,
                rev,
            )])
            .and_then([TxnOp::delete(contender.as_str(), None)]);
        Ok(self.node.txn(txn).await?.succeeded())
    }
}

/// A contender's id: its key after the name's prefix (the lease in hex,
/// as `etcdctl get --prefix` shows it).
fn id_of(prefix: &str, kv: &KeyValue) -> Option<String> {
    let key = kv.key_str().ok()?;
    key.strip_prefix(prefix).map(str::to_owned)
}
