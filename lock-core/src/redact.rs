//! URLs shown without their secrets ([`RedactedUrl`]): the password, and
//! any query parameter that carries one.

use std::fmt;

/// A connection URL whose `Debug` and `Display` hide the password (and any
/// `password`/`token` query parameter, or one whose name ends in
/// `password`, such as `sentinel_password`). Use it wherever a URL may be
/// logged.
///
/// ```
/// use lockwright_core::backend::RedactedUrl;
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
            Some((start, value)) if colon.is_none_or(|c| start < c) => {
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

/// Query parameter names whose values are secrets; so is any name that
/// ends in `password` (see [`is_secret_param`]).
const SECRET_PARAMS: [&str; 4] = ["password", "pass", "token", "secret"];

/// Whether the query parameter `name` carries a secret: one of
/// [`SECRET_PARAMS`], or a name ending in `password` (`sentinel_password`,
/// `tls_key_password`), so that a store's second password is hidden as its
/// first one is.
pub(crate) fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    SECRET_PARAMS.contains(&name.as_str()) || name.ends_with("password")
}

/// Where the first secret parameter (`?password=`, `&token=`,
/// `&sentinel_password=`, …) starts, and where its value starts.
fn secret_param(s: &str) -> Option<(usize, usize)> {
    // Every '?' or '&' is a possible start, the userinfo's included: a
    // password may hold either unescaped.
    let bytes = s.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b != b'?' && b != b'&' {
            continue;
        }
        let rest = &s[i + 1..];
        let Some(end) = rest.find(['=', '&', '?']) else {
            continue;
        };
        if rest.as_bytes()[end] == b'=' && is_secret_param(&rest[..end]) {
            return Some((i, i + 1 + end + 1));
        }
    }
    None
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
        if is_secret_param(key) {
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
            // A second password (the sentinels' own) is hidden as the
            // first is, whatever precedes it in its name.
            (
                "rediss+sentinel://:pw@s1,s2/m?tls_ca=/ca.pem&sentinel_password=spw&timeout=1s",
                "rediss+sentinel://:***@s1,s2/m?tls_ca=/ca.pem&sentinel_password=***&***",
            ),
            (
                "redis+sentinel://s1/m?Sentinel_Password=spw",
                "redis+sentinel://s1/m?Sentinel_Password=***",
            ),
        ] {
            let u = RedactedUrl::new(url);
            assert_eq!(u.to_string(), shown);
            assert_eq!(format!("{u:?}"), format!("{shown:?}"));
        }
        assert_eq!(RedactedUrl::new("Postgres://x").scheme(), "postgres");
    }

    #[test]
    fn parameters_named_for_a_password_are_secret() {
        for name in [
            "password",
            "PASS",
            "token",
            "sentinel_password",
            "SENTINEL_PASSWORD",
        ] {
            assert!(is_secret_param(name), "{name}");
        }
        for name in ["sentinel_username", "passwords_file", "tls_ca", "user"] {
            assert!(!is_secret_param(name), "{name}");
        }
        // A password parameter after the userinfo's '@' hides the rest.
        let u = RedactedUrl::new("redis+sentinel://u:p@s1/m?sentinel_password=a@b&x=1");
        assert!(!u.to_string().contains("a@b"), "{u}");
        assert!(!u.to_string().contains(":p@"), "{u}");
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
                if r.is_multiple_of(3) {
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
                format!("lockwright:{pw}@127.0.0.1:5432/db"),
                format!("postgres//user:{pw}@h/db"),
                format!("redis:/:{pw}@h:6379"),
                format!("postgres:user:{pw}@h/db"),
                format!("postgres://h/db?sslmode=disable&password={pw}&table=t"),
                format!("redis+unix:///tmp/r.sock?pass={pw}"),
                format!("rediss+sentinel://:{pw}@s1,s2/m?sentinel_password={pw}"),
                format!("redis+sentinel://s1/m?tls_ca=/x&sentinel_password={pw}&timeout=1s"),
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
