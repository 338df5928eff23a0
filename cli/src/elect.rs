//! `lockwright elect`: run a command while elected leader; `lockwright
//! leader`: who leads, once or as it changes.
//!
//! An election is a lock whose holder advertises a value, so `elect` is
//! `run` with a campaign for the acquire: the same supervision
//! (`supervise`), the same exit codes.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;

use futures::StreamExt;
use lockwright::{Error, Leader, LockOptions, Result, MAX_VALUE_LEN};
use lockwright_cli_kit::exit::{die_by_signal_on_exit, EX_OSERR};

use crate::args::{ElectArgs, LeaderArgs};
use crate::status;
use crate::supervise::{self, Signals, Spec};

/// `lockwright elect`: the command's exit code, or the error that ended it.
pub(crate) async fn elect(args: ElectArgs) -> Result<i32> {
    let url = args.store.shared_url()?;
    let value = args.value.as_bytes().to_vec();
    // Refused before connecting: a value the election would refuse is a
    // mistake in the command line, not something a store outage may hide.
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::invalid_options(format!(
            "--value is at most {MAX_VALUE_LEN} bytes, not {}",
            value.len()
        )));
    }
    supervise::check_label(args.label.as_deref())?;
    let spec = Spec {
        url,
        key: &args.key,
        ttl: args.ttl,
        kill_after: args.kill_after,
        command: &args.command,
        wait: args.wait_policy(),
        label: args.label.as_deref(),
    };
    let ttl = args.ttl;
    let key = args.key.as_str();
    supervise::under_lease(&spec, |locker, wait| async move {
        let opts = LockOptions::new().ttl(ttl).wait(wait);
        // A store that keeps no values fails here (Unsupported) as any
        // acquire error does: nothing taken, nothing run.
        let election = locker.election(key)?;
        election.campaign_with(value, &opts).await
    })
    .await
}

/// `lockwright leader`: 0 whether someone leads or not, or the error that ended it.
pub(crate) async fn leader(args: LeaderArgs) -> Result<i32> {
    // Lazy, as `status`: a read must not create the lease table, and a
    // store that is down fails the first read with Unavailable.
    let locker = lockwright::connect_lazy(args.store.shared_url()?).await?;
    let election = locker.election(args.key.as_str())?;
    let code = if args.watch {
        watch(&election, &args).await?
    } else {
        let now = election.leader().await?;
        show(&args, now.as_ref()).unwrap_or(0)
    };
    // Nothing was taken, so nothing waits to be released: a store gone by
    // now is worth a warning, not a failed read.
    if let Err(e) = locker.close().await {
        eprintln!("lockwright: warning: {}", e.chain());
    }
    Ok(code)
}

/// Who leads now, then every change, until SIGINT or SIGTERM.
async fn watch(election: &lockwright::Election, args: &LeaderArgs) -> Result<i32> {
    let mut signals = Signals::new()?;
    let changes = election.observe();
    tokio::pin!(changes);
    let mut first = true;
    loop {
        tokio::select! {
            item = changes.next() => match item {
                Some(Ok(now)) => {
                    first = false;
                    if let Some(code) = show(args, now.as_ref()) {
                        return Ok(code);
                    }
                }
                // The first read decides as `leader` without --watch does:
                // a store that cannot be read is not "nobody leads".
                Some(Err(e)) if first => return Err(e),
                // One line per outage (the stream yields one), then the
                // watch goes on and shows whoever leads when it is back.
                Some(Err(e)) => eprintln!("lockwright: {}", e.chain()),
                None => return Ok(0),
            },
            sig = signals.recv() => {
                // A hang-up ends the watch as a kill would (by the signal);
                // an interrupt or termination is how a watch is meant to end.
                if sig == nix::sys::signal::Signal::SIGHUP {
                    die_by_signal_on_exit(sig);
                    return Ok(128 + sig as i32);
                }
                return Ok(0);
            }
        }
    }
}

/// Prints one reading; `Some(exit code)` when stdout is gone and the
/// command must end (0 for a closed pipe, quietly: the reader had enough).
fn show(args: &LeaderArgs, now: Option<&Leader>) -> Option<i32> {
    let line = if args.json {
        json(&args.key, now)
    } else {
        text(&args.key, now)
    };
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => None,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Some(0),
        Err(e) => {
            eprintln!("lockwright: cannot write to standard output: {e}");
            Some(EX_OSERR)
        }
    }
}

/// `"KEY": led by "VALUE" (term N, 12.3s left)` or `"KEY": nobody leads`.
fn text(key: &str, now: Option<&Leader>) -> String {
    let Some(l) = now else {
        return format!("{key:?}: nobody leads");
    };
    // Debug quoting escapes control characters, so a value cannot rewrite
    // the terminal; bytes that are not UTF-8 are shown in hex.
    let value = match l.value_str() {
        Some(v) => format!("{v:?}"),
        None => format!("hex:{}", hex(&l.value)),
    };
    let mut details = Vec::new();
    if let Some(t) = l.term {
        details.push(format!("term {t}"));
    }
    if let Some(left) = l.lease_left {
        details.push(format!("{} left", status::human(left)));
    }
    if details.is_empty() {
        format!("{key:?}: led by {value}")
    } else {
        format!("{key:?}: led by {value} ({})", details.join(", "))
    }
}

/// One line of `--json`: the fields in the order a reader looks for them.
#[derive(serde::Serialize)]
struct Json<'a> {
    key: &'a str,
    leader: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    encoding: Option<&'static str>,
    /// Null when the store gives no fences; absent when nobody leads.
    #[serde(skip_serializing_if = "Option::is_none")]
    term: Option<Option<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_left_ms: Option<Option<u64>>,
}

/// One reading as a line of `--json`.
fn json(key: &str, now: Option<&Leader>) -> String {
    let line = match now {
        None => Json {
            key,
            leader: None,
            encoding: None,
            term: None,
            lease_left_ms: None,
        },
        Some(l) => {
            let (value, encoding) = match l.value_str() {
                Some(v) => (v.to_owned(), "utf8"),
                None => (hex(&l.value), "hex"),
            };
            Json {
                key,
                leader: Some(value),
                encoding: Some(encoding),
                term: Some(l.term.map(|t| t.0)),
                lease_left_ms: Some(
                    l.lease_left
                        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                ),
            }
        }
    };
    // Strings and numbers only: serializing cannot fail.
    serde_json::to_string(&line).unwrap_or_default()
}

/// A value that is not UTF-8, as lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
