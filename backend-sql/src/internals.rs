//! The key hashing and session handles, for benchmarks that run the lease
//! statements raw and for fault tests that end a holder's session. Only
//! with the `internals` feature, and outside semver.

use lockwright_core::LockKey;

use crate::session_backend::SqlSessionBackend;

/// The lease row's `key_hash`: lowercase hex SHA-256 of the key.
pub fn key_hash(key: &LockKey) -> String {
    crate::layout::key_hash(key)
}

/// Server-side ids (PostgreSQL backend pid, MySQL connection id) of the
/// connections holding `backend`'s session locks.
pub fn session_ids(backend: &SqlSessionBackend) -> Vec<i64> {
    backend.session_ids()
}
