//! The memcached server's own clock, as groups read it for their
//! holders' ends (see `claims.rs`).
//!
//! A group's holders end at times on the server's clock. It is read with
//! the group, in the same round trip: the item
//! `<prefix>#clock` holds the absolute expiry it was stored with, `E`,
//! and `mg` reports its seconds left, `t`, so the server's clock is
//! `E − t`. It is read before the group's item, so it is never ahead of
//! the group's read: a holder whose end has come is gone, and one read as
//! live may have ended less than a second before (never granted over too
//! soon). When the clock item is missing (the first use, a restart, after
//! its day), `stats` gives the server's time once and the item is added
//! again to expire a day later: one small item per prefix, never more.
//!
//! A first holder of a name nothing holds is stamped without reading the
//! clock first (`fresh_group`): by the last reading, plus the seconds
//! since, rounded up, and one more, so never behind the server's clock
//! unless that jumped ahead (a restarted server). The clock read after the
//! `add`, in the same round trip, tells: an end that came out too early is
//! undone before it is granted.

use std::time::{Duration, Instant};

use lockwright_core::backend::HoldId;
use lockwright_core::{Claim, Error, Result};

use crate::error::unexpected;
use crate::layout::{store_ttl, Group, Item, CLOCK_LAG};
use crate::node::Node;
use crate::rules::{decide, secs, Outcome};
use crate::wire::{Commands, Reply};

/// How long a reading of the clock stamps fresh groups: the local clock's
/// drift over it stays far below the second added.
const CLOCK_REUSE: Duration = Duration::from_secs(60);

/// What the attempt at a fresh group came to.
pub(crate) enum Fresh {
    /// The caller is the group's first member.
    Granted,
    /// The name is held: the clock and the item, read in that order.
    Read(u64, Option<Item>),
}

/// How long the clock item is kept, in seconds.
const CLOCK_LIFE: u64 = 24 * 3600;
/// A server clock below this reads as no Unix time: memcached would take
/// an absolute expiry under 30 days for a relative one.
const EARLIEST_CLOCK: u64 = 60 * 24 * 3600;

impl Node {
    /// The key of the item that reads the server's clock.
    pub(crate) fn clock_key(&self) -> String {
        format!("{}#clock", self.prefix)
    }

    /// The server's clock from the clock item's `mg` reply; `None` when
    /// the item is missing.
    pub(crate) fn clock_of(&self, reply: Option<Reply>) -> Result<Option<u64>> {
        match reply {
            Some(Reply::Miss) => Ok(None),
            Some(Reply::Value {
                data, ttl: Some(t), ..
            }) => std::str::from_utf8(&data)
                .ok()
                .and_then(|e| e.parse::<u64>().ok())
                .and_then(|e| e.checked_sub(t))
                .map(|now| Some(self.saw_clock(now)))
                .ok_or_else(|| {
                    Error::backend(format!(
                        "the item {:?} is not lockwright's clock",
                        self.clock_key()
                    ))
                }),
            Some(Reply::Value { .. }) => Err(Error::backend(format!(
                "the item {:?} is not lockwright's clock: it never expires",
                self.clock_key()
            ))),
            Some(other) => Err(unexpected(&other)),
            None => Err(Error::backend("memcached sent too few replies")),
        }
    }

    /// The server's clock by `stats` (checked: a Unix time, as absolute
    /// expiries need), and the clock item added for the next reads.
    pub(crate) async fn set_clock(&self) -> Result<u64> {
        let now = stats_clock(self.one(Commands::default().stats()).await?)?;
        self.saw_clock(now);
        self.add_clock(now).await?;
        Ok(now)
    }

    /// Adds the clock item, to expire a day after `now` (if no one else
    /// just did). A full server's refusal is no error and raises no alarm:
    /// it unlinked nothing, and groups read the clock by `stats` until
    /// there is room.
    async fn add_clock(&self, now: u64) -> Result<()> {
        let at = now + CLOCK_LIFE;
        let mut c = Commands::default();
        c.add_at(&self.clock_key(), at.to_string().as_bytes(), at);
        match self.one(&c).await? {
            Reply::Stored | Reply::NotStored | Reply::OutOfMemory(_) => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    /// Keeps `now`, the server's clock just read, for fresh groups.
    fn saw_clock(&self, now: u64) -> u64 {
        if let Ok(mut c) = self.clock.lock() {
            *c = Some((now, Instant::now()));
        }
        now
    }

    /// The server's clock or later: the last reading, if recent, plus the
    /// seconds since, rounded up, and one (a reading is a second's start).
    fn clock_ahead(&self) -> Option<u64> {
        let (then, at) = (*self.clock.lock().ok()?)?;
        let since = at.elapsed();
        (since < CLOCK_REUSE).then(|| then + secs(since) + 1)
    }

    /// A permit or read hold on a name nothing holds, in one round trip:
    /// the fresh group added, stamped by [`clock_ahead`](Self::clock_ahead),
    /// then the clock and the item read. `None`: no recent reading, another
    /// kind of claim, or the clock item missing; the caller reads as usual.
    pub(crate) async fn fresh_group(
        &self,
        hold: &HoldId,
        k: &str,
        ttl: Duration,
    ) -> Result<Option<Fresh>> {
        let Some(now) = self.clock_ahead() else {
            return Ok(None);
        };
        if hold.claim() == Claim::MUTEX || hold.kind.beside().is_some() {
            return Ok(None);
        }
        let lease = secs(store_ttl(ttl));
        let (mut g, end) = (Group::default(), now + lease);
        if decide(hold, &mut g, now, end, end)? != Outcome::Granted(1) {
            return Ok(None);
        }
        let mut c = Commands::default();
        c.add_at(k, &g.encode(), end).get(&self.clock_key()).get(k);
        let mut replies = self.send(&c).await?.into_iter();
        let (added, clock) = (replies.next(), self.clock_of(replies.next()));
        match added {
            // An end as the usual path sets it from a clock read before
            // the write, or up to the reading's two seconds later (not a
            // reading of another server behind the same address): granted.
            Some(Reply::Stored)
                if clock.as_ref().is_ok_and(|c| {
                    c.is_some_and(|c| (c + lease..=c + lease + CLOCK_LAG.as_secs()).contains(&end))
                }) =>
            {
                return Ok(Some(Fresh::Granted))
            }
            Some(Reply::Stored) => {
                // The clock is not where the reading said: undone, never
                // granted.
                self.group_release(&hold.key, k, &hold.owner).await?;
                return Ok(None);
            }
            Some(Reply::NotStored) => {}
            Some(Reply::OutOfMemory(m)) => return Err(self.full_alarm(&m)),
            Some(other) => return Err(unexpected(&other)),
            None => return Err(Error::backend("memcached sent too few replies")),
        }
        match (clock?, replies.next()) {
            (Some(now), Some(item)) => Ok(Some(Fresh::Read(now, self.item(k, item)?))),
            _ => Ok(None),
        }
    }

    /// The server's clock, then the item at `k`, in one round trip (two,
    /// and the clock item added, when it is missing).
    pub(crate) async fn read_timed(&self, k: &str) -> Result<(u64, Option<Item>)> {
        let mut c = Commands::default();
        c.get(&self.clock_key()).get(k);
        let mut replies = self.send(&c).await?.into_iter();
        let clock = self.clock_of(replies.next())?;
        let item = replies.next();
        if let (Some(now), Some(item)) = (clock, item) {
            return Ok((now, self.item(k, item)?));
        }
        // `stats` reads the clock, before the item as the clock item would.
        let mut c = Commands::default();
        c.stats().get(k);
        let mut replies = self.send(&c).await?.into_iter();
        let (Some(time), Some(item)) = (replies.next(), replies.next()) else {
            return Err(Error::backend("memcached sent too few replies"));
        };
        let now = self.saw_clock(stats_clock(time)?);
        let item = self.item(k, item)?;
        self.add_clock(now).await?;
        Ok((now, item))
    }
}

/// The server's clock from a `stats` reply: a Unix time, or absolute
/// expiries would be read as relative (or pass 2038).
fn stats_clock(reply: Reply) -> Result<u64> {
    let now = match reply {
        Reply::Time(t) => t,
        other => return Err(unexpected(&other)),
    };
    if now < EARLIEST_CLOCK || now + CLOCK_LIFE > i32::MAX as u64 {
        return Err(Error::backend(format!(
            "memcached's clock reads {now}, which is no Unix time before 2038: a group's \
             holders could not be given their own expiries"
        )));
    }
    Ok(now)
}
