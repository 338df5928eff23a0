//! Names: any non-empty UTF-8 key up to the limit is a lock of its own;
//! keys are case-sensitive, and awkward ones (slashes, spaces, quotes,
//! control characters, emoji, long ones) never share a lock.

use anyhow::{Context, Result};
use lockwright_core::{LockKey, OwnerToken, MAX_KEY_LEN};

use super::{acquired, contended, key, LONG_TTL};
use crate::Harness;

/// Keys differing only in case are different locks.
pub async fn keys_are_case_sensitive(h: &dyn Harness) -> Result<()> {
    let (a, b) = (h.client().await, h.client().await);
    let upper = key("keys_are_case_sensitive", "Key");
    let lower = key("keys_are_case_sensitive", "key");
    acquired(&*a, &upper, &OwnerToken::generate(), LONG_TTL).await?;
    acquired(&*b, &lower, &OwnerToken::generate(), LONG_TTL)
        .await
        .context("\"key\" collided with \"Key\"")?;
    Ok(())
}

/// Awkward keys are accepted, and no two of them share a lock.
pub async fn tricky_keys_are_distinct(h: &dyn Harness) -> Result<()> {
    let (a, b) = (h.client().await, h.client().await);
    let base = key("tricky_keys_are_distinct", "").as_str().to_owned();
    let max_tail = MAX_KEY_LEN - base.len();
    let long_x = "x".repeat(max_tail);
    let mut long_y = "x".repeat(max_tail - 1);
    long_y.push('y');
    let names: Vec<String> = vec![
        "/".into(),
        "a/b".into(),
        "a b".into(),
        "a b ".into(),
        "'".into(),
        "\"".into(),
        "''".into(),
        "..".into(),
        "../..".into(),
        "\\".into(),
        "%".into(),
        "_".into(),
        "a%".into(),
        "a_".into(),
        "\t\u{1}\u{7f}".into(),
        "\n".into(),
        "🔒".into(),
        "e\u{301}".into(),
        "\u{e9}".into(),
        "Robert'); DROP TABLE locks;--".into(),
        "*".into(),
        "?".into(),
        "{tag}".into(),
        long_x,
        long_y,
    ];
    let mut keys = Vec::new();
    for n in &names {
        let k = LockKey::new(format!("{base}{n}")).with_context(|| format!("key {n:?} refused"))?;
        keys.push(k);
    }
    for k in &keys {
        acquired(&*a, k, &OwnerToken::generate(), LONG_TTL)
            .await
            .with_context(|| format!("{k:?} collided with another key"))?;
    }
    for k in &keys {
        contended(&*b, k, "acquired above").await?;
    }
    Ok(())
}
