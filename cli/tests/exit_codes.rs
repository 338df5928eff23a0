//! Exit codes mean one thing on every store: 64 for configuration retrying
//! will not fix, 69 only for a store that cannot be reached now. One row per
//! failure and store, through the binary against the real servers, the
//! README's table in test form. No row may print a password.

#![cfg(all(
    unix,
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]

mod common;

use std::process::{Command, Stdio};

use common::BIN;
/// Part of every wrong password; no message may show it.
const SECRET: &str = "PWxyz";

/// `base` (a test server's URL) with the given user, password and database.
fn server_url(base: &str, user: &str, password: &str, db: &str) -> String {
    let u = url::Url::parse(base).expect("a server URL");
    format!(
        "{}://{user}:{password}@{}:{}/{db}",
        u.scheme(),
        u.host_str().unwrap(),
        u.port().unwrap()
    )
}

fn pg(user: &str, password: &str, db: &str) -> String {
    server_url(&common::postgres_url(), user, password, db)
}

fn my(user: &str, password: &str, db: &str) -> String {
    server_url(&common::mysql_url(), user, password, db)
}

use common::{redis_url as redis, redlock_url as redlock};

/// Runs `lockwright run --no-wait` on `url`; its code and stderr.
fn run(url: &str) -> (i32, String) {
    let dir = std::env::temp_dir();
    let o = Command::new(BIN)
        .current_dir(&dir)
        .args([
            "run",
            "--url",
            url,
            "--key",
            "exit-codes",
            "--no-wait",
            "--",
            "true",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("lockwright runs");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn each_failure_has_one_exit_code_on_every_store() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    std::fs::write(dir.path().join("garbage.db"), "this is not a database\n").unwrap();
    let auth = common::PrivateRedis::start(&["--requirepass", "right-password"]);
    let wrong = format!("wrong%2F{SECRET}");
    let rows: Vec<(&str, String, i32)> = vec![
        // Credentials refused.
        (
            "MySQL wrong password",
            my("lockwright", &wrong, "lockwright_test"),
            64,
        ),
        (
            "PostgreSQL unknown role",
            pg("nobody", &wrong, "lockwright_test"),
            64,
        ),
        (
            "Redis wrong password",
            format!("redis://:{wrong}@127.0.0.1:{}", auth.port),
            64,
        ),
        (
            "Redis no password (NOAUTH)",
            format!("redis://127.0.0.1:{}", auth.port),
            64,
        ),
        // A database that does not exist.
        (
            "PostgreSQL unknown database",
            pg("lockwright", "lockwright", "no_such_db"),
            64,
        ),
        (
            "MySQL unknown database",
            my("lockwright", "lockwright", "no_such_db"),
            64,
        ),
        ("Redis database out of range", format!("{}/99", redis()), 64),
        // TLS that cannot be had as asked: the shared server's certificate
        // is not one the system trusts (or it has no TLS at all).
        (
            "PostgreSQL certificate not verified",
            pg(
                "lockwright",
                "lockwright",
                "lockwright_test?sslmode=verify-full",
            ),
            64,
        ),
        (
            "MySQL CA file missing",
            my(
                "lockwright",
                "lockwright",
                "lockwright_test?ssl-mode=verify_ca&ssl-ca=/nonexistent/ca.pem",
            ),
            64,
        ),
        // A quorum refused (the per-node timeout leaves room for the handshake).
        (
            "Redlock database out of range",
            redlock("/99?timeout=2s"),
            64,
        ),
        // A table name the SQL parser refuses.
        (
            "SQLite bad table",
            format!("sqlite://{d}/t.db?table=select"),
            64,
        ),
        (
            "PostgreSQL bad table",
            pg("lockwright", "lockwright", "lockwright_test?table=select"),
            64,
        ),
        (
            "MySQL bad table",
            my("lockwright", "lockwright", "lockwright_test?table=select"),
            64,
        ),
        // A misspelt parameter.
        (
            "SQLite unknown parameter",
            format!("sqlite://{d}/t.db?tabel=x"),
            64,
        ),
        (
            "PostgreSQL unknown parameter",
            pg("lockwright", "lockwright", "lockwright_test?tabel=x"),
            64,
        ),
        (
            "MySQL unknown parameter",
            my("lockwright", "lockwright", "lockwright_test?tabel=x"),
            64,
        ),
        (
            "Redis unknown parameter",
            format!("{}?prefx=app:", redis()),
            64,
        ),
        ("Redis zero timeout", format!("{}?timeout=0s", redis()), 64),
        // Files that cannot be a lock table.
        (
            "SQLite not a database",
            format!("sqlite://{d}/garbage.db"),
            64,
        ),
        (
            "SQLite missing directory",
            format!("sqlite://{d}/no/such/dir/t.db"),
            64,
        ),
        // Not a store another process can share, or not independent nodes.
        ("memory://", "memory://".to_owned(), 64),
        (
            "Redlock with one node thrice",
            "redis+redlock://127.0.0.1:6379,localhost:6379,127.0.0.1:6379".to_owned(),
            64,
        ),
        // Nothing answers: the only 69s.
        (
            "PostgreSQL down",
            format!("postgres://lockwright:{wrong}@127.0.0.1:1/db?connect_timeout=1s"),
            69,
        ),
        (
            "MySQL down",
            format!("mysql://lockwright:{wrong}@127.0.0.1:1/lockwright_test?connect_timeout=1s"),
            69,
        ),
        ("Redis down", format!("redis://:{wrong}@127.0.0.1:1"), 69),
    ];
    let mut failures = Vec::new();
    for (what, url, expected) in rows {
        let (code, stderr) = run(&url);
        if code != expected {
            failures.push(format!(
                "{what}: exit {code}, expected {expected}: {stderr}"
            ));
        }
        if stderr.contains(SECRET) || stderr.contains("wrong") {
            failures.push(format!("{what}: the password shows: {stderr}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Passwords holding reserved URL characters, unescaped, on every server
/// scheme: whatever the outcome, stderr never shows them.
#[test]
fn no_password_shows_on_stderr() {
    const RESERVED: &[u8] = b":/?#[]@!$&'()*+,;=%";
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut failures = Vec::new();
    for case in 0..6 {
        let mut pw = String::from(SECRET);
        for _ in 0..4 {
            pw.insert(
                (next() as usize) % (pw.len() + 1),
                char::from(RESERVED[(next() as usize) % RESERVED.len()]),
            );
        }
        let pw = format!("{pw}{case}");
        for url in [
            format!("postgres://lockwright:{pw}@127.0.0.1:1/db?connect_timeout=200ms"),
            format!("mysql://lockwright:{pw}@127.0.0.1:1/db?connect_timeout=200ms"),
            format!("redis://:{pw}@127.0.0.1:1"),
            format!("redis+redlock://:{pw}@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"),
            format!("postgres://127.0.0.1:1/db?connect_timeout=200ms&password={pw}&x=1"),
            format!("postgres:/lockwright:{pw}@127.0.0.1:1/db"),
            format!("postgres//lockwright:{pw}@127.0.0.1:1/db"),
            format!("lockwright:{pw}@127.0.0.1:1/db"),
            format!("redis:/:{pw}@127.0.0.1:1"),
        ] {
            let (code, stderr) = run(&url);
            // Whatever fragments the password splits into at reserved bytes.
            for piece in pw.split(|c: char| RESERVED.contains(&(c as u8))) {
                if piece.len() >= 3 && stderr.contains(piece) {
                    failures.push(format!("{url:?} (exit {code}) shows {piece:?}: {stderr}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
