//! A semaphore's permit at once: when nobody is at the gate, the lease is
//! made and counted without it, in two requests sent together (Curator's
//! way takes three round trips: the gate, the lease, the gate's delete).
//!
//! The gate (`P/locks`) is not what keeps the count. A lease is held when
//! a listing made after it was created numbers at most N. Of any N + 1
//! leases held at once, the one created last was listed, in its session's
//! order, by a server that had applied its create and so every create
//! before it: that listing counted them all. No lease needs the gate to
//! be safe, a Java peer's included. The gate
//! gives order and progress: a waiting lease counts against N, so only
//! the gate's holder may keep one while it waits. So the attempt here
//! makes its lease, then reads the gate, the leases, their N and the
//! name's other contenders in one `multiRead` (ZooKeeper 3.6 or later; an
//! older server is left to the gate's way), and keeps the lease only when
//! it is held and nobody was at the gate. Otherwise the lease's delete is
//! sent at once (the server answers a session's requests in order, so it
//! is gone before any later request of ours is served), and the attempt
//! takes the gate as Curator does. A gate holder that counted the lease
//! meanwhile is woken by its delete.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use lockwright_core::backend::{refusal, Found, Grant, HoldId};
use lockwright_core::{Claim, LockKey, OwnerToken, Result};
use zookeeper_client::{Client, CreateMode, Error as ZkError, MultiReadResult};

use crate::claims::{other_kind, Undo};
use crate::cleanup::delete_surely;
use crate::error::{is_transient, map_err};
use crate::layout::{self, Role, SEM_LEASES, SEM_LOCKS};
use crate::node::{Contender, Session};
use crate::state::Inner;

impl Inner {
    /// A permit of `n` for `hold.owner` without the gate, if nobody is at
    /// the gate and fewer than `n` leases are out; `None` leaves nothing
    /// made, for the gate's way (which also makes missing directories,
    /// writes a new semaphore's N and waits).
    pub(crate) async fn permit_at_once(
        &self,
        session: &Arc<Session>,
        hold: &HoldId,
        n: u32,
        ticket: Option<&OwnerToken>,
    ) -> Result<Option<Grant>> {
        let key = &hold.key;
        if self.no_multi_read.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let client = &session.client;
        let key_dir = self.dir(key);
        let leases = format!("{key_dir}/{SEM_LEASES}");
        let prefix = layout::contender_prefix(Role::Lease(n), hold.owner.tag());
        // A lease whose create was answered into silence is found by its
        // prefix and deleted, if the caller goes meanwhile or this fails.
        let pending = Undo {
            session: session.clone(),
            path: None,
            find: Some((leases.clone(), prefix.clone())),
        };
        let options = CreateMode::EphemeralSequential.with_acls(self.sessions.acls());
        // Each request is sent as it is made, so the reads follow the create.
        let path = format!("{leases}/{prefix}");
        let create = client.create(&path, &[], &options);
        let mut reads = client.new_multi_reader();
        for dir in [&format!("{key_dir}/{SEM_LOCKS}"), &leases, &key_dir] {
            reads.add_get_children(dir).map_err(map_err)?;
        }
        reads.add_get_data(&leases).map_err(map_err)?;
        let read = reads.commit();
        let (created, read) = session
            .call(async { Ok(futures::future::join(create, read).await) })
            .await
            .map_err(map_err)?;
        let lease = match created {
            Ok((stat, sequence)) => Contender {
                session: session.clone(),
                path: format!("{leases}/{prefix}{sequence}"),
                czxid: stat.czxid,
            },
            Err(ZkError::NoNode) => {
                pending.disarm();
                return Ok(None);
            }
            Err(e) => {
                if !is_transient(&e) {
                    pending.disarm();
                }
                return Err(map_err(e));
            }
        };
        pending.disarm();
        let undo = Undo::node(&lease);
        let results = match read {
            Ok(r) => r,
            Err(ZkError::Unimplemented) => {
                // No multiRead on this server (before 3.6): the gate's way
                // from now on. Such a server also drops the connection, so
                // this one attempt may fail as the store being away.
                tracing::debug!("no multiRead: semaphores take the gate");
                self.no_multi_read.store(true, Ordering::Relaxed);
                return Ok(None);
            }
            Err(e) => return Err(map_err(e)),
        };
        let keep = match lease_kept(key, n, &lease, &results) {
            Ok(keep) => keep,
            Err(refused) => {
                // The lease goes before the refusal is told: another
                // client asking next must not meet it as a holder of this
                // N (our own session's requests would be served after
                // the delete anyway, another's would not).
                undo.disarm();
                let _ = crate::cleanup::delete(lease).await;
                return Err(refused);
            }
        };
        undo.disarm();
        if keep {
            let grant = lease.grant(1);
            self.hold(hold, lease, ticket.cloned());
            return Ok(Some(grant));
        }
        give_back(client, lease);
        Ok(None)
    }
}

/// Whether our `lease` may be kept, judged from the `multiRead`'s
/// `results` (the gate's, the leases' and the key directory's children,
/// then the leases' N): held among at most `n`, nobody at the gate, and
/// kept with our N; an error if the name is another kind's, or its live
/// leases are kept with another N.
fn lease_kept(
    key: &LockKey,
    n: u32,
    lease: &Contender,
    results: &[MultiReadResult],
) -> Result<bool> {
    let children = |i: usize| match results.get(i) {
        Some(MultiReadResult::Children { children }) => Some(children.as_slice()),
        _ => None,
    };
    let at_gate = children(0).is_some_and(|c| c.iter().any(|c| layout::is_contender(c)));
    if let Some(e) = children(2).and_then(|others| other_kind(key, n, others)) {
        return Err(e);
    }
    let kept = match results.get(3) {
        Some(MultiReadResult::Data { data, .. }) => std::str::from_utf8(data).ok(),
        _ => None,
    };
    let name = lease.path.rsplit('/').next().unwrap_or_default();
    // Live leases kept with another N refuse us here, as at the gate:
    // a holder's gate node whose delete is still in flight must not
    // turn a refusal into contention.
    let others_hold = children(1).is_some_and(|c| c.iter().any(|c| c != name));
    if let Some(k) = kept.and_then(|t| t.parse::<u32>().ok()) {
        if k != n && others_hold {
            let found = Found::semaphore(k);
            return Err(refusal(key, Claim::Exclusive { permits: n }, found));
        }
    }
    let held = children(1).is_some_and(|c| c.len() <= n as usize && c.iter().any(|c| c == name));
    Ok(held && !at_gate && kept == Some(n.to_string().as_str()))
}

/// Deletes our lease, not kept: the delete is sent now (so it is gone
/// before any later request of ours is served) and its answer awaited in
/// the background, where a transient failure is followed by a sure delete.
fn give_back(client: &Client, lease: Contender) {
    let sent = client.delete(&lease.path, None);
    tokio::spawn(async move {
        if let Err(e) = sent.await {
            if is_transient(&e) {
                delete_surely(lease.session, lease.path).await;
            }
        }
    });
}
