//! Connection URLs: taken apart once ([`ServerUrl`]), never shown with
//! their secrets ([`RedactedUrl`]), and the schemes backends declare.

use std::fmt;

use crate::params::{percent_decode, UrlParams};

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

/// Refuses a server URL whose user name or password holds an unescaped
/// `/`, `?` or `#`: the URL then means something else than intended (the
/// driver reads part of the password as host, port or query), and every
/// message about it would show pieces of the password.
///
/// # Errors
/// `Config`, showing nothing of the URL.
fn check_userinfo(url: &str) -> crate::Result<()> {
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

/// A URL scheme a backend crate answers to, as the crate declares it in its
/// `SCHEMES`. The facade's registry maps each to the crate and its cargo
/// feature; the core knows no store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheme {
    /// The scheme as written before `://`, lowercase (`postgres`).
    pub name: &'static str,
    /// The store it names, for messages (`PostgreSQL`).
    pub store: &'static str,
    /// The port of a server written without one; `None` for a store not
    /// reached through a `host[:port]` list (a file, a Unix socket).
    pub default_port: Option<u16>,
}

impl Scheme {
    /// A scheme named `name` for `store`, with the port of a server
    /// written without one (`None`: not reached through a host list).
    pub const fn new(name: &'static str, store: &'static str, default_port: Option<u16>) -> Self {
        Scheme {
            name,
            store,
            default_port,
        }
    }

    /// The entry of `schemes` that `url`'s scheme names.
    ///
    /// ```
    /// use lockwright_core::backend::Scheme;
    /// const S: &[Scheme] = &[Scheme { name: "zk", store: "ZooKeeper", default_port: Some(2181) }];
    /// assert_eq!(Scheme::find(S, "ZK://h").unwrap().store, "ZooKeeper");
    /// assert!(Scheme::find(S, "redis://h").is_err());
    /// ```
    ///
    /// # Errors
    /// `Config` for text that is not a URL, or a scheme not among
    /// `schemes` (the message lists them).
    pub fn find<'a>(schemes: &'a [Scheme], url: &str) -> crate::Result<&'a Scheme> {
        let scheme = scheme_of(url)?;
        schemes.iter().find(|s| s.name == scheme).ok_or_else(|| {
            let names: Vec<&str> = schemes.iter().map(|s| s.name).collect();
            crate::Error::config(format!(
                "{}: a {scheme}:// URL is not for this backend; its schemes are {}",
                RedactedUrl::new(url),
                names.join(", ")
            ))
        })
    }
}

/// A URL's scheme, lowercased.
///
/// # Errors
/// `Config` for text that is not a URL (no `scheme:`), without secrets.
pub fn scheme_of(url: &str) -> crate::Result<String> {
    let scheme = RedactedUrl::new(url).scheme();
    let well_formed = url.contains(':')
        && scheme
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
    if well_formed {
        Ok(scheme)
    } else {
        Err(crate::Error::config(format!(
            "{}: not a URL; expected e.g. sqlite://lockwright.db or memory://",
            RedactedUrl::new(url)
        )))
    }
}

/// One server of a URL's host list: a lowercase name or address and a port
/// (the scheme's default where none was written). Shown as `host:port`,
/// IPv6 addresses in brackets (`[::1]:2181`), ready for `ToSocketAddrs`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    host: String,
    port: u16,
}

impl HostPort {
    /// A server at `host` (a name, an IPv4 or a bare IPv6 address) and `port`.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        HostPort {
            host: host.into().to_ascii_lowercase(),
            port,
        }
    }

    /// The name or address, IPv6 without brackets.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A server URL taken apart once, the same way for every store:
/// `scheme://[user[:password]@]host[:port][,host[:port]…][/path][?k=v&…]`.
///
/// Every backend, the quorum and the CLI's endpoint rewriting read URLs
/// through this type; nobody splits one by hand. The query is read by type
/// through [`params`](Self::params) ([`UrlParams`]); what the backend did
/// not read and its driver does not know is refused by
/// [`finish`](Self::finish). Errors show the URL without secrets.
///
/// ```
/// use lockwright_core::backend::ServerUrl;
/// let mut u = ServerUrl::parse("zk://app:p%40ss@H1,h2:2182,[::1]/locks?timeout=2s", 2181)?;
/// assert_eq!(u.scheme(), "zk");
/// let hosts: Vec<String> = u.hosts().iter().map(|h| h.to_string()).collect();
/// assert_eq!(hosts, ["h1:2181", "h2:2182", "[::1]:2181"]);
/// assert_eq!(u.user()?.as_deref(), Some("app"));
/// assert_eq!(u.password()?.as_deref(), Some("p@ss"));
/// assert_eq!(u.path(), "/locks");
/// assert!(u.params().duration("timeout", std::time::Duration::ZERO..=std::time::Duration::MAX)?.is_some());
/// u.finish(&[])?;
/// assert!(!u.shown().to_string().contains("p%40ss"));
/// # Ok::<(), lockwright_core::Error>(())
/// ```
pub struct ServerUrl {
    shown: RedactedUrl,
    scheme: String,
    /// The user information as written (percent-escapes kept), without `@`.
    userinfo: Option<String>,
    /// The host list as written, for rebuilding the URL unchanged.
    authority: String,
    hosts: Vec<HostPort>,
    path: String,
    params: UrlParams,
    /// The query to hand on: the whole query until `finish` keeps only the
    /// driver's parameters.
    query: String,
}

impl ServerUrl {
    /// Parses `url`; a host written without a port gets `default_port`. An
    /// empty host list (`postgres:///db?host=/run/pg`) is allowed: a
    /// backend that needs servers asks [`servers`](Self::servers).
    ///
    /// # Errors
    /// `Config` for text that is not `scheme://…`, a user name or password
    /// holding an unescaped `/`, `?` or `#`, an empty entry in the host
    /// list, an IPv6 address without brackets, or a port that is not
    /// 1..=65535. Nothing of a password is shown.
    pub fn parse(url: &str, default_port: u16) -> crate::Result<Self> {
        let scheme = scheme_of(url)?;
        // An '@' in the query (`?prefix=team@eu`) is a value, not the end
        // of user information.
        let before_query = url.split('?').next().unwrap_or(url);
        check_userinfo(before_query)?;
        let shown = RedactedUrl::new(url);
        let rest = url.split_once("://").map_or("", |(_, r)| r);
        let (userinfo, rest) = match rest.split('?').next().unwrap_or(rest).rfind('@') {
            Some(at) => (Some(rest[..at].to_owned()), &rest[at + 1..]),
            None => (None, rest),
        };
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
        if path.contains('#') {
            return Err(crate::Error::config(format!(
                "{shown}: a '#' outside the query means nothing to a store; percent-encode it as %23"
            )));
        }
        // A password holding an unescaped '?' ends up in the host list: then
        // messages must not quote the entries.
        let quote = !url.contains('@');
        let hosts = if authority.is_empty() {
            Vec::new()
        } else {
            authority
                .split(',')
                .map(|h| host_port(&shown, h, default_port, quote))
                .collect::<crate::Result<_>>()?
        };
        Ok(ServerUrl {
            params: UrlParams::new(url),
            shown,
            scheme,
            userinfo,
            authority: authority.to_owned(),
            hosts,
            path: path.to_owned(),
            query: query.to_owned(),
        })
    }

    /// Parses `url` for a backend that answers to `schemes`, with the
    /// default port of the scheme it names.
    ///
    /// # Errors
    /// As [`Scheme::find`] and [`parse`](Self::parse); `Config` for a
    /// scheme of `schemes` not reached through a host list.
    pub fn parse_for(schemes: &[Scheme], url: &str) -> crate::Result<Self> {
        let scheme = Scheme::find(schemes, url)?;
        let port = scheme.default_port.ok_or_else(|| {
            crate::Error::config(format!(
                "{}: a {}:// URL names no servers",
                RedactedUrl::new(url),
                scheme.name
            ))
        })?;
        Self::parse(url, port)
    }

    /// The scheme, lowercased.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The URL without secrets, for messages.
    pub fn shown(&self) -> &RedactedUrl {
        &self.shown
    }

    /// The servers, in the order written (none for an empty host list).
    pub fn hosts(&self) -> &[HostPort] {
        &self.hosts
    }

    /// The host list as written (`h1:2181,H2`), for messages and tests.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The servers, at least one.
    ///
    /// # Errors
    /// `Config` for an empty host list, showing `example` as the form.
    pub fn servers(&self, example: &str) -> crate::Result<&[HostPort]> {
        if self.hosts.is_empty() {
            return Err(crate::Error::config(format!(
                "{}: no server in the URL; expected e.g. {example}",
                self.shown
            )));
        }
        Ok(&self.hosts)
    }

    /// Whether the URL has user information (`user@`, `user:pw@`, `:pw@`).
    pub fn has_userinfo(&self) -> bool {
        self.userinfo.is_some()
    }

    /// The user name, percent-decoded (`None` without user information).
    ///
    /// # Errors
    /// `Config` for a bad %-escape or bytes that are not UTF-8.
    pub fn user(&self) -> crate::Result<Option<String>> {
        self.userinfo_part(|u| u.split_once(':').map_or(u, |(user, _)| user))
    }

    /// The password, percent-decoded (`None` when there is none).
    ///
    /// # Errors
    /// `Config` for a bad %-escape or bytes that are not UTF-8.
    pub fn password(&self) -> crate::Result<Option<String>> {
        match &self.userinfo {
            Some(u) if u.contains(':') => {
                self.userinfo_part(|u| u.split_once(':').map_or("", |(_, pw)| pw))
            }
            _ => Ok(None),
        }
    }

    fn userinfo_part(&self, part: impl Fn(&str) -> &str) -> crate::Result<Option<String>> {
        let Some(u) = &self.userinfo else {
            return Ok(None);
        };
        percent_decode(part(u)).map(Some).ok_or_else(|| {
            crate::Error::config(format!(
                "{}: the user name or password has a bad %-escape or is not UTF-8",
                self.shown
            ))
        })
    }

    /// The path as written (`""`, `/`, `/locks`, `/0`), not decoded.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// A key prefix from the path, for a store that keeps its locks under
    /// a root: no path takes `default`, `/` is the top (`""`), a trailing
    /// `/` is dropped, and %-escapes are decoded.
    ///
    /// # Errors
    /// `Config` for a bad %-escape or a path that is not UTF-8.
    pub fn root(&self, default: &str) -> crate::Result<String> {
        let path = match self.path.as_str() {
            "" => return Ok(default.to_owned()),
            "/" => return Ok(String::new()),
            p => p.strip_suffix('/').unwrap_or(p),
        };
        percent_decode(path).ok_or_else(|| {
            crate::Error::config(format!(
                "{}: the root path has a bad %-escape or is not UTF-8",
                self.shown
            ))
        })
    }

    /// The query parameters, read by type.
    pub fn params(&mut self) -> &mut UrlParams {
        &mut self.params
    }

    /// Refuses every parameter the backend did not read and `driver` does
    /// not know (see [`UrlParams::finish`]); the URLs built afterwards
    /// carry only `driver`'s parameters.
    ///
    /// # Errors
    /// `InvalidOptions` naming the unknown parameter.
    pub fn finish(&mut self, driver: &[&str]) -> crate::Result<()> {
        self.query = self.params.leftover(driver)?.join("&");
        Ok(())
    }

    /// The URL as written, with only the query left to hand on.
    pub fn url(&self) -> RedactedUrl {
        self.build(&self.scheme, &self.authority)
    }

    /// [`url`](Self::url) under another scheme (`mariadb://` for a driver
    /// that knows only `mysql://`).
    pub fn url_as(&self, scheme: &str) -> RedactedUrl {
        self.build(scheme, &self.authority)
    }

    /// The URL with another scheme and host list (a quorum's node, or a
    /// proxy in front of each server); user information, path and query kept.
    pub fn url_with(&self, scheme: &str, hosts: &[HostPort]) -> RedactedUrl {
        let list: Vec<String> = hosts.iter().map(HostPort::to_string).collect();
        self.build(scheme, &list.join(","))
    }

    fn build(&self, scheme: &str, authority: &str) -> RedactedUrl {
        let mut s = format!("{scheme}://");
        if let Some(u) = &self.userinfo {
            s.push_str(u);
            s.push('@');
        }
        s.push_str(authority);
        s.push_str(&self.path);
        if !self.query.is_empty() {
            s.push('?');
            s.push_str(&self.query);
        }
        RedactedUrl::new(s)
    }
}

impl fmt::Debug for ServerUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL as shown, never the raw user information or query.
        f.debug_struct("ServerUrl")
            .field("url", &self.shown)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// One `host[:port]` entry of a host list; `quote`: messages may show it.
fn host_port(
    shown: &RedactedUrl,
    entry: &str,
    default_port: u16,
    quote: bool,
) -> crate::Result<HostPort> {
    let bad = |why: String| crate::Error::config(format!("{shown}: {why}"));
    let entry_shown = if quote {
        format!("{entry:?}")
    } else {
        "a server".to_owned()
    };
    let port_shown = |p: &str| {
        if quote {
            format!("{p:?}")
        } else {
            "a port".to_owned()
        }
    };
    let (host, port) = if let Some(v6) = entry.strip_prefix('[') {
        let (addr, after) = v6
            .split_once(']')
            .ok_or_else(|| bad(format!("{entry_shown} opens an IPv6 '[' it does not close")))?;
        match after {
            "" => (addr, None),
            _ => match after.strip_prefix(':') {
                Some(p) => (addr, Some(p)),
                None => return Err(bad(format!("{entry_shown} is not host:port"))),
            },
        }
    } else {
        match entry.split_once(':') {
            Some((_, p)) if p.contains(':') => {
                return Err(bad(format!(
                    "{entry_shown}: write an IPv6 address in brackets, as [::1]:{default_port}"
                )))
            }
            Some((h, p)) => (h, Some(p)),
            None => (entry, None),
        }
    };
    if host.is_empty() {
        return Err(bad(format!(
            "an empty host in the server list; expected host1:{default_port},host2:{default_port}"
        )));
    }
    let port = match port {
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| bad(format!("{} is not a port number", port_shown(p))))?,
    };
    Ok(HostPort::new(host, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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

    #[test]
    fn server_urls_are_taken_apart_once() {
        let mut u =
            ServerUrl::parse("redis+redlock://:pw@a:1,B,[::1]:3/0?timeout=1s&x=2", 6379).unwrap();
        let hosts: Vec<String> = u.hosts().iter().map(ToString::to_string).collect();
        assert_eq!(hosts, ["a:1", "b:6379", "[::1]:3"]);
        assert_eq!(u.hosts()[2].host(), "::1");
        assert_eq!(u.user().unwrap().as_deref(), Some(""));
        assert_eq!(u.password().unwrap().as_deref(), Some("pw"));
        assert_eq!(u.path(), "/0");
        assert_eq!(
            u.url().expose(),
            "redis+redlock://:pw@a:1,B,[::1]:3/0?timeout=1s&x=2"
        );
        u.params()
            .duration("timeout", Duration::ZERO..=Duration::MAX)
            .unwrap();
        u.finish(&["x"]).unwrap();
        let one = HostPort::new("h9", 9);
        assert_eq!(
            u.url_with("redis", &[one]).expose(),
            "redis://:pw@h9:9/0?x=2"
        );
        let u = ServerUrl::parse("postgres:///db?host=/run/pg", 5432).unwrap();
        assert!(u.hosts().is_empty());
        assert!(u.servers("postgres://h/db").is_err());
        assert!(!u.has_userinfo());
        assert_eq!(u.user().unwrap(), None);
        let u = ServerUrl::parse("zk://user@h", 2181).unwrap();
        assert_eq!(u.password().unwrap(), None);
        assert_eq!(u.user().unwrap().as_deref(), Some("user"));
        for bad in [
            "zk://h1,,h2",
            "zk://h:0",
            "zk://h:x",
            "zk://h:",
            "zk://::1",
            "zk://[::1",
            "zk://[::1]x",
            "zk://u:a/b@h",
            "zk:h",
            "h1:2181",
            "zk://u:%zz@h",
        ] {
            let e = ServerUrl::parse(bad, 2181)
                .and_then(|u| u.password())
                .unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Config, "{bad}: {e}");
        }
        let e = ServerUrl::parse("zk://u:hunter2@h:x", 1).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        // A password with an unescaped '?' lands in the host list: not quoted.
        let e = ServerUrl::parse("redis://user:hun?ter2@h", 1).unwrap_err();
        assert!(!e.to_string().contains("hun"), "{e}");
        assert!(ServerUrl::parse("zk://h/x#y", 1).is_err());
        // An '@' in a query value is a value.
        let u = ServerUrl::parse("memcache://h:1?prefix=team@eu:", 1).unwrap();
        assert_eq!(
            (u.has_userinfo(), u.hosts()[0].to_string()),
            (false, "h:1".to_owned())
        );
        let u = ServerUrl::parse("zk://u:hunter2@h?x=1", 1).unwrap();
        assert!(!format!("{u:?}").contains("hunter2"), "{u:?}");
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
