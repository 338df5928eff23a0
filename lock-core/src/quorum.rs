//! [`Quorum`]: one lock over N independent lease stores, held while a
//! majority of them grant it (Redlock's rules, for any backend).

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::join_all;

use crate::backend::{
    Acquire, AcquireRequest, Binding, Capabilities, Grant, HoldId, LockBackend, Release, Renew,
    RenewRequest,
};
use crate::error::{Error, ErrorKind, Result};
use crate::key::{Claim, LockKey, OwnerToken};
use crate::lease::{clock_drift, Holder, LockStatus};
use crate::url::ServerUrl;

/// A lock over N independent nodes, each a lease backend of its own: held
/// when a quorum (N/2 + 1) granted it within `ttl − elapsed − drift`.
///
/// - Every request goes to all nodes at once.
/// - A failed acquire is undone on every node that granted it or did not
///   answer (its request may still be applied), so nothing of ours stays.
/// - Release and renewal count a quorum the same way.
/// - A minority of nodes down or held by someone else changes nothing;
///   when more nodes fail than the quorum can spare, the answer is
///   `Unavailable` (or `Config` when a node refused our credentials),
///   never "contended".
/// - No fencing tokens: the nodes share no order. No notification or
///   queue: waiters poll with backoff, and election observers poll.
///
/// Redlock is this over Redis nodes. A node's per-request timeout is its
/// own business; the TTL must leave room for a slow round (`min_ttl`).
///
/// ```
/// use std::time::Duration;
/// use lockwright_core::backend::{LockBackendExt, MemoryBackend, Quorum};
/// use lockwright_core::{LockKey, OwnerToken};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockwright_core::Result<()> {
/// let nodes = vec![MemoryBackend::new(), MemoryBackend::new(), MemoryBackend::new()];
/// let q = Quorum::new("memory", nodes, Duration::from_millis(10))?;
/// let (key, me) = (LockKey::new("k")?, OwnerToken::generate());
/// assert!(matches!(
///     q.try_lock(&key, &me, Duration::from_secs(5)).await?,
///     lockwright_core::backend::Acquire::Acquired(_)
/// ));
/// # Ok(())
/// # }
/// ```
pub struct Quorum<B> {
    name: String,
    nodes: Vec<B>,
    quorum: usize,
    min_ttl: Duration,
}

impl<B> fmt::Debug for Quorum<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quorum")
            .field("name", &self.name)
            .field("nodes", &self.nodes.len())
            .field("quorum", &self.quorum)
            .finish()
    }
}

/// Refuses a quorum's server list that cannot make an honest majority:
/// fewer than 3 servers (of 2, both must answer: no better than one, and
/// twice as likely to be down), or one server named twice or under two
/// names. Hosts are compared by name and port, and by every address they
/// resolve to (an IPv4-mapped IPv6 address counts as the IPv4 one). `kind`
/// names the servers in messages ("Redlock").
///
/// # Errors
/// `Config` giving the count, or naming the two entries that are one server.
pub fn quorum_servers(url: &ServerUrl, kind: &str) -> Result<()> {
    use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
    let shown = url.shown();
    let hosts = url.hosts();
    if hosts.len() < 3 {
        return Err(Error::config(format!(
            "{shown}: a {kind} quorum needs at least 3 independent servers, got {} (of 2, both \
             must answer: no better than one, and twice as likely to be down)",
            hosts.len()
        )));
    }
    let mut seen: Vec<(String, Vec<SocketAddr>)> = Vec::new();
    for host in hosts {
        let named = host.to_string();
        let addrs: Vec<SocketAddr> = named
            .to_socket_addrs()
            .map(|a| {
                a.map(|a| match a.ip() {
                    IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                        Some(v4) => SocketAddr::new(v4.into(), a.port()),
                        None => a,
                    },
                    IpAddr::V4(_) => a,
                })
                .collect()
            })
            .unwrap_or_default();
        if let Some((other, _)) = seen
            .iter()
            .find(|(n, a)| *n == named || a.iter().any(|x| addrs.contains(x)))
        {
            return Err(Error::config(format!(
                "{shown}: {kind} nodes {other} and {named} are the same server; \
                 a quorum needs independent nodes"
            )));
        }
        seen.push((named, addrs));
    }
    Ok(())
}

/// How the nodes answered one request.
struct Tally<T> {
    ok: Vec<T>,
    errors: usize,
    /// The first node that refused our credentials or database.
    refused: Option<Error>,
}

fn tally<T>(name: &str, results: Vec<Result<T>>) -> Tally<T> {
    let mut t = Tally {
        ok: Vec::new(),
        errors: 0,
        refused: None,
    };
    for r in results {
        match r {
            Ok(v) => t.ok.push(v),
            Err(e) => {
                if e.kind() != ErrorKind::Unavailable {
                    tracing::warn!(error = %e.chain(), "{name} node failed");
                }
                if e.kind() == ErrorKind::Config && t.refused.is_none() {
                    t.refused = Some(e);
                }
                t.errors += 1;
            }
        }
    }
    t
}

impl<B: LockBackend> Quorum<B> {
    /// A quorum over `nodes`, named `name` in messages ("Redlock").
    /// `min_ttl`: the shortest TTL that leaves room for a slow round of
    /// requests and the drift.
    ///
    /// # Errors
    /// `Config` for no nodes.
    pub fn new(name: impl Into<String>, nodes: Vec<B>, min_ttl: Duration) -> Result<Self> {
        let name = name.into();
        if nodes.is_empty() {
            return Err(Error::config(format!("{name}: a quorum needs nodes")));
        }
        // A lease that some node ends early (a session) would break the
        // validity arithmetic, which assumes every grant lasts the TTL.
        if nodes.iter().any(|n| {
            let caps = n.capabilities();
            caps.binding != Binding::Lease || caps.max_lease.is_some()
        }) {
            return Err(Error::config(format!(
                "{name}: a quorum is made of lease backends; a session-bound node cannot be one"
            )));
        }
        Ok(Quorum {
            quorum: nodes.len() / 2 + 1,
            name,
            nodes,
            min_ttl,
        })
    }

    /// How many nodes must agree on a mutex, a writer or a reader.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// How many nodes must grant `claim`. A majority for a mutex, a writer
    /// or a reader (a writer's majority and a reader's meet on a node,
    /// which grants one of them only). For a semaphore of N permits, more
    /// than n·N/(N+1) of the n nodes: each node grants at most N, so N+1
    /// holders with that many nodes each would need more grants than the
    /// nodes have (a majority would not do: over 3 nodes, 3 holders of 2
    /// permits can each hold 2 nodes). So from N ≥ n − 1 on, every node
    /// must grant, renew and release: with one node down, no new permit is
    /// granted, held permits are lost at their TTL (their renewals fail),
    /// and a release is `Unavailable` (the permit frees at its TTL).
    pub fn needed(&self, claim: Claim) -> usize {
        match claim {
            Claim::Exclusive { permits } if permits > 1 => {
                let (n, p) = (self.nodes.len() as u64, u64::from(permits));
                usize::try_from(n * p / (p + 1)).unwrap_or(usize::MAX) + 1
            }
            _ => self.quorum,
        }
    }

    /// The nodes, in the order given.
    pub fn nodes(&self) -> &[B] {
        &self.nodes
    }

    /// More nodes failed than the quorum can spare: the answer is
    /// unknowable. A node that `refused` our credentials or database will
    /// not do better on a retry, so then it is `Config` with that cause,
    /// not `Unavailable`.
    fn unreachable(&self, errors: usize, refused: Option<&Error>) -> Option<Error> {
        self.unreachable_for(self.quorum, errors, refused)
    }

    /// As [`unreachable`](Self::unreachable), where `needed` nodes must agree.
    fn unreachable_for(
        &self,
        needed: usize,
        errors: usize,
        refused: Option<&Error>,
    ) -> Option<Error> {
        let n = self.nodes.len();
        (errors > n.saturating_sub(needed)).then(|| {
            let e = Error::unavailable(format!(
                "only {} of {n} {} nodes answered; {needed} are needed",
                n - errors,
                self.name,
            ));
            match refused {
                Some(r) => Error::new(ErrorKind::Config, e.message()).with_source(r.clone()),
                None => e,
            }
        })
    }
}

impl<B: LockBackend> Quorum<B> {
    /// The status of a name with several holders (a semaphore's permits,
    /// readers): each owner the nodes list counts where as many nodes as
    /// its claim needs list it, with the lease its needed-th longest node
    /// has left. `Unavailable` when the nodes that did not answer could
    /// make an owner count.
    fn holders_of(&self, statuses: &[LockStatus], errors: usize) -> Result<LockStatus> {
        let permits = statuses.iter().filter_map(|s| s.permits).max();
        let mut by_owner: HashMap<(Option<&str>, usize), Vec<&Holder>> = HashMap::new();
        for (i, status) in statuses.iter().enumerate() {
            for holder in &status.holders {
                let owner = match &holder.owner {
                    Some(o) => (Some(o.as_str()), 0),
                    None => (None, i),
                };
                by_owner.entry(owner).or_default().push(holder);
            }
        }
        let mut holders = Vec::new();
        for nodes in by_owner.into_values() {
            let first = nodes[0];
            let needed = match (first.shared, permits) {
                (false, Some(n)) => self.needed(Claim::Exclusive { permits: n }),
                _ => self.quorum,
            };
            if nodes.len() >= needed {
                let mut left: Vec<Duration> = nodes.iter().filter_map(|h| h.remaining).collect();
                left.sort_unstable_by(|a, b| b.cmp(a));
                let holds = nodes.iter().map(|h| h.holds).max().unwrap_or(1);
                holders.push(
                    Holder::new(first.shared, holds)
                        .with_owner(first.owner.clone())
                        .with_remaining(left.get(needed - 1).copied()),
                );
            } else if nodes.len() + errors >= needed {
                return Err(Error::unavailable(format!(
                    "{errors} of {} {} nodes did not answer, and with them a holder may or \
                     may not hold",
                    self.nodes.len(),
                    self.name
                )));
            }
        }
        let exclusive = holders.iter().any(|h| !h.shared);
        let single = (holders.len() == 1)
            .then(|| holders[0].owner.clone())
            .flatten();
        Ok(LockStatus::of_holders(holders)
            .with_permits(permits.filter(|_| exclusive))
            .with_owner(single))
    }
}

#[async_trait]
impl<B: LockBackend> LockBackend for Quorum<B> {
    fn capabilities(&self) -> Capabilities {
        // No fences, no notification, no queue; state goes when the
        // slowest node collects it.
        let retention = self
            .nodes
            .iter()
            .map(|n| n.capabilities().retention)
            .max()
            .unwrap_or_default();
        let resolution = self
            .nodes
            .iter()
            .map(|n| n.capabilities().ttl_resolution)
            .max()
            .unwrap_or_default();
        let node_min = self
            .nodes
            .iter()
            .map(|n| n.capabilities().min_ttl)
            .max()
            .unwrap_or_default();
        Capabilities::default()
            .with_min_ttl(self.min_ttl.max(node_min))
            .with_ttl_resolution(resolution)
            .with_retention(retention)
            .with_values(self.nodes.iter().all(|n| n.capabilities().values))
            .with_permits(self.nodes.iter().all(|n| n.capabilities().permits))
            .with_shared(self.nodes.iter().all(|n| n.capabilities().shared))
            .with_listing(self.nodes.iter().all(|n| n.capabilities().listing))
            .with_in_line(self.nodes.iter().all(|n| n.capabilities().in_line))
            .with_max_poll(
                self.nodes
                    .iter()
                    .filter_map(|n| n.capabilities().max_poll)
                    .min(),
            )
    }

    /// A quorum of nodes must answer; a node that refuses our credentials
    /// is named as the reason when the quorum fails.
    async fn verify(&self) -> Result<()> {
        let t = tally(
            &self.name,
            join_all(self.nodes.iter().map(|n| n.verify())).await,
        );
        match self.unreachable(t.errors, t.refused.as_ref()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn try_acquire(&self, request: &AcquireRequest) -> Result<Acquire> {
        // No queue spans the nodes (see the end of this impl): each node
        // gets a single attempt.
        let single = AcquireRequest {
            ticket: None,
            ..request.clone()
        };
        let (hold, ttl) = (&request.hold, request.ttl);
        let start = Instant::now();
        let answers = join_all(self.nodes.iter().map(|n| n.try_acquire(&single))).await;
        let elapsed = start.elapsed();
        let mut grants = Vec::new();
        let mut retry_after: Option<Duration> = None;
        // Nodes that may now hold our key: those that granted, and those that
        // did not answer (their request may still be applied), and which.
        let mut undo: Vec<(&B, bool)> = Vec::new();
        let mut errors = 0;
        let mut refused: Option<&Error> = None;
        // A node that refuses the claim itself (another N kept for the
        // name, a reader asking to write): the caller's mistake, not an
        // outage, whatever the other nodes said.
        let mut invalid: Option<&Error> = None;
        for (node, answer) in self.nodes.iter().zip(&answers) {
            match answer {
                Ok(Acquire::Acquired(g)) => {
                    grants.push(*g);
                    undo.push((node, true));
                }
                Ok(Acquire::Contended { retry_after: r }) => {
                    retry_after = match (retry_after, *r) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    }
                }
                Err(e) => {
                    if e.kind() == ErrorKind::Config {
                        refused.get_or_insert(e);
                    }
                    if e.kind() == ErrorKind::InvalidOptions {
                        invalid.get_or_insert(e);
                    }
                    errors += 1;
                    // A node that refused outright holds nothing new of
                    // ours, and may hold an earlier hold of the owner's.
                    if !e.is_unapplied() {
                        undo.push((node, false));
                    }
                }
            }
        }
        let valid = ttl > elapsed + clock_drift(ttl);
        let needed = self.needed(hold.claim());
        if grants.len() >= needed && valid && invalid.is_none() {
            let holds = grants.iter().map(|g| g.holds).max().unwrap_or(1);
            return Ok(Acquire::Acquired(Grant {
                fence: None,
                holds,
                lease: None,
            }));
        }
        // A node that answered "contended" holds someone else's lock, not
        // ours, so a waiter polling a busy key costs one round, not two. A
        // node whose release overtakes the request it undoes (a client
        // that sends them on different connections) keeps that vote until
        // its TTL: Redis nodes send both on one ordered connection.
        // A re-entry (some node counted more than one hold) cannot be
        // undone on a node that did not answer: a release there would take
        // away a hold the owner had before, if the request never arrived.
        // Only the nodes that granted are undone; an extra hold elsewhere
        // is left to expire, as the Locker leaves a re-entrant one.
        let reentry = grants.iter().any(|g| g.holds > 1);
        let undo: Vec<&B> = undo
            .into_iter()
            .filter(|&(_, granted)| granted || !reentry)
            .map(|(n, _)| n)
            .collect();
        if !undo.is_empty() {
            let _ = join_all(undo.into_iter().map(|n| n.release(hold))).await;
        }
        if let Some(e) = invalid {
            return Err(e.clone());
        }
        if let Some(e) = self.unreachable_for(needed, errors, refused) {
            return Err(e);
        }
        Ok(Acquire::Contended { retry_after })
    }

    async fn release(&self, hold: &HoldId) -> Result<Release> {
        let t = tally(
            &self.name,
            join_all(self.nodes.iter().map(|n| n.release(hold))).await,
        );
        let still: Vec<u32> =
            t.ok.iter()
                .filter_map(|r| match r {
                    Release::StillHeld(n) => Some(*n),
                    _ => None,
                })
                .collect();
        let held = t.ok.iter().filter(|r| **r != Release::NotHeld).count();
        let needed = self.needed(hold.claim());
        if held >= needed {
            return Ok(if still.len() >= needed {
                Release::StillHeld(still.into_iter().min().unwrap_or(1))
            } else {
                Release::Freed
            });
        }
        if held + t.errors >= needed {
            if let Some(e) = self.unreachable_for(needed, t.errors, t.refused.as_ref()) {
                return Err(e);
            }
        }
        Ok(Release::NotHeld)
    }

    /// Sets the value on every node; done when a quorum of them had the
    /// owner's hold, `NotHeld` when too few did for the rest to matter.
    async fn proclaim(&self, hold: &HoldId, value: &[u8]) -> Result<Renew> {
        let t = tally(
            &self.name,
            join_all(self.nodes.iter().map(|n| n.proclaim(hold, value))).await,
        );
        let set = t.ok.iter().filter(|r| **r == Renew::Renewed).count();
        if set >= self.quorum {
            return Ok(Renew::Renewed);
        }
        if set + t.errors >= self.quorum {
            if let Some(e) = self.unreachable(t.errors, t.refused.as_ref()) {
                return Err(e);
            }
        }
        Ok(Renew::NotHeld)
    }

    /// Held when a quorum of nodes holds the key for one owner; the lease
    /// left is what the quorum-th longest of that owner's leases has left
    /// (the lock holds while a quorum does). `Unavailable` when the nodes
    /// that did not answer could make or break that quorum.
    async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        let t = tally(
            &self.name,
            join_all(self.nodes.iter().map(|n| n.inspect(key))).await,
        );
        if let Some(e) = self.unreachable(t.errors, t.refused.as_ref()) {
            return Err(e);
        }
        let several = t.ok.iter().any(|s| {
            s.holders.len() > 1 || s.holders.iter().any(|h| h.shared) || s.permits > Some(1)
        });
        if several {
            return self.holders_of(&t.ok, t.errors);
        }
        // Nodes held by one owner count together; a node that cannot say
        // whose its lock is counts alone (two such nodes may hold for two
        // different owners).
        let mut by_owner: HashMap<(Option<&str>, usize), Vec<&LockStatus>> = HashMap::new();
        for (i, status) in t.ok.iter().enumerate().filter(|(_, s)| s.held) {
            let holder = match &status.owner {
                Some(o) => (Some(o.as_str()), 0),
                None => (None, i),
            };
            by_owner.entry(holder).or_default().push(status);
        }
        let best = by_owner
            .into_values()
            .max_by_key(Vec::len)
            .unwrap_or_default();
        if best.len() < self.quorum {
            if best.len() + t.errors >= self.quorum {
                return Err(Error::unavailable(format!(
                    "{} of {} {} nodes did not answer, and with them the lock may \
                     or may not be held",
                    t.errors,
                    self.nodes.len(),
                    self.name
                )));
            }
            return Ok(LockStatus::free());
        }
        let mut left: Vec<Duration> = best.iter().filter_map(|s| s.remaining).collect();
        left.sort_unstable_by(|a, b| b.cmp(a));
        let holds = best.iter().map(|s| s.holds).max().unwrap_or(1);
        // The value a quorum of the holder's nodes agree on: a proclaim
        // that reached only some of them is not the leader's value yet, so
        // the older one stands while a quorum still has it. When neither
        // has a quorum (the holder holds a bare quorum and the proclaim
        // reached part of it), the value most of its nodes hold, ties
        // broken by the bytes so that every read picks the same: one the
        // leader did advertise, never none.
        let mut values: HashMap<Option<&[u8]>, usize> = HashMap::new();
        for status in &best {
            *values.entry(status.value.as_deref()).or_default() += 1;
        }
        let value = values
            .into_iter()
            .max_by(|(a, n), (b, m)| n.cmp(m).then_with(|| a.cmp(b)))
            .and_then(|(v, _)| v.map(<[u8]>::to_vec));
        Ok(LockStatus::held(holds)
            .with_remaining(left.get(self.quorum - 1).copied())
            .with_owner(best.first().and_then(|s| s.owner.clone()))
            .with_value(value))
    }

    /// Every node's names together: a name a quorum holds is on a
    /// majority of nodes, and answers from all but `quorum - 1` of them
    /// meet every majority, so each such name is seen. A store whose nodes
    /// cannot list says so.
    async fn list(&self, prefix: &str) -> Result<Vec<LockKey>> {
        let answers = join_all(self.nodes.iter().map(|n| n.list(prefix))).await;
        if let Some(Err(e)) = answers
            .iter()
            .find(|a| matches!(a, Err(e) if e.kind() == ErrorKind::Unsupported))
        {
            return Err(e.clone());
        }
        let t = tally(&self.name, answers);
        let needed = self.nodes.len() - self.quorum + 1;
        if let Some(e) = self.unreachable_for(needed, t.errors, t.refused.as_ref()) {
            return Err(e);
        }
        let mut names: Vec<LockKey> = t.ok.into_iter().flatten().collect();
        names.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        names.dedup();
        Ok(names)
    }

    /// A writer giving up takes its marks away on every node it reaches;
    /// one that cannot be reached drops its mark at the writer's TTL.
    async fn abandon(&self, hold: &HoldId, ticket: &OwnerToken) -> Result<()> {
        let answers = join_all(self.nodes.iter().map(|n| n.abandon(hold, ticket))).await;
        let t = tally(&self.name, answers);
        match self.unreachable(t.errors, t.refused.as_ref()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn renew(&self, requests: &[RenewRequest]) -> Vec<Result<Renew>> {
        let start = Instant::now();
        let per_node = join_all(self.nodes.iter().map(|n| n.renew(requests))).await;
        let elapsed = start.elapsed();
        let results: Vec<Result<Renew>> = (0..requests.len())
            .map(|i| {
                let mut renewed = 0;
                let mut errors = 0;
                for answers in &per_node {
                    match answers.get(i) {
                        Some(Ok(Renew::Renewed)) => renewed += 1,
                        Some(Ok(Renew::NotHeld)) => {}
                        Some(Err(_)) | None => errors += 1,
                    }
                }
                let ttl = requests[i].ttl;
                let needed = self.needed(requests[i].hold.claim());
                if renewed >= needed && ttl > elapsed + clock_drift(ttl) {
                    Ok(Renew::Renewed)
                } else if renewed + errors >= needed {
                    // Could still be ours; let the watchdog try again before its deadline.
                    Err(self
                        .unreachable_for(needed, errors, None)
                        .unwrap_or_else(|| {
                            Error::unavailable(format!("{} renewal was too slow", self.name))
                        }))
                } else {
                    Ok(Renew::NotHeld)
                }
            })
            .collect();
        // A node that lost our vote (a restart that forgot it, an eviction)
        // gets it back while a majority still holds the lock: otherwise a
        // second node restarting before the lock ends would leave a
        // majority free for someone else. Best effort; where another
        // owner took that node meanwhile, it stays theirs.
        let restore = per_node.iter().enumerate().flat_map(|(n, answers)| {
            let results = &results;
            answers.iter().enumerate().filter_map(move |(i, a)| {
                let lost = matches!(a, Ok(Renew::NotHeld));
                let kept = matches!(results.get(i), Some(Ok(Renew::Renewed)));
                (lost && kept).then_some((n, i))
            })
        });
        let restored = join_all(restore.map(|(n, i)| {
            let r = &requests[i];
            let again = AcquireRequest {
                value: r.value.clone(),
                ..AcquireRequest::new(r.hold.clone(), r.ttl)
            };
            async move { self.nodes[n].try_acquire(&again).await }
        }))
        .await;
        let back = restored
            .iter()
            .filter(|r| matches!(r, Ok(Acquire::Acquired(_))))
            .count();
        if back > 0 {
            tracing::debug!(
                votes = back,
                "{}: votes restored on nodes that had lost them",
                self.name
            );
        }
        results
    }

    // The change notices, the release watch and the alarm keep the trait's
    // defaults, and a waiter's ticket is not passed on, on purpose: they
    // make sense on one store, not across independent ones.
    // - `changes`: none, so observers poll. Merging the nodes' notices
    //   needs a task that outlives the call, and which nodes it must hear
    //   from depends on the nodes' own notices (Redlock merges its nodes'
    //   above its quorum, where it knows them).
    // - `watch`: no notification. A subscription per node would wake a
    //   waiter on every node's release, most of which free no quorum, and a
    //   node that is down would leave it waiting on nothing; waiters poll.
    // - a waiter's ticket: each node gets a plain attempt. The nodes' queues
    //   would each order the waiters their own way, so no queue spans the
    //   quorum.
    // - `abandon`: forwarded (below): no ticket was queued anywhere, but a
    //   writer's marks on the nodes go.
    // - `alarm`: none. Merging the nodes' alarms would need a task of its
    //   own; a backend whose nodes raise alarms gives them one sender and
    //   answers `alarm` above its quorum, as memcached's does.
}
