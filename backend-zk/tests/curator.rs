//! Interop with a real Apache Curator `InterProcessMutex` (Debian's Curator
//! 5.4.0, driven through `tests/curator/CuratorLock.java`): on the same
//! path, Curator and lockwright exclude each other both ways, each waits on
//! the other's node, and with digest credentials nobody else can touch them.
//! And with Curator's `LeaderSelector` (`tests/curator/CuratorLeader.java`):
//! an election is one election, whichever side leads, and each reads the
//! other's leader id. And with Curator's `InterProcessSemaphoreV2` and
//! `InterProcessReadWriteLock` (`tests/curator/CuratorGroup.java`): a
//! semaphore's N permits are shared, and readers and writers exclude each
//! other as a Java service expects, both ways.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{raw_client, server_hosts};
use lockwright_conformance::kit::unique_id;
use lockwright_core::{ErrorKind, LockOptions, Locker};
use lockwright_zk::internals::zookeeper_client as zk;
use lockwright_zk::ZkBackend;

const CLASSPATH: &str = "/usr/share/java/curator-recipes.jar:/usr/share/java/slf4j-nop.jar";

/// One Curator client running one of the programs in `tests/curator`
/// (an `InterProcessMutex` or a `LeaderSelector`), answering commands.
struct Curator {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Curator {
    /// `CuratorLock.java` on `path`.
    fn start(hosts: &str, path: &str, credentials: Option<&str>) -> Curator {
        let mut args = vec![hosts, path];
        args.extend(credentials);
        Curator::run("CuratorLock.java", &args)
    }

    /// `tests/curator/<program>` with `args`, once it says it is ready.
    fn run(program: &str, args: &[&str]) -> Curator {
        let source = format!("{}/tests/curator/{program}", env!("CARGO_MANIFEST_DIR"));
        let mut cmd = Command::new("java");
        cmd.args(["-cp", CLASSPATH, &source])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = cmd
            .spawn()
            .expect("java runs (scripts/test installs a JDK and Curator)");
        let stdin = child.stdin.take().expect("stdin");
        let stdout: ChildStdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut c = Curator {
            child,
            stdin,
            lines,
        };
        // The JVM compiles the source first: allow for a loaded machine.
        assert_eq!(c.next(Duration::from_secs(60)), "ready");
        c
    }

    fn next(&mut self, within: Duration) -> String {
        self.lines
            .recv_timeout(within)
            .unwrap_or_else(|e| panic!("Curator did not answer within {within:?}: {e}"))
    }

    /// Sends a command without waiting for its answer.
    fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("Curator's stdin");
    }

    fn ask(&mut self, command: &str) -> String {
        self.send(command);
        self.next(Duration::from_secs(30))
    }
}

impl Drop for Curator {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        if self.child.wait_timeout_or_kill() {
            let _ = self.child.wait();
        }
    }
}

trait WaitOrKill {
    fn wait_timeout_or_kill(&mut self) -> bool;
}

impl WaitOrKill for Child {
    /// Waits up to 5 s for the JVM to close its client, then kills it.
    /// `true` if it had to be killed.
    fn wait_timeout_or_kill(&mut self) -> bool {
        for _ in 0..50 {
            if let Ok(Some(_)) = self.try_wait() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.kill();
        true
    }
}

fn unique(name: &str) -> String {
    format!("{name}-{}", unique_id())
}

fn locker(hosts: &str, credentials: &str, root: &str) -> Locker {
    let url = format!("zk://{credentials}{hosts}{root}?session_timeout=4s");
    Locker::new(ZkBackend::connect(&url).expect("valid URL"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_and_lockwright_exclude_each_other_both_ways() {
    let hosts = server_hosts();
    let root = format!("/{}", unique("interop"));
    let path = format!("{root}/k");
    let ours = locker(&hosts, "", &root);
    let mut curator = Curator::start(&hosts, &path, None);

    // Curator holds: lockwright is refused, then waits on Curator's node.
    assert_eq!(curator.ask("try"), "acquired");
    assert!(
        ours.try_lock("k").await.expect("try_lock").is_none(),
        "lockwright took a lock Curator holds"
    );
    let waiting = {
        let ours = ours.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new().wait_for(Duration::from_secs(20));
            ours.lock_with("k", &opts).await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "lockwright got the lock while Curator held it"
    );
    assert_eq!(curator.ask("release"), "released");
    let guard = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("Curator's release wakes the lockwright waiter")
        .expect("task")
        .expect("the waiter gets the lock");

    // lockwright holds: Curator is refused, and sees our node in its layout.
    assert_eq!(curator.ask("try"), "busy");
    assert_eq!(curator.ask("acquire 300"), "timeout");
    let nodes = curator.ask("nodes");
    let names: Vec<&str> = nodes
        .trim_start_matches("nodes")
        .trim()
        .split(',')
        .filter(|n| !n.is_empty())
        .collect();
    assert_eq!(names.len(), 1, "{nodes}");
    let name = names[0];
    assert!(
        name.starts_with("_c_") && name.len() == "_c_".len() + 36 + "-lock-".len() + 10,
        "our node {name:?} is not named as Curator names its own"
    );
    // Curator waits on our node and gets the lock when we release.
    curator.send("acquire 20000");
    tokio::time::sleep(Duration::from_millis(500)).await;
    guard.release().await.expect("release");
    assert_eq!(curator.next(Duration::from_secs(20)), "acquired");
    assert!(ours.try_lock("k").await.expect("try_lock").is_none());
    assert_eq!(curator.ask("release"), "released");
    let again = ours.try_lock("k").await.expect("try_lock");
    assert!(again.is_some(), "free after Curator's release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_credentials_only_that_identity_can_touch_the_locks() {
    let hosts = server_hosts();
    let root = format!("/{}", unique("interop-auth"));
    let path = format!("{root}/k");
    let ours = locker(&hosts, "alice:s%3Acret@", &root);
    let guard = ours.lock("k").await.expect("lock with credentials");

    // The same identity through Curator is excluded by our node.
    let mut curator = Curator::start(&hosts, &path, Some("alice:s:cret"));
    assert_eq!(curator.ask("try"), "busy");

    // Nobody else can read the directory or delete our node.
    let stranger = raw_client(&hosts).await;
    assert!(
        matches!(stranger.list_children(&path).await, Err(zk::Error::NoAuth)),
        "a client without the credentials listed the lock directory"
    );
    let mine = raw_client(&hosts).await;
    mine.auth("digest", b"alice:s:cret").await.expect("auth");
    let children = mine.list_children(&path).await.expect("alice lists");
    assert_eq!(children.len(), 1, "{children:?}");
    let node = format!("{path}/{}", children[0]);
    assert!(
        matches!(stranger.delete(&node, None).await, Err(zk::Error::NoAuth)),
        "a client without the credentials deleted our node"
    );
    // Another identity's locker gets a typed error, never "contended".
    let mallory = locker(&hosts, "mallory:x@", &root);
    let e = mallory.try_lock("k").await.expect_err("another identity");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    // The root alice made is shared: others lock keys of their own in it.
    for (other, key) in [
        (&mallory, "mallory's"),
        (&locker(&hosts, "", &root), "anyone's"),
    ] {
        let g = other.try_lock(key).await.expect("a key of their own");
        g.expect("free").release().await.expect("release");
    }

    guard.release().await.expect("release");
    assert_eq!(curator.ask("try"), "acquired");
    assert_eq!(curator.ask("release"), "released");
}

/// Java's `LeaderSelector` leads: our election sees its id as the value and
/// cannot lead, then leads once Java gives up. We lead: Java reads our
/// value (also after a proclaim) as the leader's id and waits, then leads
/// once we resign. The election named `e` under the root is Curator's
/// `<root>/e`, as a lock's key is.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_leader_selector_and_our_election_are_one_election() {
    let hosts = server_hosts();
    let root = format!("/{}", unique("interop-leader"));
    let path = format!("{root}/e");
    let election = locker(&hosts, "", &root).election("e").expect("election");
    let mut java = Curator::run("CuratorLeader.java", &[&hosts, &path, "java-1"]);
    let within = Duration::from_secs(20);

    // Java leads.
    assert_eq!(java.ask("start"), "started");
    assert_eq!(java.next(within), "leading");
    let leader = election
        .leader()
        .await
        .expect("leader")
        .expect("Java leads");
    assert_eq!(leader.value_str(), Some("java-1"));
    assert!(leader.term.is_some());
    let no_wait = LockOptions::new().no_wait();
    let tried = election
        .try_campaign_with("rust-1", &no_wait)
        .await
        .expect("try_campaign");
    assert!(tried.is_none(), "we led while Java's LeaderSelector led");
    let campaign = {
        let election = election.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new().wait_for(Duration::from_secs(30));
            election.campaign_with("rust-1", &opts).await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !campaign.is_finished(),
        "we led while Java's LeaderSelector led"
    );
    assert_eq!(java.ask("stop"), "stopped");
    let mut ours = tokio::time::timeout(within, campaign)
        .await
        .expect("Java's giving up wakes our campaign")
        .expect("task")
        .expect("we lead");
    let leader = election.leader().await.expect("leader").expect("we lead");
    assert_eq!(leader.value_str(), Some("rust-1"));
    assert_eq!(leader.term, ours.term());
    assert!(leader.term > Some(lockwright_core::FencingToken(0)));

    // We lead: Java reads our value as the leader's id, and waits.
    assert_eq!(java.ask("start"), "started");
    assert_eq!(java.ask("leader"), "leader rust-1");
    ours.proclaim("rust-2").await.expect("proclaim");
    assert_eq!(java.ask("leader"), "leader rust-2");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(java.ask("has"), "has false", "Java led while we did");
    ours.resign().await.expect("resign");
    assert_eq!(java.next(within), "leading");
    assert_eq!(java.ask("has"), "has true");
    let leader = election
        .leader()
        .await
        .expect("leader")
        .expect("Java leads");
    assert_eq!(leader.value_str(), Some("java-1"));
    assert_eq!(java.ask("stop"), "stopped");
}

/// What a listing of `reply` ("<word> a,b,c") names.
fn names(reply: &str) -> Vec<String> {
    reply
        .split_once(' ')
        .map_or("", |(_, rest)| rest)
        .split(',')
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect()
}

/// Whether `name` is named as Curator names a node of `marker`.
fn curator_named(name: &str, marker: &str) -> bool {
    name.starts_with("_c_")
        && name.len() == "_c_".len() + 36 + 1 + marker.len() + 10
        && name[3 + 36 + 1..].starts_with(marker)
}

/// Our semaphore of 2 and Curator's `InterProcessSemaphoreV2` of 2 on the
/// same path share its 2 permits: a permit each leaves none for either, a
/// waiter on either side is served by the other side's release, and our
/// lease is a node Curator counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_semaphore_and_ours_share_the_permits_both_ways() {
    let hosts = server_hosts();
    let root = format!("/{}", unique("interop-sem"));
    let path = format!("{root}/s");
    let ours = locker(&hosts, "", &root)
        .semaphore("s", 2)
        .expect("semaphore");
    let mut java = Curator::run("CuratorGroup.java", &[&hosts, &path, "sem", "2"]);
    let now = LockOptions::new().no_wait();
    let within = Duration::from_secs(20);

    assert_eq!(java.ask("try"), "acquired");
    let first = ours
        .try_acquire_with(&now)
        .await
        .expect("try")
        .expect("a permit is free");
    assert_eq!(
        java.ask("leases"),
        "leases 2",
        "Curator does not count our lease"
    );
    assert!(
        ours.try_acquire_with(&now).await.expect("try").is_none(),
        "a third permit of 2 was granted to us"
    );
    assert_eq!(
        java.ask("try"),
        "busy",
        "a third permit of 2 was granted to Curator"
    );
    let children = raw_client(&hosts)
        .await
        .list_children(&format!("{path}/leases"))
        .await;
    let children = children.expect("the lease directory");
    assert_eq!(children.len(), 2, "{children:?}");
    assert!(
        children.iter().all(|c| curator_named(c, "lease-")),
        "a lease is not named as Curator names its own: {children:?}"
    );

    // Our waiter is served by Curator's release.
    let waiting = {
        let ours = ours.clone();
        tokio::spawn(async move {
            ours.acquire_with(&LockOptions::new().wait_for(Duration::from_secs(20)))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !waiting.is_finished(),
        "we got a permit while both were held"
    );
    assert_eq!(java.ask("release"), "released");
    let second = tokio::time::timeout(within, waiting)
        .await
        .expect("Curator's release wakes our waiter")
        .expect("task")
        .expect("our waiter gets the permit");

    // Curator's waiter is served by ours.
    java.send("acquire 20000");
    tokio::time::sleep(Duration::from_millis(500)).await;
    first.release().await.expect("release");
    assert_eq!(java.next(within), "acquired");
    assert!(ours.try_acquire_with(&now).await.expect("try").is_none());
    assert_eq!(java.ask("release"), "released");
    second.release().await.expect("release");
    assert_eq!(java.ask("leases"), "leases 0");
    let both = (
        ours.try_acquire_with(&now).await,
        ours.try_acquire_with(&now).await,
    );
    assert!(
        matches!(both, (Ok(Some(_)), Ok(Some(_)))),
        "both permits free again"
    );
}

/// Our read-write lock and Curator's `InterProcessReadWriteLock` on the
/// same path: readers share across the two; a writer of either side
/// excludes the other side's readers and writers and is served by their
/// release; a waiting writer of ours keeps Curator's new readers out; and
/// our downgrade keeps a Java writer that queued behind us waiting until
/// our read hold goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn curator_read_write_lock_and_ours_exclude_each_other_both_ways() {
    let hosts = server_hosts();
    let root = format!("/{}", unique("interop-rw"));
    let path = format!("{root}/rw");
    let ours = locker(&hosts, "", &root).rwlock("rw").expect("rwlock");
    let mut java = Curator::run("CuratorGroup.java", &[&hosts, &path, "rw"]);
    let mut java2 = Curator::run("CuratorGroup.java", &[&hosts, &path, "rw"]);
    let now = LockOptions::new().no_wait();
    let wait = LockOptions::new().wait_for(Duration::from_secs(20));
    let within = Duration::from_secs(20);

    // Readers share; a reader of each side keeps the other side's writer out.
    assert_eq!(java.ask("try-read"), "acquired");
    let read = ours
        .try_read_with(&now)
        .await
        .expect("try")
        .expect("readers share");
    assert!(
        ours.try_write_with(&now).await.expect("try").is_none(),
        "we wrote beside a Java reader"
    );
    assert_eq!(
        java2.ask("try-write"),
        "busy",
        "Java wrote beside our reader"
    );
    let nodes = names(&java.ask("nodes"));
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    assert!(
        nodes.iter().all(|n| curator_named(n, "__READ__")),
        "{nodes:?}"
    );
    read.release().await.expect("release");

    // Our waiting writer keeps Java's new readers out, and Java's reader's
    // release lets it in.
    let writing = {
        let ours = ours.clone();
        let wait = wait.clone();
        tokio::spawn(async move { ours.write_with(&wait).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!writing.is_finished(), "we wrote beside a Java reader");
    assert_eq!(
        java2.ask("try-read"),
        "busy",
        "a Java reader passed our waiting writer"
    );
    assert_eq!(java.ask("release-read"), "released");
    let write = tokio::time::timeout(within, writing)
        .await
        .expect("Java's release wakes our writer")
        .expect("task")
        .expect("our writer gets in");
    let nodes = names(&java.ask("nodes"));
    assert!(
        nodes.len() == 1 && curator_named(&nodes[0], "__WRIT__"),
        "our writer is not a Curator writer's node: {nodes:?}"
    );

    // Our writer keeps Java's readers and writers out; a Java reader
    // waiting on it is served by our release.
    assert_eq!(java.ask("try-read"), "busy");
    assert_eq!(java2.ask("try-write"), "busy");
    java.send("read 20000");
    tokio::time::sleep(Duration::from_millis(500)).await;
    write.release().await.expect("release");
    assert_eq!(java.next(within), "acquired");
    assert_eq!(java.ask("release-read"), "released");

    // A Java writer keeps ours out, and our waiting reader is served by
    // its release.
    assert_eq!(java.ask("try-write"), "acquired");
    assert!(
        ours.try_read_with(&now).await.expect("try").is_none(),
        "we read beside a Java writer"
    );
    assert!(
        ours.try_write_with(&now).await.expect("try").is_none(),
        "we wrote beside a Java writer"
    );
    let reading = {
        let ours = ours.clone();
        let wait = wait.clone();
        tokio::spawn(async move { ours.read_with(&wait).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!reading.is_finished(), "we read beside a Java writer");
    assert_eq!(java.ask("release-write"), "released");
    let read = tokio::time::timeout(within, reading)
        .await
        .expect("Java's release wakes our reader")
        .expect("task")
        .expect("our reader gets in");
    read.release().await.expect("release");

    // Our downgrade: a Java writer queued behind our writer stays out
    // while our read hold lasts (Curator 5.5's rule, which 5.4 peers
    // honour), and gets in once it goes.
    let write = ours.write_with(&wait).await.expect("write");
    java2.send("write 20000");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let read = ours.downgrade(write).await.expect("downgrade");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        java.ask("try-write"),
        "busy",
        "a Java writer got in beside our read hold"
    );
    read.release().await.expect("release");
    assert_eq!(
        java2.next(within),
        "acquired",
        "the queued Java writer gets in"
    );
    assert_eq!(java2.ask("release-write"), "released");
}
