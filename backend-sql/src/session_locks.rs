//! The server side of session mode: PostgreSQL advisory locks and MySQL
//! `GET_LOCK`, each holder's on a dedicated connection for as long as it
//! holds. On PostgreSQL, readers hold the lock shared, a writer's
//! downgrade shares the writer's session, and a waiting writer holds the
//! name's turnstile on a session of its own (see `session_sql`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use lockwright_core::backend::{
    lock_unpoisoned, reentry_refused, Acquire, Grant, HoldId, Release, Renew, MARK_LIFE,
};
use lockwright_core::{Error, ErrorKind, LockKey, LockStatus, OwnerToken, Result};

use crate::config::SqlConfig;
use crate::error::map_err;
use crate::session_sql::{Conn, Got, Name, Options};

/// Idle connections kept for the next attempt; more are closed.
const MAX_IDLE: usize = 4;

#[derive(Debug)]
struct Holder {
    owner: OwnerToken,
    holds: u32,
    shared: bool,
}

/// A server session and the holds it carries: one holder's, or a writer's
/// and the read hold it downgraded to.
#[derive(Debug)]
struct Session {
    conn: Conn,
    holders: Vec<Holder>,
}

/// A waiting writer's turnstile, on a session of its own, kept while the
/// writer's refused attempts keep coming (at least every quarter of
/// [`MARK_LIFE`]); a writer gone quiet loses it after `MARK_LIFE`.
#[derive(Debug)]
struct Mark {
    /// Which of the slot's marks this is, for its timer.
    id: u64,
    owner: OwnerToken,
    conn: Conn,
    renewed: Instant,
}

/// This process's sessions on one name.
#[derive(Debug, Default)]
struct Held {
    sessions: Vec<Session>,
    mark: Option<Mark>,
    marks_made: u64,
}

impl Held {
    /// The session and the place in it of `owner`'s holds.
    fn find(&self, owner: &OwnerToken) -> Option<(usize, usize)> {
        self.sessions.iter().enumerate().find_map(|(s, session)| {
            let h = session.holders.iter().position(|h| h.owner == *owner)?;
            Some((s, h))
        })
    }

    fn is_empty(&self) -> bool {
        self.sessions.is_empty() && self.mark.is_none()
    }

    fn writing(&self) -> bool {
        self.sessions
            .iter()
            .any(|s| s.holders.iter().any(|h| !h.shared))
    }

    /// Drops a mark whose writer went quiet: closing its connection frees
    /// the turnstile.
    fn lapse(&mut self) {
        if self
            .mark
            .as_ref()
            .is_some_and(|m| m.renewed.elapsed() >= MARK_LIFE)
        {
            self.mark = None;
        }
    }
}

type Slot = Arc<tokio::sync::Mutex<Held>>;

#[derive(Debug)]
pub(crate) struct SessionLocks {
    options: Options,
    namespace: String,
    connect_timeout: Duration,
    idle: Mutex<Vec<Conn>>,
    slots: Mutex<HashMap<LockKey, Slot>>,
}

fn granted(holds: u32) -> Result<Acquire> {
    Ok(Acquire::Acquired(Grant {
        fence: None,
        holds,
        lease: None,
    }))
}

fn refused() -> Result<Acquire> {
    Ok(Acquire::Contended { retry_after: None })
}

/// A first attempt on a new session: a reader's past the turnstile, a
/// writer's taking the turnstile when refused (with `mark`).
async fn first(
    conn: &mut Conn,
    n: &Name,
    shared: bool,
    mark: bool,
) -> std::result::Result<Got, sqlx::Error> {
    if shared {
        let got = conn.shared(n, true).await?;
        Ok(if got { Got::Lock } else { Got::Refused })
    } else {
        conn.exclusive(n, mark).await
    }
}

/// Closes mark `id`, left by a writer that stopped asking, `MARK_LIFE`
/// after its last renewal, even if nobody in this process asks for the
/// name again; ends with its mark.
fn lapse_later(slot: Weak<tokio::sync::Mutex<Held>>, id: u64) {
    tokio::spawn(async move {
        loop {
            let due = {
                let Some(slot) = slot.upgrade() else { return };
                let held = slot.lock().await;
                match held.mark.as_ref().filter(|m| m.id == id) {
                    Some(m) => m.renewed + MARK_LIFE,
                    None => return,
                }
            };
            tokio::time::sleep_until(due.into()).await;
            let Some(slot) = slot.upgrade() else { return };
            let mut held = slot.lock().await;
            if held.mark.as_ref().is_some_and(|m| m.id == id) {
                held.lapse();
            }
        }
    });
}

/// Re-entry of the holder `h` of session `s`: one more hold, locked
/// again on the session that holds it.
async fn reenter(
    held: &mut Held,
    s: usize,
    h: usize,
    n: &Name,
    key: &LockKey,
    shared: bool,
) -> Result<Acquire> {
    let own_shared = held.sessions[s].holders[h].shared;
    if own_shared != shared {
        return Err(reentry_refused(key, own_shared));
    }
    let mut session = held.sessions.swap_remove(s);
    // Re-entry: the server counts holds per session, so lock again on
    // the session that holds it (past the turnstile: it holds).
    let again = if shared {
        session.conn.shared(n, false).await
    } else {
        session
            .conn
            .exclusive(n, false)
            .await
            .map(|g| g == Got::Lock)
    };
    // An error: the session is broken, and with it its locks.
    let again = again.map_err(map_err)?;
    let holds = &mut session.holders[h].holds;
    *holds += u32::from(again);
    let holds = *holds;
    held.sessions.push(session);
    if again {
        granted(holds)
    } else {
        Err(Error::backend(
            "the server refused a re-entrant session lock",
        ))
    }
}

/// A read hold for `owner` beside its writer `w`'s exclusive hold, on the
/// writer's session; refused if the writer holds nothing here.
async fn downgrade(held: &mut Held, w: &str, n: &Name, owner: &OwnerToken) -> Result<Acquire> {
    // A downgrade, on the writer's own session, where the server
    // grants the shared lock beside the exclusive one whoever waits.
    let writer = |s: &Session| s.holders.iter().any(|h| !h.shared && h.owner.as_str() == w);
    let Some(s) = held.sessions.iter().position(writer) else {
        // Never a read hold after a gap in the writer's.
        return refused();
    };
    let mut session = held.sessions.swap_remove(s);
    let got = session.conn.shared(n, false).await.map_err(map_err)?;
    if got {
        session.holders.push(Holder {
            owner: owner.clone(),
            holds: 1,
            shared: true,
        });
    }
    held.sessions.push(session);
    if got {
        granted(1)
    } else {
        refused()
    }
}

/// A writer that holds the turnstile tries for the lock on its mark's
/// session: the answer, or `None` (nothing of `owner`'s marked, or the
/// mark's connection broke) to go on with a new session.
async fn retry_marked(held: &mut Held, n: &Name, owner: &OwnerToken) -> Result<Option<Acquire>> {
    if !held.mark.as_ref().is_some_and(|m| m.owner == *owner) {
        return Ok(None);
    }
    let mut m = held.mark.take().expect("checked above");
    match m.conn.exclusive(n, false).await {
        Ok(Got::Lock) => {
            // In: the turnstile goes, so readers wait on the lock alone.
            m.conn.unmark(n).await.map_err(map_err)?;
            held.sessions.push(Session {
                conn: m.conn,
                holders: vec![Holder {
                    owner: owner.clone(),
                    holds: 1,
                    shared: false,
                }],
            });
            granted(1).map(Some)
        }
        Ok(_) => {
            m.renewed = Instant::now();
            held.mark = Some(m);
            refused().map(Some)
        }
        // The mark's connection broke, and the turnstile with it:
        // marked again by the caller, on a fresh connection.
        Err(_) => Ok(None),
    }
}

impl SessionLocks {
    pub(crate) fn new(config: &SqlConfig) -> Result<Self> {
        Ok(SessionLocks {
            options: Options::new(config)?,
            // Locks of different tables (applications) never meet.
            namespace: config.table.clone(),
            connect_timeout: config.connect_timeout,
            idle: Mutex::new(Vec::new()),
            slots: Mutex::new(HashMap::new()),
        })
    }

    /// Whether read holds are granted (PostgreSQL).
    pub(crate) fn shared(&self) -> bool {
        self.options.shared()
    }

    pub(crate) fn session_ids(&self) -> Vec<i64> {
        let slots = lock_unpoisoned(&self.slots);
        let mut ids = Vec::new();
        for slot in slots.values() {
            if let Ok(held) = slot.try_lock() {
                ids.extend(held.sessions.iter().map(|s| s.conn.server_id));
                ids.extend(held.mark.iter().map(|m| m.conn.server_id));
            }
        }
        ids
    }

    fn slot(&self, key: &LockKey) -> Slot {
        let mut slots = lock_unpoisoned(&self.slots);
        slots.entry(key.clone()).or_default().clone()
    }

    fn name(&self, key: &LockKey) -> Name {
        Name::new(&self.namespace, key)
    }

    /// Forgets an empty slot nobody else is using. Clones are only made under
    /// the map's lock, so the count cannot grow while we look.
    fn tidy(&self, key: &LockKey, slot: &Slot, empty: bool) {
        if !empty {
            return;
        }
        let mut slots = lock_unpoisoned(&self.slots);
        if Arc::strong_count(slot) == 2 {
            slots.remove(key);
        }
    }

    async fn checkout(&self) -> Result<Conn> {
        let idle = lock_unpoisoned(&self.idle).pop();
        match idle {
            Some(conn) => Ok(conn),
            None => self.options.connect(self.connect_timeout).await,
        }
    }

    async fn checkout_fresh(&self) -> Result<Conn> {
        lock_unpoisoned(&self.idle).clear();
        self.checkout().await
    }

    fn checkin(&self, conn: Conn) {
        let mut idle = lock_unpoisoned(&self.idle);
        if idle.len() < MAX_IDLE {
            idle.push(conn);
        }
    }

    pub(crate) async fn try_acquire(&self, hold: &HoldId) -> Result<Acquire> {
        let key = &hold.key;
        let claim = hold.claim();
        if claim.exclusive_permits().is_some_and(|p| p > 1) || claim.is_shared() && !self.shared() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "session locks grant exclusive holds, and read holds on PostgreSQL only",
            )
            .unapplied());
        }
        let slot = self.slot(key);
        let mut held = slot.lock().await;
        held.lapse();
        let outcome = self.acquire_in(&mut held, &slot, hold).await;
        let empty = held.is_empty();
        drop(held);
        self.tidy(key, &slot, empty);
        outcome
    }

    async fn acquire_in(&self, held: &mut Held, slot: &Slot, hold: &HoldId) -> Result<Acquire> {
        let (key, owner) = (&hold.key, &hold.owner);
        let n = self.name(key);
        let shared = hold.claim().is_shared();
        // A session or mark is out of the slot while the server answers:
        // dropped mid-request, its connection closes and the server frees
        // what it holds, where the slot would not know what it held.
        if let Some((s, h)) = held.find(owner) {
            return reenter(held, s, h, &n, key, shared).await;
        }
        if let Some(w) = hold.kind.beside() {
            return downgrade(held, w.as_str(), &n, owner).await;
        }
        if held.writing() || shared && held.mark.is_some() {
            // This process writes, or a writer of it waits: the server
            // would refuse.
            if let Some(m) = held.mark.as_mut().filter(|m| m.owner == *owner) {
                m.renewed = Instant::now();
            }
            return refused();
        }
        if let Some(outcome) = retry_marked(held, &n, owner).await? {
            return Ok(outcome);
        }
        self.attempt_new(held, slot, &n, owner, shared).await
    }

    /// An attempt on a session of its own: the lock, the turnstile (kept
    /// as this writer's mark), or a refusal (the connection goes idle).
    async fn attempt_new(
        &self,
        held: &mut Held,
        slot: &Slot,
        n: &Name,
        owner: &OwnerToken,
        shared: bool,
    ) -> Result<Acquire> {
        // A refused writer takes the turnstile unless one of this process
        // already holds it.
        let mark = !shared && self.shared() && held.mark.is_none();
        let (conn, got) = self.first_on_new(n, shared, mark).await?;
        match got {
            Got::Lock => {
                held.sessions.push(Session {
                    conn,
                    holders: vec![Holder {
                        owner: owner.clone(),
                        holds: 1,
                        shared,
                    }],
                });
                granted(1)
            }
            Got::Turnstile => {
                held.marks_made += 1;
                let id = held.marks_made;
                held.mark = Some(Mark {
                    id,
                    owner: owner.clone(),
                    conn,
                    renewed: Instant::now(),
                });
                lapse_later(Arc::downgrade(slot), id);
                refused()
            }
            Got::Refused => {
                self.checkin(conn);
                refused()
            }
        }
    }

    /// The `first` attempt on an idle (or new) connection, tried once
    /// more on a fresh connection if it fails; the connection and its answer.
    async fn first_on_new(&self, n: &Name, shared: bool, mark: bool) -> Result<(Conn, Got)> {
        let mut conn = self.checkout().await?;
        let got = match first(&mut conn, n, shared, mark).await {
            Ok(got) => got,
            Err(_) => {
                // An idle connection may have died with a server restart; one
                // fresh attempt tells that apart from a database that is down.
                drop(conn);
                conn = self.checkout_fresh().await?;
                first(&mut conn, n, shared, mark).await.map_err(map_err)?
            }
        };
        Ok((conn, got))
    }

    /// Lets go of the turnstile `owner` holds as a waiting writer, if any;
    /// whether it held one.
    pub(crate) async fn abandon(&self, key: &LockKey, owner: &OwnerToken) -> Result<bool> {
        let slot = self.slot(key);
        let mut held = slot.lock().await;
        let marked = held.mark.as_ref().is_some_and(|m| m.owner == *owner);
        if marked {
            let mut m = held.mark.take().expect("checked above");
            // Clean of every lock, the connection serves the next attempt;
            // otherwise dropping it ends the session, and the turnstile.
            if let Ok(true) = m.conn.unlock(&self.name(key), false, true).await {
                self.checkin(m.conn);
            }
        }
        let empty = held.is_empty();
        drop(held);
        self.tidy(key, &slot, empty);
        Ok(marked)
    }

    /// A connection is made (or an idle one answers).
    pub(crate) async fn verify(&self) -> Result<()> {
        let mut conn = self.checkout().await?;
        conn.ping().await.map_err(map_err)?;
        self.checkin(conn);
        Ok(())
    }

    /// Who holds `key`, asked of the server on an idle connection of ours.
    pub(crate) async fn inspect(&self, key: &LockKey) -> Result<LockStatus> {
        let mut conn = self.checkout().await?;
        let status = conn.status(&self.name(key)).await?;
        self.checkin(conn);
        Ok(status)
    }

    pub(crate) async fn release(&self, key: &LockKey, owner: &OwnerToken) -> Result<Release> {
        let slot = self.slot(key);
        let mut held = slot.lock().await;
        let outcome = match held.find(owner) {
            None => Release::NotHeld,
            Some((s, h)) => {
                // Out of the slot while the server answers (see acquire_in).
                let mut session = held.sessions.swap_remove(s);
                let hold = &session.holders[h];
                let last = hold.holds == 1 && session.holders.len() == 1;
                let unlocked = session
                    .conn
                    .unlock(&self.name(key), hold.shared, last)
                    .await;
                match unlocked {
                    Ok(true) if session.holders[h].holds > 1 => {
                        let hold = &mut session.holders[h];
                        hold.holds -= 1;
                        let holds = hold.holds;
                        held.sessions.push(session);
                        return Ok(Release::StillHeld(holds));
                    }
                    Ok(true) => {
                        session.holders.remove(h);
                        if session.holders.is_empty() {
                            self.checkin(session.conn);
                        } else {
                            held.sessions.push(session);
                        }
                        Release::Freed
                    }
                    // The session broke (or lost the lock) while held: closing
                    // the connection ends it, and its locks were not reliably
                    // ours; another holder on it learns at its next renewal.
                    Ok(false) | Err(_) => Release::NotHeld,
                }
            }
        };
        let empty = held.is_empty();
        drop(held);
        self.tidy(key, &slot, empty);
        Ok(outcome)
    }

    /// A session lock lasts as long as its connection: renewing checks that
    /// the connection is alive, and a dead one means the lock is gone.
    pub(crate) async fn renew(&self, key: &LockKey, owner: &OwnerToken) -> Result<Renew> {
        let slot = self.slot(key);
        let mut held = slot.lock().await;
        let outcome = match held.find(owner) {
            None => Renew::NotHeld,
            Some((s, _)) => match held.sessions[s].conn.ping().await {
                Ok(()) => Renew::Renewed,
                Err(e) => {
                    tracing::warn!(key = %key, error = %e, "session lock's connection failed; the lock is lost");
                    held.sessions.swap_remove(s);
                    Renew::NotHeld
                }
            },
        };
        let empty = held.is_empty();
        drop(held);
        self.tidy(key, &slot, empty);
        Ok(outcome)
    }
}
