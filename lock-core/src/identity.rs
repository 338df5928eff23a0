//! Who holds a lock: the host, process id and optional label a
//! [`Locker`](crate::Locker) records for its holds when asked
//! ([`Locker::with_identity`](crate::Locker::with_identity)), so that
//! `status`, `list` and an operator about to `break` a hold can tell
//! whose it is.
//!
//! No store's hold format has room for it (older clients parse every
//! field), so it goes beside the holds: one record per locker, a lock
//! named [`RECORD_PREFIX`] and the locker's tag, whose value is the
//! identity (`host=`, `pid=`, `label=` lines) and which the locker keeps renewed as any other lock. Each
//! hold carries the tag: in its owner token (`<32 hex>_<12 hex>`) where
//! the store keeps owners, in the ZooKeeper node's name, and in a key
//! beside etcd's session lease. A reader looks the tag up; a record that
//! outlived its locker names no live hold and is never read.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::key::{LockKey, OwnerToken};

/// The longest label accepted, in UTF-8 bytes; a longer one is
/// `InvalidOptions`, never cut.
pub const MAX_LABEL_LEN: usize = 128;

/// The longest host name recorded, in UTF-8 bytes: a longer one (none is
/// longer on Linux) is cut at a character boundary.
pub const MAX_HOST_LEN: usize = 64;

/// The names of the identity records: this, then the locker's tag. It
/// starts with the unit separator (U+001F), which no name an application
/// chooses is expected to, and `list` leaves such names out.
pub const RECORD_PREFIX: &str = "\u{1f}lockwright/holder/";

/// How many hex digits a tag has (48 bits: room for it in a ZooKeeper
/// node's UUID beside 68 random bits).
pub const TAG_LEN: usize = crate::key::TAG_LEN;

/// Who holds a lock, as its holder recorded it: the host, the process id
/// and the label its locker was given. None of it is a secret, and none
/// of it proves anything: it is what the holder says of itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's host name (at most [`MAX_HOST_LEN`] bytes).
    pub host: String,
    /// The holder's process id.
    pub pid: u32,
    /// The label the holder was given (a pod's name, a job's), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

impl HolderInfo {
    /// This process: its host name, its id, and `label`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`](crate::ErrorKind::InvalidOptions) for a
    /// label over [`MAX_LABEL_LEN`] bytes, or one with a control character
    /// but newline and tab.
    pub fn this_process(label: Option<&str>) -> Result<Self> {
        if let Some(label) = label {
            check_label(label)?;
        }
        Ok(HolderInfo {
            host: cut(host_name(), MAX_HOST_LEN),
            pid: std::process::id(),
            label: label.map(str::to_owned),
        })
    }

    /// The record's bytes, as a lock's value: `host=…`, `pid=…` and
    /// `label=…` lines, each value with `\` and newlines escaped, so that
    /// `redis-cli` or `zkCli` shows it readably.
    pub(crate) fn to_record(&self) -> Vec<u8> {
        let mut out = format!("host={}\npid={}", escape(&self.host), self.pid);
        if let Some(label) = &self.label {
            out.push_str(&format!("\nlabel={}", escape(label)));
        }
        out.into_bytes()
    }

    /// A record read back, if it is one and within the bounds (a record
    /// is written by any process, so it is checked as input).
    pub(crate) fn from_record(record: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(record).ok()?;
        let (mut host, mut pid, mut label) = (None, None, None);
        for line in text.split('\n') {
            // A later version's line of another shape.
            let Some((field, value)) = line.split_once('=') else {
                continue;
            };
            match field {
                "host" => host = Some(unescape(value)?),
                "pid" => pid = Some(value.parse().ok()?),
                "label" => label = Some(unescape(value)?),
                // A later version's field.
                _ => {}
            }
        }
        let info = HolderInfo {
            host: host?,
            pid: pid?,
            label,
        };
        let label_ok = info.label.as_deref().is_none_or(|l| check_label(l).is_ok());
        (info.host.len() <= MAX_HOST_LEN && label_ok).then_some(info)
    }
}

impl fmt::Display for HolderInfo {
    /// `label on host pid N`, or `host pid N`; the label and host
    /// escaped (`\n`, `\"`), as they are whatever the holder said.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(label) = &self.label {
            write!(f, "{} on ", label.escape_debug())?;
        }
        write!(f, "{} pid {}", self.host.escape_debug(), self.pid)
    }
}

fn check_label(label: &str) -> Result<()> {
    if label.len() > MAX_LABEL_LEN {
        return Err(Error::invalid_options(format!(
            "a holder's label is at most {MAX_LABEL_LEN} bytes, not {}",
            label.len()
        )));
    }
    // A newline or a tab is shown escaped; other control characters
    // (NUL, ESC, a carriage return) would reach an operator's terminal as
    // they are when a store's own tool shows the record.
    if label
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return Err(Error::invalid_options(
            "a holder's label cannot contain control characters but newline and tab",
        ));
    }
    Ok(())
}

/// `text` with `\` and newlines escaped (`\\`, `\n`).
fn escape(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// [`escape`] undone; `None` for an escape it never writes.
fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            '\\' => out.push('\\'),
            'n' => out.push('\n'),
            _ => return None,
        }
    }
    Some(out)
}

/// This host's name: the kernel's, else `HOSTNAME`, else `?`.
pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "?".to_owned())
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

/// A fresh tag: [`TAG_LEN`] random hex digits.
pub(crate) fn draw_tag() -> String {
    let mut tag = OwnerToken::generate().as_str().to_owned();
    tag.truncate(TAG_LEN);
    tag
}

/// Whether `tag` has a tag's shape: [`TAG_LEN`] lowercase hex digits.
pub fn is_tag(tag: &str) -> bool {
    crate::key::is_tag(tag)
}

/// The name of the identity record of the holders tagged `tag`.
pub fn record_name(tag: &str) -> Option<LockKey> {
    LockKey::new(format!("{RECORD_PREFIX}{tag}")).ok()
}

/// Whether `name` is an identity record's (left out of listings).
pub fn is_record_name(name: &str) -> bool {
    name.starts_with(RECORD_PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_bounded_and_records_read_back() {
        let long = "x".repeat(10 * 1024);
        let e = HolderInfo::this_process(Some(&long)).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidOptions);
        assert!(HolderInfo::this_process(Some("a\0b")).is_err());
        assert!(HolderInfo::this_process(Some("red \u{1b}[31m")).is_err());
        assert!(HolderInfo::this_process(Some("a\rb")).is_err());
        assert!(HolderInfo::this_process(Some("tab\there")).is_ok());
        let info = HolderInfo::this_process(Some("pod \"7\"\nnext")).unwrap();
        assert_eq!(
            HolderInfo::from_record(&info.to_record()),
            Some(info.clone())
        );
        let shown = info.to_string();
        assert!(shown.starts_with(r#"pod \"7\"\nnext on "#), "{shown}");
        assert!(!shown.contains('\n'));
        let record = String::from_utf8(info.to_record()).unwrap();
        assert!(record.ends_with(r#"label=pod "7"\nnext"#), "{record}");
        let slashes = HolderInfo::this_process(Some(r"a\n\")).unwrap();
        assert_eq!(HolderInfo::from_record(&slashes.to_record()), Some(slashes));
        // A record over the bounds, or not one, is not believed.
        let forged = format!("host=h\npid=1\nlabel={long}");
        assert_eq!(HolderInfo::from_record(forged.as_bytes()), None);
        assert_eq!(HolderInfo::from_record(b"not a record"), None);
        assert!(HolderInfo::from_record(b"host=h\npid=1\n").is_some());
        assert_eq!(
            HolderInfo::from_record(b"host=h\npid=1\nlabel=\x1b[31m"),
            None
        );
        assert_eq!(HolderInfo::from_record(b"host=h\npid=x"), None);
        assert_eq!(HolderInfo::from_record(b"host=h\\q\npid=1"), None);
        let plain = HolderInfo::from_record(b"host=h\npid=7\nzone=eu").unwrap();
        assert_eq!(
            (plain.host.as_str(), plain.pid, plain.label),
            ("h", 7, None)
        );
    }

    #[test]
    fn hosts_are_cut_at_a_character_boundary() {
        assert_eq!(cut("é".repeat(40), 5), "éé");
        assert_eq!(cut("abc".into(), 64), "abc");
    }

    #[test]
    fn tags_have_their_shape() {
        let tag = draw_tag();
        assert!(is_tag(&tag));
        assert!(!is_tag("ABCDEF012345") && !is_tag("abc"));
        assert!(is_record_name(record_name(&tag).unwrap().as_str()));
    }
}
