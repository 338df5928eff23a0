//! A URL's query parameters, read by type the same way by every backend.

use std::fmt;
use std::ops::RangeInclusive;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::redact::{is_secret_param, RedactedUrl};

/// A URL's query parameters, read by type. A backend asks for each of its
/// own parameters by name; [`finish`](Self::finish) then refuses any
/// parameter that neither the backend asked for nor its driver reads (a
/// misspelt `prefx=` silently ignored would put the locks in another
/// namespace), and returns the URL for the driver without the backend's
/// own parameters. Every error is `InvalidOptions`, shows the URL without
/// secrets and names the parameter.
///
/// ```
/// use std::time::Duration;
/// use lockwright_core::backend::UrlParams;
///
/// let mut p = UrlParams::new("redis://h:6379/0?timeout=250ms&prefix=app:&protocol=resp3");
/// let timeout = p.duration("timeout", Duration::from_millis(1)..=Duration::from_secs(60))?;
/// let prefix = p.text("prefix")?;
/// let driver_url = p.finish(&["protocol"])?;
/// assert_eq!(timeout, Some(Duration::from_millis(250)));
/// assert_eq!(prefix.as_deref(), Some("app:"));
/// assert_eq!(driver_url, "redis://h:6379/0?protocol=resp3");
///
/// let mut p = UrlParams::new("redis://h?timeout=soon");
/// let e = p.duration("timeout", Duration::ZERO..=Duration::MAX).unwrap_err();
/// assert!(e.to_string().contains("timeout"));
/// # Ok::<(), lockwright_core::Error>(())
/// ```
pub struct UrlParams {
    shown: RedactedUrl,
    base: String,
    /// Each `key=value` pair as written, and whether a read took it.
    pairs: Vec<(String, String, bool)>,
    /// Every name the backend asked for, present or not, for messages.
    asked: Vec<String>,
}

impl fmt::Debug for UrlParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The URL as shown, never the raw values (a password parameter).
        f.debug_struct("UrlParams")
            .field("url", &self.shown)
            .field("asked", &self.asked)
            .finish_non_exhaustive()
    }
}

impl UrlParams {
    /// Splits `url` into its base and its query parameters.
    pub fn new(url: &str) -> Self {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let pairs = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                (k.to_owned(), v.to_owned(), false)
            })
            .collect();
        UrlParams {
            shown: RedactedUrl::new(url),
            base: base.to_owned(),
            pairs,
            asked: Vec::new(),
        }
    }

    /// What the URL names before its query, after `scheme:` and any `//`:
    /// a file or socket path (`sqlite://data/locks.db` → `data/locks.db`).
    pub fn location(&self) -> &str {
        self.base
            .split_once(':')
            .map_or("", |(_, rest)| rest.trim_start_matches("//"))
    }

    /// The value of `name` as written, without taking it: for a check on a
    /// parameter that stays the driver's.
    pub fn peek(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _, _)| k == name)
            .map(|(_, v, _)| v.as_str())
    }

    /// The URL without secrets, for messages.
    pub fn shown(&self) -> &RedactedUrl {
        &self.shown
    }

    /// An `InvalidOptions` error about parameter `name`.
    pub fn invalid(&self, name: &str, why: impl fmt::Display) -> Error {
        Error::invalid_options(format!("{}: URL parameter {name}: {why}", self.shown))
    }

    /// Takes the value of `name`, percent-decoded; a parameter given twice
    /// is refused.
    fn take(&mut self, name: &str) -> Result<Option<String>> {
        if !self.asked.iter().any(|a| a == name) {
            self.asked.push(name.to_owned());
        }
        let mut found: Option<String> = None;
        let mut twice = false;
        for (k, v, taken) in &mut self.pairs {
            if k == name {
                twice |= found.is_some();
                found = Some(v.clone());
                *taken = true;
            }
        }
        if twice {
            return Err(self.invalid(name, "given more than once"));
        }
        match found {
            None => Ok(None),
            Some(v) => percent_decode(&v)
                .map(Some)
                .ok_or_else(|| self.invalid(name, "holds a bad percent-escape or invalid UTF-8")),
        }
    }

    /// `v`, quoted, for a message about parameter `name`; not shown after a
    /// password parameter, whose value may run on past an unescaped `&`.
    pub fn quoted(&self, name: &str, v: &str) -> String {
        let secret_before = self
            .pairs
            .iter()
            .take_while(|(k, _, _)| k != name)
            .any(|(k, _, _)| is_secret_param(k));
        if secret_before {
            "the value (not shown: it follows a password parameter)".to_owned()
        } else {
            format!("{v:?}")
        }
    }

    /// The text of `name`, as written.
    ///
    /// # Errors
    /// The parameter given twice.
    pub fn text(&mut self, name: &str) -> Result<Option<String>> {
        self.take(name)
    }

    /// A human duration (`500ms`, `3s`, `1m 30s`) within `range`.
    ///
    /// # Errors
    /// Text that is not a duration, or one out of range.
    pub fn duration(
        &mut self,
        name: &str,
        range: RangeInclusive<Duration>,
    ) -> Result<Option<Duration>> {
        let Some(v) = self.take(name)? else {
            return Ok(None);
        };
        let shown = self.quoted(name, &v);
        let d = humantime::parse_duration(&v).map_err(|_| {
            self.invalid(name, format!("{shown} is not a duration like 500ms or 3s"))
        })?;
        if !range.contains(&d) {
            return Err(self.invalid(
                name,
                format!(
                    "{shown} is out of range: it must be between {} and {}",
                    humantime::format_duration(*range.start()),
                    humantime::format_duration(*range.end())
                ),
            ));
        }
        Ok(Some(d))
    }

    /// A whole number within `range`.
    ///
    /// # Errors
    /// Text that is not a whole number, or one out of range.
    pub fn integer<T>(&mut self, name: &str, range: RangeInclusive<T>) -> Result<Option<T>>
    where
        T: FromStr + PartialOrd + fmt::Display,
    {
        let Some(v) = self.take(name)? else {
            return Ok(None);
        };
        match v.parse::<T>() {
            Ok(n) if range.contains(&n) => Ok(Some(n)),
            _ => Err(self.invalid(
                name,
                format!(
                    "{} must be a whole number from {} to {}",
                    self.quoted(name, &v),
                    range.start(),
                    range.end()
                ),
            )),
        }
    }

    /// `true`/`false` (also `1`/`0`, `yes`/`no`, `on`/`off`).
    ///
    /// # Errors
    /// Any other text.
    pub fn boolean(&mut self, name: &str) -> Result<Option<bool>> {
        let Some(v) = self.take(name)? else {
            return Ok(None);
        };
        match v.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(Some(true)),
            "false" | "0" | "no" | "off" => Ok(Some(false)),
            _ => Err(self.invalid(
                name,
                format!("{} must be true or false", self.quoted(name, &v)),
            )),
        }
    }

    /// One of the named `choices`.
    ///
    /// # Errors
    /// Any text not among them.
    pub fn choice<T: Copy>(&mut self, name: &str, choices: &[(&str, T)]) -> Result<Option<T>> {
        let Some(v) = self.take(name)? else {
            return Ok(None);
        };
        match choices.iter().find(|(c, _)| *c == v) {
            Some(&(_, t)) => Ok(Some(t)),
            None => {
                let names: Vec<String> = choices.iter().map(|(c, _)| format!("{c:?}")).collect();
                Err(self.invalid(
                    name,
                    format!(
                        "{} must be one of {}",
                        self.quoted(name, &v),
                        names.join(", ")
                    ),
                ))
            }
        }
    }

    /// Refuses every parameter that was not read and is not in `driver`,
    /// and returns the URL with only the parameters left for the driver.
    ///
    /// # Errors
    /// `InvalidOptions` naming the first unknown parameter and the known
    /// ones. After a password parameter the name is not shown: a password
    /// may hold an unescaped `&`, and what follows could be a piece of it.
    pub fn finish(self, driver: &[&str]) -> Result<String> {
        let rest = self.leftover(driver)?;
        Ok(if rest.is_empty() {
            self.base
        } else {
            format!("{}?{}", self.base, rest.join("&"))
        })
    }

    /// The `key=value` pairs left for the driver, after refusing every
    /// parameter not read and not in `driver` (see [`finish`](Self::finish)).
    pub(crate) fn leftover(&self, driver: &[&str]) -> Result<Vec<String>> {
        let mut after_secret = false;
        let mut rest = Vec::new();
        for (k, v, taken) in &self.pairs {
            if *taken {
                continue;
            }
            if !driver.contains(&k.as_str()) {
                if after_secret {
                    return Err(Error::invalid_options(format!(
                        "{}: unknown URL parameter after a password parameter (not shown); \
                         percent-encode '&' in passwords as %26",
                        self.shown
                    )));
                }
                let mut known: Vec<&str> = self.asked.iter().map(String::as_str).collect();
                known.extend(driver);
                known.sort_unstable();
                known.dedup();
                return Err(Error::invalid_options(format!(
                    "{}: unknown URL parameter {k:?}; known: {}",
                    self.shown,
                    known.join(", ")
                )));
            }
            after_secret |= is_secret_param(k);
            rest.push(if v.is_empty() && !k.is_empty() {
                k.clone()
            } else {
                format!("{k}={v}")
            });
        }
        Ok(rest)
    }
}

/// Decodes `%XX` escapes (and nothing else: a `+` stays a `+`); `None` for
/// a bad escape or bytes that are not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_reads_name_the_parameter_and_never_the_password() {
        let url = "postgres://u:hunter2@h/db?pool_max=0&retention=1y&flag=maybe&mode=x&t=1&t=2";
        let ms = Duration::from_millis(1)..=Duration::from_secs(60);
        let mut p = UrlParams::new(url);
        for e in [
            p.integer::<u32>("pool_max", 1..=1000).unwrap_err(),
            p.duration("retention", ms).unwrap_err(),
            p.boolean("flag").unwrap_err(),
            p.choice("mode", &[("lease", 0), ("session", 1)])
                .unwrap_err(),
            p.text("t").unwrap_err(),
        ] {
            assert_eq!(e.kind(), crate::ErrorKind::InvalidOptions);
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
        let mut p = UrlParams::new("sqlite://a.db?table=t&mode=ro&tabel=x");
        assert_eq!(p.text("table").unwrap().as_deref(), Some("t"));
        let e = p.finish(&["mode"]).unwrap_err();
        assert!(e.to_string().contains("\"tabel\""), "{e}");
        assert!(e.to_string().contains("known: mode, table"), "{e}");
        let mut p = UrlParams::new("sqlite://a.db?table=a%5Fb&prefix=%zz&x=%C3%A9");
        assert_eq!(p.text("table").unwrap().as_deref(), Some("a_b"));
        assert!(p.text("prefix").is_err());
        assert_eq!(p.text("x").unwrap().as_deref(), Some("é"));
        // A value after a password parameter may be a piece of it.
        let mut p = UrlParams::new("postgres://h/db?password=a&mode=hunter2");
        let e = p.choice("mode", &[("lease", 0)]).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        let mut p = UrlParams::new("sqlite://a.db?table=t&mode=ro");
        assert_eq!(p.boolean("absent").unwrap(), None);
        p.text("table").unwrap();
        assert_eq!(p.finish(&["mode"]).unwrap(), "sqlite://a.db?mode=ro");
    }
}
