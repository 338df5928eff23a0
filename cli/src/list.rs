//! `lockwright list`: every lock, semaphore, read-write lock and election
//! held under a prefix, read only.

use lockwright::Result;

use crate::args::ListArgs;
use crate::status::{json, line};

/// `lockwright list`: 0 whether anything is held or not, or the error that
/// ended it.
pub(crate) async fn list(args: ListArgs) -> Result<i32> {
    // Lazy, as status: a listing must not create the lease table.
    let locker = lockwright::connect_lazy(args.store.shared_url()?).await?;
    let held = locker.list(&args.prefix).await;
    locker.close().await?;
    let held = held?;
    if args.json {
        let all: Vec<serde_json::Value> = held.iter().map(|(k, s)| json(k.as_str(), s)).collect();
        println!("{}", serde_json::Value::Array(all));
    } else if held.is_empty() {
        println!("no lock is held under {:?}", args.prefix);
    } else {
        for (k, s) in &held {
            println!("{}", line(k.as_str(), s));
        }
    }
    Ok(0)
}
