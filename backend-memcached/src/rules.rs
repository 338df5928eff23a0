//! The rules of a claim on a group (see `claims.rs`): who joins, who waits
//! and leaves a mark, and who is refused as asking for something else.

use std::time::Duration;

use lockwright_core::backend::{claim_changed, permits_mismatch, semaphore_or_rwlock};
use lockwright_core::{Claim, LockKey, OwnerToken, Result};

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
    key: &LockKey,
    owner: &OwnerToken,
    g: &mut Group,
    now: u64,
    end: u64,
    mark_end: u64,
) -> Result<Outcome> {
    let me = owner.as_str();
    let claim = owner.claim();
    let wait = |until: u64| Duration::from_secs(until.saturating_sub(now));
    // The permits kept: a semaphore's N, or 1 while a downgraded writer
    // (exclusive) holds.
    let kept = g
        .permits
        .or_else(|| g.members.iter().any(|m| m.tag == Tag::Writer).then_some(1));
    if let Some(m) = g.members.iter_mut().find(|m| m.owner == me) {
        let shared = m.tag == Tag::Reader;
        if shared != claim.is_shared() {
            return Err(claim_changed(key, shared));
        }
        if let (Some(asked), Some(kept)) = (claim.exclusive_permits(), kept) {
            if asked != kept {
                return Err(permits_mismatch(key, kept, asked));
            }
        }
        m.holds = m.holds.saturating_add(1);
        m.end = m.end.max(end);
        return Ok(Outcome::Granted(m.holds));
    }
    let soonest =
        |f: &dyn Fn(&Member) -> bool| g.members.iter().filter(|m| f(m)).map(|m| m.end).min();
    let readers = soonest(&|m| m.tag == Tag::Reader);
    // The marks of the other kind that came before this owner's own (all
    // of them, if it has none): a waiter yields to those, so back-to-back
    // writers cannot starve a waiting reader, nor readers a writer.
    let before = |reader: bool| {
        let mine = g.marks.iter().position(|m| m.owner == me);
        g.marks[..mine.unwrap_or(g.marks.len())]
            .iter()
            .filter(|m| m.reader == reader)
            .map(|m| m.end)
            .max()
    };
    let (readers_before, writers_before) = (before(true), before(false));
    let join = |g: &mut Group, tag| {
        g.marks.retain(|m| m.owner != me);
        g.members.push(Member {
            owner: me.to_owned(),
            holds: 1,
            end,
            tag,
        });
        Ok(Outcome::Granted(1))
    };
    match claim {
        Claim::Exclusive { permits } => {
            if let Some(kept) = kept.filter(|&kept| kept != permits) {
                return Err(permits_mismatch(key, kept, permits));
            }
            if readers.is_some() && permits > 1 {
                return Err(semaphore_or_rwlock(key, permits, true));
            }
            if g.members.is_empty() {
                if let (1, Some(until)) = (permits, readers_before) {
                    // Readers waited first: they go before this writer.
                    return Ok(Outcome::Refused {
                        retry_after: wait(until),
                        marked: mark(g, me, mark_end, false),
                    });
                }
                if permits == 1 && g.marks.iter().all(|m| m.owner == me) {
                    return Ok(Outcome::Free);
                }
                if permits == 1 {
                    // Others wait: holding as a member, not a mutex's
                    // item, keeps their marks, so later readers still wait
                    // when this writer goes, and earlier ones go first.
                    return join(g, Tag::Writer);
                }
                // A semaphore has no use for a writer's marks.
                g.marks.clear();
                g.permits = Some(permits);
                return join(g, Tag::Permit);
            }
            if let Some(until) = readers {
                // Stop new readers until this writer is served or gives up.
                return Ok(Outcome::Refused {
                    retry_after: wait(until),
                    marked: mark(g, me, mark_end, false),
                });
            }
            if g.members.len() < permits as usize {
                return join(g, Tag::Permit);
            }
            // A writer behind a writer keeps its place while others wait in
            // line (readers that came later must not pass it).
            Ok(Outcome::Refused {
                retry_after: wait(soonest(&|_| true).unwrap_or(now)),
                marked: permits == 1 && !g.marks.is_empty() && mark(g, me, mark_end, false),
            })
        }
        Claim::Shared => {
            if let Some(kept) = g.permits {
                return Err(semaphore_or_rwlock(key, kept, false));
            }
            let writer = soonest(&|m| m.tag == Tag::Writer);
            if let Some(w) = owner.writer() {
                let writers = g.members.iter().filter(|m| m.tag == Tag::Writer);
                if writer.is_some() && writers.clone().all(|m| m.owner == w) {
                    return join(g, Tag::Reader);
                }
                // A downgrade whose writer no longer holds: refused, never
                // a read hold after a gap.
                return Ok(Outcome::Refused {
                    retry_after: Duration::ZERO,
                    marked: false,
                });
            }
            if g.members.len() >= MAX_MEMBERS {
                return Ok(Outcome::Refused {
                    retry_after: wait(soonest(&|_| true).unwrap_or(now)),
                    marked: false,
                });
            }
            match writer.or(writers_before) {
                Some(until) => {
                    // In line behind the writers that came first, ahead
                    // of any that come later.
                    Ok(Outcome::Refused {
                        retry_after: wait(until),
                        marked: mark(g, me, mark_end, true),
                    })
                }
                None => join(g, Tag::Reader),
            }
        }
    }
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
