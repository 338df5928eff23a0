//! The shared pub/sub connection on which one backend's waiters hear that
//! a lock was handed to them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use locksmith_core::backend::{Grant, Watch};
use locksmith_core::{Error, FencingToken, OwnerToken, Result};
use redis::aio::PubSubSink;
use tokio::sync::{mpsc, oneshot};

use crate::error::map_err;

type Tickets = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Grant>>>>;

/// The shared pub/sub connection of one backend. It listens on a channel of
/// its own, on which the scripts publish `<ticket> <fence> <lease ms>` when
/// they hand a lock to one of this backend's waiters; each message wakes
/// that waiter only. A message sent while the connection was down is lost;
/// the waiter finds its grant on its next refresh.
#[derive(Debug)]
pub(crate) struct Hub {
    client: redis::Client,
    connect_timeout: Duration,
    channel: String,
    conn: tokio::sync::Mutex<Option<HubConn>>,
    tickets: Tickets,
}

struct HubConn {
    _sink: PubSubSink,
    alive: Arc<AtomicBool>,
    /// Dropped with the hub: stops the reader, which closes the connection.
    _stop: oneshot::Sender<()>,
}

impl std::fmt::Debug for HubConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubConn")
            .field("alive", &self.alive.load(Ordering::Relaxed))
            .finish()
    }
}

/// Unregisters a ticket when its watch is dropped.
struct Registration {
    ticket: String,
    tickets: Weak<Mutex<HashMap<String, mpsc::UnboundedSender<Grant>>>>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(t) = self.tickets.upgrade() {
            t.lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&self.ticket);
        }
    }
}

impl Hub {
    pub(crate) fn new(client: redis::Client, connect_timeout: Duration) -> Self {
        Hub {
            client,
            connect_timeout,
            channel: format!("locksmith:hub:{}", OwnerToken::generate().as_str()),
            conn: tokio::sync::Mutex::new(None),
            tickets: Arc::default(),
        }
    }

    /// Subscribes (again, after a dropped connection) if need be; returns
    /// the channel once the server confirmed it.
    pub(crate) async fn listening(&self) -> Result<&str> {
        let mut conn = self.conn.lock().await;
        if !conn
            .as_ref()
            .is_some_and(|c| c.alive.load(Ordering::SeqCst))
        {
            *conn = Some(self.connect().await?);
        }
        Ok(&self.channel)
    }

    pub(crate) fn register(&self, ticket: &OwnerToken) -> Watch {
        let (tx, rx) = mpsc::unbounded_channel();
        self.tickets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ticket.as_str().to_owned(), tx);
        let registration = Registration {
            ticket: ticket.as_str().to_owned(),
            tickets: Arc::downgrade(&self.tickets),
        };
        Watch::grants(rx, Some(Box::new(registration)))
    }

    async fn connect(&self) -> Result<HubConn> {
        let connecting = async {
            let pubsub = self.client.get_async_pubsub().await.map_err(map_err)?;
            let (mut sink, stream) = pubsub.split();
            sink.subscribe(&self.channel).await.map_err(map_err)?;
            Ok::<_, Error>((sink, stream))
        };
        let (sink, mut stream) = match tokio::time::timeout(self.connect_timeout, connecting).await
        {
            Ok(r) => r?,
            Err(_) => return Err(Error::unavailable("pub/sub connect timed out")),
        };
        let alive = Arc::new(AtomicBool::new(true));
        let (tickets, flag) = (Arc::downgrade(&self.tickets), alive.clone());
        let (stop, mut stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            loop {
                let msg = tokio::select! {
                    msg = stream.next() => msg,
                    _ = &mut stopped => None,
                };
                let Some(msg) = msg else {
                    break;
                };
                let Some(tickets) = tickets.upgrade() else {
                    break;
                };
                let payload: String = msg.get_payload().unwrap_or_default();
                let mut fields = payload.split(' ');
                let (Some(ticket), Some(Ok(fence)), lease) = (
                    fields.next(),
                    fields.next().map(str::parse::<u64>),
                    fields.next().and_then(|l| l.parse::<u64>().ok()),
                ) else {
                    continue;
                };
                let sender = tickets
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(ticket)
                    .cloned();
                if let Some(s) = sender {
                    let _ = s.send(Grant {
                        fence: Some(FencingToken(fence)),
                        holds: 1,
                        lease: lease.map(Duration::from_millis),
                    });
                }
            }
            // Waiters fall back to their refresh; the next attempt reconnects.
            flag.store(false, Ordering::SeqCst);
        });
        Ok(HubConn {
            _sink: sink,
            alive,
            _stop: stop,
        })
    }
}
