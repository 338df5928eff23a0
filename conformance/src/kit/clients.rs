//! The typed clients behind a harness's `Arc<dyn LockBackend>`s, for the
//! harness methods that need more than the trait (`end_sessions` reads a
//! client's session ids or handle).

use std::sync::{Arc, Mutex, Weak};

use lockwright_core::backend::LockBackend;

/// Every client a harness made, held weakly: a client whose last user is
/// gone must be dropped, closing its sessions, as a real one would be.
#[derive(Debug)]
pub struct Clients<T> {
    made: Mutex<Vec<Weak<T>>>,
}

impl<T> Default for Clients<T> {
    fn default() -> Self {
        Clients {
            made: Mutex::new(Vec::new()),
        }
    }
}

impl<T: LockBackend> Clients<T> {
    /// None yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Remembers `client` and hands it back.
    pub fn add(&self, client: Arc<T>) -> Arc<T> {
        self.lock().push(Arc::downgrade(&client));
        client
    }

    /// The typed client behind `client`, if this harness made it and it is
    /// still alive.
    pub fn find(&self, client: &Arc<dyn LockBackend>) -> Option<Arc<T>> {
        let want = Arc::as_ptr(client).cast::<u8>();
        let mut made = self.lock();
        made.retain(|c| c.strong_count() > 0);
        made.iter()
            .filter_map(Weak::upgrade)
            .find(|c| Arc::as_ptr(c).cast::<u8>() == want)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Weak<T>>> {
        self.made.lock().unwrap_or_else(|e| e.into_inner())
    }
}
