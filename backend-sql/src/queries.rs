//! The SQL each dialect runs: one statement per operation, every time taken
//! from the database clock.

use crate::config::Dialect;

/// Statements for one dialect and table, built once per backend. The table
/// name was validated as a plain identifier before it got here.
#[derive(Debug, Clone)]
pub(crate) struct Queries {
    pub(crate) create: Vec<String>,
    pub(crate) acquire: String,
    pub(crate) release: String,
    pub(crate) renew: String,
}

impl Queries {
    pub(crate) fn new(dialect: Dialect, table: &str) -> Self {
        match dialect {
            Dialect::Sqlite => sqlite(table),
        }
    }
}

/// Milliseconds since the Unix epoch on the database's clock. SQLite keeps
/// `'now'` fixed for the whole statement, so every use agrees.
const SQLITE_NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

fn sqlite(t: &str) -> Queries {
    let now = SQLITE_NOW;
    Queries {
        // key_hash: SHA-256 of the key, so any key (up to 1024 bytes) fits a
        // fixed-width unique key in every dialect; lock_key keeps the key
        // itself for people reading the table. The row outlives release so
        // the fence keeps rising.
        create: vec![format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                key_hash   TEXT    NOT NULL PRIMARY KEY,
                lock_key   TEXT    NOT NULL,
                owner      TEXT,
                holds      INTEGER NOT NULL DEFAULT 0,
                fence      INTEGER NOT NULL DEFAULT 0,
                expires_at INTEGER NOT NULL DEFAULT 0
            )"
        )],
        // Insert a new row, or take over a free/expired one (fence + 1), or
        // re-enter our own live hold (holds + 1, same fence). A live row of
        // another owner fails the WHERE and returns nothing: contended.
        acquire: format!(
            "INSERT INTO {t} (key_hash, lock_key, owner, holds, fence, expires_at)
             VALUES (?1, ?2, ?3, 1, 1, {now} + ?4)
             ON CONFLICT (key_hash) DO UPDATE SET
                holds = CASE WHEN {t}.owner = excluded.owner AND {t}.expires_at > {now}
                             THEN {t}.holds + 1 ELSE 1 END,
                fence = CASE WHEN {t}.owner = excluded.owner AND {t}.expires_at > {now}
                             THEN {t}.fence ELSE {t}.fence + 1 END,
                owner = excluded.owner,
                expires_at = excluded.expires_at
             WHERE {t}.owner IS NULL OR {t}.expires_at <= {now} OR {t}.owner = excluded.owner
             RETURNING fence, holds"
        ),
        release: format!(
            "UPDATE {t} SET
                holds = holds - 1,
                owner = CASE WHEN holds > 1 THEN owner ELSE NULL END,
                expires_at = CASE WHEN holds > 1 THEN expires_at ELSE 0 END
             WHERE key_hash = ?1 AND owner = ?2 AND expires_at > {now}
             RETURNING holds"
        ),
        renew: format!(
            "UPDATE {t} SET expires_at = {now} + ?3
             WHERE key_hash = ?1 AND owner = ?2 AND expires_at > {now}"
        ),
    }
}
