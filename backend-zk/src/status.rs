//! What `status` reads of a key's directory when a group holds it: a
//! semaphore's leases (the first N hold, and the clients at its gate
//! wait) or the readers at the head of the queue.

use lockwright_core::backend::lock_unpoisoned;
use lockwright_core::{Holder, LockStatus, Result};
use zookeeper_client::Error as ZkError;

use crate::error::map_err;
use crate::layout::{self, LEASE_NAME, SEM_LEASES, SEM_LOCKS};
use crate::node::{fence_of, Session};
use crate::state::Inner;

impl Inner {
    /// The children of `dir`, none if it is gone.
    async fn children_of(&self, session: &Session, dir: &str) -> Result<Vec<String>> {
        match session.call(session.client.list_children(dir)).await {
            Ok(c) => Ok(c),
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(e) => Err(map_err(e)),
        }
    }

    /// The holders of a semaphore (its first N leases) or of readers at
    /// the head of `children` (sorted), or `None` for a mutex's or
    /// writer's queue.
    pub(crate) async fn group_status(
        &self,
        session: &Session,
        dir: &str,
        children: &[String],
    ) -> Result<Option<LockStatus>> {
        let client = &session.client;
        let (nodes, permits, at_gate) = if children.iter().any(|c| c == SEM_LEASES) {
            let leases = format!("{dir}/{SEM_LEASES}");
            match session.call(client.get_data(&leases)).await {
                Ok((data, _)) => {
                    let kept = std::str::from_utf8(&data)
                        .ok()
                        .and_then(|t| t.parse::<u32>().ok());
                    let mut names = self.children_of(session, &leases).await?;
                    // Leases are made one at a time behind the gate, so
                    // the first N hold and one past them is the gate's
                    // holder, waiting for a permit (with N unknown, as a
                    // Curator-made directory leaves it, all are listed).
                    names.sort_by(|a, b| lease_order(a).cmp(&lease_order(b)));
                    if let Some(n) = kept.filter(|n| *n > 0) {
                        names.truncate(usize::try_from(n).unwrap_or(usize::MAX));
                    }
                    let paths: Vec<String> =
                        names.iter().map(|c| format!("{leases}/{c}")).collect();
                    // Every client at the gate waits for a permit.
                    let gate = self
                        .children_of(session, &format!("{dir}/{SEM_LOCKS}"))
                        .await?;
                    let waiting = gate.iter().filter(|c| layout::is_contender(c)).count();
                    (paths, kept, u32::try_from(waiting).ok())
                }
                Err(ZkError::NoNode) => (Vec::new(), None, None),
                Err(e) => return Err(map_err(e)),
            }
        } else {
            (Vec::new(), None, None)
        };
        let (paths, shared, waiters) = if !nodes.is_empty() {
            (nodes, false, at_gate)
        } else {
            let readers: Vec<String> = children
                .iter()
                .take_while(|c| !layout::is_exclusive_node(c))
                .filter(|c| c.contains(layout::READ_NAME))
                .map(|c| format!("{dir}/{c}"))
                .collect();
            if readers.is_empty() {
                return Ok(None);
            }
            let behind = children.iter().filter(|c| layout::is_contender(c)).count();
            let waiters = u32::try_from(behind - readers.len()).ok();
            (readers, true, waiters)
        };
        let mut holders = Vec::new();
        for path in paths {
            let stat = match session.call(client.check_stat(&path)).await {
                Ok(Some(s)) => s,
                Ok(None) | Err(ZkError::NoNode) => continue,
                Err(e) => return Err(map_err(e)),
            };
            let mine = lock_unpoisoned(&self.held)
                .iter()
                .find(|(_, h)| h.node.path == path)
                .map(|((_, o), h)| (o.clone(), h.holds));
            let name = path.rsplit('/').next().map(str::to_owned);
            holders.push(
                Holder::new(shared, mine.as_ref().map_or(1, |m| m.1))
                    .with_owner(mine.map(|m| m.0))
                    .with_tag(name.as_deref().and_then(layout::tag_of))
                    .with_id(name)
                    .with_fence(Some(fence_of(stat.czxid))),
            );
        }
        if holders.is_empty() {
            return Ok(None);
        }
        holders.sort_by_key(|h| h.fence);
        let status = LockStatus::of_holders(holders)
            .with_permits(permits.filter(|_| !shared))
            .with_waiters(waiters);
        Ok(Some(status))
    }
}

/// A lease's place among its directory's: its sequence number (the text
/// after `lease-`; Curator's protected names put a random prefix before
/// it), then its whole name.
fn lease_order(child: &str) -> (&str, &str) {
    let seq = child
        .rfind(LEASE_NAME)
        .map_or(child, |i| &child[i + LEASE_NAME.len()..]);
    (seq, child)
}
