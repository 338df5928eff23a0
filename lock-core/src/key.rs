//! Validated lock names, the owner tokens that prove who holds a lock, and
//! the fencing tokens a grant carries.

use std::fmt;

use crate::error::{Error, Result};

/// The longest key accepted, in UTF-8 bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// A validated lock name: non-empty UTF-8, at most [`MAX_KEY_LEN`] bytes, no NUL.
///
/// Keys are case-sensitive and compared byte for byte. Every backend maps them
/// onto its store injectively (or by a collision-resistant hash), so two
/// different keys never share a lock. NUL is refused because several stores
/// (PostgreSQL text, C-string APIs) cannot carry it faithfully.
///
/// ```
/// use lockwright_core::LockKey;
/// let key = LockKey::new("orders/42").unwrap();
/// assert_eq!(key.as_str(), "orders/42");
/// assert!(LockKey::new("").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(String);

impl LockKey {
    /// Validates `name` and wraps it.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) when the name is
    /// empty, longer than [`MAX_KEY_LEN`] bytes, or contains NUL.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::invalid_key("lock key is empty"));
        }
        if name.len() > MAX_KEY_LEN {
            return Err(Error::invalid_key(format!(
                "lock key is {} bytes, the limit is {MAX_KEY_LEN}",
                name.len()
            )));
        }
        if name.contains('\0') {
            return Err(Error::invalid_key("lock key contains NUL"));
        }
        Ok(LockKey(name))
    }

    /// The key as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Anything a lock key can be made from: `&str`, `String`, or a [`LockKey`].
pub trait IntoLockKey {
    /// Validates and converts.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidKey`](crate::ErrorKind::InvalidKey) as in [`LockKey::new`].
    fn into_lock_key(self) -> Result<LockKey>;
}

impl IntoLockKey for LockKey {
    fn into_lock_key(self) -> Result<LockKey> {
        Ok(self)
    }
}
impl IntoLockKey for &LockKey {
    fn into_lock_key(self) -> Result<LockKey> {
        Ok(self.clone())
    }
}
impl IntoLockKey for &str {
    fn into_lock_key(self) -> Result<LockKey> {
        LockKey::new(self)
    }
}
impl IntoLockKey for String {
    fn into_lock_key(self) -> Result<LockKey> {
        LockKey::new(self)
    }
}
impl IntoLockKey for &String {
    fn into_lock_key(self) -> Result<LockKey> {
        LockKey::new(self.as_str())
    }
}

/// Proof of ownership: 128 random bits from the operating system's RNG.
///
/// A fresh token is drawn for every acquisition unless the caller passes its
/// own (to re-enter a lock it already holds). Stores compare it atomically on
/// release and renew, so a stale holder can never free or extend a lock that
/// someone else now holds.
///
/// A token is only an identity: two tokens are equal when their text is.
/// What a request claims (a mutex, N permits, a reader) and the value it
/// carries are fields of the request ([`HoldId`](crate::backend::HoldId),
/// [`AcquireRequest`](crate::backend::AcquireRequest)).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct OwnerToken {
    token: String,
}

/// The most permits a semaphore can have.
pub const MAX_PERMITS: u32 = 1024;

/// What an acquire asks the store for. The mutex is `Exclusive { permits: 1 }`.
///
/// Grant rule on every store, on the store's clock: an exclusive claim of
/// `permits` N is granted when no shared hold is live and fewer than N
/// exclusive holds are; a shared claim when no exclusive hold is live and
/// no exclusive claim is waiting (so a waiting writer stops new readers).
/// The store keeps N while any exclusive hold is live, and refuses a claim
/// with another N.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Claim {
    /// One of at most `permits` holders at a time (a mutex or writer: 1;
    /// a semaphore: N).
    Exclusive {
        /// How many holders the name admits at once.
        permits: u32,
    },
    /// A reader: shares the name with other readers, never with an
    /// exclusive holder.
    Shared,
}

impl Claim {
    /// The mutex's claim: one exclusive holder.
    pub const MUTEX: Claim = Claim::Exclusive { permits: 1 };

    /// A semaphore's claim of `permits` permits.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`](crate::ErrorKind::InvalidOptions) for 0
    /// or more than [`MAX_PERMITS`].
    pub fn permits(permits: u32) -> Result<Claim> {
        if !(1..=MAX_PERMITS).contains(&permits) {
            return Err(Error::invalid_options(format!(
                "a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"
            )));
        }
        Ok(Claim::Exclusive { permits })
    }

    /// A shared (reader's) claim.
    pub fn is_shared(self) -> bool {
        matches!(self, Claim::Shared)
    }

    /// The permits of an exclusive claim; `None` for a shared one.
    pub fn exclusive_permits(self) -> Option<u32> {
        match self {
            Claim::Exclusive { permits } => Some(permits),
            Claim::Shared => None,
        }
    }
}

impl Default for Claim {
    fn default() -> Self {
        Claim::MUTEX
    }
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Claim::Exclusive { permits: 1 } => f.write_str("exclusive"),
            Claim::Exclusive { permits } => write!(f, "one of {permits} permits"),
            Claim::Shared => f.write_str("shared"),
        }
    }
}

/// The longest value a leader can advertise, in bytes.
pub const MAX_VALUE_LEN: usize = 1024;

impl OwnerToken {
    /// Draws a new token from the OS RNG.
    ///
    /// # Panics
    /// Only if the operating system cannot supply randomness at all, in which
    /// case no lock could be taken safely anyway.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the OS random number generator failed");
        Self::plain(hex::encode(bytes))
    }

    /// Wraps a token read back from a store or handed over by another process.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`](crate::ErrorKind::InvalidOptions) unless the
    /// text is 32 to 128 ASCII alphanumeric characters or `-`/`_`.
    pub fn from_string(token: impl Into<String>) -> Result<Self> {
        let token = token.into();
        let ok_len = (32..=128).contains(&token.len());
        let ok_chars = token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if ok_len && ok_chars {
            Ok(Self::plain(token))
        } else {
            Err(Error::invalid_options(
                "owner token must be 32..=128 characters of [A-Za-z0-9_-]",
            ))
        }
    }

    fn plain(token: String) -> Self {
        OwnerToken { token }
    }

    /// Draws a new token carrying `tag`, the name of its holder's
    /// identity record (who holds, as `Locker::with_identity` records it):
    /// `<32 hex>_<tag>`. The 128 random bits still make it unguessable;
    /// the tag is public. A `tag` that is not 12 hex digits is left out.
    pub fn generate_tagged(tag: &str) -> Self {
        let token = Self::generate();
        if is_tag(tag) {
            Self::plain(format!("{}_{tag}", token.token))
        } else {
            token
        }
    }

    /// The identity record's tag this token carries, if it was drawn by
    /// [`generate_tagged`](Self::generate_tagged).
    pub fn tag(&self) -> Option<&str> {
        let (random, tag) = self.token.split_once('_')?;
        let random_ok = random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit());
        (random_ok && is_tag(tag)).then_some(tag)
    }

    /// A new token with this one's tag, if it has one.
    pub(crate) fn redrawn(&self) -> Self {
        match self.tag() {
            Some(tag) => Self::generate_tagged(tag),
            None => Self::generate(),
        }
    }

    /// The token as text (32 lowercase hex digits when generated).
    pub fn as_str(&self) -> &str {
        &self.token
    }
}

/// How many hex digits an identity record's tag has.
pub(crate) const TAG_LEN: usize = 12;

/// Whether `tag` has a tag's shape: [`TAG_LEN`] lowercase hex digits.
pub(crate) fn is_tag(tag: &str) -> bool {
    tag.len() == TAG_LEN && tag.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Checks an advertised value's size.
///
/// # Errors
/// [`ErrorKind::InvalidOptions`](crate::ErrorKind::InvalidOptions) over [`MAX_VALUE_LEN`] bytes.
pub(crate) fn check_value(value: Vec<u8>) -> Result<Vec<u8>> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::invalid_options(format!(
            "a leader's value is at most {MAX_VALUE_LEN} bytes, not {}",
            value.len()
        )));
    }
    Ok(value)
}

impl OwnerToken {
    /// The token's first 8 characters, as logs, `Debug` and spans show it:
    /// enough to tell tokens apart, not enough to forge one.
    pub(crate) fn short(&self) -> &str {
        self.token.get(..8).unwrap_or(&self.token)
    }
}

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OwnerToken({}…)", self.short())
    }
}

impl fmt::Display for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.token)
    }
}

/// A fencing token: strictly increasing across successive grants of one key.
///
/// Pass it to the resource you protect and have the resource refuse any
/// request carrying a token lower than one it has already seen; that is what
/// keeps a paused holder whose lease expired from doing damage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn keys_are_validated() {
        assert_eq!(LockKey::new("").unwrap_err().kind(), ErrorKind::InvalidKey);
        assert_eq!(
            LockKey::new("a\0b").unwrap_err().kind(),
            ErrorKind::InvalidKey
        );
        assert!(LockKey::new("x".repeat(MAX_KEY_LEN)).is_ok());
        assert_eq!(
            LockKey::new("x".repeat(MAX_KEY_LEN + 1))
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidKey
        );
        // The limit is in bytes: 256 four-byte emoji fit, one more does not.
        assert!(LockKey::new("🔒".repeat(256)).is_ok());
        assert!(LockKey::new("🔒".repeat(257)).is_err());
        assert!(LockKey::new("a/../b \t\"'").is_ok());
    }

    #[test]
    fn owner_tokens_are_random_and_128_bits() {
        let a = OwnerToken::generate();
        let b = OwnerToken::generate();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(OwnerToken::from_string(a.as_str()).is_ok());
        assert!(OwnerToken::from_string("short").is_err());
        assert!(OwnerToken::from_string("x".repeat(40) + "'").is_err());
        assert!(!format!("{a:?}").contains(a.as_str()));
    }

    #[test]
    fn tagged_tokens_carry_their_tag_and_still_parse() {
        let t = OwnerToken::generate_tagged("0123456789ab");
        assert_eq!(t.tag(), Some("0123456789ab"));
        assert_eq!(t.as_str().len(), 45);
        assert!(OwnerToken::from_string(t.as_str()).is_ok());
        let again = t.redrawn();
        assert_ne!(again, t);
        assert_eq!(again.tag(), t.tag());
        assert_eq!(OwnerToken::generate().tag(), None);
        assert_eq!(OwnerToken::generate_tagged("nope").tag(), None);
        let user = OwnerToken::from_string(format!("{}_0123456789ab", "z".repeat(32))).unwrap();
        assert_eq!(user.tag(), None);
    }
}
