//! Where a lock lives in the tree: key → directory name, and Curator's
//! contender node names and their order.
//!
//! A key's directory `P` holds, as Curator's recipes on the path `P` do:
//! the mutex's contenders `_c_<uuid>-lock-<seq>` (`InterProcessMutex`);
//! a read-write lock's `_c_<uuid>-__READ__<seq>` and `_c_<uuid>-__WRIT__<seq>`
//! (`InterProcessReadWriteLock`), in the same queue; and a semaphore's
//! two directories (`InterProcessSemaphoreV2`): `P/locks`, a mutex taken
//! only while a lease is being acquired, and `P/leases`, one
//! `_c_<uuid>-lease-<seq>` node per permit held, whose own data is the
//! semaphore's N as ASCII decimal while it lives (Curator keeps N in no
//! node; it ignores that data).

use lockwright_core::backend::{AcquireRequest, HoldKind};
use sha2::{Digest, Sha256};

/// Curator's `InterProcessMutex` lock name: contender nodes are
/// `_c_<uuid>-lock-<sequence>`, ordered by the text after the last `lock-`.
pub(crate) const LOCK_NAME: &str = "lock-";

/// A read-write lock's reader nodes (Curator's `READ_LOCK_NAME`).
pub(crate) const READ_NAME: &str = "__READ__";
/// A read-write lock's writer nodes (Curator's `WRITE_LOCK_NAME`).
pub(crate) const WRITE_NAME: &str = "__WRIT__";
/// A semaphore's lease nodes (Curator's `LEASE_BASE_NAME`).
pub(crate) const LEASE_NAME: &str = "lease-";
/// The semaphore's mutex directory under the key's (Curator's `LOCK_PARENT`).
pub(crate) const SEM_LOCKS: &str = "locks";
/// The semaphore's lease directory under the key's (Curator's `LEASE_PARENT`).
pub(crate) const SEM_LEASES: &str = "leases";

/// What a contender node of ours stands for, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A mutex holder (`lock-`), also the semaphore's internal mutex.
    Mutex,
    /// A read-write lock's writer (`__WRIT__`).
    Writer,
    /// A read-write lock's reader (`__READ__`).
    Reader,
    /// A semaphore's lease, of the semaphore of N (`lease-`).
    Lease(u32),
}

impl Role {
    /// The role of a hold of `kind`.
    pub(crate) fn of(kind: &HoldKind) -> Role {
        match kind.claim() {
            lockwright_core::Claim::Shared => Role::Reader,
            lockwright_core::Claim::Exclusive { permits: 1 } if kind.is_writer() => Role::Writer,
            lockwright_core::Claim::Exclusive { permits: 1 } => Role::Mutex,
            lockwright_core::Claim::Exclusive { permits } => Role::Lease(permits),
        }
    }

    /// The claim this role makes, for the claim rules.
    pub(crate) fn claim(self) -> lockwright_core::Claim {
        match self {
            Role::Reader => lockwright_core::Claim::Shared,
            Role::Lease(permits) => lockwright_core::Claim::Exclusive { permits },
            Role::Mutex | Role::Writer => lockwright_core::Claim::MUTEX,
        }
    }

    fn marker(self) -> &'static str {
        match self {
            Role::Mutex => LOCK_NAME,
            Role::Writer => WRITE_NAME,
            Role::Reader => READ_NAME,
            Role::Lease(_) => LEASE_NAME,
        }
    }

    /// Whether the role holds alone (a mutex's or a writer's).
    pub(crate) fn is_exclusive(self) -> bool {
        matches!(self, Role::Mutex | Role::Writer)
    }
}

/// Whether a child of a key's directory excludes readers: a mutex's or a
/// writer's node, waiting or holding. Curator's reader looks only for
/// `__WRIT__`; a mutex of ours on the same name excludes readers too.
pub(crate) fn is_exclusive_node(child: &str) -> bool {
    child.contains(WRITE_NAME) || (!child.contains(READ_NAME) && child.contains(LOCK_NAME))
}

/// Whether a child of a key's directory is a contender of any of the
/// mutex's or the read-write lock's kinds (not the semaphore's directories).
pub(crate) fn is_contender(child: &str) -> bool {
    [LOCK_NAME, READ_NAME, WRITE_NAME]
        .iter()
        .any(|m| child.contains(m))
}

/// The longest key text used as a node name as it is.
const MAX_PLAIN: usize = 255;

/// Marks a directory name that is an escaped or hashed key.
const ESCAPED: char = '%';
/// After [`ESCAPED`], marks a hashed key (`~` never appears in an escape).
const HASHED: char = '~';

/// A character ZooKeeper refuses in a path (`PathUtils.validatePath`):
/// controls, and what Java sees as private-use or surrogate code units.
fn is_refused(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..)
}

/// A name ZooKeeper takes as one node name: not empty, not `.` or `..`,
/// no `/` and no refused character.
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.chars().any(is_refused)
}

/// The directory name of a key: the key itself when it is a plain node
/// name of at most 255 bytes that does not start with `%` (and is not
/// `zookeeper` at the top of the tree); otherwise `%` and the key's UTF-8
/// bytes percent-encoded (every byte but `A-Z a-z 0-9 . _ -`), or, if
/// that is longer than 255 bytes, `%~` and the SHA-256 of the key in hex.
/// Plain names never start with `%`, and escapes never hold `~`, so no
/// two keys share a directory.
pub(crate) fn dir_name(key: &str, at_top: bool) -> String {
    let plain = key.len() <= MAX_PLAIN
        && is_plain_name(key)
        && !key.starts_with(ESCAPED)
        && !(at_top && key == "zookeeper");
    if plain {
        return key.to_owned();
    }
    let mut escaped = String::with_capacity(key.len() * 3 + 1);
    escaped.push(ESCAPED);
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-') {
            escaped.push(char::from(b));
        } else {
            escaped.push_str(&format!("%{b:02X}"));
        }
    }
    if escaped.len() <= MAX_PLAIN {
        return escaped;
    }
    format!(
        "{ESCAPED}{HASHED}{}",
        hex::encode(Sha256::digest(key.as_bytes()))
    )
}

/// The key a directory name stands for; `None` for a hashed one.
pub(crate) fn key_of(dir: &str) -> Option<String> {
    match dir.strip_prefix(ESCAPED) {
        None => Some(dir.to_owned()),
        Some(rest) if rest.starts_with(HASHED) => None,
        Some(rest) => lockwright_core::backend::percent_decode(rest),
    }
}

/// Curator's protected-mode prefix, before a node's UUID.
const PROTECTED: &str = "_c_";

/// The prefix of one contender's node: Curator's protected-mode prefix
/// with a fresh UUID, then the lock name. The server appends the sequence.
/// The UUID is random but marked version 8 (RFC 9562's custom version),
/// where Curator, and lockwright before it kept values, draw version 4:
/// the mark says that the node's data is a value, never an owner token
/// (see [`value_of`]). Curator takes any UUID (`UUID.fromString`).
///
/// With the `tag` of its owner's identity record
/// ([`OwnerToken::tag`](lockwright_core::OwnerToken::tag)), the UUID's
/// first six bytes are the tag ([`tag_of`] reads it back) and its eighth
/// is [`TAGGED`], and the other 60 bits stay random: the node's name says
/// whose it is, with nothing written beside it.
pub(crate) fn contender_prefix(role: Role, tag: Option<&str>) -> String {
    let mut bytes = uuid::Uuid::new_v4().into_bytes();
    if let Some(tag) = tag
        .and_then(|t| hex::decode(t).ok())
        .filter(|t| t.len() == 6)
    {
        bytes[..6].copy_from_slice(&tag);
        bytes[7] = TAGGED;
    }
    let id = uuid::Builder::from_custom_bytes(bytes).into_uuid();
    format!("{PROTECTED}{}-{}", id.hyphenated(), role.marker())
}

/// The eighth byte of a tagged node's UUID (the seventh holds its
/// version): a node made without a tag has it by chance once in 256,
/// and then names a record nobody holds.
const TAGGED: u8 = 0x1d;

/// The identity record's tag a node named by [`contender_prefix`]
/// carries: its UUID's first six bytes, as hex. A node made without a
/// tag gives none, nor do Curator's nodes (version 4).
pub(crate) fn tag_of(child: &str) -> Option<String> {
    if !is_marked(child) {
        return None;
    }
    let id = uuid::Uuid::try_parse(child.get(PROTECTED.len()..PROTECTED.len() + 36)?).ok()?;
    let bytes = id.as_bytes();
    (bytes[7] == TAGGED).then(|| hex::encode(&bytes[..6]))
}

/// Whether `child` was named by [`contender_prefix`] (a version 8 UUID).
fn is_marked(child: &str) -> bool {
    child
        .strip_prefix(PROTECTED)
        .and_then(|rest| rest.get(..36))
        .and_then(|id| uuid::Uuid::try_parse(id).ok())
        .is_some_and(|id| id.get_version_num() == 8)
}

/// The data our contender node is created with: the value its owner
/// advertises, which is what Curator's `LeaderSelector` writes (its
/// participant id, UTF-8) and reads back as the leader's id; else nothing.
/// Never the owner token, which nothing reads back (a lost create is found
/// by its UUID and session, a hold by its path and session) and which
/// would show as the leader's id to Curator.
pub(crate) fn node_data(request: &AcquireRequest) -> &[u8] {
    request.value().unwrap_or_default()
}

/// The value a holder's node advertises: its data, as Curator's
/// `getLeader()` reads a participant's id (a Curator mutex without an id
/// writes its host's address there, which is what Curator shows too).
/// ZooKeeper keeps no difference between empty and no data, so empty
/// is none. A node not named by this version (Curator's, or lockwright's
/// before values) whose data is 32 lowercase hex digits is taken for an
/// older lockwright's generated owner token, and not shown: a token is not
/// a value, and is not to be shown.
pub(crate) fn value_of(child: &str, data: Vec<u8>) -> Option<Vec<u8>> {
    let token_like =
        || data.len() == 32 && data.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if data.is_empty() || (!is_marked(child) && token_like()) {
        return None;
    }
    Some(data)
}

/// What Curator sorts a child by: the text after the last `__READ__` or
/// `__WRIT__` (its read-write lock) or `lock-` (its mutex), or the whole
/// name when it has none. Only a directory where a mutex and a read-write
/// lock meet sees two kinds; there all three sort by their sequence, one
/// counter.
pub(crate) fn sequence_of(child: &str) -> &str {
    [READ_NAME, WRITE_NAME, LOCK_NAME]
        .iter()
        .find_map(|m| child.rfind(m).map(|i| &child[i + m.len()..]))
        .unwrap_or(child)
}

/// Sorts a lock directory's children into queue order, as Curator does
/// (ties, which Curator leaves to the listing's order, by whole name).
pub(crate) fn sort_queue(children: &mut [String]) {
    children.sort_by(|a, b| sequence_of(a).cmp(sequence_of(b)).then_with(|| a.cmp(b)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockwright_core::OwnerToken;

    #[test]
    fn plain_keys_are_their_own_names() {
        for k in [
            "orders",
            "job.nightly",
            "a b",
            "ключ",
            "x".repeat(255).as_str(),
        ] {
            assert_eq!(dir_name(k, false), k);
            assert_eq!(key_of(&dir_name(k, false)).as_deref(), Some(k));
        }
        assert_eq!(dir_name("zookeeper", false), "zookeeper");
    }

    #[test]
    fn other_keys_map_to_distinct_escapes_or_hashes() {
        let keys = [
            "a/b",
            "a%2Fb",
            "%",
            "%25",
            ".",
            "..",
            "tab\there",
            "\u{e000}",
            "😀",
            "~",
            "%~",
            "zookeeper",
        ];
        let mut seen = std::collections::HashSet::new();
        for k in keys {
            let top = k == "zookeeper";
            let d = dir_name(k, top);
            assert!(is_plain_name(&d) && d.len() <= 255, "{k:?} → {d:?}");
            assert_eq!(key_of(&d).as_deref(), Some(k), "{k:?} → {d:?}");
            assert!(seen.insert(d), "{k:?} collides");
        }
        let long = "/".repeat(100);
        let d = dir_name(&long, false);
        assert!(d.starts_with("%~") && d.len() == 66, "{d}");
        assert_eq!(key_of(&d), None);
        assert_ne!(dir_name(&"/".repeat(101), false), d);
    }

    #[test]
    fn the_queue_sorts_by_sequence_as_curator_does() {
        let mut c: Vec<String> = [
            "_c_ffff-lock-0000000003",
            "_c_0000-lock-0000000010",
            "_c_aaaa-lock-0000000001",
            "other-lock-0000000002",
        ]
        .map(String::from)
        .to_vec();
        sort_queue(&mut c);
        let seqs: Vec<&str> = c.iter().map(|s| sequence_of(s)).collect();
        assert_eq!(
            seqs,
            ["0000000001", "0000000002", "0000000003", "0000000010"]
        );
        let p = contender_prefix(Role::Mutex, None);
        assert!(p.starts_with("_c_") && p.ends_with("-lock-") && p.len() == 3 + 36 + 6);
        assert_ne!(p, contender_prefix(Role::Mutex, None));
        let w = contender_prefix(Role::Writer, None);
        assert!(w.ends_with("-__WRIT__") && is_exclusive_node(&format!("{w}0000000001")));
        let r = format!("{}0000000002", contender_prefix(Role::Reader, None));
        assert!(!is_exclusive_node(&r) && is_contender(&r) && sequence_of(&r) == "0000000002");
        assert!(!is_contender(SEM_LEASES) && !is_contender(SEM_LOCKS));
        assert!(!is_exclusive_node(SEM_LOCKS));
        let mut mixed = vec![
            r.clone(),
            format!("{w}0000000003"),
            format!("{p}0000000001"),
        ];
        mixed.push(SEM_LEASES.to_owned());
        sort_queue(&mut mixed);
        assert_eq!(mixed[1], r);
        assert_eq!(mixed[3], SEM_LEASES);
    }

    #[test]
    fn a_nodes_name_carries_its_owners_tag() {
        let tagged = format!(
            "{}0000000007",
            contender_prefix(Role::Mutex, Some("0123456789ab"))
        );
        assert_eq!(tag_of(&tagged).as_deref(), Some("0123456789ab"));
        assert!(is_marked(&tagged), "still a version 8 UUID");
        let a = contender_prefix(Role::Mutex, Some("0123456789ab"));
        assert_ne!(
            a,
            contender_prefix(Role::Mutex, Some("0123456789ab")),
            "and random"
        );
        let curators = "_c_0c8e2a36-5c4d-4d5e-9f1a-2b3c4d5e6f70-lock-0000000007";
        assert_eq!(tag_of(curators), None);
        assert_eq!(tag_of("lock-0000000001"), None);
        let untagged = (0..64)
            .map(|_| format!("{}0000000001", contender_prefix(Role::Mutex, None)))
            .filter(|n| tag_of(n).is_some())
            .count();
        assert!(
            untagged < 8,
            "{untagged} of 64 untagged nodes read as tagged"
        );
    }

    #[test]
    fn values_are_read_back_and_tokens_never_are() {
        let ours = format!("{}0000000007", contender_prefix(Role::Mutex, None));
        let curators = "_c_0c8e2a36-5c4d-4d5e-9f1a-2b3c4d5e6f70-lock-0000000007";
        let token = OwnerToken::generate();
        let hex = token.as_str().as_bytes().to_vec();
        assert_eq!(
            value_of(&ours, b"java-1".to_vec()).as_deref(),
            Some(&b"java-1"[..])
        );
        assert_eq!(
            value_of(curators, b"java-1".to_vec()).as_deref(),
            Some(&b"java-1"[..])
        );
        assert_eq!(
            value_of(curators, vec![127, 0, 0, 1]),
            Some(vec![127, 0, 0, 1])
        );
        assert_eq!(value_of(&ours, Vec::new()), None);
        // An older lockwright's node holds its owner token: never shown.
        assert_eq!(value_of(curators, hex.clone()), None);
        assert_eq!(value_of("other-lock-0000000001", hex.clone()), None);
        // Our own marked nodes hold only values, whatever they look like.
        assert_eq!(value_of(&ours, hex.clone()), Some(hex));
        let key = lockwright_core::LockKey::new("k").unwrap();
        let ttl = std::time::Duration::from_secs(1);
        let plain = AcquireRequest::mutex(&key, &token, ttl);
        assert_eq!(node_data(&plain), b"");
        let valued = plain.with_value(b"a\0b\n".to_vec()).unwrap();
        assert_eq!(node_data(&valued), b"a\0b\n");
    }
}
