//! Connection URLs that never show their secrets.

use std::fmt;

/// A connection URL whose `Debug` and `Display` hide the password (and any
/// `password`/`token` query parameter). Use it wherever a URL may be logged.
///
/// ```
/// use locksmith_core::RedactedUrl;
/// let u = RedactedUrl::new("postgres://app:s3cret@db:5432/locks?password=x");
/// assert_eq!(u.to_string(), "postgres://app:***@db:5432/locks?password=***");
/// assert_eq!(u.expose(), "postgres://app:s3cret@db:5432/locks?password=x");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RedactedUrl(String);

impl RedactedUrl {
    /// Wraps a URL.
    pub fn new(url: impl Into<String>) -> Self {
        RedactedUrl(url.into())
    }

    /// The URL with its secrets, for handing to a driver only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The scheme (before the first `:`), lowercased.
    pub fn scheme(&self) -> String {
        self.0
            .split_once(':')
            .map(|(s, _)| s.to_ascii_lowercase())
            .unwrap_or_default()
    }

    fn redacted(&self) -> String {
        let s = &self.0;
        let (head, query) = match s.split_once('?') {
            Some((h, q)) => (h, Some(q)),
            None => (s.as_str(), None),
        };
        let mut out = String::with_capacity(s.len());
        // userinfo sits between "://" and the last '@' before the path.
        match head.split_once("://") {
            Some((scheme, rest)) => {
                let authority_end = rest.find('/').unwrap_or(rest.len());
                let (authority, path) = rest.split_at(authority_end);
                out.push_str(scheme);
                out.push_str("://");
                match authority.rsplit_once('@') {
                    Some((userinfo, host)) => {
                        match userinfo.split_once(':') {
                            Some((user, _)) => {
                                out.push_str(user);
                                out.push_str(":***");
                            }
                            None => out.push_str(userinfo),
                        }
                        out.push('@');
                        out.push_str(host);
                    }
                    None => out.push_str(authority),
                }
                out.push_str(path);
            }
            None => out.push_str(head),
        }
        if let Some(q) = query {
            out.push('?');
            let parts: Vec<String> = q
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _))
                        if ["password", "pass", "token", "secret"]
                            .contains(&k.to_ascii_lowercase().as_str()) =>
                    {
                        format!("{k}=***")
                    }
                    _ => kv.to_owned(),
                })
                .collect();
            out.push_str(&parts.join("&"));
        }
        out
    }
}

impl fmt::Debug for RedactedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.redacted(), f)
    }
}

impl fmt::Display for RedactedUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Splits off the query parameters a backend understands, leaving the rest
/// for its driver: `take(key, value)` answers `Ok(true)` for a parameter it
/// consumed. Returns the URL without the consumed parameters.
///
/// ```
/// let mut table = String::new();
/// let rest = locksmith_core::take_params("sqlite://a.db?table=t&mode=ro", |k, v| {
///     Ok(k == "table" && { table = v.to_owned(); true })
/// })
/// .unwrap();
/// assert_eq!((rest.as_str(), table.as_str()), ("sqlite://a.db?mode=ro", "t"));
/// ```
///
/// # Errors
/// Whatever `take` returns for a bad value.
pub fn take_params(
    url: &str,
    mut take: impl FnMut(&str, &str) -> crate::Result<bool>,
) -> crate::Result<String> {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let mut rest = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if !take(k, v)? {
            rest.push(pair);
        }
    }
    Ok(if rest.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", rest.join("&"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_hidden_everywhere_they_print() {
        for (url, shown) in [
            ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
            ("redis://user:p@ss@h", "redis://user:***@h"),
            ("sqlite://locks.db", "sqlite://locks.db"),
            ("mysql://root@h/db", "mysql://root@h/db"),
            (
                "zk://h:2181/locks?token=abc&x=1",
                "zk://h:2181/locks?token=***&x=1",
            ),
        ] {
            let u = RedactedUrl::new(url);
            assert_eq!(u.to_string(), shown);
            assert_eq!(format!("{u:?}"), format!("{shown:?}"));
        }
        assert_eq!(RedactedUrl::new("Postgres://x").scheme(), "postgres");
    }
}
