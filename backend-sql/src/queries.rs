//! The SQL each dialect runs: one statement per operation, every time taken
//! from the database clock.

use std::time::Duration;

use crate::config::Dialect;
use crate::layout::create_table;

/// Added to the fence reported through MySQL's `LAST_INSERT_ID(expr)` when
/// the grant re-entered an existing hold, so one statement can say both
/// "granted, with this fence" and "it was a re-entry".
pub(crate) const MYSQL_REENTRY_FLAG: u64 = 1 << 62;

/// Added to the ms left of another owner's lease, reported the same way
/// when the name is held: a waiter looks again when it is due.
pub(crate) const MYSQL_HELD_FLAG: u64 = 1 << 61;

/// Statements for one dialect and table, built once per backend. The table
/// name was validated as a plain identifier before it got here.
#[derive(Debug, Clone)]
pub(crate) struct Queries {
    pub(crate) create: Vec<String>,
    pub(crate) acquire: String,
    pub(crate) release: String,
    pub(crate) renew: String,
    /// Renews a batch of leases in one statement, owner-checked. PostgreSQL:
    /// arrays of key hashes, owners and TTLs in ms, returning the key hash
    /// and owner of each lease renewed. The others: see [`renew_batch`].
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) renew_many: String,
    /// Sets the holder's value, owner-checked, leaving the lease alone
    /// (parameters: key hash, owner, value; on MySQL the value first).
    pub(crate) proclaim: String,
    /// Deletes up to [`SWEEP_BATCH`] rows free for longer than the retention
    /// (parameter: the retention in ms).
    pub(crate) sweep: String,
    /// Reads a live lease row without changing it (parameter: key hash):
    /// holds, fence, ms of lease left, owner, value.
    pub(crate) inspect: String,
    /// [`inspect`](Self::inspect) on a table of an earlier version, not
    /// yet given its `value` column: the value reads as `NULL`.
    pub(crate) inspect_legacy: String,
    /// MySQL only: reads the hold count after a re-entrant grant.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) holds: String,
    /// MySQL only: the same in the holders table, where a lone permit's
    /// hold moves if a second claim came between the grant and its read.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) holds_moved: String,
}

impl Queries {
    pub(crate) fn new(dialect: Dialect, table: &str) -> Self {
        match dialect {
            Dialect::Sqlite => sqlite(table),
            Dialect::Postgres => postgres(table),
            Dialect::MySql => mysql(table),
        }
    }
}

/// The names of the rows of the lease table `t` that have an owner (live,
/// or expired and not yet taken over or swept) and start with a prefix,
/// measured by the database as it measures the column (parameter: the
/// prefix; MySQL's twice).
pub(crate) fn list_names(dialect: Dialect, t: &str) -> String {
    match dialect {
        Dialect::Postgres => {
            format!("SELECT lock_key FROM {t} WHERE owner IS NOT NULL AND starts_with(lock_key, $1)")
        }
        Dialect::Sqlite => format!(
            "SELECT lock_key FROM {t} WHERE owner IS NOT NULL AND SUBSTR(lock_key, 1, LENGTH(?1)) = ?1"
        ),
        // A binary collation's text reads as a BLOB unless converted, as
        // `inspect` converts the owner.
        Dialect::MySql => format!(
            "SELECT CONVERT(lock_key USING utf8mb4) FROM {t}
             WHERE owner IS NOT NULL AND SUBSTR(lock_key, 1, CHAR_LENGTH(?)) = ?"
        ),
    }
}

/// Rows one sweep statement deletes at most, so a sweep of a large backlog
/// (a table from an earlier version) never holds locks for long.
pub(crate) const SWEEP_BATCH: u64 = 1000;

/// Milliseconds since the Unix epoch on the database's clock. SQLite keeps
/// `'now'` fixed for the whole statement, so every use agrees.
pub(crate) const SQLITE_NOW: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";
/// The same in µs (SQLite's clock has ms precision; the fence needs only to
/// rise, which `MAX(fence + 1, …)` ensures within a millisecond).
const SQLITE_NOW_US: &str = "(CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) * 1000)";

fn sqlite(t: &str) -> Queries {
    let now = SQLITE_NOW;
    let us = SQLITE_NOW_US;
    let batch = SWEEP_BATCH;
    Queries {
        create: vec![create_table(Dialect::Sqlite, t)],
        // Insert a new row, or take over a free/expired one (fence + 1), or
        // re-enter our own live hold (holds + 1, same fence). A live row of
        // another owner fails the WHERE and returns nothing: contended.
        acquire: format!(
            "INSERT INTO {t} (key_hash, lock_key, owner, holds, fence, expires_at, value)
             VALUES (?1, ?2, ?3, 1, {us}, {now} + ?4, ?5)
             ON CONFLICT (key_hash) DO UPDATE SET
                holds = CASE WHEN {t}.owner = excluded.owner AND {t}.expires_at > {now}
                             THEN {t}.holds + 1 ELSE 1 END,
                fence = CASE WHEN {t}.owner = excluded.owner AND {t}.expires_at > {now}
                             THEN {t}.fence ELSE MAX({t}.fence + 1, {us}) END,
                value = CASE WHEN {t}.owner = excluded.owner AND {t}.expires_at > {now}
                             THEN {t}.value ELSE excluded.value END,
                owner = excluded.owner,
                expires_at = excluded.expires_at
             WHERE {t}.owner IS NULL OR {t}.expires_at <= {now} OR {t}.owner = excluded.owner
             RETURNING fence, holds"
        ),
        release: format!(
            "UPDATE {t} SET
                holds = holds - 1,
                owner = CASE WHEN holds > 1 THEN owner ELSE NULL END,
                value = CASE WHEN holds > 1 THEN value ELSE NULL END,
                expires_at = CASE WHEN holds > 1 THEN expires_at ELSE {now} END
             WHERE key_hash = ?1 AND owner = ?2 AND expires_at > {now}
             RETURNING holds"
        ),
        renew: format!(
            "UPDATE {t} SET expires_at = {now} + ?3
             WHERE key_hash = ?1 AND owner = ?2 AND expires_at > {now}"
        ),
        renew_many: String::new(),
        proclaim: format!(
            "UPDATE {t} SET value = ?3
             WHERE key_hash = ?1 AND owner = ?2 AND expires_at > {now}"
        ),
        sweep: format!(
            "DELETE FROM {t} WHERE key_hash IN
                (SELECT key_hash FROM {t} WHERE expires_at < {now} - ?1 LIMIT {batch})
             AND expires_at < {now} - ?1"
        ),
        inspect: format!(
            "SELECT holds, fence, expires_at - {now}, owner, value FROM {t}
             WHERE key_hash = ?1 AND owner IS NOT NULL AND expires_at > {now}"
        ),
        inspect_legacy: format!(
            "SELECT holds, fence, expires_at - {now}, owner, NULL FROM {t}
             WHERE key_hash = ?1 AND owner IS NOT NULL AND expires_at > {now}"
        ),
        holds: String::new(),
        holds_moved: String::new(),
    }
}

/// `now()` is the transaction's start, fixed for the statement. With
/// autocommit that is after the client sent the request, so a lease computed
/// from it never ends before the client's conservative local deadline.
fn postgres(t: &str) -> Queries {
    let us = "(extract(epoch from now()) * 1000000)::bigint";
    let batch = SWEEP_BATCH;
    let stale = "now() - $1::bigint * interval '1 millisecond'";
    Queries {
        create: vec![create_table(Dialect::Postgres, t)],
        acquire: format!(
            "INSERT INTO {t} AS l (key_hash, lock_key, owner, holds, fence, expires_at, value)
             VALUES ($1, $2, $3, 1, {us}, now() + $4::bigint * interval '1 millisecond', $5)
             ON CONFLICT (key_hash) DO UPDATE SET
                holds = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now()
                             THEN l.holds + 1 ELSE 1 END,
                fence = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now()
                             THEN l.fence ELSE GREATEST(l.fence + 1, {us}) END,
                value = CASE WHEN l.owner = EXCLUDED.owner AND l.expires_at > now()
                             THEN l.value ELSE EXCLUDED.value END,
                owner = EXCLUDED.owner,
                expires_at = EXCLUDED.expires_at
             WHERE l.owner IS NULL OR l.expires_at <= now() OR l.owner = EXCLUDED.owner
             RETURNING fence, holds"
        ),
        // A release that frees the name notifies its channel ($3), in the
        // same round trip, if someone waits (holds $4 shared; see
        // `notify::waited_key`): waiters in every process try again at
        // once. CASE, so a re-entrant hold's release notifies nobody.
        release: format!(
            "WITH r AS (UPDATE {t} SET
                holds = holds - 1,
                owner = CASE WHEN holds > 1 THEN owner ELSE NULL END,
                value = CASE WHEN holds > 1 THEN value ELSE NULL END,
                expires_at = CASE WHEN holds > 1 THEN expires_at ELSE now() END
             WHERE key_hash = $1 AND owner = $2 AND expires_at > now()
             RETURNING holds)
             SELECT holds, CASE WHEN holds = 0 AND NOT pg_try_advisory_xact_lock($4)
                                THEN pg_notify($3, '') IS NULL END FROM r"
        ),
        renew: format!(
            "UPDATE {t} SET expires_at = now() + $3::bigint * interval '1 millisecond'
             WHERE key_hash = $1 AND owner = $2 AND expires_at > now()"
        ),
        renew_many: format!(
            "UPDATE {t} AS l SET expires_at = now() + r.ttl * interval '1 millisecond'
             FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key_hash, owner, ttl)
             WHERE l.key_hash = r.key_hash AND l.owner = r.owner AND l.expires_at > now()
             RETURNING l.key_hash, l.owner"
        ),
        proclaim: format!(
            "UPDATE {t} SET value = $3
             WHERE key_hash = $1 AND owner = $2 AND expires_at > now()"
        ),
        // The outer condition is checked again on a row that changed while
        // the statement waited for it, so a row taken meanwhile stays.
        sweep: format!(
            "DELETE FROM {t} WHERE key_hash IN
                (SELECT key_hash FROM {t} WHERE expires_at < {stale} LIMIT {batch})
             AND expires_at < {stale}"
        ),
        inspect: format!(
            "SELECT holds, fence,
                    (extract(epoch from (expires_at - now())) * 1000)::bigint, owner, value
             FROM {t} WHERE key_hash = $1 AND owner IS NOT NULL AND expires_at > now()"
        ),
        inspect_legacy: format!(
            "SELECT holds, fence,
                    (extract(epoch from (expires_at - now())) * 1000)::bigint, owner, NULL::bytea
             FROM {t} WHERE key_hash = $1 AND owner IS NOT NULL AND expires_at > now()"
        ),
        holds: String::new(),
        holds_moved: String::new(),
    }
}

/// `NOW(3)` is fixed for the statement; sqlx pins the session time zone to
/// UTC, so the epoch arithmetic is exact.
pub(crate) const MYSQL_NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";
/// The same in µs, for fences.
const MYSQL_NOW_US: &str = "CAST(UNIX_TIMESTAMP(NOW(6)) * 1000000 AS SIGNED)";

fn mysql(t: &str) -> Queries {
    let now = MYSQL_NOW;
    let us = MYSQL_NOW_US;
    let batch = SWEEP_BATCH;
    let flag = MYSQL_REENTRY_FLAG;
    let held = MYSQL_HELD_FLAG;
    let mine = format!("(owner = VALUES(owner) AND expires_at > {now})");
    let free = format!("(owner IS NULL OR expires_at <= {now})");
    Queries {
        create: vec![create_table(Dialect::MySql, t)],
        // MySQL has no RETURNING here, and evaluates these assignments left to
        // right, each seeing the columns already assigned. So value, owner
        // and expires_at go last (value before owner, as it tests the old
        // one), and expires_at tests the *new* owner. The
        // outcome comes back in the OK packet through LAST_INSERT_ID(expr):
        // the clock's µs from the VALUES list on a fresh insert (evaluated on duplicates
        // too, hence the explicit reset), the new fence on takeover, the fence
        // plus a flag on re-entry, and the ms left of the holder's lease
        // plus another flag when someone else holds the key.
        acquire: format!(
            "INSERT INTO {t} (key_hash, lock_key, owner, holds, fence, expires_at, value)
             VALUES (?, ?, ?, 1, LAST_INSERT_ID({us}), {now} + ?, ?)
             ON DUPLICATE KEY UPDATE
                holds = IF({mine}, holds + 1, IF({free}, 1, holds)),
                fence = IF({mine}, LAST_INSERT_ID(fence + {flag}) - {flag},
                        IF({free}, LAST_INSERT_ID(GREATEST(fence + 1, {us})),
                           fence + LAST_INSERT_ID({held} + GREATEST(expires_at - {now}, 0)) * 0)),
                value = IF({mine}, value, IF({free}, VALUES(value), value)),
                owner = IF({mine} OR {free}, VALUES(owner), owner),
                expires_at = IF(owner = VALUES(owner), VALUES(expires_at), expires_at)"
        ),
        // Matched rows (sqlx sets CLIENT_FOUND_ROWS) say whether we held it;
        // LAST_INSERT_ID carries the holds that remain.
        release: format!(
            "UPDATE {t} SET
                holds = LAST_INSERT_ID(holds - 1),
                owner = IF(holds > 0, owner, NULL),
                value = IF(holds > 0, value, NULL),
                expires_at = IF(holds > 0, expires_at, {now})
             WHERE key_hash = ? AND owner = ? AND expires_at > {now}"
        ),
        renew: format!(
            "UPDATE {t} SET expires_at = {now} + ?
             WHERE key_hash = ? AND owner = ? AND expires_at > {now}"
        ),
        renew_many: String::new(),
        // Matched rows: a value set again to what it was still counts.
        proclaim: format!(
            "UPDATE {t} SET value = ?
             WHERE key_hash = ? AND owner = ? AND expires_at > {now}"
        ),
        sweep: format!("DELETE FROM {t} WHERE expires_at < {now} - ? LIMIT {batch}"),
        // The table's binary collation would make the owner read as bytes.
        inspect: format!(
            "SELECT holds, fence, expires_at - {now}, CONVERT(owner USING utf8mb4), value FROM {t}
             WHERE key_hash = ? AND owner IS NOT NULL AND expires_at > {now}"
        ),
        inspect_legacy: format!(
            "SELECT holds, fence, expires_at - {now}, CONVERT(owner USING utf8mb4), NULL FROM {t}
             WHERE key_hash = ? AND owner IS NOT NULL AND expires_at > {now}"
        ),
        holds: format!("SELECT holds FROM {t} WHERE key_hash = ? AND owner = ?"),
        holds_moved: format!(
            "SELECT holds FROM {} WHERE key_hash = ? AND owner = ?",
            crate::layout::holders_table(t)
        ),
    }
}

/// The statement renewing `n` leases at once where its text depends on
/// the batch's size; parameters: key hash, owner, TTL in ms for each lease.
/// SQLite returns the key hash and owner of each lease renewed. MySQL
/// cannot return rows from an `UPDATE`: the count of leases matched (sqlx
/// sets `CLIENT_FOUND_ROWS`) says whether all were renewed.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn renew_batch(dialect: Dialect, t: &str, n: usize) -> String {
    match dialect {
        Dialect::Sqlite => {
            let now = SQLITE_NOW;
            let rows = vec!["(?, ?, ?)"; n].join(", ");
            format!(
                "WITH r(key_hash, owner, ttl) AS (VALUES {rows})
                 UPDATE {t} SET expires_at = {now} + r.ttl FROM r
                 WHERE {t}.key_hash = r.key_hash AND {t}.owner = r.owner
                   AND {t}.expires_at > {now}
                 RETURNING {t}.key_hash, {t}.owner"
            )
        }
        Dialect::MySql => {
            let now = MYSQL_NOW;
            let first = "SELECT ? AS key_hash, ? AS owner, ? AS ttl";
            let rows = std::iter::once(first)
                .chain(std::iter::repeat_n("SELECT ?, ?, ?", n.saturating_sub(1)))
                .collect::<Vec<_>>()
                .join(" UNION ALL ");
            format!(
                "UPDATE {t} AS l JOIN ({rows}) AS r
                   ON l.key_hash = r.key_hash AND l.owner = r.owner
                 SET l.expires_at = {now} + r.ttl
                 WHERE l.expires_at > {now}"
            )
        }
        Dialect::Postgres => String::new(),
    }
}

/// A TTL in whole milliseconds, as the statements take it.
pub(crate) fn ttl_ms(ttl: Duration) -> i64 {
    // The core caps TTLs at a year; the clamp only keeps this total.
    i64::try_from(ttl.as_millis().max(1)).unwrap_or(i64::MAX / 4)
}
