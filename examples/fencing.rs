//! Fencing done right: the protected resource, not the lock holder, refuses a stale holder.
//!
//! A lock's lease can run out while its holder is paused (a long GC pause, a
//! swapped-out VM, a stopped process); another client then takes the lock, and
//! when the first one wakes up it still believes it holds it. Checking
//! `guard.is_lost()` before each write cannot fix that: the pause can fall
//! between the check and the write. What does fix it is a **fencing token**:
//! each grant carries one, strictly greater than every earlier grant's of the
//! same lock, the holder sends it with every write, and the storage service
//! refuses any write whose token is lower than the highest it has accepted.
//!
//! The demo: client A takes the lock with a 500 ms lease and renewal off, and
//! writes (accepted). Then A "pauses" past its lease. Client B, another
//! `Locker`, waits for the lock, gets it once A's lease has run out, and
//! writes with its token (accepted). A wakes up and writes with its old token:
//! refused. It exits 0 only if exactly that happened.
//!
//! Not every store gives fences (`Capabilities::fencing`): SQLite and the
//! other SQL stores' lease rows, Redis, ZooKeeper, etcd and `memory://` do;
//! Redlock, memcached and SQL's `?mode=session` do not, and `guard.fence()`
//! is `None` there. On those this example says so and exits 0 without a
//! demo: the only protection left is the lease itself, with the risk above.
//!
//! ```sh
//! cargo run -p lockwright --example fencing                # an SQLite file in the temp dir
//! cargo run -p lockwright --example fencing -- sqlite:///tmp/fencing.db
//! cargo run -p lockwright --features redis --example fencing -- redis://127.0.0.1:6379
//! ```

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockwright::backend::{Binding, RedactedUrl};
use lockwright::{ErrorKind, FencingToken, LockOptions};

/// The storage service the lock protects. It remembers the highest fencing
/// token it has accepted and refuses any write with a lower one: that writer
/// held the lock before someone who has written since, so its lock is gone.
/// A write with the highest token itself is the current holder writing
/// again, and is accepted.
#[derive(Debug, Default)]
struct Storage {
    highest: Mutex<Option<FencingToken>>,
    writes: Mutex<Vec<(FencingToken, String)>>,
}

impl Storage {
    /// Accepts or refuses one write, checking and recording the token in one
    /// step (under one mutex here; in a database, in the write's transaction
    /// or a conditional update: `... WHERE fence <= $token`).
    fn write(&self, token: FencingToken, value: &str) -> Result<(), String> {
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        let seen: Option<FencingToken> = *highest;
        if let Some(newer) = seen.filter(|newer| token < *newer) {
            return Err(format!(
                "refused {value:?}: token {token} is stale, {newer} has written since"
            ));
        }
        *highest = Some(token);
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((token, value.to_owned()));
        Ok(())
    }

    fn writes(&self) -> Vec<(FencingToken, String)> {
        self.writes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let url = common::store_url("fencing");
    let shown = RedactedUrl::new(&url);
    let mut pair = common::clients(&url, 2).await?.into_iter();
    let (Some(a), Some(b)) = (pair.next(), pair.next()) else {
        unreachable!("two clients were asked for");
    };
    let caps = a.capabilities().clone();
    if !caps.fencing {
        println!(
            "fencing: {shown} gives no fencing tokens (Capabilities::fencing is false), so a \
             resource cannot tell a stale holder from the current one; nothing to show. Use a \
             store with fences where a paused holder's late write would do harm."
        );
        a.close().await?;
        b.close().await?;
        return Ok(());
    }
    if caps.binding == Binding::Session {
        // A's session keeps its lock while the connection lives, and a pause
        // of one task does not stop this process's session heartbeats: B
        // would wait for ever. (A whole process frozen past its session
        // timeout is the same story as below.)
        println!(
            "fencing: {shown} binds locks to a session, which an in-process pause cannot end; \
             this demo needs a lease-bound store (SQL lease rows, Redis, memory://)"
        );
        a.close().await?;
        b.close().await?;
        return Ok(());
    }

    let name = format!("example-fencing/{}", common::run_id());
    let storage = Arc::new(Storage::default());
    println!("fencing: on {shown}");

    // A: a short lease and no renewal, so that a pause outlives it.
    let lease_a = Duration::from_millis(500).max(caps.min_ttl);
    let opts_a = LockOptions::new().ttl(lease_a).auto_renew(false).no_wait();
    let guard_a = a.lock_with(name.as_str(), &opts_a).await?;
    let Some(token_a) = guard_a.fence() else {
        // The capabilities said fences; the grant had none. Say so honestly.
        println!("fencing: {shown} granted A's lock without a fencing token; nothing to show");
        guard_a.release().await?;
        a.close().await?;
        b.close().await?;
        return Ok(());
    };
    let first = storage.write(token_a, "A: first write");
    println!("  A holds the lock, token {token_a}, lease {lease_a:?}; writes: {first:?}");
    anyhow::ensure!(
        first.is_ok(),
        "fencing: FAILED: A's first write was refused"
    );

    // The lost signal fires when A's lease runs out, but A is paused and
    // cannot act on it: the signal alone does not protect the resource.
    let signalled = Arc::new(AtomicBool::new(false));
    {
        let signalled = signalled.clone();
        guard_a.on_lost(move |reason| {
            signalled.store(true, Ordering::SeqCst);
            println!("  (A's lost signal fires: {reason:?}; A is paused and does not see it)");
        });
    }

    // B: another client, which waits for the lock and writes with its token.
    let (wrote, b_wrote) = tokio::sync::oneshot::channel();
    let client_b = {
        let (storage, name) = (storage.clone(), name.clone());
        tokio::spawn(async move {
            let opts_b = LockOptions::new()
                .ttl(Duration::from_secs(10))
                .wait_for(Duration::from_secs(10));
            let guard_b = b.lock_with(name.as_str(), &opts_b).await?;
            let token_b = guard_b
                .fence()
                .ok_or_else(|| anyhow::anyhow!("B's grant carried no fencing token"))?;
            let accepted = storage.write(token_b, "B: write");
            println!("  B takes the lock, token {token_b}; writes: {accepted:?}");
            // Fails only if A's pause is already over: nothing to tell then.
            let _ = wrote.send(());
            anyhow::Ok((b, guard_b, token_b, accepted))
        })
    };

    // A pauses: a stop-the-world GC, say. Here the pause lasts until B has
    // written (at most 15 s), so that the interleaving is the same on every
    // run; a real pause has no such courtesy.
    println!("  A pauses (GC) ...");
    if tokio::time::timeout(Duration::from_secs(15), b_wrote)
        .await
        .is_err()
    {
        println!("  (B did not write within 15 s; A wakes up anyway)");
    }
    let (b, guard_b, token_b, b_write) = client_b.await??;

    // A wakes up, unaware that its lease ran out, and writes with its token.
    let late = storage.write(token_a, "A: late write after the pause");
    println!(
        "  A wakes up (its guard says lost: {}), writes with token {token_a}: {late:?}",
        guard_a.is_lost()
    );
    match guard_a.release().await {
        Err(e) if e.kind() == ErrorKind::Lost => println!("  A's release says: {e}"),
        other => println!("  A's release: {other:?}"),
    }
    guard_b.release().await?;
    a.close().await?;
    b.close().await?;

    let writes: Vec<String> = storage.writes().into_iter().map(|(_, w)| w).collect();
    println!("  the storage holds: {writes:?}");
    if !signalled.load(Ordering::SeqCst) {
        println!("  (A's lost signal did not fire before its release)");
    }
    anyhow::ensure!(
        token_b > token_a,
        "fencing: FAILED: B's token {token_b} is not above A's {token_a}"
    );
    anyhow::ensure!(b_write.is_ok(), "fencing: FAILED: B's write was refused");
    anyhow::ensure!(
        late.is_err(),
        "fencing: FAILED: A's stale write was accepted"
    );
    anyhow::ensure!(
        writes == ["A: first write", "B: write"],
        "fencing: FAILED: the storage holds {writes:?}"
    );
    println!(
        "fencing: OK: the stale holder's write (token {token_a}) was refused after {token_b}'s"
    );
    Ok(())
}
