//! The one error type every lockwright operation returns.

use std::fmt;
use std::sync::Arc;

/// Convenience alias used throughout lockwright.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, in terms a caller can match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock was not acquired before the wait policy's deadline.
    Timeout,
    /// The caller does not hold the lock (never did, released it, or its lease expired).
    NotHeld,
    /// A lock that was held has been lost (renewal failed until the local deadline).
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
        }
    }
}

impl ErrorKind {
    /// The exit status (from BSD's `sysexits.h`) a command-line tool should
    /// end with for this kind of error, so that scripts can tell "busy" from
    /// "broken"; the `lockwright` command uses this table.
    ///
    /// | kind | status |
    /// |---|---|
    /// | `Timeout` | 75 (`EX_TEMPFAIL`): not acquired within the wait |
    /// | `Lost`, `NotHeld`, `Closed` | 70 (`EX_SOFTWARE`): the lock could not be kept |
    /// | `InvalidKey`, `InvalidOptions`, `Config`, `Unsupported` | 64 (`EX_USAGE`): retrying will not help |
    /// | `Unavailable` | 69 (`EX_UNAVAILABLE`): the store cannot be reached now |
    /// | `Backend` | 76 (`EX_PROTOCOL`): the store answered unexpectedly |
    pub fn exit_code(self) -> i32 {
        // Exhaustive on purpose: a new kind must be given its status here.
        match self {
            ErrorKind::Timeout => 75,
            ErrorKind::Lost | ErrorKind::NotHeld | ErrorKind::Closed => 70,
            ErrorKind::InvalidKey
            | ErrorKind::InvalidOptions
            | ErrorKind::Config
            | ErrorKind::Unsupported => 64,
            ErrorKind::Unavailable => 69,
            ErrorKind::Backend => 76,
        }
    }

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

    /// True when retrying the same call later may succeed (store outage, timeout).
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind, ErrorKind::Unavailable | ErrorKind::Timeout)
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
