//! A local TCP proxy between a client and one store server: `check` cuts it
//! (a partition: connections go silent, then are reset when it heals) and
//! slows it (latency); `bench` counts the round trips and connections
//! through it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The switches and counters shared by every proxy of one client.
#[derive(Debug)]
pub(crate) struct Control {
    cut: watch::Sender<bool>,
    latency_us: AtomicU64,
    round_trips: AtomicU64,
    /// Connections open to the server now, and the most at once.
    open: AtomicU64,
    most_open: AtomicU64,
}

impl Control {
    /// Connected, no added latency.
    pub(crate) fn new() -> Arc<Control> {
        Arc::new(Control {
            cut: watch::channel(false).0,
            latency_us: AtomicU64::new(0),
            round_trips: AtomicU64::new(0),
            open: AtomicU64::new(0),
            most_open: AtomicU64::new(0),
        })
    }

    /// Partitions the client: nothing more crosses, new connections hang.
    pub(crate) fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Ends the partition; the connections it silenced are closed, as the
    /// peers' TCP stacks would after a long outage.
    pub(crate) fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// Delays every chunk of data, both ways, by `d`.
    pub(crate) fn set_latency(&self, d: Duration) {
        self.latency_us
            .store(d.as_micros() as u64, Ordering::Relaxed);
    }

    /// Requests sent so far: each time the client speaks after the server
    /// did (or first), which is one round trip however many commands a
    /// pipeline carries.
    pub(crate) fn round_trips(&self) -> u64 {
        self.round_trips.load(Ordering::Relaxed)
    }

    /// The most connections the client had open to the server at once
    /// (through this control's proxies).
    pub(crate) fn most_open(&self) -> u64 {
        self.most_open.load(Ordering::Relaxed)
    }

    fn latency(&self) -> Duration {
        Duration::from_micros(self.latency_us.load(Ordering::Relaxed))
    }

    async fn until(&self, cut: bool) {
        let mut rx = self.cut.subscribe();
        let _ = rx.wait_for(|c| *c == cut).await;
    }
}

/// Listens on a fresh local port and forwards every connection to
/// `upstream`, under `control`. Returns the port; the proxy lives as long
/// as the runtime.
///
/// # Errors
/// The local listener could not be bound.
pub(crate) async fn start(upstream: SocketAddr, control: Arc<Control>) -> std::io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(connection(client, upstream, control.clone()));
        }
    });
    Ok(port)
}

async fn connection(client: TcpStream, upstream: SocketAddr, ctl: Arc<Control>) {
    if *ctl.cut.borrow() {
        // A connection made during a partition never reaches the server.
        ctl.until(false).await;
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let open = ctl.open.fetch_add(1, Ordering::Relaxed) + 1;
    ctl.most_open.fetch_max(open, Ordering::Relaxed);
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let client_spoke_last = AtomicBool::new(false);
    tokio::select! {
        _ = pump(&mut cr, &mut sw, &ctl, &client_spoke_last, true) => {}
        _ = pump(&mut sr, &mut cw, &ctl, &client_spoke_last, false) => {}
        _ = ctl.until(true) => {
            // Silent, not closed, until the partition heals: the client
            // must notice by its own timeouts, as on a real network.
            ctl.until(false).await;
        }
    }
    // Dropping the halves closes both connections.
    let _ = sw.shutdown().await;
    let _ = cw.shutdown().await;
    ctl.open.fetch_sub(1, Ordering::Relaxed);
}

/// Copies one direction: `up` from the client. Data from the client after
/// data from the server (`client_spoke_last` false) starts a round trip.
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    ctl: &Control,
    client_spoke_last: &AtomicBool,
    up: bool,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = ctl.latency();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if client_spoke_last.swap(up, Ordering::Relaxed) != up && up {
            ctl.round_trips.fetch_add(1, Ordering::Relaxed);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
