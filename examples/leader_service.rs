//! A service whose instances elect one leader and tell anyone who asks who it is.
//!
//! Every instance campaigns in one election, advertising its own HTTP address
//! as the leader's value, and serves on 127.0.0.1:
//!
//! - `GET /leader`: the current leader's value (its address), as the store
//!   says (`Election::leader`);
//! - `GET /metrics`: Prometheus text, with the metrics lockwright emits through
//!   the `metrics` facade (`lockwright_leader`, `lockwright_acquire_wait_seconds`,
//!   `lockwright_renewals_total`, ...);
//! - `POST /resign`: the leader steps down, and another instance takes over.
//!
//! An instance whose leadership is lost (the store said so, or renewals failed
//! until the lease ran out) campaigns again.
//!
//! Arguments: the store URL (default: an SQLite file in the temp dir), then the
//! port (default: `$PORT`, else 0, a port the OS picks; the address is printed).
//!
//! ```sh
//! cargo run -p lockwright --example leader_service                 # one instance
//! PORT=8081 cargo run -p lockwright --example leader_service       # on a given port
//! cargo run -p lockwright --example leader_service -- sqlite:///tmp/lead.db 8082
//! cargo run -p lockwright --example leader_service -- --demo       # the self-check
//! ```
//!
//! Start two or more on the same store URL (from several terminals) and
//! `curl -X POST` the leader's `/resign`, or stop it, to watch another take
//! over. `--demo` starts two instances in this process and checks that
//! exactly one leads, that both name the same leader, that the other takes
//! over when the leader resigns, and that `/metrics` shows lockwright's
//! metrics; it exits 0 only if all of that held.

mod common;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use lockwright::backend::RedactedUrl;
use lockwright::{Election, LockOptions, Locker, Reign};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The election every instance joins (outside `--demo`).
const ELECTION: &str = "example-leader-service";
/// The leader's lease: renewed every third of it while it leads; an instance
/// that dies without resigning is replaced at most this long after.
const LEASE: Duration = Duration::from_secs(5);

/// What the HTTP handlers share with the campaign.
#[derive(Clone)]
struct AppState {
    election: Election,
    metrics: PrometheusHandle,
    me: Arc<str>,
    leading: Arc<AtomicBool>,
    step_down: Arc<Notify>,
}

/// `GET /leader`: the leader's value, as the store says.
async fn leader_page(State(state): State<AppState>) -> (StatusCode, String) {
    match state.election.leader().await {
        Ok(Some(leader)) => (
            StatusCode::OK,
            format!("{}\n", String::from_utf8_lossy(&leader.value)),
        ),
        Ok(None) => (StatusCode::SERVICE_UNAVAILABLE, "nobody leads\n".to_owned()),
        // Never "nobody leads" for a store we could not read.
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot read the leader: {e}\n"),
        ),
    }
}

/// `GET /metrics`: everything recorded in this process, in Prometheus text.
async fn metrics_page(State(state): State<AppState>) -> String {
    state.metrics.render()
}

/// `POST /resign`: the leader steps down.
async fn resign_page(State(state): State<AppState>) -> (StatusCode, String) {
    if state.leading.load(Ordering::SeqCst) {
        state.step_down.notify_waiters();
        (StatusCode::OK, format!("{} steps down\n", state.me))
    } else {
        (
            StatusCode::CONFLICT,
            format!("{} does not lead\n", state.me),
        )
    }
}

/// Says `leading` while a reign lasts: set by the reign, cleared when it
/// ends, by resigning or by a loss that stops it.
struct Leading(Arc<AtomicBool>);

impl Drop for Leading {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Stands for leadership until `stop`: each reign leads until a step-down
/// is asked for (it then resigns) or leadership is lost, and the stand
/// campaigns again.
async fn stand(
    election: Election,
    me: Arc<str>,
    leading: Arc<AtomicBool>,
    step_down: Arc<Notify>,
    stop: impl Future<Output = ()> + Send + 'static,
) {
    // Wait for ever to lead (the default wait), with the lease above.
    let opts = LockOptions::new().ttl(LEASE);
    let lead = |reign: Reign| {
        let (me, leading, step_down) = (me.clone(), leading.clone(), step_down.clone());
        async move {
            // Registered before `leading` shows, so no step-down request is missed.
            let asked_to_step_down = step_down.notified();
            leading.store(true, Ordering::SeqCst);
            let _leading = Leading(leading);
            let term = reign
                .term()
                .map_or_else(|| "none".to_owned(), |t| t.to_string());
            println!("{me}: leading (term {term})");
            // A loss stops the reign here; a step-down ends it, and resigns.
            asked_to_step_down.await;
            println!("{me}: stepped down");
        }
    };
    if let Err(e) = election.stand_with(me.as_bytes(), &opts, stop, lead).await {
        eprintln!("{me}: standing for leadership failed: {e}");
    }
}

/// One instance of the service: an HTTP server and a campaign.
struct Instance {
    me: Arc<str>,
    addr: SocketAddr,
    locker: Locker,
    leading: Arc<AtomicBool>,
    server: JoinHandle<()>,
    stand: JoinHandle<()>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Instance {
    async fn start(
        locker: Locker,
        election: &str,
        port: u16,
        metrics: PrometheusHandle,
    ) -> anyhow::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))
            .await
            .with_context(|| format!("cannot listen on 127.0.0.1:{port}"))?;
        let addr = listener.local_addr()?;
        let me: Arc<str> = format!("http://{addr}").into();
        let election = locker.election(election)?;
        let leading = Arc::new(AtomicBool::new(false));
        let step_down = Arc::new(Notify::new());
        let state = AppState {
            election: election.clone(),
            metrics,
            me: me.clone(),
            leading: leading.clone(),
            step_down: step_down.clone(),
        };
        let app = Router::new()
            .route("/leader", get(leader_page))
            .route("/metrics", get(metrics_page))
            .route("/resign", post(resign_page))
            .with_state(state);
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("{addr}: the HTTP server stopped: {e}");
            }
        });
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let stopped = async move {
            let _ = stopped.await;
        };
        let stand = tokio::spawn(stand(
            election,
            me.clone(),
            leading.clone(),
            step_down,
            stopped,
        ));
        Ok(Instance {
            me,
            addr,
            locker,
            leading,
            server,
            stand,
            stop,
        })
    }

    fn is_leading(&self) -> bool {
        self.leading.load(Ordering::SeqCst)
    }

    /// Stops serving and standing; resigns, awaited, if it leads.
    async fn stop(self) {
        self.server.abort();
        let _ = self.stop.send(());
        let _ = self.stand.await;
        if let Err(e) = self.locker.close().await {
            eprintln!("{}: closing: {e}", self.me);
        }
    }
}

/// A minimal HTTP/1.1 client for the demo's checks: one request, the status
/// and the body.
async fn http(addr: SocketAddr, method: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .with_context(|| format!("{method} http://{addr}{path}: no answer within 5 s"))?
        .with_context(|| format!("{method} http://{addr}{path}"))?;
    let text = String::from_utf8(raw).context("the response is not UTF-8")?;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("not an HTTP response")?;
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status code in the response")?;
    let chunked = head.lines().any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_owned()
    };
    Ok((status, body))
}

/// Decodes a chunked HTTP body.
fn dechunk(mut rest: &str) -> anyhow::Result<String> {
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").context("a bad chunk")?;
        let size = size.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size, 16).context("a bad chunk size")?;
        if size == 0 {
            return Ok(body);
        }
        body.push_str(after.get(..size).context("a short chunk")?);
        rest = after.get(size + 2..).context("a short chunk")?;
    }
}

/// Polls every instance's `/leader` until all answer `expected`.
async fn wait_for_agreement(
    instances: &[Instance],
    expected: &str,
    within: Duration,
) -> anyhow::Result<()> {
    let give_up = Instant::now() + within;
    loop {
        let mut answers = Vec::new();
        for instance in instances {
            let (status, body) = http(instance.addr, "GET", "/leader").await?;
            answers.push((status, body.trim().to_owned()));
        }
        if answers
            .iter()
            .all(|(status, body)| *status == 200 && body == expected)
        {
            for (instance, (_, body)) in instances.iter().zip(&answers) {
                println!("  GET {}/leader -> {body}", instance.me);
            }
            return Ok(());
        }
        if Instant::now() >= give_up {
            bail!("after {within:?}, /leader answers {answers:?}; expected {expected} everywhere");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Which instances believe they lead.
fn leaders(instances: &[Instance]) -> Vec<usize> {
    instances
        .iter()
        .enumerate()
        .filter(|(_, instance)| instance.is_leading())
        .map(|(i, _)| i)
        .collect()
}

/// Waits until exactly one instance leads, and returns it; two at once is a
/// failure.
async fn wait_for_one_leader(instances: &[Instance], within: Duration) -> anyhow::Result<usize> {
    let give_up = Instant::now() + within;
    loop {
        match leaders(instances).as_slice() {
            [one] => return Ok(*one),
            [] if Instant::now() < give_up => tokio::time::sleep(Duration::from_millis(20)).await,
            [] => bail!("nobody led within {within:?}"),
            many => bail!("{} instances lead at once: {many:?}", many.len()),
        }
    }
}

/// The self-check: two instances in this process, on one store.
async fn demo(url: &str, metrics: PrometheusHandle) -> anyhow::Result<()> {
    let election = format!("{ELECTION}/demo-{}", common::run_id());
    println!(
        "leader_service demo: two instances, store {}",
        RedactedUrl::new(url)
    );
    let mut instances = Vec::new();
    for locker in common::clients(url, 2).await? {
        let instance =
            Instance::start(locker.with_name_label(true), &election, 0, metrics.clone()).await?;
        println!("  instance at {}", instance.me);
        instances.push(instance);
    }
    let outcome = demo_checks(&instances).await;
    for instance in instances {
        instance.stop().await;
    }
    outcome?;
    println!("leader_service demo: OK");
    Ok(())
}

async fn demo_checks(instances: &[Instance]) -> anyhow::Result<()> {
    // Exactly one leads, and stays the only one for a while.
    let first = wait_for_one_leader(instances, Duration::from_secs(10)).await?;
    for _ in 0..25 {
        ensure!(
            leaders(instances) == [first],
            "more than one instance, or none, leads: {:?}",
            leaders(instances)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("  exactly one leads: {}", instances[first].me);
    // Both name it.
    wait_for_agreement(instances, &instances[first].me, Duration::from_secs(5)).await?;

    // The leader resigns; the other takes over.
    let (status, body) = http(instances[first].addr, "POST", "/resign").await?;
    ensure!(
        status == 200,
        "POST /resign on the leader answered {status}: {body}"
    );
    println!("  POST {}/resign -> {}", instances[first].me, body.trim());
    let second = 1 - first;
    wait_for_agreement(instances, &instances[second].me, Duration::from_secs(10)).await?;
    let now = wait_for_one_leader(instances, Duration::from_secs(5)).await?;
    ensure!(
        now == second,
        "after the resignation {} leads, not {}",
        instances[now].me,
        instances[second].me
    );
    println!("  the other took over: {}", instances[second].me);

    // The metrics, from either instance (one recorder per process).
    let (status, text) = http(instances[second].addr, "GET", "/metrics").await?;
    ensure!(status == 200, "GET /metrics answered {status}");
    for name in ["lockwright_acquire_wait_seconds", "lockwright_leader"] {
        ensure!(text.contains(name), "/metrics has no {name}:\n{text}");
    }
    let shown: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("lockwright_leader")
                || l.starts_with("lockwright_acquire_wait_seconds_count")
        })
        .collect();
    println!("  GET {}/metrics shows:", instances[second].me);
    for line in shown {
        println!("    {line}");
    }
    Ok(())
}

/// Completes on Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    if tokio::signal::ctrl_c().await.is_err() {
        // No signal handling: serve until killed.
        std::future::pending::<()>().await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let demo_mode = args.iter().any(|a| a == "--demo");
    let mut positional = args.iter().filter(|a| !a.starts_with("--")).cloned();
    let url = positional
        .next()
        .unwrap_or_else(|| common::default_url("leader_service"));
    let port = positional.next().or_else(|| std::env::var("PORT").ok());
    let port: u16 = match port {
        Some(port) => port
            .parse()
            .with_context(|| format!("port {port:?} is not a port number"))?,
        None => 0,
    };

    // The `metrics` facade has one recorder per process: install it once,
    // before anything records. lockwright's metrics go to it from then on;
    // every instance in this process renders the same registry.
    let metrics = PrometheusBuilder::new().install_recorder()?;
    // A recorder installed this way leaves its upkeep (draining histogram
    // samples) to its owner.
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });

    if demo_mode {
        return demo(&url, metrics).await;
    }

    // Label the metrics with the lock's name too: one election here, so a
    // handful of series.
    let locker = lockwright::connect(&url).await?.with_name_label(true);
    let instance = Instance::start(locker, ELECTION, port, metrics).await?;
    let me = instance.me.clone();
    println!(
        "leader_service: serving {me} (election {ELECTION:?} on {})",
        RedactedUrl::new(&url)
    );
    println!("  curl {me}/leader            # who leads: the leader's address");
    println!("  curl {me}/metrics           # Prometheus text, lockwright_* included");
    println!("  curl -X POST {me}/resign    # the leader steps down; another instance takes over");
    println!("Start more instances on the same store URL to watch them take turns; Ctrl-C stops.");
    shutdown_signal().await;
    println!("{me}: shutting down (resigning if leading)");
    instance.stop().await;
    Ok(())
}
