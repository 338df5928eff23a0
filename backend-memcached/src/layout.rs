//! What a lock is in memcached: one item, under a key made from the lock's
//! key, whose value names the owner and its holds, and carries the value
//! the holder advertises (a leader's), stored for a little longer than the
//! TTL asked for.
//!
//! The item's value is `<owner token> <holds>`, then, if the holder
//! advertises a value, `\n` and the value's raw bytes (any bytes, none
//! included: memcached frames values by length). The first line is what
//! earlier versions stored, so their items read as holds without a value.
//! An owner token never holds a space or a newline, so the first newline
//! ends it. Earlier versions reading an item with a value see a holder
//! that is not theirs (the owner they parse runs into the value), or an
//! item that is not a lock: never their own hold.

use std::time::Duration;

use lockwright_core::{LockKey, OwnerToken};
use sha2::{Digest, Sha256};

/// memcached's longest key.
const MAX_KEY: usize = 250;

/// How much of an item's time memcached's clock may skip: it is the
/// monotonic clock's whole seconds, refreshed by a timer re-armed a second
/// after each tick, so it jumps by two when a late tick crosses a second,
/// and an item stored for N seconds may expire after N − 2 of them
/// (`clock_handler` in its `memcached.c`).
pub(crate) const CLOCK_LAG: Duration = Duration::from_secs(2);

/// The memcached key of a lock: `<prefix><key>` when the key is
/// printable ASCII without spaces, does not start with `#` and fits in
/// 250 bytes; otherwise `<prefix>#` and the SHA-256 of the key in hex.
/// A plain key never starts with `#`, so no two keys share an item.
pub(crate) fn item_key(prefix: &str, key: &LockKey) -> String {
    let k = key.as_str();
    let plain = !k.starts_with('#')
        && prefix.len() + k.len() <= MAX_KEY
        && k.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if plain {
        format!("{prefix}{k}")
    } else {
        format!("{prefix}#{}", hex::encode(Sha256::digest(k.as_bytes())))
    }
}

/// The item's value: whose lock it is, how many holds, and the value its
/// holder advertises.
pub(crate) struct Holder {
    pub(crate) owner: String,
    pub(crate) holds: u32,
    pub(crate) value: Option<Vec<u8>>,
}

impl Holder {
    /// The holder an item's data names; `None` for an item that is not a
    /// lock of ours.
    pub(crate) fn parse(data: &[u8]) -> Option<Holder> {
        let (head, value) = match data.iter().position(|&b| b == b'\n') {
            Some(i) => (&data[..i], Some(data[i + 1..].to_vec())),
            None => (data, None),
        };
        let text = std::str::from_utf8(head).ok()?;
        let (owner, holds) = text.rsplit_once(' ')?;
        Some(Holder {
            owner: owner.to_owned(),
            holds: holds.parse().ok()?,
            value,
        })
    }
}

/// The data stored for `holds` holds by `owner`, advertising `value`.
pub(crate) fn encode(owner: &OwnerToken, holds: u32, value: Option<&[u8]>) -> Vec<u8> {
    let mut data = format!("{} {holds}", owner.as_str()).into_bytes();
    if let Some(v) = value {
        data.push(b'\n');
        data.extend_from_slice(v);
    }
    data
}

/// The first bytes of a group's item: a name held by several holders (a
/// semaphore's permits, readers), or only by writers' marks. Its first
/// line (`#g <kind> 0`) reads to earlier versions as a hold by an owner
/// that is never theirs, so they see the name held.
const GROUP: &[u8] = b"#g ";

/// What one member of a group holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tag {
    /// One of a semaphore's permits.
    Permit,
    /// A read hold.
    Reader,
    /// A writer that took a read hold beside its own (a downgrade): its
    /// hold is still exclusive, so new readers wait until it goes.
    Writer,
}

/// One holder in a group, with its own lease: it ends when the server's
/// clock (see `clock.rs`) reaches `end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) owner: String,
    pub(crate) holds: u32,
    pub(crate) end: u64,
    pub(crate) tag: Tag,
}

/// A waiter's place: a writer waiting for the readers to go, or a reader
/// waiting for a writer, until `end` on the server's clock. Marks keep the
/// order their waiters first came in, so neither kind starves the other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mark {
    pub(crate) owner: String,
    pub(crate) end: u64,
    pub(crate) reader: bool,
}

/// A name held by a group: its permits (`None`: readers), its members and
/// the marks of the waiters of a read-write lock, oldest first, every time
/// on the server's clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Group {
    pub(crate) permits: Option<u32>,
    pub(crate) members: Vec<Member>,
    pub(crate) marks: Vec<Mark>,
}

impl Group {
    /// Whether `data` is a group's item (not a mutex's).
    pub(crate) fn is_group(data: &[u8]) -> bool {
        data.starts_with(GROUP)
    }

    /// The group an item's data holds; `None` for data that is not one.
    pub(crate) fn parse(data: &[u8]) -> Option<Group> {
        let text = std::str::from_utf8(data.strip_prefix(GROUP)?).ok()?;
        let mut lines = text.split('\n');
        let mut group = Group::default();
        match lines.next()?.split(' ').collect::<Vec<_>>()[..] {
            [kind, "0"] => match kind.strip_prefix('p') {
                Some(n) => group.permits = Some(n.parse().ok().filter(|&n| n > 1)?),
                None if kind == "s" || kind == "m" => {}
                None => return None,
            },
            _ => return None,
        }
        for line in lines.filter(|l| !l.is_empty()) {
            match line.split(' ').collect::<Vec<_>>()[..] {
                ["h", owner, holds, end, tag] => group.members.push(Member {
                    owner: owner.to_owned(),
                    holds: holds.parse().ok().filter(|&h| h > 0)?,
                    end: end.parse().ok()?,
                    tag: match tag {
                        "x" => Tag::Permit,
                        "r" => Tag::Reader,
                        "w" => Tag::Writer,
                        _ => return None,
                    },
                }),
                ["m", owner, end, ref reader @ ..] => group.marks.push(Mark {
                    owner: owner.to_owned(),
                    end: end.parse().ok()?,
                    reader: match reader {
                        [] => false,
                        ["r"] => true,
                        _ => return None,
                    },
                }),
                _ => return None,
            }
        }
        Some(group)
    }

    /// The item's data.
    pub(crate) fn encode(&self) -> Vec<u8> {
        use std::fmt::Write;
        let kind = match (self.permits, self.members.is_empty()) {
            (Some(n), false) => format!("p{n}"),
            (None, false) => "s".to_owned(),
            (_, true) => "m".to_owned(),
        };
        let mut text = format!("#g {kind} 0");
        for m in &self.members {
            let tag = match m.tag {
                Tag::Permit => 'x',
                Tag::Reader => 'r',
                Tag::Writer => 'w',
            };
            let _ = write!(text, "\nh {} {} {} {tag}", m.owner, m.holds, m.end);
        }
        for m in &self.marks {
            let r = if m.reader { " r" } else { "" };
            let _ = write!(text, "\nm {} {}{r}", m.owner, m.end);
        }
        text.into_bytes()
    }

    /// Drops the members and marks whose time ended by `now`.
    pub(crate) fn prune(&mut self, now: u64) {
        self.members.retain(|m| m.end > now);
        self.marks.retain(|m| m.end > now);
        if self.members.is_empty() {
            self.permits = None;
        }
    }

    /// When the item can go: the last member's or mark's end; `None` when
    /// nothing is left in it.
    pub(crate) fn end(&self) -> Option<u64> {
        let members = self.members.iter().map(|m| m.end);
        members.chain(self.marks.iter().map(|m| m.end)).max()
    }
}

/// A lock item as read: what it holds, its CAS and whole seconds left.
pub(crate) struct Item {
    pub(crate) body: Body,
    pub(crate) cas: u64,
    pub(crate) left: Option<u64>,
}

/// What a lock item holds.
pub(crate) enum Body {
    /// A mutex's (or writer's) holder.
    Lock(Holder),
    /// Several holders: a semaphore's permits, or readers (`claims.rs`).
    Group(Group),
}

/// The TTL sent: [`CLOCK_LAG`] more than asked, and the wire rounds it up
/// to whole seconds. The lease then lasts at least the TTL asked for and
/// at most three seconds more.
pub(crate) fn store_ttl(ttl: Duration) -> Duration {
    ttl.saturating_add(CLOCK_LAG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_injectively_within_250_bytes() {
        let k = |s: &str| item_key("ls:", &LockKey::new(s).unwrap());
        assert_eq!(k("orders/42"), "ls:orders/42");
        let hashed = [
            k("a b"),
            k("#x"),
            k("ключ"),
            k(&"x".repeat(248)),
            k("tab\t"),
        ];
        for h in &hashed {
            assert!(h.starts_with("ls:#") && h.len() == 3 + 1 + 64, "{h}");
        }
        let distinct: std::collections::HashSet<_> = hashed.iter().collect();
        assert_eq!(distinct.len(), hashed.len());
        assert_eq!(k(&"x".repeat(247)).len(), 250);
    }

    #[test]
    fn items_carry_a_value_after_the_first_line_and_old_ones_parse() {
        let owner = OwnerToken::generate();
        let old = format!("{} 2", owner.as_str());
        assert_eq!(encode(&owner, 2, None), old.as_bytes());
        let h = Holder::parse(old.as_bytes()).unwrap();
        assert_eq!(
            (h.owner.as_str(), h.holds, h.value),
            (owner.as_str(), 2, None)
        );
        let every: Vec<u8> = (0..=255).collect();
        for value in [&b""[..], b"a b\n\nc 1", b"\r\n", &every] {
            let h = Holder::parse(&encode(&owner, 3, Some(value))).unwrap();
            assert_eq!(h.owner, owner.as_str());
            assert_eq!((h.holds, h.value.as_deref()), (3, Some(value)));
        }
        assert!(Holder::parse(b"no-holds").is_none());
        assert!(Holder::parse(b"owner x\n1").is_none());
    }

    #[test]
    fn groups_round_trip_and_read_to_old_versions_as_anothers_hold() {
        let g = Group {
            permits: Some(3),
            members: vec![
                Member {
                    owner: "a".repeat(32),
                    holds: 2,
                    end: 1_800_000_004,
                    tag: Tag::Permit,
                },
                Member {
                    owner: "b".repeat(32),
                    holds: 1,
                    end: 1_800_000_009,
                    tag: Tag::Permit,
                },
            ],
            marks: vec![
                Mark {
                    owner: "c".repeat(32),
                    end: 1_800_000_002,
                    reader: false,
                },
                Mark {
                    owner: "d".repeat(32),
                    end: 1_800_000_003,
                    reader: true,
                },
            ],
        };
        let data = g.encode();
        assert!(Group::is_group(&data));
        assert_eq!(Group::parse(&data).as_ref(), Some(&g));
        assert_eq!(g.end(), Some(1_800_000_009));
        let old = Holder::parse(&data).unwrap();
        assert_eq!((old.owner.as_str(), old.holds), ("#g p3", 0));
        let mut readers = g.clone();
        readers.permits = None;
        readers.members[1].tag = Tag::Writer;
        assert_eq!(Group::parse(&readers.encode()), Some(readers.clone()));
        readers.prune(1_800_000_004);
        assert_eq!(readers.members.len(), 1);
        assert!(readers.marks.is_empty());
        readers.prune(1_800_000_009);
        assert_eq!(
            (readers.end(), readers.encode()),
            (None, b"#g m 0".to_vec())
        );
        for bad in [
            &b"#g p1 0"[..],
            b"#g q 0",
            b"#g s 0\nh o 0 5 r",
            b"#g s 0\nh o 1 5 z",
            b"#g s 0\nx",
            b"#g s 1",
        ] {
            assert!(
                Group::parse(bad).is_none(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn ttls_add_the_clock_lag() {
        assert_eq!(
            store_ttl(Duration::from_millis(2000)),
            Duration::from_secs(4)
        );
        assert_eq!(
            store_ttl(Duration::from_millis(2001)),
            Duration::from_millis(4001)
        );
    }
}
