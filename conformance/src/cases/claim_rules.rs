//! Claim rules: every store answers a sequence of claims as the reference
//! model does: the same grant with the same holds, the same contention,
//! the same kind of refusal (a reader asking to write, another N than the
//! one kept, a read on a semaphore's name or a permit on a read one), the
//! same release, while the holders' leases live and after they ran out.
//! Seeded random sequences of acquires (a mutex, a semaphore's permit of
//! 2 or 3, a read, a write, by owners whose claims change between their
//! acquires) and releases, after a fixed opening that names each rule
//! once, go to the store (each owner through a client of its own) and to a fresh
//! [`MemoryBackend`].
//! `LOCKWRIGHT_CLAIMS_SEED` replays a run (`<seed>`) or one of its
//! sequences (`<seed>:<sequence>`).

use lockwright_core::backend::LockBackendExt;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use lockwright_core::backend::{
    Acquire, AcquireRequest, Binding, Capabilities, HoldId, HoldKind, LockBackend, MemoryBackend,
    Release,
};
use lockwright_core::{Claim, ErrorKind, LockKey, OwnerToken};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{key, past_expiry, short_ttl, LONG_TTL};
use crate::Harness;

/// The case's name, under which its keys are made.
const CASE: &str = "claims_answer_as_the_model_does";
/// The run's seed unless `LOCKWRIGHT_CLAIMS_SEED` gives another.
const BASE_SEED: u64 = 20_240_611;
/// The environment variable that replays a run or one of its sequences.
const SEED_VAR: &str = "LOCKWRIGHT_CLAIMS_SEED";
/// How many random sequences follow the opening (sequence 0).
const SEQUENCES: usize = 12;
/// How many ops a random sequence has.
const OPS: usize = 25;
/// How many owners a run has; a random sequence uses three of them or all.
const OWNERS: usize = 4;
/// The random sequence that waits out its holders' leases, on a
/// lease-bound store: once a run, as the wait costs a TTL.
const EXPIRING: usize = 1;
/// How many acquires come before that wait.
const BEFORE_EXPIRY: usize = 6;
/// How many times the waiting sequence is played before a host too slow
/// to keep its short leases apart from the answers is a broken setup.
const TRIES: usize = 3;
/// More releases than any owner can have holds: enough to empty a name.
const MAX_HOLDS: usize = 64;

/// A claim an acquire makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The mutex's: one exclusive holder.
    Mutex,
    /// A semaphore's permit of N.
    Permits(u32),
    /// A read-write lock's reader.
    Read,
    /// A read-write lock's writer (exclusive, as the mutex).
    Write,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Mutex => f.write_str("mutex"),
            Kind::Permits(n) => write!(f, "permits({n})"),
            Kind::Read => f.write_str("read"),
            Kind::Write => f.write_str("write"),
        }
    }
}

/// One step of a sequence; owners are numbered from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// The owner makes one attempt with the claim.
    Acquire(usize, Kind),
    /// The owner releases one hold.
    Release(usize),
    /// Every hold taken so far runs out: the case waits past their leases.
    Expire,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Acquire(o, kind) => write!(f, "o{o} {kind}"),
            Op::Release(o) => write!(f, "o{o} release"),
            Op::Expire => f.write_str("expire"),
        }
    }
}

/// The opening sequence: each rule named once, in an order no seed can
/// miss (the random sequences mix them). Claims the store does not grant
/// are left out; what remains is still compared op by op.
const OPENING: &[Op] = &[
    // Readers share and re-enter; a reader never upgrades, by a write or
    // a mutex claim.
    Op::Acquire(0, Kind::Read),
    Op::Acquire(0, Kind::Read),
    Op::Acquire(0, Kind::Write),
    Op::Acquire(0, Kind::Mutex),
    Op::Acquire(1, Kind::Read),
    Op::Acquire(2, Kind::Read),
    // Readers keep a writer out; once it gave up, readers enter again.
    Op::Acquire(3, Kind::Write),
    Op::Acquire(3, Kind::Read),
    // A name read is no semaphore's.
    Op::Acquire(1, Kind::Permits(2)),
    Op::Release(0),
    Op::Release(0),
    // A release by an owner that holds nothing any more.
    Op::Release(0),
    Op::Release(1),
    Op::Release(2),
    Op::Release(3),
    // A semaphore of 3: re-entered, but not with another N; another N, a
    // mutex and a read refused; full at three holders.
    Op::Acquire(2, Kind::Permits(3)),
    Op::Acquire(2, Kind::Permits(3)),
    Op::Acquire(2, Kind::Permits(2)),
    Op::Acquire(0, Kind::Permits(3)),
    Op::Acquire(3, Kind::Permits(2)),
    Op::Acquire(3, Kind::Mutex),
    Op::Acquire(3, Kind::Read),
    Op::Acquire(1, Kind::Permits(3)),
    Op::Acquire(3, Kind::Permits(3)),
    // An owner that holds no permit releases none of the others'.
    Op::Release(3),
    Op::Release(2),
    Op::Release(2),
    Op::Release(0),
    Op::Release(1),
    // A writer re-enters as the mutex and keeps readers out; it reads
    // only by a downgrade, not with its own token; its name is no
    // semaphore's, its own or another owner's.
    Op::Acquire(1, Kind::Write),
    Op::Acquire(1, Kind::Mutex),
    Op::Acquire(2, Kind::Read),
    Op::Acquire(1, Kind::Read),
    Op::Acquire(1, Kind::Permits(2)),
    Op::Acquire(3, Kind::Permits(2)),
    Op::Release(1),
    Op::Release(1),
    Op::Acquire(2, Kind::Read),
    Op::Release(2),
];

/// What a random sequence mostly claims, so that its holders meet as a
/// lock's do in use; a quarter of its claims are of any other kind.
const THEMES: &[&[Kind]] = &[
    &[Kind::Mutex],
    &[Kind::Mutex, Kind::Write],
    &[Kind::Permits(2)],
    &[Kind::Permits(3)],
    &[Kind::Read, Kind::Write],
    &[Kind::Read, Kind::Read, Kind::Write],
];

/// What one side answered, compared by class: grants by their holds,
/// refusals by their error's kind (every store words a refusal with the
/// core's claim rules, but where two rules refuse one claim, a store may
/// meet either first), fences and leases not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Acquired, with the owner's holds now.
    Granted(u32),
    /// Held by another (`Contended`).
    Contended,
    /// An error of this kind.
    Refused(ErrorKind),
    /// Released, the name free of this owner.
    Freed,
    /// One hold released, this many left.
    StillHeld(u32),
    /// Released nothing: the owner held nothing.
    NotHeld,
}

impl Answer {
    /// An acquire's answer.
    fn of_acquire(result: &lockwright_core::Result<Acquire>) -> Self {
        match result {
            Ok(Acquire::Acquired(grant)) => Answer::Granted(grant.holds),
            Ok(Acquire::Contended { .. }) => Answer::Contended,
            Err(e) => Answer::Refused(e.kind()),
        }
    }

    /// A release's answer.
    fn of_release(result: &lockwright_core::Result<Release>) -> Self {
        match result {
            Ok(Release::Freed) => Answer::Freed,
            Ok(Release::StillHeld(n)) => Answer::StillHeld(*n),
            Ok(Release::NotHeld) => Answer::NotHeld,
            Err(e) => Answer::Refused(e.kind()),
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Granted(n) => write!(f, "granted ({n} holds)"),
            Answer::Contended => f.write_str("contended"),
            Answer::Refused(kind) => write!(f, "refused ({kind:?})"),
            Answer::Freed => f.write_str("freed"),
            Answer::StillHeld(n) => write!(f, "still held ({n} holds left)"),
            Answer::NotHeld => f.write_str("not held"),
        }
    }
}

/// An answer as a report shows it: with the error's message for a refusal.
fn text<T>(answer: Answer, result: &lockwright_core::Result<T>) -> String {
    match result {
        Err(e) => format!("{answer}: {e}"),
        Ok(_) => answer.to_string(),
    }
}

/// How a sequence ended.
#[derive(Debug)]
enum Ended {
    /// Every answer was the model's.
    Agreed,
    /// An answer was not the model's; the report says which.
    Differed(String),
    /// An answer was not the model's while holds with the short TTL were
    /// out and the host had been slow: a lease may have run out on one
    /// side and not yet on the other, so the difference proves nothing.
    TooSlow(String),
}

/// One owner of a sequence.
#[derive(Debug)]
struct Owner {
    /// Its token, the same string on both sides; each acquire sets its claim.
    token: OwnerToken,
    /// The ticket it gives up waiting with.
    ticket: OwnerToken,
    /// Its live hold, of the kind it was taken as.
    held: Option<HoldId>,
    /// The hold of its last acquire, which it releases with while it
    /// holds nothing.
    last: Option<HoldId>,
}

impl Owner {
    /// Its hold of `key` as `kind`.
    fn claiming(&self, key: &LockKey, kind: Kind) -> Result<HoldId> {
        let kind = match kind {
            Kind::Mutex => HoldKind::Mutex,
            Kind::Permits(n) => HoldKind::of_claim(Claim::permits(n)?),
            Kind::Read => HoldKind::Reader { beside: None },
            Kind::Write => HoldKind::Writer,
        };
        Ok(HoldId::new(key.clone(), self.token.clone(), kind))
    }
}

/// The lease of the holds the expiring sequence waits out: the suite's
/// short TTL, but at least 3 s, so that a loaded host answers the ops
/// before the wait well within half of it.
fn expiring_ttl(caps: &Capabilities) -> Duration {
    short_ttl(caps).max(Duration::from_secs(3))
}

/// The two answers of an op that differ: the store's, then the model's.
type Difference = Option<(String, String)>;

/// One sequence as it is played: the store's clients and a fresh model,
/// the name, the owners, and the ops played so far.
struct Run<'a> {
    /// A client of the store under test for each owner, so that what one
    /// owner meets of another is the store's answer, not one client's
    /// bookkeeping.
    stores: &'a [Arc<dyn LockBackend>],
    /// The reference model, fresh for the sequence.
    model: MemoryBackend,
    /// The sequence's own name.
    key: LockKey,
    /// Its owners.
    owners: Vec<Owner>,
    /// The run's seed, for the report.
    seed: u64,
    /// The sequence's number, for the report.
    sequence: usize,
    /// The ops played so far, the one being answered last.
    played: Vec<Op>,
}

impl<'a> Run<'a> {
    /// Sequence `sequence` of the run seeded `seed`, on `key`. Its owners'
    /// tokens come from the seed, so that a replay sends the same ones.
    fn new(
        stores: &'a [Arc<dyn LockBackend>],
        key: LockKey,
        seed: u64,
        sequence: usize,
    ) -> Result<Self> {
        let mut owners = Vec::with_capacity(OWNERS);
        for o in 0..OWNERS {
            let token = OwnerToken::from_string(format!(
                "claims-seed{seed:020}-sequence{sequence:02}-owner{o}"
            ))?;
            owners.push(Owner {
                last: None,
                held: None,
                ticket: OwnerToken::generate(),
                token,
            });
        }
        Ok(Run {
            stores,
            model: MemoryBackend::new(),
            key,
            owners,
            seed,
            sequence,
            played: Vec::new(),
        })
    }

    /// Plays `ops` on both sides until an answer differs.
    async fn play(&mut self, ops: &[Op], caps: &Capabilities) -> Result<Ended> {
        // Holds taken before the wait have the short TTL, so that the wait
        // is short; every other hold one that nothing waits out.
        let mut waiting = ops.contains(&Op::Expire);
        let mut ttl = if waiting {
            expiring_ttl(caps)
        } else {
            LONG_TTL
        };
        let started = Instant::now();
        for &op in ops {
            self.played.push(op);
            let differed = match op {
                Op::Acquire(o, kind) => self.acquire(o, kind, ttl).await?,
                Op::Release(o) => self.release(o).await?,
                Op::Expire => {
                    self.expire(caps, ttl).await?;
                    waiting = false;
                    ttl = LONG_TTL;
                    None
                }
            };
            if let Some((store, model)) = differed {
                let report = self.report(&store, &model);
                // Before the wait, a slow host may have let a short lease run
                // out on one side and not yet on the other.
                let unsure = waiting && started.elapsed() > ttl / 2;
                return Ok(if unsure {
                    Ended::TooSlow(report)
                } else {
                    Ended::Differed(report)
                });
            }
        }
        Ok(Ended::Agreed)
    }

    /// Owner `o` asks for `kind` on both sides.
    async fn acquire(&mut self, o: usize, kind: Kind, ttl: Duration) -> Result<Difference> {
        let owner = &mut self.owners[o];
        let hold = owner.claiming(&self.key, kind)?;
        owner.last = Some(hold.clone());
        let ticket = owner.ticket.clone();
        let request = AcquireRequest::new(hold.clone(), ttl);
        let store = self.stores[o].try_acquire(&request).await;
        let model = self.model.try_acquire(&request).await;
        let contended = matches!(store, Ok(Acquire::Contended { .. }))
            || matches!(model, Ok(Acquire::Contended { .. }));
        if contended {
            // A refused writer (and, on a store that keeps waiters in line,
            // a refused reader) leaves a mark or a place, which the Locker
            // takes away when it gives up; this case gives up at once, so
            // that no mark outlives its op on either side.
            self.stores[o]
                .abandon(&hold, &ticket)
                .await
                .context("the store could not take a refused claim's mark away")?;
            self.model.abandon(&hold, &ticket).await?;
        }
        let (s, m) = (Answer::of_acquire(&store), Answer::of_acquire(&model));
        if s != m {
            return Ok(Some((text(s, &store), text(m, &model))));
        }
        if s == Answer::Granted(1) {
            self.owners[o].held = Some(hold);
        }
        Ok(None)
    }

    /// Owner `o` releases one hold on both sides.
    async fn release(&mut self, o: usize) -> Result<Difference> {
        let owner = &self.owners[o];
        // A holder releases with the claim it holds by, as its guard does:
        // a store may find a hold by its claim (SQL's lone permit is the
        // name row's, memcached's mutex an item of its own). An owner that
        // holds nothing releases with the claim it last asked for, and
        // every store must answer that it holds nothing, whatever claim.
        let hold = match owner.held.clone().or_else(|| owner.last.clone()) {
            Some(hold) => hold,
            None => HoldId::mutex(self.key.clone(), owner.token.clone()),
        };
        let store = self.stores[o].release(&hold).await;
        let model = self.model.release(&hold).await;
        let (s, m) = (Answer::of_release(&store), Answer::of_release(&model));
        if s != m {
            return Ok(Some((text(s, &store), text(m, &model))));
        }
        if matches!(s, Answer::Freed | Answer::NotHeld) {
            self.owners[o].held = None;
        }
        Ok(None)
    }

    /// Waits out every hold taken so far (each with `ttl`). The model's run
    /// out with the sleep; the store's on its own clock, which may keep one
    /// a little longer (its resolution, a lease rounded up), never less, so
    /// the store is probed until the name is free there too.
    async fn expire(&mut self, caps: &Capabilities, ttl: Duration) -> Result<()> {
        tokio::time::sleep(past_expiry(caps, ttl)).await;
        free_in_store(&*self.stores[0], &self.key, caps, ttl).await?;
        for owner in &mut self.owners {
            owner.held = None;
        }
        Ok(())
    }

    /// Releases every hold still out, on both sides, with each claim the
    /// store grants (a store may find a hold by the claim it was taken by).
    async fn clean_up(&self, kinds: &[Kind]) -> Result<()> {
        for (o, owner) in self.owners.iter().enumerate() {
            let sides: [&dyn LockBackend; 2] = [&*self.stores[o], &self.model];
            for &kind in kinds {
                let hold = owner.claiming(&self.key, kind)?;
                for side in sides {
                    for _ in 0..MAX_HOLDS {
                        if side.release(&hold).await? == Release::NotHeld {
                            break;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// What a difference says: how to replay it, the op, both answers,
    /// and the ops so far.
    fn report(&self, store: &str, model: &str) -> String {
        let (seed, sequence, key) = (self.seed, self.sequence, &self.key);
        let at = self.played.len().saturating_sub(1);
        let op = self
            .played
            .last()
            .map(ToString::to_string)
            .unwrap_or_default();
        let ops: Vec<String> = self.played.iter().map(ToString::to_string).collect();
        let ops = ops.join(", ");
        format!(
            "sequence {sequence} of seed {seed} (replay it with {SEED_VAR}={seed}:{sequence}), \
             op {at} `{op}` on {key}: the store answered {store}, the model {model}; the ops \
             so far: [{ops}]"
        )
    }
}

/// Polls `store` until a stranger's mutex takes `k`, then gives it back:
/// every hold on `k`, taken with `ttl`, has run out there.
async fn free_in_store(
    store: &dyn LockBackend,
    k: &LockKey,
    caps: &Capabilities,
    ttl: Duration,
) -> Result<()> {
    let patience = caps.ttl_resolution * 2 + Duration::from_secs(3);
    let (probe, ticket) = (OwnerToken::generate(), OwnerToken::generate());
    let start = Instant::now();
    loop {
        match store.try_lock(k, &probe, LONG_TTL).await {
            Ok(Acquire::Acquired(_)) => {
                store.unlock(k, &probe).await?;
                return Ok(());
            }
            // Its mark, left beside readers still live, goes at once.
            Ok(Acquire::Contended { .. }) => store.abandon_lock(k, &probe, &ticket).await?,
            // Permits still out: their N is not the mutex's.
            Err(e) if e.kind() == ErrorKind::InvalidOptions => {}
            Err(e) => return Err(e).context("probing whether the holds had run out"),
        }
        if start.elapsed() > patience {
            let waited = past_expiry(caps, ttl) + start.elapsed();
            bail!(
                "{k} was still held {waited:?} after its holders' last acquire, with a TTL of \
                 {ttl:?}: a lease ends at its TTL, give or take the store's resolution"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The claims `caps` says the store grants: the mutex's always, a
/// semaphore's permits and reads and writes where it has them.
fn kinds_of(caps: &Capabilities) -> Vec<Kind> {
    let mut kinds = vec![Kind::Mutex];
    if caps.permits {
        kinds.extend([Kind::Permits(2), Kind::Permits(3)]);
    }
    if caps.shared {
        kinds.extend([Kind::Read, Kind::Write]);
    }
    kinds
}

/// The run's seed, and the one sequence to play if `LOCKWRIGHT_CLAIMS_SEED`
/// picks one (`<seed>` or `<seed>:<sequence>`).
fn replay() -> Result<(u64, Option<usize>)> {
    let Ok(text) = std::env::var(SEED_VAR) else {
        return Ok((BASE_SEED, None));
    };
    let (seed, one) = match text.split_once(':') {
        Some((s, i)) => (s, Some(i)),
        None => (text.as_str(), None),
    };
    let seed = seed
        .trim()
        .parse::<u64>()
        .with_context(|| format!("{SEED_VAR}={text:?}: the seed is not a number"))?;
    let one = one
        .map(|i| i.trim().parse::<usize>())
        .transpose()
        .with_context(|| format!("{SEED_VAR}={text:?}: the sequence is not a number"))?;
    if let Some(i) = one.filter(|i| *i > SEQUENCES) {
        bail!("{SEED_VAR}={text:?}: a run has sequences 0 to {SEQUENCES}, not {i}");
    }
    Ok((seed, one))
}

/// Sequence `i` of the run seeded `seed`, of the claims in `kinds`: 0 is
/// the opening, the others are drawn from their own seed. `expiring`: the
/// sequence waits out its holders' leases after its first acquires.
fn sequence(seed: u64, i: usize, kinds: &[Kind], expiring: bool) -> Vec<Op> {
    if i == 0 {
        let granted = |op: &Op| match op {
            Op::Acquire(_, kind) => kinds.contains(kind),
            Op::Release(_) | Op::Expire => true,
        };
        return OPENING.iter().copied().filter(granted).collect();
    }
    let mut rng = StdRng::seed_from_u64(seed.wrapping_add(i as u64));
    let owners = rng.random_range(3..=OWNERS);
    let themes: Vec<&[Kind]> = THEMES
        .iter()
        .copied()
        .filter(|theme| theme.iter().all(|k| kinds.contains(k)))
        .collect();
    // The mutex's theme is every store's, so there is always one.
    let theme = themes[rng.random_range(0..themes.len())];
    let mut ops = Vec::with_capacity(OPS + 1);
    for n in 0..OPS {
        if expiring && n == BEFORE_EXPIRY {
            ops.push(Op::Expire);
        }
        // Every draw is made for every op, so that a sequence is the same
        // whatever its ops turn out to be.
        let owner = rng.random_range(0..owners);
        let release = rng.random_bool(0.35);
        let kind = if rng.random_bool(0.75) {
            theme[rng.random_range(0..theme.len())]
        } else {
            kinds[rng.random_range(0..kinds.len())]
        };
        // Only acquires before the wait, so that holds are out when it comes.
        let before_wait = expiring && n < BEFORE_EXPIRY;
        if release && !before_wait {
            ops.push(Op::Release(owner));
        } else {
            ops.push(Op::Acquire(owner, kind));
        }
    }
    ops
}

/// Sequences of acquires (a mutex, a semaphore's permit of 2 or 3, a read,
/// a write, by three or four owners whose claims change between their
/// acquires) and releases, and on a lease-bound store one wait past the
/// holders' leases, get from the store (a client for each owner) the answers the
/// reference model gives: the same grants with the same holds, the same
/// contention, the same kind of refusal (an upgrade, another N, a
/// semaphore's name read), the same releases. A fixed opening names each
/// rule once; 12 seeded random sequences of 25 ops follow.
pub async fn claims_answer_as_the_model_does(h: &dyn Harness) -> Result<()> {
    let mut stores = Vec::with_capacity(OWNERS);
    for _ in 0..OWNERS {
        stores.push(h.client().await);
    }
    let caps = stores[0].capabilities();
    let kinds = kinds_of(&caps);
    let (seed, only) = replay()?;
    for i in 0..=SEQUENCES {
        if only.is_some_and(|one| one != i) {
            continue;
        }
        // A session-bound store keeps its holds while the session lives:
        // there is no lease to wait out.
        let expiring = i == EXPIRING && caps.binding == Binding::Lease;
        let ops = sequence(seed, i, &kinds, expiring);
        for tries in 1..=TRIES {
            let name = if tries == 1 {
                format!("s{i}")
            } else {
                format!("s{i}-try{tries}")
            };
            let mut run = Run::new(&stores, key(CASE, &name), seed, i)?;
            let ended = run.play(&ops, &caps).await;
            // Nothing is left held, whatever the sequence came to.
            let cleaned = run.clean_up(&kinds).await;
            match ended? {
                Ended::Agreed => {
                    cleaned?;
                    break;
                }
                Ended::Differed(report) => bail!("{report}"),
                Ended::TooSlow(report) if tries == TRIES => bail!(
                    "broken setup: in {TRIES} tries, the host was too slow to answer the ops \
                     before the wait within half the short TTL, so that a lease may have run \
                     out on one side only; the last: {report}"
                ),
                Ended::TooSlow(_) => {}
            }
        }
    }
    Ok(())
}
