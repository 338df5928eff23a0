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

use locksmith_core::{LockKey, OwnerToken};
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
