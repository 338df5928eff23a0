//! The memcached server's own clock, as groups read it for their
//! holders' ends (see `group.rs`).
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

use locksmith_core::{Error, Result};

use crate::error::unexpected;
use crate::layout::Item;
use crate::node::Node;
use crate::wire::{Commands, Reply};

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
                .map(Some)
                .ok_or_else(|| {
                    Error::backend(format!(
                        "the item {:?} is not locksmith's clock",
                        self.clock_key()
                    ))
                }),
            Some(Reply::Value { .. }) => Err(Error::backend(format!(
                "the item {:?} is not locksmith's clock: it never expires",
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
        let now = stats_clock(time)?;
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
