//! SQL backend for lockwright: lease rows on SQLite, PostgreSQL and
//! MySQL/MariaDB, or session locks on PostgreSQL and MySQL.
//!
//! # Lease mode (default)
//!
//! Each lock is a row under a unique key holding the owner token, a hold
//! count for re-entrancy, a fencing column, an expiry, and the value its
//! holder advertises (an election's leader value). The naive scheme
//! (insert a row to lock, delete it to unlock) has three known flaws, and
//! this one has none of them:
//!
//! * *A crashed holder leaves the row forever*: rows expire; the next
//!   acquirer takes an expired row over in the same statement.
//! * *Clocks differ between application servers*: every time is computed in
//!   the statement on the database's clock (`now()`, `NOW(3)`,
//!   `julianday('now')`), never sent by a client.
//! * *The database is slow*: each operation is one statement and one round
//!   trip. PostgreSQL and SQLite use `INSERT … ON CONFLICT DO UPDATE … WHERE
//!   … RETURNING`; MySQL uses `INSERT … ON DUPLICATE KEY UPDATE` and reads
//!   the outcome from `LAST_INSERT_ID(expr)` in the reply.
//!
//! Keys are stored under their SHA-256 (a fixed-width unique key, so a key of
//! any length up to 1024 bytes fits and none is ever truncated), with the key
//! itself beside it for people reading the table. The table (default
//! `lockwright_locks`, or `?table=name`, a plain identifier) is created on
//! first use, by [`SqlBackend::migrate`], or by `lockwright::connect`, which
//! checks the store before it returns.
//!
//! # Bounded state, and fences
//!
//! A row lives while its lock does and for the retention after
//! (`?retention=60s` by default): release stamps it with the time of
//! release, and a sweep deletes rows free (released, or their lease ended)
//! for longer than the retention. Each client starts a sweep in the
//! background with an acquire, at most every quarter of the retention, so a
//! free row is gone within 1.25 × the retention while anyone acquires
//! ([`SqlBackend::sweep`] does it on demand). The table holds the live
//! locks plus the names freed within the retention, however many distinct
//! names were ever locked.
//!
//! A grant's fence is the larger of the row's previous fence + 1 and the
//! database clock in microseconds. Through the row, fences rise across
//! takeovers whatever the clock does; across the row's deletion they rise
//! through the clock, **provided the database clock never steps back by
//! more than the retention** and no acquire statement takes longer than the
//! retention between reading the clock and inserting its row. Tables of
//! earlier versions (fences counted 1, 2, 3… per row, released rows kept
//! for ever) keep working: their fences are far below the clock, and their
//! old rows are swept like new ones.
//!
//! # Leader values
//!
//! Lease rows run elections (`Locker::election`): the row's `value`
//! column (at most 1024 bytes) is written with the first grant, in the
//! acquire's own statement, so a lock is never seen held without its
//! value; re-entries and renewals leave it alone; `proclaim` is one
//! `UPDATE` checking the owner and the lease, and leaves the lease alone;
//! the last release clears it. Tables of earlier versions have no `value`
//! column; the backend adds it when it sets the table up (its first
//! operation, or [`SqlBackend::migrate`]), and locks held in them stay
//! held. Until then, a reader sees their locks without values. Clients of
//! earlier versions still running on the table neither write nor clear
//! values: one that takes a lock over from an expired leader shows that
//! leader's value until it releases, so upgrade every client before using
//! elections on a table they share. Session mode keeps no values.
//!
//! # Session mode (`?mode=session`, PostgreSQL and MySQL): [`SqlSessionBackend`]
//!
//! Each held lock is a server-side session lock on a connection of its own:
//! PostgreSQL `pg_try_advisory_lock` on 64 bits of SHA-256 over the table
//! name and the key (a collision between two keys has probability about
//! 2^-64 per pair: with a million keys in use, about 3 in 10^8), MySQL
//! `GET_LOCK` on `lsm:` plus 240 bits of the same hash in hex (the name
//! limit is 64 characters). The lock lives exactly as long as that
//! connection: no TTL, no expiry, nothing left behind by a crash. Renewal
//! checks the connection; a dropped connection fires the lost signal at the
//! next renewal (by then the server has already freed the lock, so in this
//! mode the signal comes *after* the loss, not before).
//!
//! On PostgreSQL, session mode also gives read-write locks: a reader holds
//! the advisory lock shared, and a writer refused keeps new readers out by
//! holding the name's turnstile (the two-`int4` advisory key made of the
//! same 64 bits) on a connection of its own while it waits; a new reader
//! must pass it. Semaphores, and readers on MySQL (`GET_LOCK` has no shared
//! mode), are `Unsupported`.
//!
//! Session mode gives **no fencing tokens**: there is no row to keep a
//! counter in, and a counter row would add a write to every acquire and
//! undo the mode's point (it is several times faster than lease mode, as it
//! writes nothing). Use lease mode where the resource checks fences.
//!
//! Session locks break behind transaction-pooling proxies (PgBouncer in
//! transaction mode, ProxySQL multiplexing): the proxy hands the server
//! session to other clients between transactions, so the lock would be held
//! by, and released with, a session that is not yours. Connect directly, or
//! through a session-pooling proxy.
//!
//! ```no_run
//! # async fn f() -> lockwright_core::Result<()> {
//! use lockwright_core::Locker;
//! use lockwright_sql::SqlBackend;
//! // Or lockwright_sql::open(url), which picks SqlSessionBackend for ?mode=session.
//! let locker = Locker::new(SqlBackend::connect("postgres://app:secret@db/app")?);
//! let guard = locker.lock("invoice-7").await?;
//! println!("fencing token {:?}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

#[macro_use]
mod node;
mod backend;
mod claims;
mod claims_seen;
mod claims_sql;
mod config;
mod error;
#[cfg(feature = "internals")]
pub mod internals;
mod layout;
mod lease;
#[cfg(feature = "postgres")]
mod listen;
mod notify;
mod queries;
mod session_backend;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod session_locks;
#[cfg(not(any(feature = "postgres", feature = "mysql")))]
#[path = "session_locks_none.rs"]
mod session_locks;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod session_sql;

use std::sync::Arc;

use lockwright_core::backend::{Driver, LockBackend, ServerUrl};
use lockwright_core::Result;

pub use backend::{LeaseStatements, SqlBackend};
pub use config::SCHEMES;
pub use config::{validate_table_name, Dialect, Mode, SqlConfig, DEFAULT_RETENTION, DEFAULT_TABLE};
pub use session_backend::SqlSessionBackend;

/// Opens the backend a SQL URL names: [`SqlBackend`] for lease rows (the
/// default), [`SqlSessionBackend`] for `?mode=session`.
///
/// # Errors
/// As [`SqlConfig::from_url`], and the backend's `connect`.
pub fn open(url: &str) -> Result<Arc<dyn LockBackend>> {
    let config = SqlConfig::from_url(url)?;
    Ok(match config.mode {
        Mode::Lease => Arc::new(SqlBackend::with_config(config)?),
        Mode::Session => Arc::new(SqlSessionBackend::with_config(config)?),
    })
}

/// This crate's declaration for the facade's registry: its schemes, its
/// opener, and which URLs must reach their servers directly (TLS that
/// verifies the server, which a local proxy would stand in for).
pub const DRIVER: Driver = Driver::new(SCHEMES, open).with_direct(verifies_the_server);

/// See [`DRIVER`]: `sslmode=verify-…` (PostgreSQL) or `ssl-mode=verify_…`
/// (MySQL), in any of the spellings the drivers take.
fn verifies_the_server(url: &ServerUrl) -> bool {
    let url = url.url().expose().to_ascii_lowercase();
    ["sslmode=verify", "ssl-mode=verify", "ssl_mode=verify"]
        .iter()
        .any(|p| url.contains(p))
}
