//! Two small tools every backend with background tasks or shared state
//! needs, written once: a mutex lock that survives a poisoning panic, and
//! a task handle that aborts its task when dropped.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::task::AbortHandle;

/// Locks `m`, taking its data even when a thread panicked while holding
/// it. The data behind every such mutex here (maps of holds, waiters,
/// cached connections) stays consistent between statements, and a lock
/// library that stopped working after one panic elsewhere would turn a
/// bug into lost locks.
pub fn lock_unpoisoned<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A spawned task that ends when this value is dropped: the keepalive of
/// a [`Watch`](crate::backend::Watch) whose notices a task of the
/// backend's produces, so that a subscriber that goes away stops it.
#[derive(Debug)]
pub struct AbortOnDrop(AbortHandle);

impl AbortOnDrop {
    /// Aborts the task behind `handle` when dropped.
    pub fn new(handle: AbortHandle) -> Self {
        AbortOnDrop(handle)
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
