//! Parsing a SQL connection URL into a [`SqlConfig`].

use std::time::Duration;

use lockwright_core::backend::{RedactedUrl, Scheme, ServerUrl, UrlParams};
use lockwright_core::{Error, Result};

/// The URL schemes this crate answers to (each dialect is built in by its
/// own cargo feature; a URL for one that is not says which to enable).
pub const SCHEMES: &[Scheme] = &[
    Scheme::new("sqlite", "SQLite", None),
    Scheme::new("postgres", "PostgreSQL", Some(5432)),
    Scheme::new("postgresql", "PostgreSQL", Some(5432)),
    Scheme::new("mysql", "MySQL/MariaDB", Some(3306)),
    Scheme::new("mariadb", "MySQL/MariaDB", Some(3306)),
];

/// How long a free lease row is kept by default (see [`SqlConfig::retention`]).
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(60);

/// The parameters each driver understands (sqlx 0.8); anything else in the
/// URL is refused rather than silently ignored.
fn driver_params(dialect: Dialect) -> &'static [&'static str] {
    match dialect {
        Dialect::Sqlite => &["mode", "cache", "immutable", "vfs"],
        Dialect::Postgres => &[
            "sslmode",
            "ssl-mode",
            "sslrootcert",
            "ssl-root-cert",
            "ssl-ca",
            "sslcert",
            "ssl-cert",
            "sslkey",
            "ssl-key",
            "statement-cache-capacity",
            "host",
            "hostaddr",
            "port",
            "dbname",
            "user",
            "password",
            "application_name",
            "options",
        ],
        Dialect::MySql => &[
            "sslmode",
            "ssl-mode",
            "sslca",
            "ssl-ca",
            "sslcert",
            "ssl-cert",
            "sslkey",
            "ssl-key",
            "charset",
            "collation",
            "statement-cache-capacity",
            "socket",
            "timezone",
            "time-zone",
        ],
    }
}

/// The shortest TTL accepted, in both modes: renewed every third of it, a
/// lease must outlast a commit, a busy wait behind other writers and a
/// scheduling delay on a loaded host, which together can take tens of
/// milliseconds.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(250);

/// Default name of the lease table.
pub const DEFAULT_TABLE: &str = "lockwright_locks";

/// Which database speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dialect {
    /// SQLite, embedded through sqlx's bundled library.
    Sqlite,
    /// PostgreSQL.
    Postgres,
    /// MySQL or MariaDB.
    MySql,
}

/// How locks live in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A lease row per key with an expiry on the database clock (default).
    Lease,
    /// A session lock (PostgreSQL advisory lock, MySQL `GET_LOCK`) held by a
    /// dedicated connection for as long as the lock is held.
    Session,
}

/// Everything needed to open a [`SqlBackend`](crate::SqlBackend).
///
/// Parameters of ours in the URL query (removed before the URL reaches the
/// driver): `mode` or `lock_mode` (`lease`, the default, or `session`; for
/// SQLite only `lock_mode`, as `mode` is the driver's), `table` (lease table
/// name, a plain identifier), `pool_max` (connections in the pool),
/// `connect_timeout` (e.g. `3s`) and, for SQLite only, `busy_timeout` (how
/// long a statement waits for another process's write lock before the store
/// counts as unavailable; default 5s), and `retention` (how long a free lease
/// row is kept, from 1s; default 60s). Any other parameter must be one the
/// driver understands, or the URL is refused.
#[derive(Debug, Clone)]
pub struct SqlConfig {
    /// The database.
    pub dialect: Dialect,
    /// The URL handed to the driver, without our parameters.
    pub url: RedactedUrl,
    /// Lease rows or session locks (`?mode=session`).
    pub mode: Mode,
    /// The lease table; validated as an identifier.
    pub table: String,
    /// Pool size.
    pub pool_max: u32,
    /// How long to wait for a connection before reporting `Unavailable`.
    pub connect_timeout: Duration,
    /// SQLite: how long to wait for another connection's write lock.
    pub busy_timeout: Duration,
    /// How long a released or expired lease row is kept before a sweep
    /// deletes it. Fences stay strictly increasing across that deletion as
    /// long as the database clock never steps back by more than this, and no
    /// acquire statement takes longer than this between reading the clock
    /// and inserting its row.
    pub retention: Duration,
}

impl SqlConfig {
    /// Parses `sqlite://path/to/file.db?table=locks`,
    /// `postgres://user:pass@host/db`, `mysql://…` or `mariadb://…`.
    ///
    /// # Errors
    /// `Config` for an unknown scheme, an in-memory SQLite database (each
    /// connection would see its own) or a bad parameter; `InvalidOptions` for
    /// a table name that is not a plain identifier.
    pub fn from_url(url: &str) -> Result<Self> {
        let redacted = RedactedUrl::new(url);
        let scheme = Scheme::find(SCHEMES, url)?;
        let dialect = match scheme.name {
            "postgres" | "postgresql" => Dialect::Postgres,
            "mysql" | "mariadb" => Dialect::MySql,
            _ => Dialect::Sqlite,
        };
        // SQLite names a file, not servers: only its query is ours to read.
        let mut server = match scheme.default_port {
            Some(port) => Some(ServerUrl::parse(url, port)?),
            None => None,
        };
        let mut file = UrlParams::new(url);
        let p = match &mut server {
            Some(u) => u.params(),
            None => &mut file,
        };
        let (ms, hour) = (Duration::from_millis(1), Duration::from_secs(3600));
        let modes = [("lease", Mode::Lease), ("session", Mode::Session)];
        // SQLite's driver has a `mode` of its own (rwc, ro, memory).
        let mut mode = p.choice("lock_mode", &modes)?;
        if dialect != Dialect::Sqlite {
            mode = mode.or(p.choice("mode", &modes)?);
        }
        let table = match p.text("table")? {
            Some(t) => validate_table_name(&t)?,
            None => DEFAULT_TABLE.to_owned(),
        };
        let busy_timeout = if dialect == Dialect::Sqlite {
            p.duration("busy_timeout", ms..=hour)?
        } else {
            None
        };
        let mut config = SqlConfig {
            dialect,
            url: redacted.clone(),
            mode: mode.unwrap_or(Mode::Lease),
            table,
            pool_max: p.integer("pool_max", 1..=1000)?.unwrap_or(8),
            connect_timeout: p
                .duration("connect_timeout", ms..=hour)?
                .unwrap_or(Duration::from_secs(3)),
            busy_timeout: busy_timeout.unwrap_or(Duration::from_secs(5)),
            retention: p
                .duration(
                    "retention",
                    Duration::from_secs(1)..=Duration::from_secs(30 * 86_400),
                )?
                .unwrap_or(DEFAULT_RETENTION),
        };
        let driver_url = match &mut server {
            Some(u) => {
                // MySQL has no default database (PostgreSQL takes the
                // user's name): without one, every statement fails with
                // "No database selected", which no retry mends.
                if dialect == Dialect::MySql && u.path().trim_matches('/').is_empty() {
                    return Err(Error::config(format!(
                        "{redacted}: the URL names no database; add it as the path \
                         ({}://host:3306/<database>)",
                        u.scheme()
                    )));
                }
                tls_files_readable(u.params(), dialect)?;
                u.finish(driver_params(dialect))?;
                // sqlx knows MariaDB by the MySQL scheme.
                if u.scheme() == "mariadb" {
                    u.url_as("mysql")
                } else {
                    u.url()
                }
            }
            None => {
                let path = file.location();
                if path.is_empty()
                    || path.contains(":memory:")
                    || file.peek("mode") == Some("memory")
                {
                    return Err(Error::config(format!(
                        "{redacted}: an in-memory SQLite database is private to one connection; \
                         use a file (sqlite://locks.db) or memory:// for in-process locks"
                    )));
                }
                RedactedUrl::new(file.finish(driver_params(dialect))?)
            }
        };
        config.url = driver_url.clone();
        if dialect == Dialect::Sqlite && config.mode == Mode::Session {
            return Err(Error::config(format!(
                "{redacted}: SQLite has no session locks; use the default lease mode"
            )));
        }
        Ok(config)
    }
}

/// The client certificate's and key's parameters, under every spelling
/// both drivers accept (the CA's differ: see [`tls_files_readable`]).
const CLIENT_FILES: [&str; 4] = ["sslcert", "ssl-cert", "sslkey", "ssl-key"];

/// Checks that each TLS file the URL names can be read, and that the TLS
/// mode is one the driver knows: the driver would read the files only
/// when a connection is made, and report a missing one as an I/O error,
/// which looks like a database that cannot be reached.
///
/// # Errors
/// `Config` naming the parameter and the file.
fn tls_files_readable(p: &UrlParams, dialect: Dialect) -> Result<()> {
    let (modes, verifying, roots): (&[&str], &[&str], &[&str]) = match dialect {
        Dialect::Postgres => (
            &[
                "disable",
                "allow",
                "prefer",
                "require",
                "verify-ca",
                "verify-full",
            ],
            &["verify-ca", "verify-full"],
            &["sslrootcert", "ssl-root-cert", "ssl-ca"],
        ),
        _ => (
            &[
                "disabled",
                "preferred",
                "required",
                "verify_ca",
                "verify_identity",
            ],
            &["verify_ca", "verify_identity"],
            &["sslca", "ssl-ca"],
        ),
    };
    for name in roots.iter().chain(&CLIENT_FILES) {
        let Some(raw) = p.peek(name) else { continue };
        let path = lockwright_core::backend::percent_decode(raw).unwrap_or_else(|| raw.to_owned());
        // The drivers also take the PEM text itself.
        if path.starts_with("-----BEGIN") {
            continue;
        }
        if let Err(e) = std::fs::File::open(&path) {
            return Err(Error::config(format!(
                "{}: {name} {}: cannot read the file",
                p.shown(),
                p.quoted(name, &path)
            ))
            .with_source(e));
        }
    }
    let mut mode = None;
    for name in ["sslmode", "ssl-mode"] {
        if let Some(m) = p.peek(name) {
            if !modes.iter().any(|known| known.eq_ignore_ascii_case(m)) {
                return Err(Error::config(format!(
                    "{}: {name} {}: expected one of {}",
                    p.shown(),
                    p.quoted(name, m),
                    modes.join(", ")
                )));
            }
            mode = Some((name, m.to_ascii_lowercase()));
        }
    }
    // libpq checks the server against a CA file named under `require`
    // too; the driver checks nothing below verify-ca. A URL written for
    // libpq would quietly check less here: refused, naming the fix.
    if let Some(root) = roots.iter().find(|r| p.peek(r).is_some()) {
        let verifies = mode
            .as_ref()
            .is_some_and(|(_, m)| verifying.contains(&m.as_str()));
        if !verifies {
            let (name, m) = mode.unwrap_or((
                if dialect == Dialect::Postgres {
                    "sslmode"
                } else {
                    "ssl-mode"
                },
                modes[2].to_owned(),
            ));
            return Err(Error::config(format!(
                "{}: {root} is checked only under {name}={}: with {name}={m} the server's \
                 certificate would not be checked at all",
                p.shown(),
                verifying.join(" or ")
            )));
        }
    }
    Ok(())
}

/// A table name goes into SQL text, so it must be a plain identifier:
/// ASCII letter or `_`, then letters, digits or `_`, at most 63 bytes.
///
/// # Errors
/// `InvalidOptions` for anything else.
pub fn validate_table_name(name: &str) -> Result<String> {
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    let rest_ok = bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if first_ok && rest_ok && name.len() <= 63 {
        Ok(name.to_owned())
    } else {
        Err(Error::invalid_options(format!(
            "table name {name:?} is not a plain identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 bytes)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwright_core::ErrorKind;

    #[test]
    fn our_parameters_are_taken_out_of_the_url() {
        let c = SqlConfig::from_url("sqlite://dir/locks.db?table=my_locks&pool_max=2&mode=rwc")
            .unwrap();
        assert_eq!(c.dialect, Dialect::Sqlite);
        assert_eq!(c.table, "my_locks");
        assert_eq!(c.pool_max, 2);
        assert_eq!(c.url.expose(), "sqlite://dir/locks.db?mode=rwc");
    }

    #[test]
    fn bad_urls_and_table_names_are_typed_errors() {
        for (url, kind) in [
            (
                "sqlite://x.db?table=locks;drop table x",
                ErrorKind::InvalidOptions,
            ),
            ("sqlite://x.db?table=1abc", ErrorKind::InvalidOptions),
            ("sqlite://x.db?table=", ErrorKind::InvalidOptions),
            ("sqlite://x.db?pool_max=0", ErrorKind::InvalidOptions),
            ("sqlite://x.db?tabel=jobs", ErrorKind::InvalidOptions),
            (
                "postgres://h/db?tabel=jobs_locks",
                ErrorKind::InvalidOptions,
            ),
            ("mysql://h/db?tabel=jobs_locks", ErrorKind::InvalidOptions),
            (
                "postgres://h/db?connect_timeout=0s",
                ErrorKind::InvalidOptions,
            ),
            (
                "postgres://h/db?connect_timeout=soon",
                ErrorKind::InvalidOptions,
            ),
            ("sqlite::memory:", ErrorKind::Config),
            ("sqlite://", ErrorKind::Config),
            // MySQL has no default database.
            ("mysql://u:p@127.0.0.1:3306", ErrorKind::Config),
            ("mariadb://u:p@h/", ErrorKind::Config),
            ("oracle://x", ErrorKind::Config),
            ("sqlite://x.db?lock_mode=session", ErrorKind::Config),
            ("postgres://h/db?mode=exclusive", ErrorKind::InvalidOptions),
            ("postgres://h/db?table=locks%22", ErrorKind::InvalidOptions),
            // TLS: a CA file that is not there, an unknown mode, and a CA
            // file under a mode that would not check the server with it.
            (
                "postgres://h/db?sslrootcert=/nonexistent.pem",
                ErrorKind::Config,
            ),
            ("postgres://h/db?sslmode=verify", ErrorKind::Config),
            ("mysql://h/db?ssl-mode=verify-full", ErrorKind::Config),
            (
                "postgres://h/db?sslmode=require&sslrootcert=/etc/passwd",
                ErrorKind::Config,
            ),
            ("postgres://h/db?sslrootcert=/etc/passwd", ErrorKind::Config),
            ("mysql://h/db?ssl-ca=/etc/passwd", ErrorKind::Config),
        ] {
            assert_eq!(SqlConfig::from_url(url).unwrap_err().kind(), kind, "{url}");
        }
        assert!(validate_table_name(&"t".repeat(64)).is_err());
        let e = SqlConfig::from_url("postgres://u:pw@h/db?tabel=x").unwrap_err();
        assert!(e.to_string().contains("\"tabel\""), "{e}");
        let e = SqlConfig::from_url("postgres://u:pw@h/db?password=x&sslmode=nope").unwrap_err();
        assert!(!e.to_string().contains("nope"), "{e}");
        for ok in [
            "postgres://h/db?sslmode=verify-full&sslrootcert=/etc/passwd",
            "postgres://h/db?sslmode=verify-ca&ssl-root-cert=/etc/passwd&sslcert=/etc/passwd&sslkey=/etc/passwd",
            "mysql://h/db?ssl-mode=VERIFY_IDENTITY&ssl-ca=/etc/passwd",
            "postgres://h/db?sslmode=disable&application_name=a",
            "mysql://h/db?ssl-mode=disabled&charset=utf8mb4",
            "sqlite://x.db?mode=rwc&cache=shared",
        ] {
            assert!(SqlConfig::from_url(ok).is_ok(), "{ok}");
        }
        let m = SqlConfig::from_url("mariadb://u:pw@h/db?mode=session").unwrap();
        assert_eq!((m.dialect, m.mode), (Dialect::MySql, Mode::Session));
        assert_eq!(m.url.expose(), "mysql://u:pw@h/db");
        assert!(!format!("{m:?}").contains("pw"));
    }
}
