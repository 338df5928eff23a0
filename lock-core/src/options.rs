//! Per-lock options: lease length, how long to wait, auto-renewal.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::backend::Capabilities;
use crate::error::{Error, Result};

/// The longest TTL accepted; far beyond any sane lease, small enough that
/// every store's arithmetic (milliseconds in an `i64`, deadlines on
/// `Instant`) stays clear of overflow.
pub const MAX_TTL: Duration = Duration::from_secs(366 * 24 * 3600);

/// How long an acquire may wait for a lock held by someone else.
///
/// In configuration files it is written `"none"` (or `"no-wait"`),
/// `"forever"`, or a human duration such as `"5s"` or `"1m 30s"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum WaitPolicy {
    /// One attempt; a held lock is [`Busy`](crate::ErrorKind::Busy) at once.
    NoWait,
    /// Keep trying until this much time has passed.
    For(Duration),
    /// Keep trying until acquired (or the future is dropped).
    #[default]
    Forever,
}

impl fmt::Display for WaitPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitPolicy::NoWait => f.write_str("none"),
            WaitPolicy::Forever => f.write_str("forever"),
            WaitPolicy::For(d) => write!(f, "{}", humantime::format_duration(*d)),
        }
    }
}

impl FromStr for WaitPolicy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "none" | "no-wait" | "nowait" => Ok(WaitPolicy::NoWait),
            "forever" => Ok(WaitPolicy::Forever),
            other => humantime::parse_duration(other)
                .map(WaitPolicy::For)
                .map_err(|e| {
                    Error::invalid_options(format!(
                        "wait must be \"none\", \"forever\" or a duration like \"5s\": {e}"
                    ))
                }),
        }
    }
}

impl Serialize for WaitPolicy {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for WaitPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Options for one acquisition. Deserializes from configuration with human
/// durations:
///
/// ```
/// use lockwright_core::{LockOptions, WaitPolicy};
/// use std::time::Duration;
/// let o: LockOptions = serde_json::from_str(r#"{"ttl": "10s", "wait": "2s"}"#).unwrap();
/// assert_eq!(o.ttl, Duration::from_secs(10));
/// assert_eq!(o.wait, WaitPolicy::For(Duration::from_secs(2)));
/// assert!(o.auto_renew);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct LockOptions {
    /// Lease length: how long the store keeps the lock if the holder goes silent.
    #[serde(with = "humantime_serde")]
    pub ttl: Duration,
    /// How long `lock` waits for a held lock.
    pub wait: WaitPolicy,
    /// Renew the lease in the background while the guard lives (the watchdog).
    pub auto_renew: bool,
    /// Renewal period; `None` means a third of the TTL.
    #[serde(with = "humantime_serde")]
    pub renew_every: Option<Duration>,
    /// Longest sleep between attempts when the store cannot notify waiters,
    /// and the fallback wake-up when it can.
    #[serde(with = "humantime_serde")]
    pub max_poll: Duration,
    /// Lock at least for: a hold released sooner stays held until this
    /// long after it was taken (ShedLock's `lockAtLeastFor`); `None`: a
    /// release frees it at once.
    #[serde(with = "humantime_serde")]
    pub at_least: Option<Duration>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: WaitPolicy::Forever,
            auto_renew: true,
            renew_every: None,
            max_poll: Duration::from_millis(250),
            at_least: None,
        }
    }
}

impl LockOptions {
    /// Defaults: 30 s TTL, wait forever, auto-renew every 10 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the lease length.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the wait policy.
    pub fn wait(mut self, wait: WaitPolicy) -> Self {
        self.wait = wait;
        self
    }

    /// Shorthand for `wait(WaitPolicy::For(d))`.
    pub fn wait_for(self, d: Duration) -> Self {
        self.wait(WaitPolicy::For(d))
    }

    /// Shorthand for `wait(WaitPolicy::NoWait)`.
    pub fn no_wait(self) -> Self {
        self.wait(WaitPolicy::NoWait)
    }

    /// Turns the renewal watchdog on or off.
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// Lock at least for `d` (ShedLock's `lockAtLeastFor`): a hold given
    /// back sooner (a short run) stays held until `d` after it was taken
    /// (counted from when the grant came back: a little longer, never shorter),
    /// so a node whose clock is a little behind, firing the same
    /// scheduled run a moment later, finds it held and does not run it
    /// again. On a store whose locks live on a TTL (Redis, SQL lease rows,
    /// memcached) the release sets the lease to end then, and nothing
    /// waits; on one whose locks live with the client's session
    /// (ZooKeeper, etcd, SQL session locks) a background task keeps the
    /// hold and releases it then, and [`Locker::close`](crate::Locker::close)
    /// ends it sooner. A dropped guard keeps it too; a lost one does not.
    pub fn at_least(mut self, d: Duration) -> Self {
        self.at_least = Some(d);
        self
    }

    /// Lock at most for `d` (ShedLock's `lockAtMostFor`): a lease of `d`
    /// that is never renewed, so a run that hangs, or a holder that dies,
    /// frees the name `d` after it was taken, and the hold's lost signal
    /// fires then (scoped work is stopped). Pick it well above the
    /// longest run. The same as `ttl(d).auto_renew(false)`. On a store
    /// whose locks live with the client's session (ZooKeeper, etcd, SQL
    /// session locks), a hold that is not renewed is trusted only for the
    /// session's timeout: the hold then ends at the shorter of `d` and
    /// that timeout; and a process that hangs whole keeps its session, and
    /// the lock, alive.
    pub fn at_most(self, d: Duration) -> Self {
        self.ttl(d).auto_renew(false)
    }

    /// Sets the renewal period (default: TTL / 3).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// The renewal period in force.
    pub fn renew_period(&self) -> Duration {
        self.renew_every.unwrap_or(self.ttl / 3)
    }

    /// Checks the options against what a backend can do.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`](crate::ErrorKind::InvalidOptions) for a zero
    /// TTL, a TTL below the store's resolution or above [`MAX_TTL`], a
    /// renewal period that is zero or not shorter than the TTL, or a lock
    /// at least for longer than a lease that is not renewed.
    pub fn validate(&self, caps: &Capabilities) -> Result<()> {
        validate_ttl(self.ttl, caps)?;
        let every = self.renew_period();
        if self.auto_renew && (every.is_zero() || every >= self.ttl) {
            return Err(Error::invalid_options(format!(
                "renew period {} must be non-zero and shorter than the TTL {}",
                humantime::format_duration(every),
                humantime::format_duration(self.ttl)
            )));
        }
        if self.max_poll.is_zero() {
            return Err(Error::invalid_options("max_poll must be non-zero"));
        }
        match self.at_least {
            Some(least) if !self.auto_renew && least > self.ttl => {
                Err(Error::invalid_options(format!(
                    "lock at least for ({}) exceeds lock at most for ({}), the lease that is never renewed",
                    humantime::format_duration(least),
                    humantime::format_duration(self.ttl)
                )))
            }
            Some(least) if least > MAX_TTL => Err(Error::invalid_options(format!(
                "lock at least for ({}) is above the maximum of {}",
                humantime::format_duration(least),
                humantime::format_duration(MAX_TTL)
            ))),
            _ => Ok(()),
        }
    }
}

/// Checks one TTL against a backend's limits (shared by acquire and renew).
///
/// # Errors
/// [`ErrorKind::InvalidOptions`](crate::ErrorKind::InvalidOptions) as in
/// [`LockOptions::validate`].
pub fn validate_ttl(ttl: Duration, caps: &Capabilities) -> Result<()> {
    if ttl.is_zero() {
        return Err(Error::invalid_options("TTL must be greater than zero"));
    }
    if ttl < caps.min_ttl {
        return Err(Error::invalid_options(format!(
            "TTL {} is below this store's minimum of {}",
            humantime::format_duration(ttl),
            humantime::format_duration(caps.min_ttl)
        )));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid_options(format!(
            "TTL {} is above the maximum of {}",
            humantime::format_duration(ttl),
            humantime::format_duration(MAX_TTL)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn wait_policy_round_trips_through_text() {
        for (text, policy) in [
            ("none", WaitPolicy::NoWait),
            ("forever", WaitPolicy::Forever),
            ("1m 30s", WaitPolicy::For(Duration::from_secs(90))),
        ] {
            let parsed: WaitPolicy = text.parse().unwrap();
            assert_eq!(parsed, policy);
            assert_eq!(parsed.to_string().parse::<WaitPolicy>().unwrap(), policy);
        }
        let err = "soon".parse::<WaitPolicy>().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidOptions);
    }

    #[test]
    fn options_deserialize_and_reject_unknown_fields() {
        let o: LockOptions =
            serde_json::from_str(r#"{"ttl":"1s","wait":"none","renew_every":"200ms"}"#).unwrap();
        assert_eq!(o.wait, WaitPolicy::NoWait);
        assert_eq!(o.renew_period(), Duration::from_millis(200));
        assert!(serde_json::from_str::<LockOptions>(r#"{"tll":"1s"}"#).is_err());
        let back: LockOptions = serde_json::from_str(&serde_json::to_string(&o).unwrap()).unwrap();
        assert_eq!(back, o);
    }

    #[test]
    fn bad_ttls_are_typed_errors() {
        let caps = Capabilities {
            min_ttl: Duration::from_secs(1),
            ..Capabilities::default()
        };
        for ttl in [Duration::ZERO, Duration::from_millis(500), MAX_TTL * 2] {
            let e = LockOptions::new().ttl(ttl).validate(&caps).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidOptions, "{ttl:?}");
        }
        let e = LockOptions::new()
            .ttl(Duration::from_secs(2))
            .renew_every(Duration::from_secs(2))
            .validate(&caps)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidOptions);
        LockOptions::new().validate(&caps).unwrap();
    }

    /// Lock at least for cannot outlast a lease that is never renewed.
    #[test]
    fn at_least_longer_than_at_most_is_refused() {
        let caps = Capabilities::default();
        let (least, most) = (Duration::from_secs(10), Duration::from_secs(5));
        let e = LockOptions::new()
            .at_most(most)
            .at_least(least)
            .validate(&caps)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidOptions);
        assert!(e.to_string().contains("exceeds lock at most for"), "{e}");
        LockOptions::new()
            .at_most(least)
            .at_least(most)
            .validate(&caps)
            .unwrap();
        // Renewed, a hold may be kept longer than one lease.
        LockOptions::new()
            .ttl(most)
            .at_least(least)
            .validate(&caps)
            .unwrap();
        let o: LockOptions = serde_json::from_str(r#"{"at_least":"2s"}"#).unwrap();
        assert_eq!(o.at_least, Some(Duration::from_secs(2)));
    }
}
