//! The rules of a claim on a group (see `claims.rs`): who joins, who waits
//! and leaves a mark, and who is refused as asking for something else.

use std::time::Duration;

use lockwright_core::backend::{judge, Found, HoldId};
use lockwright_core::{Claim, OwnerToken, Result};

use crate::layout::{Group, Mark, Member, Tag};
/// The most holders one group keeps: memcached's items hold 1 MB, and a
/// holder's line up to about 150 bytes. A semaphore has fewer permits
/// ([`lockwright_core::MAX_PERMITS`]); a reader past this waits.
const MAX_MEMBERS: usize = 4096;
/// Whole seconds, rounded up.
pub(crate) fn secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// What a claim on a group comes to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Granted: the owner's holds now (the group changed).
    Granted(u32),
    /// Nobody holds the name (marks aside): a mutex's or writer's claim
    /// takes it as a mutex's item.
    Free,
    /// Refused until about `retry_after`; `marked`: the group changed (a
    /// writer's mark) and must be written.
    Refused { retry_after: Duration, marked: bool },
}

/// The rules of [`Claim`] applied to a group whose lapsed holders and
/// marks were pruned at `now`: `end` is a new hold's end, `mark_end` a
/// writer's mark's.
pub(crate) fn decide(
    hold: &HoldId,
    g: &mut Group,
    now: u64,
    end: u64,
    mark_end: u64,
) -> Result<Outcome> {
    let me = hold.owner.as_str();
    let claim = hold.claim();
    // The permits kept: a semaphore's N, or 1 while a downgraded writer
    // (exclusive) holds.
    let kept = g
        .permits
        .or_else(|| g.members.iter().any(|m| m.tag == Tag::Writer).then_some(1));
    let found = Found {
        own_shared: g
            .members
            .iter()
            .find(|m| m.owner == me)
            .map(|m| m.tag == Tag::Reader),
        kept,
        readers: g.members.iter().any(|m| m.tag == Tag::Reader),
    };
    judge(&hold.key, claim, found)?;
    if let Some(m) = g.members.iter_mut().find(|m| m.owner == me) {
        m.holds = m.holds.saturating_add(1);
        m.end = m.end.max(end);
        return Ok(Outcome::Granted(m.holds));
    }
    let ask = Ask {
        me,
        now,
        end,
        mark_end,
    };
    Ok(match claim {
        Claim::Exclusive { permits } => ask.exclusive(g, permits),
        Claim::Shared => ask.shared(g, hold.kind.beside().map(OwnerToken::as_str)),
    })
}

/// A new claim on a group, which the claim rules admit: who asks, and
/// the times its answer is made of.
struct Ask<'a> {
    /// The asking owner.
    me: &'a str,
    /// The clock, in seconds.
    now: u64,
    /// A new hold's end.
    end: u64,
    /// A writer's mark's end.
    mark_end: u64,
}

impl Ask<'_> {
    /// An exclusive claim of `permits`: a writer's or a mutex's (1), or a
    /// semaphore's permit.
    fn exclusive(&self, g: &mut Group, permits: u32) -> Outcome {
        if g.members.is_empty() {
            if let (1, Some(until)) = (permits, self.marked_before(g, true)) {
                // Readers waited first: they go before this writer.
                return self.waits(g, until, false);
            }
            if permits == 1 && g.marks.iter().all(|m| m.owner == self.me) {
                return Outcome::Free;
            }
            if permits == 1 {
                // Others wait: holding as a member, not a mutex's item,
                // keeps their marks, so later readers still wait when this
                // writer goes, and earlier ones go first.
                return self.join(g, Tag::Writer);
            }
            // A semaphore has no use for a writer's marks.
            g.marks.clear();
            g.permits = Some(permits);
            return self.join(g, Tag::Permit);
        }
        if let Some(until) = soonest(g, |m| m.tag == Tag::Reader) {
            // Stop new readers until this writer is served or gives up.
            return self.waits(g, until, false);
        }
        if g.members.len() < permits as usize {
            return self.join(g, Tag::Permit);
        }
        // A writer behind a writer keeps its place while others wait in
        // line (readers that came later must not pass it).
        let until = soonest(g, |_| true).unwrap_or(self.now);
        Outcome::Refused {
            retry_after: self.wait(until),
            marked: permits == 1 && !g.marks.is_empty() && mark(g, self.me, self.mark_end, false),
        }
    }

    /// A shared claim, made `beside` a writer's hold (a downgrade) or not.
    fn shared(&self, g: &mut Group, beside: Option<&str>) -> Outcome {
        let writer = soonest(g, |m| m.tag == Tag::Writer);
        if let Some(w) = beside {
            let mut writers = g.members.iter().filter(|m| m.tag == Tag::Writer);
            if writer.is_some() && writers.all(|m| m.owner == w) {
                return self.join(g, Tag::Reader);
            }
            // A downgrade whose writer no longer holds: refused, never a
            // read hold after a gap.
            return Outcome::Refused {
                retry_after: Duration::ZERO,
                marked: false,
            };
        }
        if g.members.len() >= MAX_MEMBERS {
            let until = soonest(g, |_| true).unwrap_or(self.now);
            return Outcome::Refused {
                retry_after: self.wait(until),
                marked: false,
            };
        }
        match writer.or(self.marked_before(g, false)) {
            // In line behind the writers that came first, ahead of any
            // that come later.
            Some(until) => self.waits(g, until, true),
            None => self.join(g, Tag::Reader),
        }
    }

    /// Joins the group as a member of `tag`, its mark gone.
    fn join(&self, g: &mut Group, tag: Tag) -> Outcome {
        g.marks.retain(|m| m.owner != self.me);
        g.members.push(Member {
            owner: self.me.to_owned(),
            holds: 1,
            end: self.end,
            tag,
        });
        Outcome::Granted(1)
    }

    /// Waits until `until`, marked as a `reader` or writer in line.
    fn waits(&self, g: &mut Group, until: u64, reader: bool) -> Outcome {
        Outcome::Refused {
            retry_after: self.wait(until),
            marked: mark(g, self.me, self.mark_end, reader),
        }
    }

    /// From now until `until`.
    fn wait(&self, until: u64) -> Duration {
        Duration::from_secs(until.saturating_sub(self.now))
    }

    /// The latest end of the marks of readers (`reader`) or writers that
    /// came before this owner's own (all of them, if it has none): a
    /// waiter yields to those, so back-to-back writers cannot starve a
    /// waiting reader, nor readers a writer.
    fn marked_before(&self, g: &Group, reader: bool) -> Option<u64> {
        let mine = g.marks.iter().position(|m| m.owner == self.me);
        g.marks[..mine.unwrap_or(g.marks.len())]
            .iter()
            .filter(|m| m.reader == reader)
            .map(|m| m.end)
            .max()
    }
}

/// The soonest end of the group's members that `which` picks.
fn soonest(g: &Group, which: impl Fn(&Member) -> bool) -> Option<u64> {
    g.members.iter().filter(|m| which(m)).map(|m| m.end).min()
}

/// Marks `me` waiting until `end`, in its first place if it has one.
/// Whether that changed the group: a mark is rewritten only when its end
/// moves on, once a second at most, not at every look.
fn mark(g: &mut Group, me: &str, end: u64, reader: bool) -> bool {
    match g.marks.iter_mut().find(|m| m.owner == me) {
        Some(m) if m.end >= end => false,
        Some(m) => {
            m.end = end;
            true
        }
        None => {
            g.marks.push(Mark {
                owner: me.to_owned(),
                end,
                reader,
            });
            true
        }
    }
}
