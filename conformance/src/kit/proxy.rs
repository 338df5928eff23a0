//! A TCP proxy between a client and a server, for the tests that cut a
//! holder off from its store (closing its connections) or silence the
//! store's replies, at the network rather than in the client.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Bytes pass both ways.
pub const PASS: u8 = 0;
/// Connections are closed, and new ones closed as soon as they open.
pub const CUT: u8 = 1;
/// Bytes to the server pass; the server's replies are dropped.
pub const MUTE: u8 = 2;

/// A TCP proxy on a free loopback port in front of one server, whose
/// links a test cuts or mutes at will ([`set`](Proxy::set)).
#[derive(Debug)]
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    mode: Arc<AtomicU8>,
    /// Connections accepted so far (cut ones included).
    pub accepted: Arc<AtomicUsize>,
    links: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    /// Starts a proxy to `upstream` (`host:port`), passing bytes.
    ///
    /// # Panics
    /// If no loopback port can be bound.
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(AtomicU8::new(PASS));
        let accepted = Arc::new(AtomicUsize::new(0));
        let links: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (m, a, l) = (mode.clone(), accepted.clone(), links.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                a.fetch_add(1, Ordering::SeqCst);
                if m.load(Ordering::SeqCst) == CUT {
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let mode = m.clone();
                let task = tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    };
                    let down = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        loop {
                            let n = match sr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if mode.load(Ordering::SeqCst) == MUTE {
                                continue;
                            }
                            if cw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    tokio::select! { () = up => {}, () = down => {} }
                });
                l.lock().unwrap().push(task.abort_handle());
            }
        });
        Proxy {
            addr,
            mode,
            accepted,
            links,
        }
    }

    /// Passes, cuts (every link closed now) or mutes from now on.
    pub fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
        if mode == CUT {
            for link in self.links.lock().unwrap().drain(..) {
                link.abort();
            }
        }
    }
}
