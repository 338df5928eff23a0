//! `rediss+sentinel://` and `rediss+cluster://`, each against private
//! servers this test starts that speak TLS only (`port 0`), with
//! certificates from a CA of its own: a primary, a replica and three
//! sentinels that require a password of their own; and a Cluster of three
//! primaries with a replica each. Through each: a lock handed from one
//! locker to a waiting one (so the pub/sub connections go over TLS too),
//! the conformance suite's exclusion and expiry cases, and the refusals: an
//! untrusted certificate and a wrong or missing sentinel password are
//! `Config`, and plain text to a TLS port is `Unavailable`, never a grant.

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lockwright_conformance::kit::free_port;
use lockwright_conformance::kit::process::ServerProcess;
use lockwright_conformance::kit::tls::{self, certificates};
use lockwright_conformance::{Harness, Rule, CASES};
use lockwright_core::backend::LockBackend;
use lockwright_core::{ErrorKind, Locker};
use lockwright_redis::RedisBackend;

/// How long the servers may take to be ready on a loaded host.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// How long a refusal may take: a hang is a failure, not a refusal.
const REFUSED_WITHIN: Duration = Duration::from_secs(20);

/// The sentinels' own password.
const SENTINEL_PASSWORD: &str = "sentinelpw";

fn locker(url: &str) -> Locker {
    Locker::new(RedisBackend::connect(url).unwrap())
}

/// The kind of error the first attempt over `url` ends with, within
/// [`REFUSED_WITHIN`].
async fn refused(url: &str) -> ErrorKind {
    tokio::time::timeout(REFUSED_WITHIN, tls::refused(locker(url), url))
        .await
        .unwrap_or_else(|_| panic!("{url}: no answer within {REFUSED_WITHIN:?}"))
}

/// `n` distinct free loopback ports.
fn ports(n: usize) -> Vec<u16> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    while out.len() < n {
        let p = free_port();
        if seen.insert(p) {
            out.push(p);
        }
    }
    out
}

/// `dir`'s file `name`, as a string for command lines and URLs.
fn file(dir: &Path, name: &str) -> String {
    dir.join(name).to_str().unwrap().to_owned()
}

/// The TLS options every server here takes: the CA's server certificate,
/// no client certificate asked for, and TLS to the primary a replica
/// follows (and, for a sentinel, to the servers it watches).
fn tls_args(dir: &Path) -> [String; 10] {
    [
        "--tls-cert-file",
        &file(dir, "server.pem"),
        "--tls-key-file",
        &file(dir, "server.key"),
        "--tls-ca-cert-file",
        &file(dir, "ca.pem"),
        "--tls-auth-clients",
        "no",
        "--tls-replication",
        "yes",
    ]
    .map(str::to_owned)
}

/// A TLS-only `redis-server` on `port`, persisting nothing, in a directory
/// of its own under `dir`, with `extra` options.
fn data_node(dir: &Path, port: u16, extra: &[String]) -> ServerProcess {
    let own = dir.join(format!("node-{port}"));
    std::fs::create_dir_all(&own).unwrap();
    ServerProcess::start(
        Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--dir", own.to_str().unwrap()])
            .args(tls_args(dir))
            .args(extra),
        port,
    )
}

/// `redis-cli` over TLS to the server at `port` with `args`: its output,
/// empty when it could not run.
fn cli(dir: &Path, port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["--tls", "--cacert", &file(dir, "ca.pem")])
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Polls `ready` until it holds, for up to [`READY_WITHIN`].
async fn wait_until(what: &str, ready: impl Fn() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < READY_WITHIN,
            "{what}: not ready within {READY_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A store reached through one URL, for the conformance cases.
struct Over {
    url: String,
    unreachable: String,
}

#[async_trait]
impl Harness for Over {
    /// Connected before it is handed out: asking the sentinels and the
    /// TLS handshakes can take longer on a loaded host than the part of a
    /// short lease the expiry cases leave a second client to find it held.
    async fn client(&self) -> Arc<dyn LockBackend> {
        let client = RedisBackend::connect(&self.url).unwrap();
        client.verify().await.expect("the TLS servers answer");
        Arc::new(client)
    }
    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect(&self.unreachable).unwrap())
    }
}

/// The suite's exclusion and expiry cases, over `harness`.
async fn exclusion_and_expiry(harness: &Over) {
    let cases: Vec<_> = CASES
        .iter()
        .filter(|c| matches!(c.rule, Rule::Exclusion | Rule::Expiry))
        .collect();
    assert!(cases.len() >= 4, "the suite's exclusion and expiry cases");
    for case in cases {
        if let Err(e) = case.run(harness).await {
            panic!(
                "conformance case {} over {} failed: {e:#}",
                case.name, harness.url
            );
        }
    }
}

/// A TLS-only primary and replica, and three TLS-only sentinels that
/// require [`SENTINEL_PASSWORD`], watching the master `m`. The servers
/// go when it is dropped.
struct Sentinels {
    _servers: Vec<ServerProcess>,
    /// `127.0.0.1:<port>` of each sentinel, comma-separated.
    list: String,
    dir: tempfile::TempDir,
}

impl Sentinels {
    async fn start() -> Sentinels {
        let dir = tempfile::tempdir().unwrap();
        certificates(dir.path());
        let d = dir.path();
        let p = ports(5);
        let (primary, replica, sentinels) = (p[0], p[1], &p[2..]);
        let mut servers = vec![data_node(d, primary, &[])];
        let follow = ["--replicaof", "127.0.0.1", &primary.to_string()].map(str::to_owned);
        servers.push(data_node(d, replica, &follow));
        for &s in sentinels {
            let own = d.join(format!("sentinel-{s}"));
            std::fs::create_dir_all(&own).unwrap();
            // A config file of its own, which the sentinel rewrites. A
            // failover is not wanted here: a primary slow to answer on a
            // loaded host is given 5 s before it counts as down.
            let conf = own.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port 0\ntls-port {s}\nbind 127.0.0.1\ndir \"{dir}\"\n\
                     tls-cert-file \"{cert}\"\ntls-key-file \"{key}\"\n\
                     tls-ca-cert-file \"{ca}\"\ntls-auth-clients no\n\
                     tls-replication yes\nrequirepass {SENTINEL_PASSWORD}\n\
                     sentinel announce-ip 127.0.0.1\n\
                     sentinel monitor m 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds m 5000\n\
                     sentinel failover-timeout m 60000\n",
                    dir = own.to_str().unwrap(),
                    cert = file(d, "server.pem"),
                    key = file(d, "server.key"),
                    ca = file(d, "ca.pem"),
                ),
            )
            .unwrap();
            servers.push(ServerProcess::start(
                Command::new("redis-server")
                    .arg(conf.to_str().unwrap())
                    .arg("--sentinel"),
                s,
            ));
        }
        // Ready once every sentinel names the primary, and the replica
        // follows it.
        let auth = ["-a", SENTINEL_PASSWORD, "--no-auth-warning"];
        wait_until("the sentinels", || {
            sentinels.iter().all(|&s| {
                let mut args = auth.to_vec();
                args.extend(["sentinel", "get-master-addr-by-name", "m"]);
                let out = cli(d, s, &args);
                out.lines().nth(1).map(str::trim) == Some(primary.to_string().as_str())
            })
        })
        .await;
        wait_until("the replica", || {
            cli(d, primary, &["info", "replication"]).contains("connected_slaves:1")
        })
        .await;
        let list: Vec<String> = sentinels.iter().map(|s| format!("127.0.0.1:{s}")).collect();
        Sentinels {
            _servers: servers,
            list: list.join(","),
            dir,
        }
    }

    fn ca(&self) -> String {
        file(self.dir.path(), "ca.pem")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls() {
    let setup = Sentinels::start().await;
    let (list, ca) = (&setup.list, setup.ca());
    let base = format!("rediss+sentinel://{list}/m?connect_timeout=2s");
    let url = format!("{base}&tls_ca={ca}&sentinel_password={SENTINEL_PASSWORD}");
    tls::hand_off(locker(&url), locker(&url)).await;

    // Not trusted by the system's roots; a wrong sentinel password, and
    // none (the sentinels refuse both questions); plain text to the TLS
    // ports (the servers close the connection: the sentinels cannot be
    // reached, as if down).
    for (bad, kind) in [
        (
            format!("{base}&sentinel_password={SENTINEL_PASSWORD}"),
            ErrorKind::Config,
        ),
        (
            format!("{base}&tls_ca={ca}&sentinel_password=wrong"),
            ErrorKind::Config,
        ),
        (format!("{base}&tls_ca={ca}"), ErrorKind::Config),
        (
            format!(
                "redis+sentinel://{list}/m?connect_timeout=1s&timeout=1s\
                 &sentinel_password={SENTINEL_PASSWORD}"
            ),
            ErrorKind::Unavailable,
        ),
    ] {
        assert_eq!(refused(&bad).await, kind, "{bad}");
    }
    // The sentinels' password is not in what an error says.
    let e = locker(&format!("{base}&tls_ca={ca}&sentinel_password=hunter2"))
        .try_lock("transport")
        .await
        .unwrap_err();
    assert!(!e.chain().contains("hunter2"), "{}", e.chain());
    // A CA file that is not there: refused before any connection.
    let e = RedisBackend::connect(&format!("{base}&tls_ca=/nonexistent.pem")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");

    let harness = Over {
        url,
        unreachable: format!("rediss+sentinel://127.0.0.1:1/m?tls_ca={ca}"),
    };
    exclusion_and_expiry(&harness).await;
}

/// Six TLS-only Cluster nodes announcing their TLS ports (`tls-cluster
/// yes`), three primaries with a replica each. The servers go when it is
/// dropped.
struct Cluster {
    _servers: Vec<ServerProcess>,
    /// `127.0.0.1:<port>` of two of its nodes, comma-separated.
    seeds: String,
    dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        certificates(dir.path());
        let d = dir.path();
        // A node's bus port, `port + 10000` unless set, may be past 65535
        // or taken: each is given a free one of its own.
        let p = ports(12);
        let (nodes, buses) = p.split_at(6);
        let mut servers = Vec::new();
        for (&port, &bus) in nodes.iter().zip(buses) {
            let extra = [
                "--tls-cluster",
                "yes",
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                // Long enough that a loaded host's pause fails no
                // primary over in the middle of a case.
                "--cluster-node-timeout",
                "5000",
                "--cluster-port",
                &bus.to_string(),
            ]
            .map(str::to_owned);
            servers.push(data_node(d, port, &extra));
        }
        let addrs: Vec<String> = nodes.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = Command::new("redis-cli")
            .args([
                "--tls",
                "--cacert",
                &file(d, "ca.pem"),
                "--cluster",
                "create",
            ])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(created, "redis-cli --cluster create {addrs:?}");
        wait_until("the Cluster", || {
            nodes
                .iter()
                .all(|&n| cli(d, n, &["cluster", "info"]).contains("cluster_state:ok"))
        })
        .await;
        Cluster {
            _servers: servers,
            seeds: addrs[..2].join(","),
            dir,
        }
    }

    fn ca(&self) -> String {
        file(self.dir.path(), "ca.pem")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls() {
    let setup = Cluster::start().await;
    let (seeds, ca) = (&setup.seeds, setup.ca());
    let base = format!("rediss+cluster://{seeds}?connect_timeout=2s");
    let url = format!("{base}&tls_ca={ca}");
    tls::hand_off(locker(&url), locker(&url)).await;

    // Not trusted by the system's roots (the driver passes a node's error
    // on as text: still `Config`); plain text to the TLS ports.
    for (bad, kind) in [
        (base.clone(), ErrorKind::Config),
        (
            format!("redis+cluster://{seeds}?connect_timeout=1s&timeout=1s"),
            ErrorKind::Unavailable,
        ),
    ] {
        assert_eq!(refused(&bad).await, kind, "{bad}");
    }
    let e = RedisBackend::connect(&format!("{base}&tls_ca=/nonexistent.pem")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");

    let harness = Over {
        url,
        unreachable: format!("rediss+cluster://127.0.0.1:1?tls_ca={ca}"),
    };
    exclusion_and_expiry(&harness).await;
}
