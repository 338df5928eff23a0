//! An election observer's notices: a children watch on the lock's
//! directory (its queue, so who holds it) and a data watch on the first
//! node in it (the leader's value, which a proclaim sets), armed again
//! each time one fires. A directory that does not exist (nobody ever
//! queued, or the server reaped it once empty) gets an existence watch,
//! which fires when it is made.
//!
//! Oneshot watches, not ZooKeeper 3.6's persistent ones: they work on the
//! 3.5 servers this backend supports, and the client sets them again on
//! the server after a reconnect (delivering what changed meanwhile),
//! where a persistent watch loses the events of the disconnection
//! (ZOOKEEPER-4698). A watch ends with its session: the observer's
//! subscription then ends, and its next one is made on the new session.

use std::sync::Arc;

use futures::future::select_all;
use lockwright_core::backend::{AbortOnDrop, Changes};
use lockwright_core::{LockKey, Result};
use tokio::sync::watch;
use zookeeper_client::{Error as ZkError, EventType, OneshotWatcher};

use crate::cleanup::RETRY_PAUSE;
use crate::error::{is_transient, map_err};
use crate::layout;
use crate::node::Session;
use crate::state::Inner;

/// A watch that wakes after each change of who holds `key` or of the value
/// it advertises (and, harmlessly, when a waiter queues or leaves). The
/// first watches are set before this returns, so no change made after it
/// is missed.
pub(crate) async fn changes(inner: &Inner, key: &LockKey) -> Result<Changes> {
    let session = inner.sessions.get().await?;
    let dir = inner.dir(key);
    let watchers = arm(&session, &dir).await.map_err(map_err)?;
    let (tx, rx) = watch::channel(0u64);
    let task = tokio::spawn(follow(session, dir, watchers, tx));
    // The task that follows the lock's watches ends when the observer's
    // watch is dropped.
    Ok(Changes::new(
        rx,
        Some(Box::new(AbortOnDrop::new(task.abort_handle()))),
    ))
}

/// Sets the watches on `dir` as it is now: its children and its first
/// node's data, or its creation if it does not exist.
async fn arm(session: &Session, dir: &str) -> std::result::Result<Vec<OneshotWatcher>, ZkError> {
    let client = &session.client;
    loop {
        let (mut children, queue) = match session.call(client.list_and_watch_children(dir)).await {
            Ok(listed) => listed,
            Err(ZkError::NoNode) => match session.call(client.check_and_watch_stat(dir)).await {
                Ok((None, made)) => return Ok(vec![made]),
                // Made meanwhile: list it.
                Ok((Some(_), _)) => continue,
                Err(e) => return Err(e),
            },
            Err(e) => return Err(e),
        };
        layout::sort_queue(&mut children);
        // The first node that still exists holds the lock, as `inspect`
        // reads it; one that went meanwhile fired the children watch.
        for first in &children {
            let path = format!("{dir}/{first}");
            match session.call(client.get_and_watch_data(&path)).await {
                Ok((_, _, value)) => return Ok(vec![queue, value]),
                Err(ZkError::NoNode) => {}
                Err(e) => return Err(e),
            }
        }
        return Ok(vec![queue]);
    }
}

/// Waits for any of `watchers` to fire, sets them all again, and only then
/// tells the observer: a change made before the new watches is read by
/// the observer this wakes, and one made after fires them. Ends (dropping
/// `tx`, which ends the observer's subscription) when the session does.
async fn follow(
    session: Arc<Session>,
    dir: String,
    mut watchers: Vec<OneshotWatcher>,
    tx: watch::Sender<u64>,
) {
    loop {
        let (fired, _, _) = select_all(watchers.into_iter().map(|w| Box::pin(w.changed()))).await;
        if fired.event_type == EventType::Session {
            // Only a session that ended is told to a oneshot watch.
            return;
        }
        watchers = loop {
            match arm(&session, &dir).await {
                Ok(w) => break w,
                Err(e) if is_transient(&e) && session.connected().await => {
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(_) => return,
            }
        };
        tx.send_modify(|v| *v = v.wrapping_add(1));
    }
}
