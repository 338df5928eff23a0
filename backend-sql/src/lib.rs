//! SQL backend for locksmith: one lease row per key.
//!
//! Each lock is a row under a unique key (the SHA-256 of the lock name, so
//! any key fits and none is truncated) holding the owner token, a hold count
//! for re-entrancy, a fencing column and an expiry. Every statement computes
//! time on the database's clock, never the client's, so clocks that differ
//! between application hosts cannot cut a lease short. A holder that crashes
//! leaves a row whose expiry passes; the next acquirer takes it over in the
//! same statement. Rows are kept after release so the fencing column keeps
//! rising across release, expiry and takeover.
//!
//! Each operation is one statement: SQLite `INSERT … ON CONFLICT DO UPDATE
//! … WHERE … RETURNING` for acquire, owner-checked `UPDATE` for release and
//! renew.
//!
//! ```no_run
//! # async fn f() -> locksmith_core::Result<()> {
//! use locksmith_core::Locker;
//! use locksmith_sql::SqlBackend;
//! let locker = Locker::new(SqlBackend::connect("sqlite://locks.db")?);
//! let guard = locker.lock("invoice-7").await?;
//! println!("fencing token {:?}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```

mod backend;
mod config;
mod queries;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod session;
#[cfg(not(any(feature = "postgres", feature = "mysql")))]
#[path = "session_none.rs"]
mod session;

pub use backend::{LeaseStatements, SqlBackend};
pub use config::{validate_table_name, Dialect, Mode, SqlConfig, DEFAULT_TABLE, SQL_SCHEMES};
