//! The test kit (cargo feature `kit`): what every backend's tests need
//! beside the suite, in one place instead of a copy per crate.
//!
//! - [`servers`]: where the test servers are, by one rule, with their
//!   ports from `scripts/ports.env`, the file `scripts/servers.sh` starts
//!   them from;
//! - [`fault_server`]: stopping and starting the private servers of the
//!   outage tests;
//! - [`process`]: a server process of a test's own, killed with the test;
//! - [`proxy`]: a TCP proxy that cuts or mutes a client's links;
//! - [`clients`]: the typed clients behind a harness's trait objects;
//! - [`forwarding`]: proof that a wrapper forwards every method it should;
//! - [`members`]: the leader-loss and majority-loss scenario of a 3-member group;
//! - [`observe`]: election changes heard by a store's notice, not its poll;
//! - [`tls`]: a private CA and its certificates, for TLS servers;
//! - [`values`]: leader values a store could mangle;
//! - below: names no other run shares, free ports, URL pieces.
//!
//! A backend's tests take it as a dev-dependency:
//! `lockwright-conformance = { workspace = true, features = ["kit"] }`.

pub mod clients;
pub mod etcdctl;
pub mod fault_server;
pub mod forwarding;
pub mod members;
pub mod observe;
pub mod outage;
pub mod process;
pub mod proxy;
pub mod servers;
pub mod tls;
pub mod values;

/// A prefix no other test run shares (process id and clock), ending in
/// `:`, for keys and key prefixes on a shared server.
pub fn unique_prefix() -> String {
    format!("lst-{}:", unique_id())
}

/// `<process id>-<nanoseconds since the epoch>`: a name no other run
/// shares, for paths and tables on a shared server.
pub fn unique_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is past 1970")
        .as_nanos();
    format!("{}-{nanos}", std::process::id())
}

/// A loopback port nothing listens on now, for a server of a test's own.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// `url` with `params` (`a=1&b=2`) appended to its query, which it may
/// already have.
pub fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// The `host:port` list of a URL: between `://` (and any credentials) and
/// the path or query.
///
/// # Panics
/// If `url` has no `://`.
pub fn hosts_of(url: &str) -> String {
    // The port only fills hosts written without one, which are not read here.
    let url = lockwright_core::backend::ServerUrl::parse(url, 1).expect("a server URL");
    url.authority().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_pieces() {
        assert_eq!(with_params("redis://h", "a=1"), "redis://h?a=1");
        assert_eq!(with_params("redis://h?a=1", "b=2"), "redis://h?a=1&b=2");
        assert_eq!(hosts_of("zk://h1:1,h2:2/root?x=1"), "h1:1,h2:2");
        assert_eq!(hosts_of("zk://u:p@h:1"), "h:1");
        assert_ne!(unique_prefix(), unique_prefix());
    }
}
