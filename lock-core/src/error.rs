//! The one error type every lockwright operation returns.

use std::fmt;
use std::sync::Arc;

/// Convenience alias used throughout lockwright.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, in terms a caller can match on: one kind per fact,
/// the same from every primitive (lock, semaphore, read-write lock,
/// election) and every store.
///
/// | fact | kind | typical source |
/// |---|---|---|
/// | a hold this caller had is gone: its lease ran out, an operator broke it, the store lost it | [`Lost`](Self::Lost) | `release`, `renew`, `proclaim`, `downgrade`, scoped work |
/// | the caller asked about a hold it does not have (never had, or gave back) | [`NotHeld`](Self::NotHeld) | a backend's owner-checked request |
/// | another owner holds it, and the attempt was not to wait (`NoWait`) | [`Busy`](Self::Busy) | `lock_with`, `acquire`, `write`, `campaign`, … with `no_wait()` |
/// | another owner still held it when the wait ran out | [`Timeout`](Self::Timeout) | the same, with `wait_for` |
/// | the store cannot be reached or refused service; nothing is known | [`Unavailable`](Self::Unavailable) | every call that reaches the store |
/// | a bad URL, credentials, database, or a store not compiled in | [`Config`](Self::Config) | `connect` |
/// | a bad name | [`InvalidKey`](Self::InvalidKey) | every call taking a name |
/// | options or values out of range | [`InvalidOptions`](Self::InvalidOptions) | every call taking options |
/// | the store cannot do this at all | [`Unsupported`](Self::Unsupported) | a primitive or an operator's request the store lacks |
/// | the locker was closed | [`Closed`](Self::Closed) | acquires after [`Locker::close`](crate::Locker::close) |
/// | the store answered what no rule explains | [`Backend`](Self::Backend) | any call |
///
/// `Option`-returning forms (`try_lock`, `try_lock_with`, `try_acquire`,
/// `try_campaign`, …) answer `Busy` and `Timeout` as `Ok(None)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Another owner still held the lock when the wait ran out.
    Timeout,
    /// The caller does not hold what it named (never did, or released it).
    NotHeld,
    /// A hold this caller had is gone (its lease ran out, it was broken or
    /// taken over): the work done under it may not have been exclusive.
    Lost,
    /// The store could not be reached or refused service; nothing is known about the lock.
    Unavailable,
    /// The key is empty, too long or contains NUL.
    InvalidKey,
    /// Lock options are out of range (zero TTL, TTL below the store's resolution, overflow).
    InvalidOptions,
    /// Bad connection URL, unknown scheme, or a backend whose cargo feature is off.
    Config,
    /// Any other store error.
    Backend,
    /// The [`Locker`](crate::Locker) was closed and takes no new locks.
    Closed,
    /// The store cannot do what was asked (e.g. report a lock's status).
    Unsupported,
    /// Another owner holds the lock, and the attempt was not to wait for
    /// it ([`WaitPolicy::NoWait`](crate::WaitPolicy::NoWait)).
    Busy,
}

impl ErrorKind {
    /// A short lowercase name, stable for logs and CLI output.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::NotHeld => "not held",
            ErrorKind::Lost => "lost",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::InvalidKey => "invalid key",
            ErrorKind::InvalidOptions => "invalid options",
            ErrorKind::Config => "config",
            ErrorKind::Backend => "backend",
            ErrorKind::Closed => "closed",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Busy => "busy",
        }
    }
}

impl ErrorKind {
    /// Every kind, for tables and tests.
    pub const ALL: &'static [ErrorKind] = &[
        ErrorKind::Timeout,
        ErrorKind::NotHeld,
        ErrorKind::Lost,
        ErrorKind::Unavailable,
        ErrorKind::InvalidKey,
        ErrorKind::InvalidOptions,
        ErrorKind::Config,
        ErrorKind::Backend,
        ErrorKind::Closed,
        ErrorKind::Unsupported,
        ErrorKind::Busy,
    ];
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A lockwright error: a matchable [`ErrorKind`], a message and an optional
/// cause. `Display` shows the kind and the message; the driver's own text
/// is in the [`source`](std::error::Error::source) chain, shown in full by
/// [`chain`](Error::chain). Cloning shares the cause.
#[derive(Clone)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
    /// The store refused the request outright: none of it took effect.
    unapplied: bool,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.kind).field("message", &self.message);
        if let Some(s) = &self.source {
            d.field("source", &s.to_string());
        }
        d.finish()
    }
}

impl Error {
    /// A new error of `kind` with a human-readable message.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            source: None,
            unapplied: false,
        }
    }

    /// Marks the error as a refusal that changed nothing in the store (a
    /// full memcached refusing a write), as opposed to a request whose
    /// answer was lost and may have been applied. A [`Quorum`] does not
    /// undo a node that answered so: its undo would remove what the owner
    /// held before.
    ///
    /// [`Quorum`]: crate::backend::Quorum
    #[must_use]
    pub fn unapplied(mut self) -> Self {
        self.unapplied = true;
        self
    }

    /// True when the store said the request changed nothing (see
    /// [`unapplied`](Self::unapplied)).
    pub fn is_unapplied(&self) -> bool {
        self.unapplied
    }

    /// Attaches the underlying cause.
    pub fn with_source(mut self, source: impl Into<Source>) -> Self {
        self.source = Some(Arc::from(source.into()));
        self
    }

    /// The error and every cause under it on one line, `a: b: c`, each
    /// cause's text shown once even where a driver repeats its own source.
    ///
    /// ```
    /// use lockwright_core::Error;
    /// let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
    /// let e = Error::unavailable("cannot reach redis").with_source(io);
    /// assert_eq!(e.chain(), "unavailable: cannot reach redis: refused");
    /// ```
    pub fn chain(&self) -> String {
        let mut out = one_line(&self.to_string());
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            let text = one_line(&c.to_string());
            if !text.is_empty() && !out.contains(&text) {
                out.push_str(": ");
                out.push_str(&text);
            }
            cause = c.source();
        }
        out
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message without the kind prefix.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// True when retrying the same call later may succeed (store outage, a
    /// lock held by someone else).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::Busy
        )
    }

    /// Shorthand for [`ErrorKind::Timeout`].
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Timeout, message)
    }
    /// Shorthand for [`ErrorKind::NotHeld`].
    pub fn not_held(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotHeld, message)
    }
    /// Shorthand for [`ErrorKind::Lost`].
    pub fn lost(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Lost, message)
    }
    /// Shorthand for [`ErrorKind::Unavailable`].
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    /// Shorthand for [`ErrorKind::InvalidKey`].
    pub fn invalid_key(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidKey, message)
    }
    /// Shorthand for [`ErrorKind::InvalidOptions`].
    pub fn invalid_options(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidOptions, message)
    }
    /// Shorthand for [`ErrorKind::Config`].
    pub fn config(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Config, message)
    }
    /// Shorthand for [`ErrorKind::Backend`].
    pub fn backend(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Backend, message)
    }
}

/// Text on one line: a server's multi-line message (an SQL excerpt, a
/// protocol dump) with each line break and the indentation after it
/// folded into one space.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_kind_and_keeps_the_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let e = Error::unavailable("store down").with_source(io);
        assert_eq!(e.to_string(), "unavailable: store down");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.is_retryable());
        assert!(std::error::Error::source(&e).is_some());
        assert!(!Error::invalid_key("x").is_retryable());
        let sql = std::io::Error::other(
            "syntax error near 'select (\n        key_hash TEXT,\n  ...' at line 1",
        );
        let e = Error::config("the database refused the configuration").with_source(sql);
        assert_eq!(
            e.chain(),
            "config: the database refused the configuration: \
             syntax error near 'select ( key_hash TEXT, ...' at line 1"
        );
    }
}
