//! Semaphores and read-write locks in Curator's layouts (see `layout`):
//! a semaphore's lease, taken at its gate as `InterProcessSemaphoreV2`
//! takes one; a writer's downgrade, as Curator 5.5's; what a claim meets
//! when the name is held as another kind; and the holders of a group.
//!
//! The semaphore's rule is Curator's, to the letter, or Java peers would
//! miscount: first in the gate's queue (`P/locks`), make the lease node,
//! then list the lease directory; the lease is held once the listing,
//! ours included, numbers at most N. Only the gate's holder waits with a
//! lease, so at most one waiting lease counts against N (besides the
//! short-lived ones of gate-less attempts, see `claims_permit.rs`, which
//! go at once unless held; a gate holder that counted one waits for its
//! delete). A waiter keeps the gate and its lease node, and lists again
//! when the lease directory's children change. The gate goes as soon as
//! the lease is held, or given up.

use std::sync::{Arc, Weak};

use lockwright_core::backend::{judge, lock_unpoisoned, refusal, Acquire, Found, Grant, HoldId};
use lockwright_core::{Claim, Error, LockKey, OwnerToken, Result};
use zookeeper_client::{CreateMode, Error as ZkError, OneshotWatcher};

use crate::cleanup::{delete_surely, find_and_delete, RETRY_PAUSE};
use crate::error::{is_session_over, is_transient, map_err};
use crate::layout::{self, Role, SEM_LEASES};
use crate::node::{Contender, Session};
use crate::state::{Entered, Inner};

/// What one listing of the lease directory says of our lease.
pub(crate) enum Step {
    /// At most N leases, ours included: held.
    Granted,
    /// More than N: wait for this watch on the lease directory.
    Full(OneshotWatcher),
    /// The name is held as another kind, or with another N.
    Refused(Error),
    /// Our lease node is not listed (its session ended).
    Gone,
}

/// Deletes a node of ours, or the node a create with `prefix` may have
/// made, when dropped armed: a cancelled acquire leaves neither its gate,
/// which would stop every semaphore acquirer, nor a lease behind.
pub(crate) struct Undo {
    pub(crate) session: Arc<Session>,
    pub(crate) path: Option<String>,
    pub(crate) find: Option<(String, String)>,
}

impl Undo {
    pub(crate) fn node(node: &Contender) -> Undo {
        Undo {
            session: node.session.clone(),
            path: Some(node.path.clone()),
            find: None,
        }
    }

    pub(crate) fn disarm(mut self) {
        self.path = None;
        self.find = None;
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if let Some(path) = self.path.take() {
            rt.spawn(delete_surely(self.session.clone(), path));
        }
        if let Some((dir, prefix)) = self.find.take() {
            rt.spawn(find_and_delete(self.session.clone(), dir, prefix));
        }
    }
}

/// Makes our lease node (if `lease` has none yet) with `prefix` in the
/// semaphore's lease directory under `key_dir`, then lists the leases
/// (with a watch), reads the N they are kept with, and lists `key_dir`
/// for a mutex's or read-write lock's contenders, in one round trip.
pub(crate) async fn lease_step(
    inner: &Inner,
    session: &Arc<Session>,
    key: &LockKey,
    n: u32,
    key_dir: &str,
    prefix: &str,
    lease: &mut Option<Contender>,
) -> std::result::Result<Step, ZkError> {
    let client = &session.client;
    let leases = format!("{key_dir}/{SEM_LEASES}");
    // Our lease node, if not made yet, and the listings in one round trip:
    // the server answers a session's requests in order, so the listing
    // holds the node.
    let mut dirs_made = 0;
    let (listed, kept, others) = loop {
        // Made first, so sent first (the client sends a request when its
        // future is made, not when it is polled).
        let options = CreateMode::EphemeralSequential.with_acls(inner.sessions.acls());
        let path = format!("{leases}/{prefix}");
        let create: futures::future::OptionFuture<_> = lease
            .is_none()
            .then(|| client.create(&path, &[], &options))
            .into();
        let (created, listed, kept, others) = session
            .call(async {
                Ok(futures::future::join4(
                    create,
                    client.list_and_watch_children(&leases),
                    client.get_data(&leases),
                    client.list_children(key_dir),
                )
                .await)
            })
            .await?;
        match created {
            None => {}
            Some(Ok((stat, sequence))) => {
                *lease = Some(Contender {
                    session: session.clone(),
                    path: format!("{leases}/{prefix}{sequence}"),
                    czxid: stat.czxid,
                });
            }
            Some(Err(ZkError::NoNode)) if dirs_made < 3 => {
                dirs_made += 1;
                // N goes with the directory: the first lease's maker writes it.
                let made = inner
                    .make_sub_dir(session, key_dir, SEM_LEASES, n.to_string().as_bytes())
                    .await;
                if let Err(e) = made {
                    tracing::debug!(error = %e, "could not make a semaphore's lease directory");
                    return Err(ZkError::NoNode);
                }
                continue;
            }
            Some(Err(e)) => return Err(e),
        }
        break (listed, kept, others);
    };
    let name = lease
        .as_ref()
        .and_then(|l| l.path.rsplit('/').next())
        .unwrap_or_default()
        .to_owned();
    let (children, watcher) = listed?;
    let (data, stat) = kept?;
    if let Some(e) = other_kind(key, n, &others?) {
        return Ok(Step::Refused(e));
    }
    if !children.contains(&name) {
        return Ok(Step::Gone);
    }
    let kept = std::str::from_utf8(&data)
        .ok()
        .and_then(|t| t.parse::<u32>().ok());
    if kept != Some(n) {
        if children.len() == 1 {
            // Alone: the semaphore starts afresh with our N. A lease
            // directory made by Curator (empty data) takes it too; one we
            // may not write keeps what it has.
            let _ = session
                .call(client.set_data(&leases, n.to_string().as_bytes(), Some(stat.version)))
                .await;
        } else if let Some(k) = kept {
            let found = Found::semaphore(k);
            return Ok(Step::Refused(refusal(
                key,
                Claim::Exclusive { permits: n },
                found,
            )));
        }
    }
    Ok(if children.len() <= n as usize {
        Step::Granted
    } else {
        Step::Full(watcher)
    })
}

/// The refusal of a semaphore of `n` when `key_dir`'s listing `others`
/// shows a mutex's or read-write lock's contender.
pub(crate) fn other_kind(key: &LockKey, n: u32, others: &[String]) -> Option<Error> {
    let mut contenders = others.iter().filter(|c| layout::is_contender(c));
    let found = Found {
        own_shared: None,
        kept: contenders
            .clone()
            .any(|c| !c.contains(layout::READ_NAME))
            .then_some(1),
        readers: contenders.any(|c| c.contains(layout::READ_NAME)),
    };
    judge(key, Claim::Exclusive { permits: n }, found).err()
}

/// The error of an attempt whose session ended while it took its lease:
/// the lease went with the session, so no grant is told.
fn lease_session_ended() -> Error {
    Error::unavailable("the ZooKeeper session ended while taking a semaphore's lease")
}

/// How a semaphore's queued waiter's wait at its gate ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseWait {
    /// Its lease is held.
    Held,
    /// The name turned out to be another kind's, or kept with another N.
    Refused,
    /// The session ended, the waiter went, or the store failed for good.
    Ended,
}

/// A semaphore's queued waiter, first at its gate: waits until its lease
/// is held, or the name turns out to be another kind's, or the session
/// ends.
pub(crate) async fn wait_lease(
    inner: &Weak<Inner>,
    session: &Arc<Session>,
    key: &LockKey,
    n: u32,
    key_dir: &str,
    ticket: &OwnerToken,
    lease: &mut Option<Contender>,
) -> LeaseWait {
    let prefix = layout::contender_prefix(Role::Lease(n), ticket.tag());
    if lease.is_none() {
        let Some(i) = inner.upgrade() else {
            return LeaseWait::Ended;
        };
        let mut waiters = lock_unpoisoned(&i.waiters);
        let Some(w) = waiters.get_mut(ticket) else {
            return LeaseWait::Ended;
        };
        w.lease = Some((format!("{key_dir}/{SEM_LEASES}"), prefix.clone()));
    }
    loop {
        let Some(i) = inner.upgrade() else {
            return LeaseWait::Ended;
        };
        let step = lease_step(&i, session, key, n, key_dir, &prefix, lease).await;
        drop(i);
        match step {
            Ok(Step::Granted) => return LeaseWait::Held,
            Ok(Step::Full(watcher)) => {
                watcher.changed().await;
            }
            Ok(Step::Refused(_)) => return LeaseWait::Refused,
            Ok(Step::Gone) => return LeaseWait::Ended,
            Err(e) if is_transient(&e) && session.connected().await => {
                if lease.is_none() {
                    // A create whose answer was lost may have made a
                    // lease: it goes before the next one is made, or it
                    // would count against N until the session ends.
                    let dir = format!("{key_dir}/{SEM_LEASES}");
                    find_and_delete(session.clone(), dir, prefix.clone()).await;
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            Err(_) => return LeaseWait::Ended,
        }
    }
}

impl Inner {
    /// Makes `key_dir/sub` (a semaphore's gate or lease directory) as a
    /// container with `data`, and `key_dir` first if it is missing.
    pub(crate) async fn make_sub_dir(
        &self,
        session: &Session,
        key_dir: &str,
        sub: &str,
        data: &[u8],
    ) -> Result<()> {
        let path = format!("{key_dir}/{sub}");
        let options = CreateMode::Container.with_acls(self.sessions.acls());
        for _ in 0..3 {
            match session
                .call(session.client.create(&path, data, &options))
                .await
            {
                Ok(_) | Err(ZkError::NodeExists) => return Ok(()),
                Err(ZkError::NoNode) => self.make_dir(session, key_dir).await?,
                Err(e) => return Err(map_err(e)),
            }
        }
        Err(Error::unavailable(format!(
            "{path} kept disappearing as it was made (its parent reaped each time)"
        )))
    }

    /// A semaphore's attempt first at its gate: the lease, if N allow it.
    /// Otherwise a waiter (`ticket`) keeps the gate and its lease node and
    /// queues (`Err`); a no-wait attempt leaves both (`try_acquire` deletes
    /// them). A refusal deletes both before it returns.
    pub(crate) async fn first_lease(
        &self,
        hold: &HoldId,
        n: u32,
        mut entered: Entered,
        ticket: Option<&OwnerToken>,
    ) -> Result<std::result::Result<Grant, Entered>> {
        let key = &hold.key;
        let session = entered.node.session.clone();
        let gate = Undo::node(&entered.node);
        let prefix = layout::contender_prefix(Role::Lease(n), hold.owner.tag());
        let pending = Undo {
            session: session.clone(),
            path: None,
            find: Some((format!("{}/{SEM_LEASES}", entered.key_dir), prefix.clone())),
        };
        let mut lease = None;
        let step = lease_step(
            self,
            &session,
            key,
            n,
            &entered.key_dir,
            &prefix,
            &mut lease,
        )
        .await;
        let undo_lease = lease.as_ref().map(Undo::node);
        if lease.is_some() || !matches!(&step, Err(e) if is_transient(e)) {
            pending.disarm();
        }
        let step = step.map_err(map_err)?;
        match step {
            Step::Granted => {
                // The gate goes before the grant is told, as a queued
                // waiter's does: another client's attempt that starts
                // after this acquire returned must not meet its gate and
                // be turned away with permits free (a CI run caught a
                // `try_acquire` refused so when the delete was not waited
                // for). The gate stays armed meanwhile: a delete whose
                // answer is lost, or an acquire cancelled while it waits,
                // leaves its delete to the background, as the lease's undo
                // does for the lease. A session that ended meanwhile took
                // the lease with it: no grant is told for it.
                let sent = session.client.delete(&entered.node.path, None);
                match session.call(sent).await {
                    Err(e) if is_transient(&e) => drop(gate),
                    Err(e) if is_session_over(&e) => {
                        gate.disarm();
                        if let Some(u) = undo_lease {
                            u.disarm();
                        }
                        return Err(lease_session_ended());
                    }
                    _ => gate.disarm(),
                }
                if let Some(u) = undo_lease {
                    u.disarm();
                }
                let lease = lease.expect("a granted lease has its node");
                let grant = lease.grant(1);
                self.hold(hold, lease, ticket.cloned());
                Ok(Ok(grant))
            }
            Step::Full(_) => {
                gate.disarm();
                if let Some(u) = undo_lease {
                    u.disarm();
                }
                entered.lease = lease;
                Ok(Err(entered))
            }
            Step::Refused(e) => {
                // The gate and the lease go before the refusal is told,
                // so that the next client to ask does not meet them.
                gate.disarm();
                if let Some(u) = undo_lease {
                    u.disarm();
                }
                entered.lease = lease;
                entered.leave().await;
                Err(e)
            }
            Step::Gone => Err(lease_session_ended()),
        }
    }

    /// A writer's downgrade: a read node beside `writer`'s node, held at
    /// once, in the writer's place in the queue (Curator 5.5's: an
    /// ephemeral node with the writer's sequence, CURATOR-621), so a writer
    /// that queued after ours stays behind it. `Contended` if the writer
    /// holds no longer.
    pub(crate) async fn beside(&self, hold: &HoldId, writer: &OwnerToken) -> Result<Acquire> {
        let no_writer = Acquire::Contended { retry_after: None };
        let node = match lock_unpoisoned(&self.held).get(&(hold.key.clone(), writer.clone())) {
            Some(h) if h.role.is_exclusive() => h.node.clone(),
            _ => return Ok(no_writer),
        };
        if !node.confirm().await? {
            return Ok(no_writer);
        }
        let session = node.session.clone();
        let (dir, name) = node.path.rsplit_once('/').unwrap_or(("", &node.path));
        let path = format!(
            "{dir}/{}{}",
            layout::contender_prefix(Role::Reader, hold.owner.tag()),
            layout::sequence_of(name)
        );
        let options = CreateMode::Ephemeral.with_acls(self.sessions.acls());
        let created = session
            .call(session.client.create(&path, &[], &options))
            .await;
        let (stat, _) = match created {
            Ok(c) => c,
            Err(e) => {
                // A create whose answer was lost may have made the node,
                // which would stand first once the writer goes: it goes.
                if is_transient(&e) {
                    tokio::spawn(delete_surely(session.clone(), path));
                }
                return Err(map_err(e));
            }
        };
        let read = Contender {
            session,
            path,
            czxid: stat.czxid,
        };
        let grant = read.grant(1);
        self.hold(hold, read, None);
        Ok(Acquire::Acquired(grant))
    }

    /// A mutex's or read-write lock's attempt whose listing showed a
    /// semaphore's lease directory: refused while any lease is held there.
    pub(crate) async fn semaphore_held(
        &self,
        session: &Session,
        key_dir: &str,
        key: &LockKey,
        role: Role,
    ) -> Result<Option<Error>> {
        let leases = format!("{key_dir}/{SEM_LEASES}");
        let client = &session.client;
        let (listed, data) = session
            .call(async {
                Ok(
                    futures::future::join(client.list_children(&leases), client.get_data(&leases))
                        .await,
                )
            })
            .await
            .map_err(map_err)?;
        let (children, data) = match (listed, data) {
            (Ok(c), Ok((d, _))) => (c, d),
            (Err(ZkError::NoNode), _) | (_, Err(ZkError::NoNode)) => return Ok(None),
            (Err(e), _) | (_, Err(e)) => return Err(map_err(e)),
        };
        if children.is_empty() {
            return Ok(None);
        }
        // Live leases make a semaphore, whatever N its directory says.
        let kept = std::str::from_utf8(&data)
            .ok()
            .and_then(|t| t.parse::<u32>().ok())
            .unwrap_or(0);
        Ok(Some(refusal(key, role.claim(), Found::semaphore(kept))))
    }
}

/// The refusal for `owner`, holding `key` here as `held`, asking again as
/// `asked`; `None` when it re-enters.
pub(crate) fn changed_claim(key: &LockKey, held: Role, asked: Role) -> Option<Error> {
    judge(key, asked.claim(), Found::own(held.claim())).err()
}
