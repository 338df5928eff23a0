//! The statements of permits and read holds (see `claims`), in each
//! dialect: SQLite, PostgreSQL and MySQL/MariaDB.
//!
//! Every time is in ms since the epoch: the holders table keeps its
//! leases so in every dialect, and the lease table's `expires_at` is
//! read and written through [`ClaimsSql`]'s conversions where it is a
//! `TIMESTAMPTZ` (PostgreSQL). Statements are written with `$n`
//! parameters, which SQLite reads as `?n`; MySQL has only positional `?`,
//! so each [`Stmt`] carries the order its arguments are bound in.
//!
//! What keeps a name's claims in order: on SQLite, the database's write
//! lock, taken by `BEGIN IMMEDIATE`; on PostgreSQL and MySQL, the name's
//! row in the lease table, made if missing and locked (`ON CONFLICT DO
//! UPDATE`/`ON DUPLICATE KEY UPDATE`, then `FOR UPDATE`) by the first
//! statements of every transaction that changes the name's holders. The
//! mutex's one statement takes the same row's lock, so it waits for them
//! and they for it, and each statement after the lock reads what the
//! transactions before it committed (on MySQL, whose repeatable read
//! takes its snapshot at the first plain read, that read comes after the
//! lock).

use crate::config::Dialect;
use crate::layout::holders_table;

/// One statement, and the order its arguments are bound in.
#[derive(Debug)]
pub(crate) struct Stmt {
    /// The text, in the dialect's parameter form.
    pub(crate) sql: String,
    /// For positional parameters (MySQL): which argument (from 0) each
    /// `?` takes, in order; `None` where parameters are numbered.
    pub(crate) order: Option<Vec<usize>>,
}

impl From<String> for Stmt {
    fn from(sql: String) -> Self {
        Stmt { sql, order: None }
    }
}

/// `sqlx::$make` (`query`, `query_as`, `query_scalar`) of the [`Stmt`]
/// `$stmt` with its arguments bound, in the order it takes them.
macro_rules! bound {
    ($make:ident, $stmt:expr; $($arg:expr),* $(,)?) => {{
        let stmt: &$crate::claims_sql::Stmt = $stmt;
        #[allow(unused_mut)]
        let mut q = sqlx::$make(&stmt.sql);
        match &stmt.order {
            None => {
                $( q = q.bind($arg); )*
            }
            Some(order) => {
                for &i in order {
                    let mut n = 0_usize;
                    $(
                        if i == n {
                            q = q.bind($arg);
                        }
                        n += 1;
                    )*
                    let _ = (i, n);
                }
            }
        }
        q
    }};
}
pub(crate) use bound;

/// The statements of one dialect, for the lease table `t`.
#[derive(Debug)]
pub(crate) struct ClaimsSql {
    /// How a claims transaction begins.
    pub(crate) begin: &'static str,
    /// Makes the name's row if it is missing, and locks it (key hash,
    /// key); `None` where the begin locks already.
    pub(crate) ensure_name: Option<Stmt>,
    /// Locks the name's row (key hash); `None` where the begin locks.
    pub(crate) lock_name: Option<Stmt>,
    /// The clock (ms) and the name row: (now, owner, holds, fence,
    /// expires_at), the row's columns `NULL` when it is missing (key hash).
    pub(crate) name_and_now: Stmt,
    /// The live holders rows (key hash, now).
    pub(crate) live_holders: Stmt,
    /// Sets the name row from its live holders (key hash).
    pub(crate) settle_name: Stmt,
    /// Writes a holders row (key hash, owner, key, shared, holds, fence,
    /// expires_at), replacing the owner's.
    pub(crate) put_holder: Stmt,
    /// Sets the name row's owner: the readers' marker at a downgrade, the
    /// group's when a lone permit moves out (key hash, owner).
    pub(crate) name_owner: Stmt,
    /// Adds a hold to the owner's row (key hash, owner, until).
    pub(crate) add_hold: Stmt,
    /// Writes the name row for a group's grant (key hash, key, marker,
    /// holds, fence, until, now).
    pub(crate) put_name: Stmt,
    /// Deletes the owner's last hold (key hash, owner).
    pub(crate) drop_last: Stmt,
    /// Takes one of the owner's holds when it has more (key hash, owner).
    pub(crate) drop_one: Stmt,
    /// The owner's holds (key hash, owner).
    pub(crate) holds: Stmt,
    /// Extends the owner's lease (key hash, owner, TTL in ms).
    pub(crate) renew: Stmt,
    /// The group marker of a live name row, read without a transaction
    /// (key hash).
    pub(crate) live_group: Stmt,
    /// The owner's live holders row's `shared` (key hash, owner, now).
    pub(crate) mine: Stmt,
    /// A writer's mark (key hash, owner, key, until).
    pub(crate) mark: Stmt,
    /// Takes a writer's mark away (key hash, owner).
    pub(crate) unmark: Stmt,
    /// The live holders and their lease left in ms (key hash).
    pub(crate) inspect: Stmt,
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

/// `$n` parameters as MySQL's positional `?`, with the argument each takes.
fn mysql_params(s: String) -> Stmt {
    let mut sql = String::with_capacity(s.len());
    let mut order = Vec::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            let mut n = 0_usize;
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                n = n * 10 + d as usize;
                chars.next();
            }
            sql.push('?');
            order.push(n - 1);
        } else {
            sql.push(c);
        }
    }
    Stmt {
        sql,
        order: Some(order),
    }
}

impl ClaimsSql {
    /// The statements for `dialect`.
    pub(crate) fn new(dialect: Dialect, t: &str) -> ClaimsSql {
        let h = holders_table(t);
        let my = dialect == Dialect::MySql;
        // The clock in ms; the name row's expiry read as ms; ms written
        // as the name row's expiry; the larger of two; a text column read
        // (MySQL's binary collation would read it as bytes).
        let (now, exp, at, max, txt): (&str, &Rewrite, &Rewrite, &str, &Rewrite) = match dialect {
            Dialect::Sqlite => (
                crate::queries::SQLITE_NOW,
                &|c: &str| c.to_owned(),
                &|p: &str| p.to_owned(),
                "MAX",
                &|c: &str| c.to_owned(),
            ),
            Dialect::Postgres => (
                "(extract(epoch from clock_timestamp()) * 1000)::bigint",
                &|c: &str| {
                    format!(
                        "(extract(epoch from GREATEST({c}, 'epoch'::timestamptz)) * 1000)::bigint"
                    )
                },
                &|p: &str| format!("to_timestamp(({p})::bigint / 1000.0)"),
                "GREATEST",
                &|c: &str| c.to_owned(),
            ),
            Dialect::MySql => (
                crate::queries::MYSQL_NOW,
                &|c: &str| c.to_owned(),
                &|p: &str| p.to_owned(),
                "GREATEST",
                &|c: &str| format!("CONVERT({c} USING utf8mb4)"),
            ),
        };
        // An upsert's tail: on a duplicate key, `sets` (column = new value,
        // the new row's values read as `excluded.c`).
        let upsert = |key: &str, sets: &str| -> String {
            if my {
                let sets = sets.replace("excluded.", "VALUES(");
                // `VALUES(c` closes at the column's end.
                let sets = close_values(&sets);
                format!("ON DUPLICATE KEY UPDATE {sets}")
            } else {
                format!("ON CONFLICT ({key}) DO UPDATE SET {sets}")
            }
        };
        let live = format!("FROM {h} WHERE key_hash = $1 AND holds > 0 AND expires_at > {now}");
        let put_holder = format!(
            "INSERT INTO {h} (key_hash, owner, lock_key, shared, holds, fence, expires_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7) {}",
            upsert(
                "key_hash, owner",
                "lock_key = excluded.lock_key, shared = excluded.shared, \
                 holds = excluded.holds, fence = excluded.fence, \
                 expires_at = excluded.expires_at"
            )
        );
        // MySQL assigns left to right, each assignment seeing the ones
        // before it: the expiry, which reads the old owner, goes first.
        let put_name_sets = format!(
            "expires_at = CASE WHEN {old} > $7 AND substr({t}.owner, 1, 1) = '~'
                               THEN {max}({t}.expires_at, excluded.expires_at)
                               ELSE excluded.expires_at END,
             lock_key = excluded.lock_key, owner = excluded.owner,
             holds = excluded.holds, fence = excluded.fence, value = NULL",
            old = exp(&format!("{t}.expires_at")),
        );
        let sql = ClaimsSql {
            begin: match dialect {
                Dialect::Sqlite => "BEGIN IMMEDIATE",
                _ => "BEGIN",
            },
            // DO UPDATE, not DO NOTHING: it locks the row it finds, and
            // makes it afresh if a sweep deleted it meanwhile.
            ensure_name: (dialect != Dialect::Sqlite).then(|| {
                format!(
                    "INSERT INTO {t} (key_hash, lock_key, owner, holds, fence, expires_at)
                     VALUES ($1, $2, NULL, 0, 0, {}) {}",
                    at(now),
                    upsert("key_hash", "lock_key = excluded.lock_key")
                )
                .into()
            }),
            lock_name: (dialect != Dialect::Sqlite)
                .then(|| format!("SELECT 1 FROM {t} WHERE key_hash = $1 FOR UPDATE").into()),
            name_and_now: match dialect {
                Dialect::Sqlite => format!(
                    "SELECT n.now, t.owner, t.holds, t.fence, t.expires_at
                     FROM (SELECT {now} AS now) n LEFT JOIN {t} t ON t.key_hash = $1"
                ),
                // The row exists (`ensure_name`), and is locked here.
                _ => format!(
                    "SELECT {now}, {}, holds, fence, {} FROM {t} WHERE key_hash = $1 FOR UPDATE",
                    txt("owner"),
                    exp("expires_at")
                ),
            }
            .into(),
            live_holders: format!(
                "SELECT {}, shared, holds, fence, expires_at FROM {h}
                 WHERE key_hash = $1 AND expires_at > $2",
                txt("owner")
            )
            .into(),
            settle_name: format!(
                "UPDATE {t} SET
                    holds = (SELECT COUNT(*) {live}),
                    expires_at = {},
                    owner = CASE WHEN EXISTS (SELECT 1 {live}) THEN owner ELSE NULL END,
                    value = NULL
                 WHERE key_hash = $1 AND substr(owner, 1, 1) = '~'
                    AND owner NOT LIKE '~permits:%/%'",
                at(&format!("COALESCE((SELECT MAX(expires_at) {live}), {now})"))
            )
            .into(),
            put_holder: put_holder.into(),
            name_owner: format!("UPDATE {t} SET owner = $2 WHERE key_hash = $1").into(),
            add_hold: format!(
                "UPDATE {h} SET holds = holds + 1, expires_at = {max}(expires_at, $3)
                 WHERE key_hash = $1 AND owner = $2"
            )
            .into(),
            put_name: format!(
                "INSERT INTO {t} (key_hash, lock_key, owner, holds, fence, expires_at, value)
                 VALUES ($1, $2, $3, $4, $5, {until}, NULL) {}",
                upsert("key_hash", &put_name_sets),
                until = at("$6"),
            )
            .into(),
            drop_last: format!(
                "DELETE FROM {h} WHERE key_hash = $1 AND owner = $2 AND holds = 1
                    AND expires_at > {now}"
            )
            .into(),
            drop_one: format!(
                "UPDATE {h} SET holds = holds - 1 WHERE key_hash = $1 AND owner = $2
                    AND holds > 1 AND expires_at > {now}"
            )
            .into(),
            holds: format!("SELECT holds FROM {h} WHERE key_hash = $1 AND owner = $2").into(),
            renew: format!(
                "UPDATE {h} SET expires_at = {now} + $3
                 WHERE key_hash = $1 AND owner = $2 AND holds > 0 AND expires_at > {now}"
            )
            .into(),
            live_group: format!(
                "SELECT {} FROM {t} WHERE key_hash = $1 AND {} > {now}
                    AND substr(owner, 1, 1) = '~'",
                txt("owner"),
                exp("expires_at")
            )
            .into(),
            mine: format!(
                "SELECT shared FROM {h} WHERE key_hash = $1 AND owner = $2
                    AND holds > 0 AND expires_at > $3"
            )
            .into(),
            mark: format!(
                "INSERT INTO {h} (key_hash, owner, lock_key, shared, holds, fence, expires_at)
                 VALUES ($1, $2, $3, 0, 0, 0, $4) {}",
                if my {
                    // No WHERE on MySQL's upsert: a holder's row stays as it is.
                    "ON DUPLICATE KEY UPDATE
                        expires_at = IF(holds = 0, VALUES(expires_at), expires_at)"
                        .to_owned()
                } else {
                    format!(
                        "ON CONFLICT (key_hash, owner) DO UPDATE
                            SET expires_at = excluded.expires_at WHERE {h}.holds = 0"
                    )
                }
            )
            .into(),
            unmark: format!("DELETE FROM {h} WHERE key_hash = $1 AND owner = $2 AND holds = 0")
                .into(),
            inspect: format!(
                "SELECT {}, shared, holds, fence, expires_at - {now} FROM {h}
                 WHERE key_hash = $1 AND holds > 0 AND expires_at > {now}",
                txt("owner")
            )
            .into(),
        };
        match dialect {
            Dialect::Sqlite => sql.rewritten(|s| sqlite_params(s).into()),
            Dialect::MySql => sql.rewritten(mysql_params),
            Dialect::Postgres => sql,
        }
    }

    /// Every statement's parameters rewritten by `p`.
    fn rewritten(self, p: impl Fn(String) -> Stmt) -> ClaimsSql {
        let p = |s: Stmt| p(s.sql);
        ClaimsSql {
            begin: self.begin,
            ensure_name: self.ensure_name.map(p),
            lock_name: self.lock_name.map(p),
            name_and_now: p(self.name_and_now),
            live_holders: p(self.live_holders),
            settle_name: p(self.settle_name),
            put_holder: p(self.put_holder),
            name_owner: p(self.name_owner),
            add_hold: p(self.add_hold),
            put_name: p(self.put_name),
            drop_last: p(self.drop_last),
            drop_one: p(self.drop_one),
            holds: p(self.holds),
            renew: p(self.renew),
            live_group: p(self.live_group),
            mine: p(self.mine),
            mark: p(self.mark),
            unmark: p(self.unmark),
            inspect: p(self.inspect),
        }
    }
}

/// Closes each `VALUES(column` left by replacing `excluded.` with a `)`
/// after the column's name.
fn close_values(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    let mut rest = s;
    while let Some(i) = rest.find("VALUES(") {
        let (before, after) = rest.split_at(i + "VALUES(".len());
        out.push_str(before);
        let end = after
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        out.push_str(&after[..end]);
        out.push(')');
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The DDL creating the holders table of the lease table `t`.
pub(crate) fn create_holders(dialect: Dialect, t: &str) -> String {
    let h = holders_table(t);
    let (hash, text, int, tail) = match dialect {
        Dialect::Sqlite => ("TEXT", "TEXT", "INTEGER", ""),
        Dialect::Postgres => ("TEXT", "TEXT", "BIGINT", ""),
        // Binary collation, as the lease table's: owners compare exactly.
        Dialect::MySql => (
            "CHAR(64)",
            "VARCHAR(128)",
            "BIGINT",
            " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
        ),
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {h} (
            key_hash   {hash} NOT NULL,
            owner      {text} NOT NULL,
            lock_key   TEXT NOT NULL,
            shared     {int} NOT NULL,
            holds      {int} NOT NULL,
            fence      {int} NOT NULL,
            expires_at {int} NOT NULL,
            PRIMARY KEY (key_hash, owner)
        ){tail}"
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
        Dialect::MySql => format!(
            "DELETE FROM {h} WHERE expires_at < {} - ? LIMIT {batch}",
            crate::queries::MYSQL_NOW
        ),
        Dialect::Sqlite => format!(
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
    fn parameters_in_each_dialect() {
        assert_eq!(
            sqlite_params("a = $1 AND b = $12, '$x'".into()),
            "a = ?1 AND b = ?12, '$x'"
        );
        let m = mysql_params("a = $3 AND b = $1 OR c = $12 AND d = $1, '$x'".into());
        assert_eq!(m.sql, "a = ? AND b = ? OR c = ? AND d = ?, '$x'");
        assert_eq!(m.order, Some(vec![2, 0, 11, 0]));
        let s = ClaimsSql::new(Dialect::Sqlite, "locks");
        assert!(!s.put_name.sql.contains('$') && s.put_name.sql.contains("?7"));
        let p = ClaimsSql::new(Dialect::Postgres, "locks");
        assert!(p.put_name.sql.contains("$7") && p.lock_name.is_some());
        let my = ClaimsSql::new(Dialect::MySql, "locks");
        assert!(!my.put_name.sql.contains('$') && !my.put_name.sql.contains("excluded"));
        assert!(my.put_holder.sql.contains("holds = VALUES(holds),"));
        assert_eq!(my.renew.order, Some(vec![2, 0, 1]));
    }

    #[test]
    fn values_close_after_the_column() {
        assert_eq!(
            close_values("a = VALUES(a, b = VALUES(b_c END"),
            "a = VALUES(a), b = VALUES(b_c) END"
        );
    }
}
