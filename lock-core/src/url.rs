//! Connection URLs that never show their secrets.

use std::fmt;

/// A connection URL whose `Debug` and `Display` hide the password (and any
/// `password`/`token` query parameter). Use it wherever a URL may be logged.
///
/// ```
/// use locksmith_core::backend::RedactedUrl;
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

    /// The URL with every secret replaced by `***`. A password may hold any
    /// byte, `/ ? # @ : &` included, unescaped, so nothing is assumed about
    /// where it ends: shown are only the text before the userinfo's first
    /// `:` and the text after the URL's *last* `@`, and nothing after a
    /// secret query parameter. That over-redacts odd URLs (a query value
    /// holding an `@` hides the host), but never shows a password.
    fn redacted(&self) -> String {
        let s = &self.0;
        let Some((scheme, rest)) = s.split_once("://") else {
            // Not a URL as we know it (a missing or mistyped scheme): still
            // hide whatever stands before an '@'.
            return match s.rsplit_once('@') {
                Some((_, after)) if secret_param(s).is_none() => {
                    format!("***@{}", redact_query(after))
                }
                Some(_) => "***".to_owned(),
                None => redact_query(s),
            };
        };
        let mut out = format!("{scheme}://");
        let Some(at) = rest.rfind('@') else {
            out.push_str(&redact_query(rest));
            return out;
        };
        let colon = rest[..at].find(':');
        match secret_param(rest).filter(|&(start, _)| start < at) {
            // A secret parameter before the last '@': its value may run on
            // past that '@', so nothing after it is shown.
            Some((start, value)) if colon.map_or(true, |c| start < c) => {
                out.push_str(&rest[..value]);
                out.push_str("***");
            }
            secret => {
                match colon {
                    Some(c) => {
                        out.push_str(&rest[..c]);
                        out.push_str(":***");
                    }
                    None => out.push_str(&rest[..at]),
                }
                out.push('@');
                if secret.is_some() {
                    out.push_str("***");
                } else {
                    out.push_str(&redact_query(&rest[at + 1..]));
                }
            }
        }
        out
    }
}

/// Query parameter names whose values are secrets.
pub(crate) const SECRET_PARAMS: [&str; 4] = ["password", "pass", "token", "secret"];

/// Where the first secret parameter (`?password=`, `&token=`, …) starts,
/// and where its value starts.
fn secret_param(s: &str) -> Option<(usize, usize)> {
    let lower = s.to_ascii_lowercase();
    let mut first = None;
    for name in SECRET_PARAMS {
        for sep in ['?', '&'] {
            let marker = format!("{sep}{name}=");
            if let Some(i) = lower.find(&marker) {
                let found = (i, i + marker.len());
                first = Some(first.map_or(found, |f: (usize, usize)| f.min(found)));
            }
        }
    }
    first
}

/// Hides the values of query parameters that carry secrets. A secret may
/// itself hold an unescaped `&` or `=`, so everything after the first
/// secret parameter is hidden too.
fn redact_query(s: &str) -> String {
    let Some((head, query)) = s.split_once('?') else {
        return s.to_owned();
    };
    let mut parts: Vec<String> = Vec::new();
    let mut rest = query.split('&');
    for kv in rest.by_ref() {
        let key = kv.split_once('=').map_or(kv, |(k, _)| k);
        if SECRET_PARAMS.contains(&key.to_ascii_lowercase().as_str()) {
            parts.push(format!("{key}=***"));
            break;
        }
        parts.push(kv.to_owned());
    }
    if rest.next().is_some() {
        parts.push("***".to_owned());
    }
    format!("{head}?{}", parts.join("&"))
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

/// Refuses a server URL whose user name or password holds an unescaped
/// `/`, `?` or `#`: the URL then means something else than intended (the
/// driver reads part of the password as host, port or query), and every
/// message about it would show pieces of the password.
///
/// # Errors
/// `Config`, showing nothing of the URL.
pub fn check_userinfo(url: &str) -> crate::Result<()> {
    let Some((_, rest)) = url.split_once("://") else {
        // `postgres:/user:pw@h` would reach the server with the password
        // read as part of a database name.
        return Err(crate::Error::config(
            "not a server URL: expected scheme://[user[:password]@]host[:port]/…",
        ));
    };
    let Some(at) = rest.rfind('@') else {
        return Ok(());
    };
    if rest[..at].contains(['/', '?', '#']) {
        return Err(crate::Error::config(
            "the URL's user name or password holds a '/', '?' or '#' (or a query value holds \
             an '@'): percent-encode them (%2F, %3F, %23, %40) so the URL reads as meant",
        ));
    }
    Ok(())
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
                "zk://h:2181/locks?token=***&***",
            ),
        ] {
            let u = RedactedUrl::new(url);
            assert_eq!(u.to_string(), shown);
            assert_eq!(format!("{u:?}"), format!("{shown:?}"));
        }
        assert_eq!(RedactedUrl::new("Postgres://x").scheme(), "postgres");
    }

    /// Passwords drawn from every reserved URL character (and letters), in
    /// every place a URL can carry one, never show in Display or Debug.
    #[test]
    fn no_password_bytes_ever_show() {
        const RESERVED: &[u8] = b":/?#[]@!$&'()*+,;=%";
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for case in 0..5000 {
            // A marker no URL part contains, then reserved bytes and letters.
            let mut pw = format!("Zq{case}Zq");
            for _ in 0..(next() % 8) {
                let r = next() as usize;
                if r % 3 == 0 {
                    pw.push(char::from(b'a' + (r % 26) as u8));
                } else {
                    pw.push(char::from(RESERVED[r % RESERVED.len()]));
                }
            }
            let at = (next() as usize) % (pw.len() + 1);
            let pw = format!("{}{}{}", &pw[..at], "SECRET", &pw[at..]);
            for url in [
                format!("postgres://user:{pw}@db.example:5432/locks?table=t"),
                format!("mysql://user:{pw}@127.0.0.1/locks"),
                format!("mariadb://user:{pw}@h"),
                format!("redis://:{pw}@127.0.0.1:6379/0"),
                format!("rediss://default:{pw}@h:6380?prefix=app:"),
                format!("redis+redlock://:{pw}@h1:1,h2:2,h3:3/0"),
                format!("zk://user:{pw}@h1:2181,h2:2181/locks"),
                format!("memcache://user:{pw}@h:11211"),
                format!("postgres://h/db?password={pw}"),
                format!("locksmith:{pw}@127.0.0.1:5432/db"),
                format!("postgres//user:{pw}@h/db"),
                format!("redis:/:{pw}@h:6379"),
                format!("postgres:user:{pw}@h/db"),
                format!("postgres://h/db?sslmode=disable&password={pw}&table=t"),
                format!("redis+unix:///tmp/r.sock?pass={pw}"),
            ] {
                let u = RedactedUrl::new(url.as_str());
                for shown in [u.to_string(), format!("{u:?}")] {
                    assert!(
                        !shown.contains("SECRET"),
                        "password {pw:?} shows in {shown:?} (from {url:?})"
                    );
                }
            }
        }
    }
}
