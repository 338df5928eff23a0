//! PostgreSQL `LISTEN`: one connection per database and table in a process
//! listens on the channel of every name a waiter here waits for, and wakes
//! them when a release anywhere sends `NOTIFY` (the release statement does,
//! in the same round trip). It also holds a shared advisory lock per name
//! waited on, which the release looks for first: a release nobody waits
//! for sends nothing (a `NOTIFY`'s commit is serialized database-wide;
//! unconditional, it halved 8 clients' release rate). Polling stays beside it as the fallback: a
//! notification lost with the connection, or a lease that simply ran out,
//! is found at the next poll as before, and a lost connection wakes every
//! waiter here to look at once.
//!
//! The types that [`notify`](crate::notify)'s waiters hold (the
//! [`Remote`] connection, a [`Listening`]) are defined there; here is what
//! they do.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Mutex, Weak};
use std::time::Duration;

use lockwright_core::backend::lock_unpoisoned;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::mpsc;

use crate::config::{Dialect, SqlConfig};
use crate::error::bad_url;
use crate::notify::{waited_key, Ask, Listening, LocalReleases, Remote};

/// The listener that wakes this process's waiters when a release anywhere
/// notifies; `None` on the other databases, which have no such channel.
pub(crate) fn listener(config: &SqlConfig) -> lockwright_core::Result<Option<Remote>> {
    if config.dialect != Dialect::Postgres {
        return Ok(None);
    }
    let opts =
        PgConnectOptions::from_str(config.url.expose()).map_err(|e| bad_url(&config.url, e))?;
    // Named for `pg_stat_activity`, unless the URL names its connections.
    let opts = match opts.get_application_name() {
        Some(_) => opts,
        None => opts.application_name("lockwright-listen"),
    };
    Ok(Some(Remote::new(opts, config.connect_timeout)))
}

impl Remote {
    /// A listener for the database `opts` connect to; nothing connects
    /// until a waiter needs it.
    pub(crate) fn new(opts: PgConnectOptions, connect_timeout: Duration) -> Self {
        Remote {
            opts,
            connect_timeout,
            task: Mutex::new(None),
            scope: Mutex::new(Weak::new()),
        }
    }

    /// Notifications go to `scope`'s waiters.
    pub(crate) fn serve(&self, scope: Weak<LocalReleases>) {
        *lock_unpoisoned(&self.scope) = scope;
    }

    /// Listens on `channel` until the result is dropped. Called with the
    /// scope's channel map locked, so one name is asked for once at a time.
    pub(crate) fn listen(&self, channel: &str) -> Option<Listening> {
        let mut task = lock_unpoisoned(&self.task);
        let live = task.as_ref().filter(|t| !t.is_closed()).cloned();
        let tx = match live {
            Some(tx) => tx,
            None => {
                // No runtime here (a backend used outside tokio): the
                // waiters poll, as on the other stores.
                let runtime = tokio::runtime::Handle::try_current().ok()?;
                let (tx, rx) = mpsc::unbounded_channel();
                let scope = lock_unpoisoned(&self.scope).clone();
                runtime.spawn(run(self.opts.clone(), self.connect_timeout, rx, scope));
                *task = Some(tx.clone());
                tx
            }
        };
        let _ = tx.send(Ask::Listen(channel.to_owned()));
        Some(Listening {
            channel: channel.to_owned(),
            task: tx,
        })
    }
}

/// What ended one wait of the listening task.
enum Event {
    Asked(Option<Ask>),
    Heard(Result<Option<String>, sqlx::Error>),
}

/// The listening task: (re)connects, keeps `LISTEN` in step with the
/// channels wanted, and wakes the waiters of each channel it hears. Ends
/// when every backend of the scope is gone. The counts of waiters per
/// channel are its own: a task started again (its runtime gone) counts
/// afresh, and waiters listening through the old one poll.
async fn run(
    opts: PgConnectOptions,
    connect_timeout: Duration,
    mut asks: mpsc::UnboundedReceiver<Ask>,
    scope: Weak<LocalReleases>,
) {
    let wanted: Mutex<HashMap<String, usize>> = Mutex::default();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(connect_timeout)
        .connect_lazy_with(opts);
    let mut listener: Option<PgListener> = None;
    let mut pause = Duration::from_millis(100);
    loop {
        if listener.is_none() {
            match connect(&pool, &wanted).await {
                Ok(l) => {
                    listener = Some(l);
                    pause = Duration::from_millis(100);
                    // Anything released while no one listened.
                    match scope.upgrade() {
                        Some(s) => s.wake_all(),
                        None => return,
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "cannot listen for releases; waiters poll meanwhile");
                    // Keep count of the asks meanwhile, and retry.
                    let wait = tokio::time::sleep(pause);
                    tokio::pin!(wait);
                    loop {
                        tokio::select! {
                            () = &mut wait => break,
                            ask = asks.recv() => match ask {
                                Some(ask) => { count(&wanted, &ask); }
                                None => return,
                            },
                        }
                    }
                    pause = (pause * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
        }
        let Some(l) = listener.as_mut() else { continue };
        let event = tokio::select! {
            ask = asks.recv() => Event::Asked(ask),
            heard = l.try_recv() => Event::Heard(heard.map(|n| n.map(|n| n.channel().to_owned()))),
        };
        let Some(scope) = scope.upgrade() else { return };
        match event {
            Event::Asked(None) => return,
            Event::Asked(Some(ask)) => {
                let change = count(&wanted, &ask);
                let done = match (change, &ask) {
                    (Some(true), Ask::Listen(c)) => listen(l, c).await,
                    (Some(false), Ask::Unlisten(c)) => unlisten(l, c).await,
                    _ => Ok(()),
                };
                if let Err(e) = done {
                    tracing::debug!(error = %e, "the listening connection failed; connecting again");
                    listener = None;
                    scope.wake_all();
                }
            }
            Event::Heard(Ok(Some(channel))) => scope.wake(&channel),
            // Lost: what was sent meanwhile is lost, so every waiter looks
            // now, and a new connection listens and marks the names again.
            Event::Heard(Ok(None)) => {
                listener = None;
                scope.wake_all();
            }
            Event::Heard(Err(e)) => {
                tracing::debug!(error = %e, "the listening connection failed; connecting again");
                listener = None;
                scope.wake_all();
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// Counts `ask` in `wanted`: `Some(true)` when the channel is wanted now
/// and was not, `Some(false)` when it was and is no more.
fn count(wanted: &Mutex<HashMap<String, usize>>, ask: &Ask) -> Option<bool> {
    let mut wanted = lock_unpoisoned(wanted);
    match ask {
        Ask::Listen(c) => {
            let n = wanted.entry(c.clone()).or_insert(0);
            *n += 1;
            (*n == 1).then_some(true)
        }
        Ask::Unlisten(c) => {
            let n = wanted.get_mut(c)?;
            *n -= 1;
            if *n == 0 {
                wanted.remove(c);
                return Some(false);
            }
            None
        }
    }
}

/// A listening connection, on every channel wanted now.
async fn connect(
    pool: &sqlx::PgPool,
    wanted: &Mutex<HashMap<String, usize>>,
) -> Result<PgListener, sqlx::Error> {
    let mut l = PgListener::connect_with(pool).await?;
    // A lost connection is replaced here, where the names are marked again.
    l.eager_reconnect(false);
    // The pool may give back the connection a failed listener had, with
    // its marks still on: start from none.
    sqlx::query("SELECT pg_advisory_unlock_all()")
        .execute(&mut l)
        .await?;
    let channels: Vec<String> = lock_unpoisoned(wanted).keys().cloned().collect();
    for c in &channels {
        listen(&mut l, c).await?;
    }
    Ok(l)
}

/// Listens on `channel`, and marks it waited on (the shared advisory lock
/// a release looks for before it notifies; see [`waited_key`]).
async fn listen(l: &mut PgListener, channel: &str) -> Result<(), sqlx::Error> {
    l.listen(channel).await?;
    sqlx::query("SELECT pg_advisory_lock_shared($1)")
        .bind(waited_key(channel))
        .execute(&mut *l)
        .await
        .map(drop)
}

/// Stops listening on `channel`, and takes its mark away.
async fn unlisten(l: &mut PgListener, channel: &str) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_unlock_shared($1)")
        .bind(waited_key(channel))
        .execute(&mut *l)
        .await?;
    l.unlisten(channel).await
}
