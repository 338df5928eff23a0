//! Release notifications within one process: a waiter hears a release made
//! by another client of the same database and table at once, not at its
//! next poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use locksmith_core::backend::Watch;
use locksmith_core::LockKey;
use tokio::sync::watch;

/// Release notifications between backends of one process that share a
/// database and table: a waiter here hears a release made here at once,
/// instead of at its next poll. Channels are dropped with their last watcher.
#[derive(Debug, Default)]
pub(crate) struct LocalReleases {
    channels: Mutex<HashMap<LockKey, Weak<watch::Sender<u64>>>>,
}

impl LocalReleases {
    pub(crate) fn for_scope(scope: String) -> Arc<Self> {
        static SCOPES: OnceLock<Mutex<HashMap<String, Weak<LocalReleases>>>> = OnceLock::new();
        let mut scopes = SCOPES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        scopes.retain(|_, w| w.strong_count() > 0);
        if let Some(existing) = scopes.get(&scope).and_then(Weak::upgrade) {
            return existing;
        }
        let fresh = Arc::new(LocalReleases::default());
        scopes.insert(scope, Arc::downgrade(&fresh));
        fresh
    }

    pub(crate) fn watch(&self, key: &LockKey) -> Watch {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        channels.retain(|_, w| w.strong_count() > 0);
        let sender = match channels.get(key).and_then(Weak::upgrade) {
            Some(s) => s,
            None => {
                let s = Arc::new(watch::channel(0u64).0);
                channels.insert(key.clone(), Arc::downgrade(&s));
                s
            }
        };
        Watch::new(sender.subscribe(), Some(Box::new(sender)))
    }

    pub(crate) fn released(&self, key: &LockKey) {
        let channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = channels.get(key).and_then(Weak::upgrade) {
            s.send_modify(|v| *v += 1);
        }
    }
}
