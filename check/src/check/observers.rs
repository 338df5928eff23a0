//! `check --election`: while the workers campaign (each advertising
//! `w<id>`), two observers in this process watch the leader, one through
//! `Election::observe` and one by `Election::leader` reads timed on both
//! sides, and a checker judges what they saw against the workers' sections:
//! terms never go back, a term names the worker that was granted it, and no
//! read shows anyone but a holder whose lease was valid all through it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use lockwright::{Election, Leader};
use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::history::{mono_ns, Section};

/// The value a worker campaigns with.
pub(crate) fn worker_value(id: u32) -> String {
    format!("w{id}")
}

/// How often the stream observer's election polls where the store does
/// not notify; short, so that it sees short reigns.
const OBSERVE_EVERY: Duration = Duration::from_millis(20);

/// The pause between the reading observer's reads.
const READ_EVERY: Duration = Duration::from_millis(10);

/// One thing an observer saw: a leader, or that nobody led.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Sighting {
    /// The observer: 0 watches the stream, 1 reads.
    pub(crate) observer: u32,
    /// When the read was sent (the reading observer only: the stream's reads
    /// happen out of sight).
    pub(crate) sent: Option<u64>,
    /// When the answer was seen.
    pub(crate) seen: u64,
    /// The leader's value (lossy UTF-8); `None` when nobody led.
    pub(crate) value: Option<String>,
    /// The leader's term.
    pub(crate) term: Option<u64>,
}

impl Sighting {
    fn new(observer: u32, sent: Option<u64>, leader: Option<&Leader>) -> Self {
        Sighting {
            observer,
            sent,
            seen: mono_ns(),
            value: leader.map(|l| String::from_utf8_lossy(&l.value).into_owned()),
            term: leader.and_then(|l| l.term).map(|t| t.0),
        }
    }
}

/// The two observers, running until [`stop`](Self::stop).
pub(crate) struct Observers {
    seen: Arc<Mutex<Vec<Sighting>>>,
    errors: Arc<AtomicU64>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Observers {
    /// Starts both observers on `election`.
    pub(crate) fn start(election: Election) -> Self {
        let seen: Arc<Mutex<Vec<Sighting>>> = Arc::default();
        let errors = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let record = {
            let seen = seen.clone();
            move |s: Sighting| seen.lock().unwrap_or_else(|e| e.into_inner()).push(s)
        };
        let mut changes = Box::pin(election.observe_every(OBSERVE_EVERY));
        let stream = tokio::spawn({
            let (stop, errors, record) = (stop.clone(), errors.clone(), record.clone());
            async move {
                loop {
                    let next = tokio::select! {
                        n = changes.next() => n,
                        () = stop.cancelled() => return,
                    };
                    match next {
                        Some(Ok(l)) => record(Sighting::new(0, None, l.as_ref())),
                        Some(Err(_)) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                        None => return,
                    }
                }
            }
        });
        let reads = tokio::spawn({
            let (stop, errors) = (stop.clone(), errors.clone());
            async move {
                while !stop.is_cancelled() {
                    let sent = mono_ns();
                    let read = tokio::select! {
                        r = election.leader() => r,
                        () = stop.cancelled() => return,
                    };
                    match read {
                        Ok(l) => record(Sighting::new(1, Some(sent), l.as_ref())),
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    tokio::time::sleep(READ_EVERY).await;
                }
            }
        });
        Observers {
            seen,
            errors,
            stop,
            tasks: vec![stream, reads],
        }
    }

    /// Stops both; what they saw, and how many errors they met.
    pub(crate) async fn stop(self) -> (Vec<Sighting>, u64) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        let seen = std::mem::take(&mut *self.seen.lock().unwrap_or_else(|e| e.into_inner()));
        (seen, self.errors.load(Ordering::Relaxed))
    }
}

/// What the observers saw, judged.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub(crate) struct LeaderVerdict {
    /// Leaders (or nobody) the observers reported.
    pub(crate) sightings: u64,
    /// Distinct reigns seen (by term, or by value without terms).
    pub(crate) reigns_seen: u64,
    /// Errors the observers met (the store unreachable for a moment).
    pub(crate) observer_errors: u64,
    /// Sightings that broke a rule (see the module's docs).
    pub(crate) violations: u64,
    /// A few of them, described.
    pub(crate) examples: Vec<String>,
}

const EXAMPLES: usize = 5;

/// Counts a violation, and keeps its description if there are few yet.
fn flag(v: &mut LeaderVerdict, msg: String) {
    v.violations += 1;
    if v.examples.len() < EXAMPLES {
        v.examples.push(msg);
    }
}

/// Judges `seen` against the run's `sections`, whose holds outlast their
/// holder by at most `outlast` (the TTL, or a session store's session).
pub(crate) fn judge(
    seen: &[Sighting],
    sections: &[Section],
    outlast: Duration,
    errors: u64,
) -> LeaderVerdict {
    let mut v = LeaderVerdict {
        sightings: seen.len() as u64,
        observer_errors: errors,
        ..LeaderVerdict::default()
    };
    let granted: HashMap<u64, u32> = sections
        .iter()
        .filter_map(|s| s.fence.map(|f| (f, s.worker)))
        .collect();
    let mut reigns: HashSet<(Option<u64>, &str)> = HashSet::new();
    let mut term_values: HashMap<u64, &str> = HashMap::new();
    let mut last_term: HashMap<u32, u64> = HashMap::new();
    let mut ordered: Vec<&Sighting> = seen.iter().collect();
    ordered.sort_by_key(|s| s.seen);
    for s in ordered {
        let who = |s: &Sighting| match (&s.value, s.term) {
            (Some(v), Some(t)) => format!("{v} (term {t})"),
            (Some(v), None) => v.clone(),
            (None, _) => "nobody".to_owned(),
        };
        let Some(value) = s.value.as_deref() else {
            check_read(&mut v, s, sections, &who(s));
            continue;
        };
        reigns.insert((s.term, value));
        let id = value.strip_prefix('w').and_then(|n| n.parse::<u32>().ok());
        if id.is_none() {
            flag(
                &mut v,
                format!(
                    "observer {} saw the value {value:?}, which no worker advertises",
                    s.observer
                ),
            );
        }
        if let Some(t) = s.term {
            if let Some(&before) = last_term.get(&s.observer) {
                if t < before {
                    flag(
                        &mut v,
                        format!(
                            "observer {} saw {} after term {before}: an older leader after a \
                             newer one",
                            s.observer,
                            who(s)
                        ),
                    );
                }
            }
            last_term.insert(s.observer, t);
            if let Some(&w) = granted.get(&t) {
                if id != Some(w) {
                    flag(
                        &mut v,
                        format!(
                            "observer {} saw {}, but term {t} was granted to w{w}",
                            s.observer,
                            who(s)
                        ),
                    );
                }
            }
            match term_values.get(&t) {
                Some(&other) if other != value => flag(
                    &mut v,
                    format!("term {t} was seen as both {other} and {value}"),
                ),
                _ => {
                    term_values.insert(t, value);
                }
            }
        }
        check_read(&mut v, s, sections, &who(s));
        if let Some(w) = id {
            check_ended(&mut v, s, sections, w, outlast, &who(s));
        }
    }
    v.reigns_seen = reigns.len() as u64;
    v
}

/// A timed read must show the holder whose lease was valid all through
/// it: anything else (nobody, another, an older term) is a leader the
/// store should not have reported.
fn check_read(v: &mut LeaderVerdict, s: &Sighting, sections: &[Section], shown: &str) {
    let Some(sent) = s.sent else { return };
    for h in sections {
        let valid_until = h.end.map_or(h.deadline, |e| e.min(h.deadline));
        if h.start > sent || valid_until < s.seen {
            continue;
        }
        let want = worker_value(h.worker);
        if s.value.as_deref() != Some(want.as_str()) || (h.fence.is_some() && s.term != h.fence) {
            flag(
                v,
                format!(
                    "observer {} read {shown} while {want} (term {:?}) held a valid lease all \
                     through the read",
                    s.observer, h.fence
                ),
            );
        }
    }
}

/// A timed read must not show a reign whose hold had run out long before
/// the read was sent. Only where the store gives terms: without them a
/// worker's later grant that never became a section (killed before it
/// reported, or refused at the cut-off) cannot be told from an old reign.
fn check_ended(
    v: &mut LeaderVerdict,
    s: &Sighting,
    sections: &[Section],
    worker: u32,
    outlast: Duration,
    shown: &str,
) {
    let (Some(sent), Some(term)) = (s.sent, s.term) else {
        return;
    };
    let outlast = u64::try_from(outlast.as_nanos()).unwrap_or(u64::MAX);
    // A grant's hold runs from when the store made it, which may be as late
    // as the section's start (a reply that was held up), and a renewal may
    // land after the last deadline reported: twice `outlast` past the later
    // of the two, the store has let it go.
    let over = |h: &Section| {
        h.start
            .max(h.deadline)
            .saturating_add(outlast.saturating_mul(2))
    };
    let Some(h) = sections
        .iter()
        .find(|h| h.fence == Some(term) && h.worker == worker)
    else {
        return;
    };
    if over(h) < sent {
        let ms = (sent - over(h)) as f64 / 1e6;
        flag(
            v,
            format!(
                "observer {} read {shown} {ms:.0} ms after its hold had run out (twice the \
                 lease past its holder's last deadline)",
                s.observer
            ),
        );
    }
}
