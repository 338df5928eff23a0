//! What a fault run records, and the checker that judges it: exclusion
//! between holders whose leases were valid (at most N at once for a
//! semaphore's permits; a reader never beside a writer), increments that
//! were lost,
//! writes accepted out of fence order, and the stale writes the fence
//! stopped (or, without fences, could not stop).
//!
//! Times are nanoseconds of `CLOCK_MONOTONIC`, which every process on the
//! machine shares, so worker and resource timestamps compare directly.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Nanoseconds of the machine's monotonic clock.
pub(crate) fn mono_ns() -> u64 {
    match nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC) {
        Ok(t) => t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64,
        Err(_) => 0,
    }
}

/// An `Instant` on the same scale as [`mono_ns`]. The two clocks are paired
/// once per process, from the closest of several back-to-back reads, so a
/// worker frozen or preempted between two reads cannot skew a deadline.
pub(crate) fn instant_ns(at: std::time::Instant) -> u64 {
    static BASE: std::sync::OnceLock<(std::time::Instant, u64)> = std::sync::OnceLock::new();
    let &(base, base_ns) = BASE.get_or_init(|| {
        let mut best: Option<(u64, std::time::Instant, u64)> = None;
        for _ in 0..16 {
            let before = mono_ns();
            let now = std::time::Instant::now();
            let after = mono_ns();
            let gap = after.saturating_sub(before);
            if best.is_none_or(|(g, _, _)| gap < g) {
                best = Some((gap, now, before + gap / 2));
            }
        }
        let (_, now, ns) = best.unwrap_or((0, std::time::Instant::now(), mono_ns()));
        (now, ns)
    });
    if at >= base {
        base_ns + (at - base).as_nanos() as u64
    } else {
        base_ns.saturating_sub((base - at).as_nanos() as u64)
    }
}

/// One critical section: from the grant to the end of the worker's work.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Section {
    /// The worker process (a restarted worker gets a new number).
    pub(crate) worker: u32,
    /// The section's number within its worker.
    pub(crate) seq: u64,
    /// The fencing token of the grant, where the store gives one.
    pub(crate) fence: Option<u64>,
    /// When the worker had the lock.
    pub(crate) start: u64,
    /// When the worker was done; `None` if it died first.
    pub(crate) end: Option<u64>,
    /// The latest deadline the worker reported: until then its lease was
    /// valid by its own (conservative) reckoning.
    pub(crate) deadline: u64,
    /// A reader's section (a shared hold), which only reads.
    #[serde(default)]
    pub(crate) shared: bool,
}

impl Section {
    /// The time during which the holder believed its lease valid.
    fn valid_until(&self) -> u64 {
        self.end.map_or(self.deadline, |e| e.min(self.deadline))
    }
}

/// What a worker did to the shared resource.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// Read the counter.
    Read,
    /// Wrote the counter.
    Write,
}

/// One request to the resource, as the resource saw and judged it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Op {
    /// When the resource applied (or refused) it.
    pub(crate) t: u64,
    /// The section it belongs to.
    pub(crate) worker: u32,
    /// The section's number within its worker.
    pub(crate) seq: u64,
    /// Read or write.
    pub(crate) kind: OpKind,
    /// The fence it carried.
    pub(crate) fence: Option<u64>,
    /// The counter before this op.
    pub(crate) before: u64,
    /// For a write: the value the section had read.
    pub(crate) read: u64,
    /// For a write: the value written.
    pub(crate) value: u64,
    /// False if the resource refused it for a fence lower than one seen.
    pub(crate) accepted: bool,
}

/// A whole fault run: every section and every op, ops in the order the
/// resource applied them.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct History {
    /// How many exclusive holders may be in at once: a semaphore's
    /// permits, otherwise 1 (0, as a history written before there were
    /// permits says, is 1).
    #[serde(default)]
    pub(crate) permits: u32,
    /// Critical sections.
    pub(crate) sections: Vec<Section>,
    /// Resource ops, in applied order.
    pub(crate) ops: Vec<Op>,
}

/// The checker's findings.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub(crate) struct Verdict {
    /// Critical sections begun.
    pub(crate) acquisitions: u64,
    /// Sections begun while their claim's rule forbade it, on the leases
    /// valid then: beside another exclusive holder (or N of them, for
    /// permits), a writer beside a reader, or a reader beside a writer.
    pub(crate) exclusion_violations: u64,
    /// The most holders whose leases were valid at one time.
    pub(crate) most_at_once: u64,
    /// Lost increments by holders with valid leases, or fenced writes
    /// accepted out of order or stale.
    pub(crate) data_violations: u64,
    /// Sections whose read or write the resource refused by fence: stale
    /// holders the fence stopped.
    pub(crate) fenced_out: u64,
    /// Lost increments caused by a holder whose lease had run out, on a
    /// store without fences: why fences matter.
    pub(crate) unfenced_overlaps: u64,
    /// Sections still running after their holder's deadline: holders the
    /// faults made stale mid-section (each then tried to write late).
    pub(crate) late_sections: u64,
    /// Writes the resource accepted.
    pub(crate) accepted_writes: u64,
    /// Increments the counter lost (accepted writes less its final value).
    pub(crate) increments_lost: u64,
    /// Exclusive grants whose fence is below that of a grant made before
    /// them (a store that lost its fence's order, at a failover say).
    pub(crate) fence_regressions: u64,
    /// A few of the violations, described.
    pub(crate) examples: Vec<String>,
}

const EXAMPLES: usize = 5;

/// Counts the exclusive grants whose fence is below that of one granted
/// before them. "Before" by the sections' starts, but only where the
/// lower one's lease was still valid when the higher one began: a holder
/// frozen between its grant and the start it recorded (its lease run out
/// meanwhile, and the lock granted on) is stale, not a regression.
fn order_of_fences(h: &History) -> Vec<(&Section, &Section)> {
    if h.permits > 1 {
        return Vec::new();
    }
    let mut exclusive: Vec<&Section> = h
        .sections
        .iter()
        .filter(|s| !s.shared && s.fence.is_some())
        .collect();
    exclusive.sort_by_key(|s| s.start);
    let mut out = Vec::new();
    for (i, s) in exclusive.iter().enumerate() {
        let earlier = exclusive[..i]
            .iter()
            .filter(|r| r.fence > s.fence && s.deadline > r.start)
            .max_by_key(|r| r.fence);
        if let Some(r) = earlier {
            out.push((*r, *s));
        }
    }
    out
}

fn fence_order(h: &History, v: &mut Verdict, note: impl Fn(&mut Verdict, String)) {
    for (r, s) in order_of_fences(h) {
        v.fence_regressions += 1;
        let msg = format!(
            "fence regression: worker {} section {} was granted fence {:?} after worker {} \
             section {} had fence {:?}",
            s.worker, s.seq, s.fence, r.worker, r.seq, r.fence
        );
        note(v, msg);
    }
}

/// Judges a history.
pub(crate) fn check(h: &History) -> Verdict {
    let mut v = Verdict {
        acquisitions: h.sections.len() as u64,
        late_sections: h
            .sections
            .iter()
            .filter(|s| s.end.is_some_and(|e| e > s.deadline))
            .count() as u64,
        ..Verdict::default()
    };
    let note = |v: &mut Verdict, s: String| {
        if v.examples.len() < EXAMPLES {
            v.examples.push(s);
        }
    };

    // Exclusion: sweep the valid intervals by start time, keeping the ones
    // still valid at each start.
    let limit = h.permits.max(1) as usize;
    let mut valid: Vec<&Section> = h
        .sections
        .iter()
        .filter(|s| s.valid_until() > s.start)
        .collect();
    valid.sort_by_key(|s| s.start);
    let mut live: Vec<&Section> = Vec::new();
    for s in valid {
        live.retain(|r| r.valid_until() > s.start);
        let writers = live.iter().filter(|r| !r.shared).count();
        let readers = live.len() - writers;
        let broken = if s.shared {
            writers > 0
        } else {
            writers >= limit || readers > 0
        };
        // The one it overlaps longest among those its rule forbids.
        let other = live
            .iter()
            .filter(|r| !s.shared || !r.shared)
            .max_by_key(|r| r.valid_until());
        if let Some(r) = other.filter(|_| broken) {
            v.exclusion_violations += 1;
            let ms = (r.valid_until() - s.start) as f64 / 1e6;
            let role = |x: &Section| if x.shared { "a reader, " } else { "" };
            let crowd = if limit > 1 && !s.shared && readers == 0 {
                format!(", with {writers} of {limit} permits already held")
            } else {
                String::new()
            };
            let msg = format!(
                "exclusion: worker {} section {} ({}fence {:?}) began {ms:.1} ms before worker \
                 {} section {} ({}fence {:?}, held {:.1} ms, {}) stopped believing its lease \
                 valid{crowd}",
                s.worker,
                s.seq,
                role(s),
                s.fence,
                r.worker,
                r.seq,
                role(r),
                r.fence,
                (r.valid_until() - r.start) as f64 / 1e6,
                match r.end {
                    Some(e) if e <= r.deadline => "ended in time",
                    Some(_) => "ended after its deadline",
                    None => "never ended",
                }
            );
            note(&mut v, msg);
        }
        live.push(s);
        v.most_at_once = v.most_at_once.max(live.len() as u64);
    }

    // Data: replay the accepted writes in the order they were applied.
    let sections: HashMap<(u32, u64), &Section> =
        h.sections.iter().map(|s| ((s.worker, s.seq), s)).collect();
    let stale = |op: &Op| {
        sections
            .get(&(op.worker, op.seq))
            .is_none_or(|s| op.t > s.valid_until())
    };
    let mut highest: Option<u64> = None;
    let mut fenced_sections = std::collections::HashSet::new();
    // Per section: the index of its latest accepted read.
    let mut read_at: HashMap<(u32, u64), usize> = HashMap::new();
    let mut writes: Vec<(usize, &Op)> = Vec::new();
    for (i, op) in h.ops.iter().enumerate() {
        if !op.accepted {
            fenced_sections.insert((op.worker, op.seq));
            continue;
        }
        match op.kind {
            OpKind::Read => {
                read_at.insert((op.worker, op.seq), i);
            }
            OpKind::Write => {
                v.accepted_writes += 1;
                if let (Some(f), Some(top)) = (op.fence, highest) {
                    if f < top {
                        v.data_violations += 1;
                        let msg = format!(
                            "fence order: worker {} section {} wrote with fence {f} after fence \
                             {top} had written",
                            op.worker, op.seq
                        );
                        note(&mut v, msg);
                    }
                }
                highest = highest.max(op.fence);
                if op.before != op.read || op.value != op.read + 1 {
                    // Another write landed between this section's read and
                    // its write: one increment is lost. Who was stale?
                    let since = read_at.get(&(op.worker, op.seq)).copied().unwrap_or(0);
                    let others: Vec<&Op> = writes
                        .iter()
                        .filter(|(j, _)| *j > since)
                        .map(|(_, w)| *w)
                        .collect();
                    let fenced = op.fence.is_some() || others.iter().any(|w| w.fence.is_some());
                    let excused = !fenced
                        && (stale(op) || (!others.is_empty() && others.iter().all(|w| stale(w))));
                    if excused {
                        v.unfenced_overlaps += 1;
                    } else {
                        v.data_violations += 1;
                        let msg = format!(
                            "lost increment: worker {} section {} (fence {:?}) read {} but the \
                             counter was {} when its write of {} was accepted",
                            op.worker, op.seq, op.fence, op.read, op.before, op.value
                        );
                        note(&mut v, msg);
                    }
                }
                writes.push((i, op));
            }
        }
    }
    v.fenced_out = fenced_sections.len() as u64;
    fence_order(h, &mut v, note);
    let last = writes.last().map_or(0, |(_, w)| w.value);
    v.increments_lost = v.accepted_writes.saturating_sub(last);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn section(worker: u32, fence: Option<u64>, start: u64, end: u64, deadline: u64) -> Section {
        Section {
            worker,
            seq: 1,
            fence,
            start: start * MS,
            end: Some(end * MS),
            deadline: deadline * MS,
            shared: false,
        }
    }

    fn op(worker: u32, kind: OpKind, t: u64, fence: Option<u64>, before: u64, read: u64) -> Op {
        Op {
            t: t * MS,
            worker,
            seq: 1,
            kind,
            fence,
            before,
            read,
            value: if kind == OpKind::Write {
                read + 1
            } else {
                before
            },
            accepted: true,
        }
    }

    /// Two holders one after the other, each reading then incrementing.
    fn clean(fences: bool) -> History {
        let f = |n| fences.then_some(n);
        History {
            permits: 1,
            sections: vec![
                section(1, f(1), 0, 10, 2000),
                section(2, f(2), 11, 20, 2011),
            ],
            ops: vec![
                op(1, OpKind::Read, 2, f(1), 0, 0),
                op(1, OpKind::Write, 5, f(1), 0, 0),
                op(2, OpKind::Read, 12, f(2), 1, 1),
                op(2, OpKind::Write, 15, f(2), 1, 1),
            ],
        }
    }

    #[test]
    fn a_lower_fence_granted_later_is_a_regression_and_a_frozen_holder_is_not() {
        let section = |worker, fence, start, deadline| Section {
            worker,
            seq: 1,
            fence: Some(fence),
            start,
            end: Some(start + 10),
            deadline,
            shared: false,
        };
        let mut h = History {
            permits: 1,
            ..History::default()
        };
        // Granted 20 at 100, then 10 at 200 (the lost grant's successor).
        h.sections = vec![section(1, 20, 100, 150), section(2, 10, 200, 250)];
        let v = check(&h);
        assert_eq!(v.fence_regressions, 1, "{v:?}");
        assert!(v.examples[0].contains("fence regression"), "{v:?}");
        // Granted 10 (lease to 150), frozen past it; 20 granted at 160;
        // the frozen one records its start at 170.
        h.sections = vec![section(1, 10, 170, 150), section(2, 20, 160, 260)];
        assert_eq!(check(&h).fence_regressions, 0);
    }

    #[test]
    fn a_clean_history_passes() {
        for fences in [true, false] {
            let v = check(&clean(fences));
            assert_eq!(v.acquisitions, 2);
            assert_eq!(v.accepted_writes, 2);
            assert_eq!(
                (
                    v.exclusion_violations,
                    v.data_violations,
                    v.fenced_out,
                    v.unfenced_overlaps
                ),
                (0, 0, 0, 0),
                "{v:?}"
            );
        }
    }

    #[test]
    fn overlapping_valid_sections_are_an_exclusion_violation() {
        let mut h = clean(true);
        h.sections[1].start = 8 * MS;
        let v = check(&h);
        assert_eq!(v.exclusion_violations, 1, "{v:?}");
        // The same overlap after the first holder's deadline is no violation.
        h.sections[0].deadline = 7 * MS;
        assert_eq!(check(&h).exclusion_violations, 0);
    }

    #[test]
    fn a_section_that_never_ended_is_valid_until_its_deadline() {
        let mut h = clean(false);
        h.sections[0].end = None;
        h.sections[0].deadline = 15 * MS;
        assert_eq!(check(&h).exclusion_violations, 1);
        h.sections[0].deadline = 11 * MS;
        assert_eq!(check(&h).exclusion_violations, 0);
    }

    #[test]
    fn a_lost_increment_by_valid_holders_is_a_data_violation() {
        for fences in [true, false] {
            let f = |n| fences.then_some(n);
            let mut h = clean(fences);
            // Worker 2 read 0 before worker 1 wrote, then wrote 1 over it.
            h.ops = vec![
                op(1, OpKind::Read, 2, f(1), 0, 0),
                op(2, OpKind::Read, 3, f(2), 0, 0),
                op(1, OpKind::Write, 5, f(1), 0, 0),
                op(2, OpKind::Write, 15, f(2), 1, 0),
            ];
            let v = check(&h);
            assert_eq!(v.data_violations, 1, "fences {fences}: {v:?}");
            assert_eq!(v.unfenced_overlaps, 0);
        }
    }

    #[test]
    fn an_accepted_write_below_a_written_fence_is_a_data_violation() {
        let mut h = clean(true);
        h.ops[3].fence = Some(0);
        h.sections[1].fence = Some(0);
        let v = check(&h);
        assert_eq!(v.data_violations, 1, "{v:?}");
        assert!(v.examples[0].contains("fence order"), "{v:?}");
    }

    #[test]
    fn a_stale_unfenced_writer_is_an_unfenced_overlap_not_a_violation() {
        // Worker 1 read 0, froze past its deadline (at 4 ms); worker 2 took
        // over and incremented; worker 1 woke and wrote 1 over it.
        let mut h = clean(false);
        h.sections[0].deadline = 4 * MS;
        h.sections[0].end = Some(30 * MS);
        h.ops = vec![
            op(1, OpKind::Read, 2, None, 0, 0),
            op(2, OpKind::Read, 12, None, 0, 0),
            op(2, OpKind::Write, 15, None, 0, 0),
            op(1, OpKind::Write, 25, None, 1, 0),
        ];
        let v = check(&h);
        assert_eq!((v.data_violations, v.unfenced_overlaps), (0, 1), "{v:?}");
        // The same with fences is a violation: the fence should have refused it.
        let mut f = h.clone();
        for (o, fence) in f.ops.iter_mut().zip([1, 2, 2, 1]) {
            o.fence = Some(fence);
        }
        assert_eq!(check(&f).data_violations, 2, "{:?}", check(&f));
    }

    /// Sections of a semaphore's permits or a read-write lock, with no ops:
    /// `(worker, shared, start, end)`, every lease valid to its end.
    fn claims(permits: u32, sections: &[(u32, bool, u64, u64)]) -> History {
        History {
            permits,
            sections: sections
                .iter()
                .map(|&(w, shared, start, end)| Section {
                    shared,
                    ..section(w, None, start, end, end + 1000)
                })
                .collect(),
            ops: Vec::new(),
        }
    }

    #[test]
    fn permits_allow_n_valid_holders_and_no_more() {
        let three = [(1, false, 0, 10), (2, false, 1, 10), (3, false, 2, 10)];
        let v = check(&claims(3, &three));
        assert_eq!((v.exclusion_violations, v.most_at_once), (0, 3), "{v:?}");
        let mut four = three.to_vec();
        four.push((4, false, 3, 10));
        let v = check(&claims(3, &four));
        assert_eq!((v.exclusion_violations, v.most_at_once), (1, 4), "{v:?}");
        assert!(v.examples[0].contains("3 of 3 permits"), "{v:?}");
        // A fourth after one of the three left is fine.
        four[3] = (4, false, 10, 20);
        assert_eq!(check(&claims(3, &four)).exclusion_violations, 0);
        // A history without permits is the lock's: one at a time.
        assert_eq!(check(&claims(0, &three)).exclusion_violations, 2);
    }

    #[test]
    fn readers_share_but_never_beside_a_writer() {
        let readers = [(1, true, 0, 10), (2, true, 1, 10), (3, true, 2, 10)];
        let v = check(&claims(1, &readers));
        assert_eq!((v.exclusion_violations, v.most_at_once), (0, 3), "{v:?}");
        let mut w = readers.to_vec();
        w.push((4, false, 5, 12));
        let v = check(&claims(1, &w));
        assert_eq!(v.exclusion_violations, 1, "{v:?}");
        assert!(v.examples[0].contains("a reader, "), "{v:?}");
        // A reader beginning inside a writer's section.
        let v = check(&claims(1, &[(1, false, 0, 10), (2, true, 5, 12)]));
        assert_eq!(v.exclusion_violations, 1, "{v:?}");
        // One after the other, either way round.
        let v = check(&claims(
            1,
            &[(1, false, 0, 10), (2, true, 10, 12), (3, false, 12, 14)],
        ));
        assert_eq!(v.exclusion_violations, 0, "{v:?}");
    }

    #[test]
    fn refused_ops_count_as_fenced_out() {
        let mut h = clean(true);
        h.ops.push(Op {
            accepted: false,
            ..op(1, OpKind::Write, 30, Some(1), 2, 0)
        });
        let v = check(&h);
        assert_eq!((v.fenced_out, v.data_violations), (1, 0), "{v:?}");
    }
}
