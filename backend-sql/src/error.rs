//! The one mapping of sqlx's errors onto the contract's kinds.

use lockwright_core::backend::RedactedUrl;
#[cfg(feature = "tls")]
use lockwright_core::backend::TlsRefusal;
use lockwright_core::Error;

/// Maps driver errors onto the contract's kinds, in one place: anything that
/// means "could not talk to the database" is `Unavailable`.
pub(crate) fn map_err(e: sqlx::Error) -> Error {
    use sqlx::Error as E;
    let unavailable = match &e {
        E::Io(_) | E::Tls(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed => true,
        E::Protocol(_) => true,
        E::Database(db) => db_unavailable(db.as_ref()),
        _ => false,
    };
    if let Some(why) = tls_refused(&e) {
        return Error::config(why).with_source(e);
    }
    let permanent = match &e {
        E::Database(db) => db_refused(db.as_ref()),
        _ => false,
    };
    if let E::Database(db) = &e {
        if let Some(why) = tls_demanded(db.as_ref()) {
            return Error::config(why).with_source(e);
        }
    }
    if permanent {
        Error::config("the database refused the configuration").with_source(e)
    } else if unavailable {
        // No connection was had (none free in time, or the server refused
        // one): the statement was never sent.
        let unsent = matches!(&e, E::PoolTimedOut)
            || matches!(&e, E::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused);
        let error = Error::unavailable("cannot reach the database").with_source(e);
        if unsent {
            error.unapplied()
        } else {
            error
        }
    } else if matches!(e, E::Configuration(_)) {
        Error::config("the database driver refused the configuration").with_source(e)
    } else {
        Error::backend("the database answered with an error").with_source(e)
    }
}

/// A TLS failure that no retry mends, in words that name the URL parameter
/// that would: a certificate not trusted or not for this host, a server
/// without TLS where TLS was required, a handshake the server refused.
/// A connection that drops during the handshake is not one of them.
fn tls_refused(e: &sqlx::Error) -> Option<&'static str> {
    match e {
        sqlx::Error::Tls(t) if t.to_string().contains("without TLS support") => {
            Some("this build has no TLS: enable lockwright's `postgres` or `mysql` feature")
        }
        sqlx::Error::Tls(t) if t.to_string().contains("does not support TLS") => Some(
            "the server does not offer TLS, and the URL requires it (sslmode / ssl-mode); \
             never sent in plain text instead",
        ),
        sqlx::Error::Tls(_) => Some(
            "the TLS files cannot be used (sslrootcert / ssl-ca, sslcert / ssl-cert, \
             sslkey / ssl-key)",
        ),
        #[cfg(feature = "tls")]
        sqlx::Error::Io(io) => TlsRefusal::of(io, true).map(tls_words),
        _ => None,
    }
}

/// What a refused handshake means for the user.
#[cfg(feature = "tls")]
fn tls_words(refusal: TlsRefusal) -> &'static str {
    match refusal {
        TlsRefusal::WrongHost => {
            "the server's certificate is not for the host the URL names \
             (sslmode=verify-full and ssl-mode=verify_identity check the name)"
        }
        TlsRefusal::UntrustedCa => {
            "the server's certificate is not signed by a trusted CA: name the CA's \
             certificate file with sslrootcert (PostgreSQL) or ssl-ca (MySQL)"
        }
        TlsRefusal::BadCertificate => {
            "the server's certificate is not valid (expired, not yet valid or not for a server)"
        }
        TlsRefusal::RefusedByServer => {
            "the server refused the TLS handshake (does it want a client certificate: \
             sslcert and sslkey, or ssl-cert and ssl-key?)"
        }
        TlsRefusal::Incompatible => {
            "the server's TLS is older than this client speaks (TLS 1.2 or 1.3 with \
             modern ciphers)"
        }
        _ => "the TLS handshake with the server failed",
    }
}

/// PostgreSQL refusing a connection without TLS (28000, "no encryption"
/// in the message: a `hostssl`-only server reached with `sslmode=disable`).
fn tls_demanded(db: &dyn sqlx::error::DatabaseError) -> Option<&'static str> {
    if db.code().as_deref() == Some("28000") && db.message().contains("no encryption") {
        return Some(
            "the server takes only TLS connections: use sslmode=require or stricter, \
             not sslmode=disable",
        );
    }
    // MySQL's require_secure_transport (3159; MariaDB says only "Access
    // denied", 1045, which stays the refused credentials it may be).
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        if my.number() == 3159 {
            return Some(
                "the server takes only TLS connections: use ssl-mode=required or stricter, \
                 not ssl-mode=disabled",
            );
        }
    }
    None
}

/// Server errors that retrying will not fix: refused credentials, a
/// database or role that does not exist, a file that is not a database or
/// cannot be created, a table name the SQL parser rejects.
fn db_refused(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // Primary result codes: CANTOPEN 14 (a missing directory), NOTADB
        // 26; ERROR 1 covers a syntax error from a reserved table name.
        let code = db.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(0);
        return matches!(code & 0xff, 14 | 26)
            || (code & 0xff == 1 && db.message().contains("syntax error"));
    }
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        // Class 28 authorization (unknown role, wrong password), 3D000
        // unknown database, 42601 syntax error, 42501 insufficient privilege.
        let c = pg.code();
        return c.starts_with("28") || matches!(c, "3D000" | "42601" | "42501");
    }
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        // Access denied (1044 database, 1045 user, 1142 table), no
        // database selected 1046, unknown database 1049, syntax error 1064.
        return matches!(my.number(), 1044 | 1045 | 1046 | 1049 | 1064 | 1142);
    }
    false
}

/// Server errors that mean "the database cannot serve us now".
fn db_unavailable(db: &dyn sqlx::error::DatabaseError) -> bool {
    #[cfg(feature = "sqlite")]
    if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
        // Primary result codes: BUSY 5, LOCKED 6, READONLY 8, IOERR 10,
        // FULL 13.
        let code = db.code().and_then(|c| c.parse::<i64>().ok()).unwrap_or(0);
        return matches!(code & 0xff, 5 | 6 | 8 | 10 | 13);
    }
    #[cfg(feature = "postgres")]
    if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        // Class 08 connection exceptions, 57P0x shutting down or starting
        // up, class 53 out of resources (e.g. too many connections).
        let c = pg.code();
        return c.starts_with("08") || c.starts_with("57P") || c.starts_with("53");
    }
    #[cfg(feature = "mysql")]
    if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
        // Too many connections, shutdown in progress, lock wait timeout,
        // read-only server.
        return matches!(my.number(), 1040 | 1053 | 1205 | 1290 | 1836);
    }
    false
}

/// MySQL reports a deadlock victim with 1213 and a lock-wait timeout with 1205.
#[cfg(feature = "mysql")]
pub(crate) fn is_mysql_conflict(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().is_some_and(|c| c == "1213" || c == "40001"))
}

/// SQLite's BUSY (primary result code 5): another connection holds the
/// lock the statement needs, and SQLite did not wait for it.
#[cfg(feature = "sqlite")]
pub(crate) fn is_sqlite_busy(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("5"))
}

/// The lease table does not exist (yet): PostgreSQL 42P01, MySQL 42S02,
/// SQLite "no such table".
pub(crate) fn is_missing_table(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("42P01" | "42S02"))
                || db.message().contains("no such table")
        }
        _ => false,
    }
}

/// The lease table has no `value` column (a table of an earlier version
/// not yet set up by this one): PostgreSQL 42703, MySQL 42S22 (1054),
/// SQLite "no such column".
pub(crate) fn is_missing_column(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("42703" | "42S22"))
                || db.message().contains("no such column")
        }
        _ => false,
    }
}

/// The column being added is there already (a twin added it first):
/// PostgreSQL 42701, MySQL 42S21 (1060), SQLite "duplicate column name".
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn is_duplicate_column(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("42701" | "42S21"))
                || db.message().contains("duplicate column name")
        }
        _ => false,
    }
}

/// A URL the driver cannot read: `Config`, the driver's reason as the source.
pub(crate) fn bad_url(url: &RedactedUrl, e: sqlx::Error) -> Error {
    Error::config(format!("{url}: the driver cannot read this URL")).with_source(e)
}
