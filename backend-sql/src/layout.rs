//! Where a lock lives in the database: the lease table's columns in each
//! dialect, a key's name as a lease row and as a session lock, and what a
//! granted row's columns say (its fence and holds).
//!
//! Every dialect keeps the same columns. `key_hash` is the SHA-256 of the
//! key, so any key up to 1024 bytes fits a fixed-width unique key and none
//! is truncated; `lock_key` keeps the key itself for people reading the
//! table. `owner` is the holder's token, `NULL` once released; `holds`
//! counts its re-entrant holds; `fence` is the last grant's fencing token;
//! `expires_at` is the end of the lease on the database's clock; `value`
//! is what the holder advertises (a leader's value, at most
//! [`MAX_VALUE_LEN`](lockwright_core::MAX_VALUE_LEN) bytes), `NULL` for
//! none. A first grant writes the value its acquire request carries, a
//! re-entry or renewal leaves it alone, `proclaim` sets it, and the last
//! release clears it. Tables of earlier versions have no `value` column:
//! the backend adds it when it sets the table up ([`add_value_column`]).
//! A nullable column without a default changes only the catalog on
//! PostgreSQL, SQLite, MySQL 8 and MariaDB 10.3 or later; older MySQL and
//! MariaDB copy the table. Either way the `ALTER` needs the table's
//! strongest lock and the right to alter it: it waits at most 5 s for the
//! lock (then `Unavailable`, tried again on the next use), and a role
//! without the right gets `Config` naming the statement to run as the
//! table's owner.
//!
//! A row lives while its lock does, and for the retention after: release
//! sets `expires_at` to the time of release, and the sweep deletes rows
//! whose `expires_at` lies more than the retention in the past (released
//! or expired alike). The fence is the database clock in µs at the grant,
//! or one above the row's previous fence if that is higher: it rises across
//! takeovers through the row, and across a row's deletion through the
//! clock. Fences of earlier versions counted 1, 2, 3… per row, far below
//! the clock, so rows from them keep rising too.
//!
//! A session lock has no row: its name on the server is a hash of the
//! table name (so that locks of different tables never meet) and the key.

use lockwright_core::backend::{Acquire, Grant};
use lockwright_core::{FencingToken, LockKey};
use sha2::{Digest, Sha256};

use crate::config::Dialect;

/// The DDL creating the lease table `t`, a validated plain identifier.
pub(crate) fn create_table(dialect: Dialect, t: &str) -> String {
    match dialect {
        Dialect::Sqlite => format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                key_hash   TEXT    NOT NULL PRIMARY KEY,
                lock_key   TEXT    NOT NULL,
                owner      TEXT,
                holds      INTEGER NOT NULL DEFAULT 0,
                fence      INTEGER NOT NULL DEFAULT 0,
                expires_at INTEGER NOT NULL DEFAULT 0,
                value      BLOB
            )"
        ),
        Dialect::Postgres => format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                key_hash   TEXT        NOT NULL PRIMARY KEY,
                lock_key   TEXT        NOT NULL,
                owner      TEXT,
                holds      BIGINT      NOT NULL DEFAULT 0,
                fence      BIGINT      NOT NULL DEFAULT 0,
                expires_at TIMESTAMPTZ NOT NULL DEFAULT '-infinity',
                value      BYTEA
            )"
        ),
        Dialect::MySql => format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                key_hash   CHAR(64)     NOT NULL PRIMARY KEY,
                lock_key   TEXT         NOT NULL,
                owner      VARCHAR(128) NULL,
                holds      BIGINT       NOT NULL DEFAULT 0,
                fence      BIGINT       NOT NULL DEFAULT 0,
                expires_at BIGINT       NOT NULL DEFAULT 0,
                value      VARBINARY(1024) NULL
            ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
        ),
    }
}

/// The DDL adding the `value` column to a lease table `t` of an earlier
/// version. `IF NOT EXISTS` on PostgreSQL only: MySQL has no such clause
/// on `ADD COLUMN` (MariaDB has), and SQLite none at all. The caller looks
/// at the catalog first, and takes a "duplicate column" error from a
/// concurrent twin as done.
pub(crate) fn add_value_column(dialect: Dialect, t: &str) -> String {
    match dialect {
        Dialect::Sqlite => format!("ALTER TABLE {t} ADD COLUMN value BLOB"),
        Dialect::Postgres => format!("ALTER TABLE {t} ADD COLUMN IF NOT EXISTS value BYTEA"),
        Dialect::MySql => format!("ALTER TABLE {t} ADD COLUMN value VARBINARY(1024) NULL"),
    }
}

/// The key's fixed-width identity in the lease table.
pub(crate) fn key_hash(key: &LockKey) -> String {
    hex::encode(Sha256::digest(key.as_str().as_bytes()))
}

/// A grant as a row reads back: its `fence` and `holds` columns (a name
/// row's, or a holder row's).
pub(crate) fn granted(fence: i64, holds: i64) -> Acquire {
    Acquire::Acquired(Grant {
        fence: Some(FencingToken(u64::try_from(fence).unwrap_or(0))),
        holds: u32::try_from(holds).unwrap_or(u32::MAX),
        lease: None,
    })
}

/// SHA-256 over the namespace (the table name) and the key: a session
/// lock's identity.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn session_digest(namespace: &str, key: &LockKey) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(namespace.as_bytes());
    h.update([0]);
    h.update(key.as_str().as_bytes());
    h.finalize().into()
}

/// The PostgreSQL advisory lock id: 64 bits of [`session_digest`].
#[cfg(feature = "postgres")]
pub(crate) fn pg_lock_id(namespace: &str, key: &LockKey) -> i64 {
    let d = session_digest(namespace, key);
    i64::from_be_bytes(d[..8].try_into().expect("SHA-256 is 32 bytes"))
}

/// The MySQL `GET_LOCK` name: MySQL allows 64 characters, so 240 bits of
/// [`session_digest`] in hex.
#[cfg(feature = "mysql")]
pub(crate) fn mysql_lock_name(namespace: &str, key: &LockKey) -> String {
    format!("lsm:{}", &hex::encode(session_digest(namespace, key))[..60])
}

// Semaphores and read-write locks (every dialect): the name row's
// markers while a group holds it, and the holders table (see `claims`).

/// The name row's owner while readers hold it.
pub(crate) const SHARED: &str = "~shared";
/// The prefix of the name row's owner while permits are out.
pub(crate) const PERMITS: &str = "~permits:";
/// Between N and the token in a lone permit's [`inline`] marker.
const LONE: char = '/';
/// The longest owner any dialect's column keeps (MySQL's `VARCHAR(128)`).
const MAX_OWNER: usize = 128;

/// The name row's owner while `token` holds the only permit of N (a lone
/// permit, `~permits:<N>/<token>`): the mutex's own statements take,
/// re-enter, renew and release it, one statement each. `None` when the
/// marker would not fit every dialect's column (such a permit goes to the
/// holders table at once).
pub(crate) fn inline(permits: u32, token: &str) -> Option<String> {
    let marker = format!("{PERMITS}{permits}{LONE}{token}");
    (marker.len() <= MAX_OWNER).then_some(marker)
}

/// The holder of a lone permit whose marker is `owner`, if it is one.
pub(crate) fn lone_holder(owner: &str) -> Option<&str> {
    owner
        .strip_prefix(PERMITS)?
        .split_once(LONE)
        .map(|(_, t)| t)
}

/// The N of a group's `~permits:<N>` or lone permit's marker.
pub(crate) fn permits_of(owner: &str) -> Option<u32> {
    let rest = owner.strip_prefix(PERMITS)?;
    rest.split_once(LONE).map_or(rest, |(n, _)| n).parse().ok()
}

/// The holders table of the lease table `t`.
pub(crate) fn holders_table(t: &str) -> String {
    format!("{t}_holders")
}

/// Who holds a name, as its row in the lease table says.
#[derive(Debug, PartialEq)]
pub(crate) enum Name {
    Free,
    Token(String),
    Permits(u32),
    Shared,
}

/// The name row: (owner, holds, fence, expires_at).
pub(crate) type NameRow = (Option<String>, i64, i64, i64);

/// Who holds the name whose row is `row`, at `now` (ms on the database clock).
pub(crate) fn classify(row: Option<&NameRow>, now: i64) -> Name {
    match row {
        Some((Some(owner), _, _, expires)) if *expires > now => {
            if owner == SHARED {
                Name::Shared
            } else if owner.starts_with(PERMITS) {
                Name::Permits(permits_of(owner).unwrap_or(0))
            } else {
                Name::Token(owner.clone())
            }
        }
        _ => Name::Free,
    }
}
