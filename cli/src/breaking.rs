//! `lockwright break`: an operator's forced release of one stuck holder,
//! confirmed first, by the id `status` shows.

use std::io::{BufRead, IsTerminal, Write};

use lockwright::{Error, Holder, LockStatus, Result};
use lockwright_cli_kit::exit::{EX_NOINPUT, EX_USAGE};

use crate::args::BreakArgs;
use crate::status::{human, line};

/// `lockwright break`: 0 when the holder is gone, or the exit code that
/// says why it was not broken.
pub(crate) async fn breaking(args: BreakArgs) -> Result<i32> {
    let locker = lockwright::connect_lazy(args.store.shared_url()?).await?;
    let code = break_one(&locker, &args).await;
    locker.close().await?;
    code
}

async fn break_one(locker: &lockwright::Locker, args: &BreakArgs) -> Result<i32> {
    let key = args.key.as_str();
    let status = locker.status(key).await?;
    let holders = status.each_holder();
    if holders.iter().any(|h| h.id.is_none()) {
        return Err(unnamed());
    }
    let target = match (&args.holder, holders.as_slice()) {
        // Whoever was named holds nothing now either: the goal is met.
        (_, []) => {
            println!("{key:?}: free, nothing to break");
            return Ok(0);
        }
        (None, [one]) => one.clone(),
        (None, several) => {
            eprintln!(
                "lockwright: {key:?} has {} holders; name one with --holder:\n{}",
                several.len(),
                line(key, &status)
            );
            return Ok(EX_USAGE);
        }
        (Some(id), listed) => match listed.iter().find(|h| h.id.as_deref() == Some(id)) {
            Some(h) => h.clone(),
            None => {
                eprintln!(
                    "lockwright: no holder of {key:?} has the id {id:?}; it holds now:\n{}",
                    line(key, &status)
                );
                return Ok(EX_NOINPUT);
            }
        },
    };
    let Some(id) = target.id.clone() else {
        return Err(unnamed());
    };
    if !args.yes && !confirmed(key, &id, &target, &status)? {
        eprintln!("lockwright: not broken");
        return Ok(1);
    }
    if locker.force_release(key, &id).await? {
        println!("broke holder {id} of {key:?}");
    } else {
        println!("holder {id} of {key:?} was already gone");
    }
    // What holds now, if it can be read: the break stands either way.
    match locker.status(key).await {
        Ok(now) => println!("{}", line(key, &now)),
        Err(e) => eprintln!("lockwright: the status after the break: {}", e.chain()),
    }
    Ok(0)
}

/// The error for a store that holds without naming its holders.
fn unnamed() -> Error {
    Error::new(
        lockwright::ErrorKind::Unsupported,
        "this store does not name a lock's holders (SQL's ?mode=session holds by \
         connection: end that connection to free it)",
    )
}

/// Asks on the terminal; refuses outright when stdin is not one, as a
/// script that meant to break must say `--yes`.
fn confirmed(key: &str, id: &str, holder: &Holder, status: &LockStatus) -> Result<bool> {
    if !std::io::stdin().is_terminal() {
        return Err(Error::config(
            "break asks for confirmation and stdin is not a terminal: pass --yes",
        ));
    }
    let mut about = String::new();
    if let Some(f) = holder.fence {
        about.push_str(&format!(", fence {f}"));
    }
    if let Some(left) = holder.remaining {
        about.push_str(&format!(", {} left", human(left)));
    }
    if let Some(w) = status.waiters.filter(|w| *w > 0) {
        about.push_str(&format!(", {w} queued"));
    }
    eprint!(
        "Break holder {id} of {key:?}{about}? Its next renewal fails and a `lockwright run` \
         holding it stops its command. [y/N] "
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Error::config(format!("reading the answer: {e}")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}
