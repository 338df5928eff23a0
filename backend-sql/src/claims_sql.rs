//! The statements of permits and read holds (see `claims`), in each
//! dialect that has them: SQLite, and PostgreSQL.
//!
//! Every time is in ms since the epoch: the holders table keeps its
//! leases so in every dialect, and the lease table's `expires_at` is
//! read and written through [`ClaimsSql`]'s conversions where it is a
//! `TIMESTAMPTZ` (PostgreSQL). Statements are written with `$n`
//! parameters, which SQLite reads as `?n`.
//!
//! What keeps a name's claims in order: on SQLite, the database's write
//! lock, taken by `BEGIN IMMEDIATE`; on PostgreSQL, the name's row in the
//! lease table, made if missing and locked (`FOR UPDATE`) by the first
//! statements of every transaction that changes the name's holders. The
//! mutex's one statement takes the same row's lock, so it waits for them
//! and they for it, and each statement after the lock reads what the
//! transactions before it committed.

use crate::config::Dialect;
use crate::layout::holders_table;

/// The statements of one dialect, for the lease table `t`.
#[derive(Debug)]
pub(crate) struct ClaimsSql {
    /// How a claims transaction begins.
    pub(crate) begin: &'static str,
    /// Makes the name's row if it is missing, and locks it (key hash,
    /// key); `None` where the begin locks already.
    pub(crate) ensure_name: Option<String>,
    /// Locks the name's row (key hash); `None` where the begin locks.
    pub(crate) lock_name: Option<String>,
    /// The clock (ms) and the name row: (now, owner, holds, fence,
    /// expires_at), the row's columns `NULL` when it is missing (key hash).
    pub(crate) name_and_now: String,
    /// The live holders rows (key hash, now).
    pub(crate) live_holders: String,
    /// Sets the name row from its live holders (key hash).
    pub(crate) settle_name: String,
    /// Writes a holders row (key hash, owner, key, shared, holds, fence,
    /// expires_at), replacing the owner's.
    pub(crate) put_holder: String,
    /// The name row's owner becomes the readers' marker (key hash).
    pub(crate) name_shared: String,
    /// Adds a hold to the owner's row (key hash, owner, until).
    pub(crate) add_hold: String,
    /// Writes the name row for a group's grant (key hash, key, marker,
    /// holds, fence, until, now).
    pub(crate) put_name: String,
    /// Deletes the owner's last hold (key hash, owner); returns a row.
    pub(crate) drop_last: String,
    /// Takes one of the owner's holds (key hash, owner); returns holds.
    pub(crate) drop_one: String,
    /// Extends the owner's lease (key hash, owner, TTL in ms).
    pub(crate) renew: String,
    /// The group marker of a live name row, read without a transaction
    /// (key hash).
    pub(crate) live_group: String,
    /// The owner's live holders row's `shared` (key hash, owner, now).
    pub(crate) mine: String,
    /// A writer's mark (key hash, owner, key, until).
    pub(crate) mark: String,
    /// Takes a writer's mark away (key hash, owner).
    pub(crate) unmark: String,
    /// The live holders and their lease left in ms (key hash).
    pub(crate) inspect: String,
}

/// Rewrites a column or parameter into the dialect's form.
type Rewrite = dyn Fn(&str) -> String;

/// `$n` parameters as SQLite's `?n`.
fn sqlite_params(s: String) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out
}

impl ClaimsSql {
    /// The statements for `dialect`, or `None` where it has no claims.
    pub(crate) fn new(dialect: Dialect, t: &str) -> Option<ClaimsSql> {
        let h = holders_table(t);
        // The clock in ms; the name row's expiry read as ms; ms written
        // as the name row's expiry; the larger of two.
        let (now, exp, at, max): (&str, &Rewrite, &Rewrite, &str) = match dialect {
            Dialect::Sqlite => (
                crate::queries::SQLITE_NOW,
                &|c: &str| c.to_owned(),
                &|p: &str| p.to_owned(),
                "MAX",
            ),
            Dialect::Postgres => {
                (
                    "(extract(epoch from clock_timestamp()) * 1000)::bigint",
                    &|c: &str| {
                        format!("(extract(epoch from GREATEST({c}, 'epoch'::timestamptz)) * 1000)::bigint")
                    },
                    &|p: &str| format!("to_timestamp(({p})::bigint / 1000.0)"),
                    "GREATEST",
                )
            }
            Dialect::MySql => return None,
        };
        let live = format!("FROM {h} WHERE key_hash = $1 AND holds > 0 AND expires_at > {now}");
        let put_holder = format!(
            "INSERT INTO {h} (key_hash, owner, lock_key, shared, holds, fence, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (key_hash, owner) DO UPDATE SET lock_key = excluded.lock_key,
                shared = excluded.shared, holds = excluded.holds, fence = excluded.fence,
                expires_at = excluded.expires_at"
        );
        let sql = ClaimsSql {
            begin: match dialect {
                Dialect::Sqlite => "BEGIN IMMEDIATE",
                _ => "BEGIN",
            },
            ensure_name: (dialect == Dialect::Postgres).then(|| {
                format!(
                    // DO UPDATE, not DO NOTHING: it locks the row it finds,
                    // and makes it afresh if a sweep deleted it meanwhile.
                    "INSERT INTO {t} (key_hash, lock_key, owner, holds, fence, expires_at)
                     VALUES ($1, $2, NULL, 0, 0, now())
                     ON CONFLICT (key_hash) DO UPDATE SET lock_key = EXCLUDED.lock_key"
                )
            }),
            lock_name: (dialect == Dialect::Postgres)
                .then(|| format!("SELECT 1 FROM {t} WHERE key_hash = $1 FOR UPDATE")),
            name_and_now: match dialect {
                Dialect::Sqlite => format!(
                    "SELECT n.now, t.owner, t.holds, t.fence, t.expires_at
                     FROM (SELECT {now} AS now) n LEFT JOIN {t} t ON t.key_hash = $1"
                ),
                // The row exists (`ensure_name`), and is locked here.
                _ => format!(
                    "SELECT {now}, owner, holds, fence, {} FROM {t} WHERE key_hash = $1 FOR UPDATE",
                    exp("expires_at")
                ),
            },
            live_holders: format!(
                "SELECT owner, shared, holds, fence, expires_at FROM {h}
                 WHERE key_hash = $1 AND expires_at > $2"
            ),
            settle_name: format!(
                "UPDATE {t} SET
                    holds = (SELECT COUNT(*) {live}),
                    expires_at = {},
                    owner = CASE WHEN EXISTS (SELECT 1 {live}) THEN owner ELSE NULL END,
                    value = NULL
                 WHERE key_hash = $1 AND substr(owner, 1, 1) = '~'",
                at(&format!("COALESCE((SELECT MAX(expires_at) {live}), {now})"))
            ),
            put_holder,
            name_shared: format!(
                "UPDATE {t} SET owner = '{}' WHERE key_hash = $1",
                crate::layout::SHARED
            ),
            add_hold: format!(
                "UPDATE {h} SET holds = holds + 1, expires_at = {max}(expires_at, $3)
                 WHERE key_hash = $1 AND owner = $2"
            ),
            put_name: format!(
                "INSERT INTO {t} (key_hash, lock_key, owner, holds, fence, expires_at, value)
                 VALUES ($1, $2, $3, $4, $5, {until}, NULL)
                 ON CONFLICT (key_hash) DO UPDATE SET
                    lock_key = excluded.lock_key, owner = excluded.owner,
                    holds = excluded.holds, fence = excluded.fence, value = NULL,
                    expires_at = CASE WHEN {old} > $7 AND substr({t}.owner, 1, 1) = '~'
                                      THEN {max}({t}.expires_at, excluded.expires_at)
                                      ELSE excluded.expires_at END",
                until = at("$6"),
                old = exp(&format!("{t}.expires_at")),
            ),
            drop_last: format!(
                "DELETE FROM {h} WHERE key_hash = $1 AND owner = $2 AND holds = 1
                    AND expires_at > {now} RETURNING holds"
            ),
            drop_one: format!(
                "UPDATE {h} SET holds = holds - 1 WHERE key_hash = $1 AND owner = $2
                    AND holds > 1 AND expires_at > {now} RETURNING holds"
            ),
            renew: format!(
                "UPDATE {h} SET expires_at = {now} + $3
                 WHERE key_hash = $1 AND owner = $2 AND holds > 0 AND expires_at > {now}"
            ),
            live_group: format!(
                "SELECT owner FROM {t} WHERE key_hash = $1 AND {} > {now}
                    AND substr(owner, 1, 1) = '~'",
                exp("expires_at")
            ),
            mine: format!(
                "SELECT shared FROM {h} WHERE key_hash = $1 AND owner = $2
                    AND holds > 0 AND expires_at > $3"
            ),
            mark: format!(
                "INSERT INTO {h} (key_hash, owner, lock_key, shared, holds, fence, expires_at)
                 VALUES ($1, $2, $3, 0, 0, 0, $4)
                 ON CONFLICT (key_hash, owner) DO UPDATE
                    SET expires_at = excluded.expires_at WHERE {h}.holds = 0"
            ),
            unmark: format!("DELETE FROM {h} WHERE key_hash = $1 AND owner = $2 AND holds = 0"),
            inspect: format!(
                "SELECT owner, shared, holds, fence, expires_at - {now} FROM {h}
                 WHERE key_hash = $1 AND holds > 0 AND expires_at > {now}"
            ),
        };
        Some(match dialect {
            Dialect::Sqlite => sql.in_sqlite(),
            _ => sql,
        })
    }

    fn in_sqlite(self) -> ClaimsSql {
        let p = sqlite_params;
        ClaimsSql {
            begin: self.begin,
            ensure_name: self.ensure_name.map(p),
            lock_name: self.lock_name.map(p),
            name_and_now: p(self.name_and_now),
            live_holders: p(self.live_holders),
            settle_name: p(self.settle_name),
            put_holder: p(self.put_holder),
            name_shared: p(self.name_shared),
            add_hold: p(self.add_hold),
            put_name: p(self.put_name),
            drop_last: p(self.drop_last),
            drop_one: p(self.drop_one),
            renew: p(self.renew),
            live_group: p(self.live_group),
            mine: p(self.mine),
            mark: p(self.mark),
            unmark: p(self.unmark),
            inspect: p(self.inspect),
        }
    }
}

/// The DDL creating the holders table of the lease table `t`.
pub(crate) fn create_holders(dialect: Dialect, t: &str) -> String {
    let h = holders_table(t);
    let (text, int) = match dialect {
        Dialect::Postgres => ("TEXT", "BIGINT"),
        _ => ("TEXT", "INTEGER"),
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {h} (
            key_hash   {text} NOT NULL,
            owner      {text} NOT NULL,
            lock_key   {text} NOT NULL,
            shared     {int} NOT NULL,
            holds      {int} NOT NULL,
            fence      {int} NOT NULL,
            expires_at {int} NOT NULL,
            PRIMARY KEY (key_hash, owner)
        )"
    )
}

/// Deletes up to `batch` rows of the holders table whose lease ended more
/// than the retention (the parameter, in ms) ago.
pub(crate) fn sweep_holders(dialect: Dialect, t: &str, batch: u64) -> String {
    let h = holders_table(t);
    match dialect {
        Dialect::Postgres => format!(
            "DELETE FROM {h} WHERE ctid IN (SELECT ctid FROM {h}
                WHERE expires_at < (extract(epoch from clock_timestamp()) * 1000)::bigint - $1
                LIMIT {batch})"
        ),
        _ => format!(
            "DELETE FROM {h} WHERE rowid IN
                (SELECT rowid FROM {h} WHERE expires_at < {} - ?1 LIMIT {batch})",
            crate::queries::SQLITE_NOW
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_reads_numbered_parameters() {
        assert_eq!(
            sqlite_params("a = $1 AND b = $12, '$x'".into()),
            "a = ?1 AND b = ?12, '$x'"
        );
        let s = ClaimsSql::new(Dialect::Sqlite, "locks").unwrap();
        assert!(!s.put_name.contains('$') && s.put_name.contains("?7"));
        let p = ClaimsSql::new(Dialect::Postgres, "locks").unwrap();
        assert!(p.put_name.contains("$7") && p.lock_name.is_some());
        assert!(ClaimsSql::new(Dialect::MySql, "locks").is_none());
    }
}
