//! Leaving no node of ours behind. A node left in a lock directory blocks
//! every contender after it until its session ends, so a delete the server
//! did not confirm, and a create whose answer was lost, are finished in the
//! background once the connection returns (or never, if the session ends
//! first: the node goes with it).
//!
//! The client sends a request when its future is made, and dropping the
//! future does not take the request back: a create that timed out may
//! still happen. Its node is then found by our UUID prefix *and* our
//! session, as Curator's protected mode finds its own (with the session
//! check Curator added for CURATOR-498): a node of an ended session with
//! the same name is never ours.

use std::sync::Arc;
use std::time::Duration;

use lockwright_core::{Error, Result};
use zookeeper_client::Error as ZkError;

use crate::error::{is_session_over, is_transient, map_err};
use crate::node::{Contender, Exchange, Session};

/// How long to let a transient failure pass before trying again, in the
/// background tasks that must finish their work (never a busy loop).
pub(crate) const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between such tries: an error that persists while the
/// session lives (a throttling server) costs a request every few seconds.
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(5);

/// Deletes our node now, or, if the store does not answer, in the
/// background once it does (or never, if the session ends first: the
/// node goes with it).
pub(crate) async fn delete(node: Contender) -> Result<bool> {
    if node.session.is_over() {
        return Ok(false);
    }
    match node
        .session
        .call(node.session.client.delete(&node.path, None))
        .await
    {
        Ok(()) => Ok(true),
        Err(ZkError::NoNode) => Ok(false),
        Err(e) if is_session_over(&e) => Ok(false),
        Err(e) if is_transient(&e) => {
            tokio::spawn(delete_surely(node.session.clone(), node.path));
            Err(Error::unavailable(
                "ZooKeeper did not confirm the delete; it is retried once the connection \
                 returns, and the node goes with the session otherwise",
            )
            .with_source(e))
        }
        Err(e) => Err(map_err(e)),
    }
}

/// Finishes a create whose answer did not come in time: once it is
/// answered, its node is deleted; if the connection dropped under it, the
/// node (if the server made it) is found by its UUID and deleted.
pub(crate) async fn undo_create(
    session: Arc<Session>,
    exchange: Exchange,
    dir: String,
    prefix: String,
) {
    match exchange.await {
        (Ok((_, sequence)), _) => delete_surely(session, format!("{dir}/{prefix}{sequence}")).await,
        (Err(e), _) if is_transient(&e) => find_and_delete(session, dir, prefix).await,
        _ => {}
    }
}

/// After a create that may or may not have happened: finds the node by our
/// UUID prefix *and* our session (never another session's node), and
/// deletes it.
pub(crate) async fn find_and_delete(session: Arc<Session>, dir: String, prefix: String) {
    let mut pause = RETRY_PAUSE;
    loop {
        if !session.connected().await {
            return;
        }
        // The server we reconnected to may lag the one that took the create.
        let found = match session.client.sync(&dir).await {
            Ok(()) => session.client.list_children(&dir).await,
            Err(e) => Err(e),
        };
        match found {
            Ok(children) => {
                for child in children.iter().filter(|c| c.starts_with(&prefix)) {
                    let path = format!("{dir}/{child}");
                    if let Ok(Some(stat)) = session.client.check_stat(&path).await {
                        if stat.ephemeral_owner == session.id {
                            delete_surely(session.clone(), path).await;
                        }
                    }
                }
                return;
            }
            Err(e) if is_transient(&e) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_RETRY_PAUSE);
            }
            Err(_) => return,
        }
    }
}

/// Deletes our node, waiting out disconnections, until it is gone or the
/// session ends (which takes the node with it).
pub(crate) async fn delete_surely(session: Arc<Session>, path: String) {
    let mut pause = RETRY_PAUSE;
    loop {
        if !session.connected().await {
            return;
        }
        match session.client.delete(&path, None).await {
            Ok(()) | Err(ZkError::NoNode) => return,
            Err(e) if is_transient(&e) => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_RETRY_PAUSE);
            }
            Err(e) => {
                tracing::warn!(path = %path, error = %e, "could not delete a lock node");
                return;
            }
        }
    }
}
