//! What a backend shares with its waiters' background tasks: the session,
//! this process's holds and its queued waiters. The tasks keep it weakly,
//! so that dropping the last clone of the backend ends them.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard};

use lockwright_core::backend::Grant;
use lockwright_core::{LockKey, OwnerToken};
use tokio::sync::mpsc;

use crate::config::ZkConfig;
use crate::layout::{self, Role};
use crate::node::{Contender, Sessions};

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) sessions: Sessions,
    /// This process's holds, by key and owner: the node that holds it.
    pub(crate) held: Mutex<HashMap<(LockKey, OwnerToken), Held>>,
    /// Queued waiters, by ticket.
    pub(crate) waiters: Mutex<HashMap<OwnerToken, Waiter>>,
    /// The server refused a `multiRead` (before ZooKeeper 3.6): every
    /// permit takes the gate (see `permit`).
    pub(crate) no_multi_read: AtomicBool,
}

#[derive(Debug)]
pub(crate) struct Held {
    /// What the hold is: a mutex's, a writer's, a reader's or a permit.
    pub(crate) role: Role,
    pub(crate) holds: u32,
    pub(crate) node: Contender,
    /// The waiter ticket the lock was handed to, if it came that way.
    pub(crate) ticket: Option<OwnerToken>,
}

#[derive(Debug, Default)]
pub(crate) struct Waiter {
    /// Where grants are delivered, once the waiter watches.
    pub(crate) grants: Option<mpsc::UnboundedSender<Grant>>,
    /// The waiter's node in the queue, once it queued.
    pub(crate) node: Option<Contender>,
    /// A semaphore's waiter first in its mutex's queue: where its lease
    /// node is (being) made, the lease directory and the node's prefix,
    /// so that a waiter given up finds and deletes it.
    pub(crate) lease: Option<(String, String)>,
    /// The lock was handed to this waiter.
    pub(crate) granted: Option<Grant>,
    pub(crate) task: Option<tokio::task::AbortHandle>,
    /// The node whose change the waiter waits for, for tests that check it
    /// is the predecessor.
    #[cfg(feature = "internals")]
    pub(crate) watching: Option<String>,
}

/// Locks a table, poisoned or not: a panic in one caller must not fail
/// every later request of the backend.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Inner {
    fn drop(&mut self) {
        for w in lock(&self.waiters).values() {
            if let Some(t) = &w.task {
                t.abort();
            }
        }
    }
}

impl Inner {
    pub(crate) fn new(config: ZkConfig) -> Self {
        Inner {
            sessions: Sessions::new(config),
            held: Mutex::new(HashMap::new()),
            waiters: Mutex::new(HashMap::new()),
            no_multi_read: AtomicBool::new(false),
        }
    }

    /// The full path of `key`'s lock directory.
    pub(crate) fn dir(&self, key: &LockKey) -> String {
        let root = &self.sessions.config().root;
        format!("{root}/{}", layout::dir_name(key.as_str(), root.is_empty()))
    }

    pub(crate) fn hold(
        &self,
        key: &LockKey,
        owner: &OwnerToken,
        node: Contender,
        ticket: Option<OwnerToken>,
    ) {
        lock(&self.held).insert(
            (key.clone(), owner.clone()),
            Held {
                role: Role::of(owner),
                holds: 1,
                node,
                ticket,
            },
        );
    }

    /// The node of `owner`'s hold of `key` here, if any.
    pub(crate) fn held_node(&self, key: &LockKey, owner: &OwnerToken) -> Option<Contender> {
        lock(&self.held)
            .get(&(key.clone(), owner.clone()))
            .map(|h| h.node.clone())
    }

    /// Forgets the hold of `key` on the node at `path`, if one is recorded.
    pub(crate) fn forget(&self, key: &LockKey, path: &str) {
        lock(&self.held).retain(|(k, _), h| !(k == key && h.node.path == path));
    }
}
