//! What a backend shares with its waiters' background tasks: the session,
//! this process's holds and its queued waiters. The tasks keep it weakly,
//! so that dropping the last clone of the backend ends them. And what one
//! attempt hands on to the next step (`Entered`: the node it made in a
//! queue), which the queue, the semaphore's gate and the backend all take
//! (leaving the queue is `queue.rs`'s).

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use lockwright_core::backend::{lock_unpoisoned, Grant, HoldId};
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
    /// permit takes the gate (see `claims_permit.rs`).
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

/// What one attempt found: our new node, and the queue it joined.
pub(crate) struct Entered {
    pub(crate) node: Contender,
    pub(crate) name: String,
    pub(crate) dir: String,
    pub(crate) first: bool,
    /// What the node claims (a semaphore's: its gate in `P/locks`).
    pub(crate) role: Role,
    /// The key's directory `P`.
    pub(crate) key_dir: String,
    /// The listing held a semaphore's lease directory.
    pub(crate) sem: bool,
    /// A semaphore's lease node, made while first at its gate.
    pub(crate) lease: Option<Contender>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for w in lock_unpoisoned(&self.waiters).values() {
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

    pub(crate) fn hold(&self, hold: &HoldId, node: Contender, ticket: Option<OwnerToken>) {
        lock_unpoisoned(&self.held).insert(
            (hold.key.clone(), hold.owner.clone()),
            Held {
                role: Role::of(&hold.kind),
                holds: 1,
                node,
                ticket,
            },
        );
    }

    /// The node of `owner`'s hold of `key` here, if any.
    pub(crate) fn held_node(&self, key: &LockKey, owner: &OwnerToken) -> Option<Contender> {
        lock_unpoisoned(&self.held)
            .get(&(key.clone(), owner.clone()))
            .map(|h| h.node.clone())
    }

    /// Forgets the hold of `key` on the node at `path`, if one is recorded.
    pub(crate) fn forget(&self, key: &LockKey, path: &str) {
        lock_unpoisoned(&self.held).retain(|(k, _), h| !(k == key && h.node.path == path));
    }
}
