//! Where a lock's keys are: Go's `concurrency.Mutex` layout.
//!
//! A lock `name` under the root `r` is the prefix `r/<name>/`, and each
//! contender is one key under it, `r/<name>/<lease id in lowercase hex>`
//! (Go's `fmt.Sprintf("%s%x", pfx, lease)`), attached to its session's
//! lease, with an empty value. The key with the lowest create revision
//! under the prefix holds the lock; that revision is its fencing token.
//!
//! A name with a `/` would put its keys under another name's prefix (the
//! keys of `a/b` are under `a/`, so Go's lock `a` waits on them for ever),
//! so `/` and `%` are %-escaped in a name (`a%2Fb`) and every other name
//! is used as it is: the mapping is injective and no name's prefix holds
//! another's keys. Go's and `etcdctl`'s lock on `r/<name>` and ours on
//! `name` are then the same lock for every name without those two
//! characters.
//!
//! `first_created` is the read that finds the holder under a prefix, by
//! that same rule.

use etcd_client::{GetOptions, SortOrder, SortTarget};
use lockwright_core::LockKey;

/// The prefix of `key`'s contenders under `root`, ending in `/`.
pub(crate) fn prefix(root: &str, key: &LockKey) -> String {
    format!("{}/", names_starting(root, key.as_str()))
}

/// The prefix every contender's key of every name starting with
/// `name_prefix` has under `root` (the escape is character by character,
/// so an escaped name starts with its escaped prefix).
pub(crate) fn names_starting(root: &str, name_prefix: &str) -> String {
    let mut escaped = String::with_capacity(root.len() + 1 + name_prefix.len());
    if !root.is_empty() {
        escaped.push_str(root);
        escaped.push('/');
    }
    for c in name_prefix.chars() {
        match c {
            '/' => escaped.push_str("%2F"),
            '%' => escaped.push_str("%25"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// A contender's key: the prefix and its lease in hex, as Go's; `n` > 0
/// for a second contender of the same backend on the same name at once
/// (Go's two mutexes on one session would share one key and both hold).
pub(crate) fn contender(prefix: &str, lease: i64, n: u64) -> String {
    if n == 0 {
        format!("{prefix}{lease:x}")
    } else {
        format!("{prefix}{lease:x}_{n}")
    }
}

/// The first contender under `prefix`: the holder.
pub(crate) fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// The name whose contender `key` is, if it is one under `root`.
pub(crate) fn name_of(root: &str, key: &str) -> Option<String> {
    let rest = if root.is_empty() {
        key
    } else {
        key.strip_prefix(root)?.strip_prefix('/')?
    };
    let (escaped, _lease) = rest.split_once('/')?;
    Some(escaped.replace("%2F", "/").replace("%25", "%"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> LockKey {
        LockKey::new(s).unwrap()
    }

    #[test]
    fn plain_names_are_go_s_prefixes() {
        assert_eq!(prefix("/lockwright", &k("orders")), "/lockwright/orders/");
        assert_eq!(prefix("", &k("orders")), "orders/");
        assert_eq!(contender("p/", 0x694d7c5b0a1b2c3d, 0), "p/694d7c5b0a1b2c3d");
        assert_eq!(contender("p/", 0x2a, 3), "p/2a_3");
    }

    #[test]
    fn no_name_s_prefix_holds_another_s_keys() {
        let names = [
            "a", "a/b", "a%2Fb", "a%b", "a/", "/a", "ab", "a b", "%", "%25",
        ];
        for x in names {
            for y in names {
                let (px, py) = (prefix("/r", &k(x)), prefix("/r", &k(y)));
                if x != y {
                    assert!(!py.starts_with(&px), "{x:?} {px:?} / {y:?} {py:?}");
                }
                let key = contender(&py, 7, 0);
                assert_eq!(name_of("/r", &key).as_deref() == Some(x), x == y, "{x} {y}");
            }
        }
    }
}
