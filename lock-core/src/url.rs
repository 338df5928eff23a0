//! Connection URLs: taken apart once ([`ServerUrl`]), and the schemes
//! backends declare. (`redact.rs` shows them without their secrets.)

use std::fmt;

use crate::params::{percent_decode, UrlParams};
use crate::redact::RedactedUrl;

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
    /// Whether the store it names has replicas that a failover promotes
    /// (what `lockwright check --faults failover` needs; the store's
    /// [`Driver`](crate::backend::Driver) says how to make one).
    pub replicas: bool,
}

impl Scheme {
    /// A scheme named `name` for `store`, with the port of a server
    /// written without one (`None`: not reached through a host list).
    pub const fn new(name: &'static str, store: &'static str, default_port: Option<u16>) -> Self {
        Scheme {
            name,
            store,
            default_port,
            replicas: false,
        }
    }

    /// The same scheme, naming a store whose primary has replicas that a
    /// failover promotes.
    #[must_use]
    pub const fn with_replicas(mut self) -> Self {
        self.replicas = true;
        self
    }

    /// The entry of `schemes` that `url`'s scheme names.
    ///
    /// ```
    /// use lockwright_core::backend::Scheme;
    /// const S: &[Scheme] = &[Scheme::new("zk", "ZooKeeper", Some(2181))];
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
}
