//! The registry: which backend crate answers a URL's scheme. The stores
//! of this repository are listed once, each behind its cargo feature; an
//! application adds its own with [`register`], and `connect(url)` and the
//! command then reach it the same way. Each crate declares its schemes
//! and opener itself (its `DRIVER`); nothing here knows a store's URLs.

use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use lockwright_core::backend::{
    scheme_of, Driver, LockBackend, MemoryBackend, RedactedUrl, Scheme, ServerUrl,
};

use lockwright_core::{Error, ErrorKind, Result};

/// One store this repository has, built in or not: the list maps a scheme
/// to the cargo feature that builds its crate in, so that a URL for a
/// store left out gets "enable feature X", not "unknown scheme".
struct Known {
    store: &'static str,
    schemes: &'static [&'static str],
    /// The cargo feature of this crate (empty: always there).
    feature: &'static str,
    driver: Option<Driver>,
}

const MEMORY: Driver = Driver::new(&[Scheme::new("memory", "in-process memory", None)], |_| {
    Ok(Arc::new(MemoryBackend::new()))
});

/// One line of [`KNOWN`]: a store of this repository, its schemes, and
/// the cargo feature that builds its crate in (whose `DRIVER` it then is).
macro_rules! known {
    ($store:literal, [$($scheme:literal),+], $feature:literal, $krate:ident) => {
        Known {
            store: $store,
            schemes: &[$($scheme),+],
            feature: $feature,
            driver: {
                #[cfg(feature = $feature)]
                let driver = Some($krate::DRIVER);
                #[cfg(not(feature = $feature))]
                let driver = None;
                driver
            },
        }
    };
}

/// Every store of this repository. Adding a store adds one line here
/// (and its feature in Cargo.toml).
#[rustfmt::skip]
const KNOWN: &[Known] = &[
    Known { store: "in-process memory", schemes: &["memory"], feature: "", driver: Some(MEMORY) },
    known!("SQLite", ["sqlite"], "sqlite", lockwright_sql),
    known!("PostgreSQL", ["postgres", "postgresql"], "postgres", lockwright_sql),
    known!("MySQL/MariaDB", ["mysql", "mariadb"], "mysql", lockwright_sql),
    known!("Redis", ["redis", "rediss", "redis+unix", "unix"], "redis", lockwright_redis),
    known!("Redlock", ["redis+redlock"], "redis", lockwright_redis),
    known!("Redis Sentinel", ["redis+sentinel", "rediss+sentinel"], "redis", lockwright_redis),
    known!("Redis Cluster", ["redis+cluster", "rediss+cluster"], "redis", lockwright_redis),
    known!("memcached", ["memcache", "memcached", "memcaches"], "memcached", lockwright_memcached),
    known!("ZooKeeper", ["zk", "zookeeper"], "zookeeper", lockwright_zk),
    known!("etcd", ["etcd", "etcds"], "etcd", lockwright_etcd),
];

/// The drivers an application registered, looked at before the built-in ones.
static REGISTERED: RwLock<Vec<Driver>> = RwLock::new(Vec::new());

/// The registered drivers, to read. A registration that panicked (it
/// cannot: it checks before it pushes) would leave the list whole, so a
/// poisoned lock is read as it stands.
fn registered() -> RwLockReadGuard<'static, Vec<Driver>> {
    REGISTERED.read().unwrap_or_else(PoisonError::into_inner)
}

/// Adds a backend written outside this repository: from now on
/// [`connect`](crate::connect), [`open`] and a build of the `lockwright`
/// command that calls this first accept the schemes `driver` declares.
///
/// ```
/// use std::sync::Arc;
/// use lockwright::backend::{Driver, MemoryBackend, Scheme};
///
/// const MINE: Driver = Driver::new(
///     &[Scheme::new("mine", "my store", None)],
///     |_url| Ok(Arc::new(MemoryBackend::new())),
/// );
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockwright::Result<()> {
/// lockwright::backend::register(MINE)?;
/// let locker = lockwright::connect("mine://anything").await?;
/// # locker.close().await?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// `Config` for a driver without schemes, a scheme that no URL could name
/// (it starts with a lowercase letter, then lowercase letters, digits, `+`,
/// `-`, `.`), one named twice, or one already answered: by a store built
/// into this binary, or by a driver registered before. (A scheme of this
/// repository's stores whose feature is off may be taken.)
pub fn register(driver: Driver) -> Result<()> {
    let mut registered = REGISTERED.write().unwrap_or_else(PoisonError::into_inner);
    if driver.schemes().is_empty() {
        return Err(Error::config("cannot register a driver without a scheme"));
    }
    for (i, scheme) in driver.schemes().iter().enumerate() {
        let name = scheme.name;
        // What `scheme_of` reads a URL's scheme as, so that it can be reached.
        let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.".contains(&b));
        if !valid {
            return Err(Error::config(format!(
                "cannot register scheme {name:?}: a scheme is a lowercase letter, then \
                 lowercase letters, digits, `+`, `-` and `.`"
            )));
        }
        if driver.schemes()[..i].iter().any(|s| s.name == name) {
            return Err(Error::config(format!(
                "cannot register scheme {name:?}: the driver names it twice"
            )));
        }
        let built_in = KNOWN
            .iter()
            .find(|k| k.driver.is_some() && k.schemes.contains(&name));
        if let Some(k) = built_in {
            return Err(Error::config(format!(
                "cannot register scheme {name:?}: it is {}'s, built into this binary",
                k.store
            )));
        }
        if registered.iter().any(|d| d.scheme(name).is_some()) {
            return Err(Error::config(format!(
                "cannot register scheme {name:?}: a driver registered before answers to it"
            )));
        }
    }
    registered.push(driver);
    Ok(())
}

/// The scheme `url` names and the driver that answers it: a registered
/// one, or one built in.
///
/// # Errors
/// `Config` for text that is not a URL, an unknown scheme, or a store of
/// this repository whose cargo feature is off (the message names it).
pub fn driver(url: &str) -> Result<(Scheme, Driver)> {
    let name = scheme_of(url)?;
    let shown = RedactedUrl::new(url);
    {
        let registered = registered();
        if let Some((s, d)) = registered
            .iter()
            .find_map(|d| Some((*d.scheme(&name)?, *d)))
        {
            return Ok((s, d));
        }
    }
    let Some(known) = KNOWN.iter().find(|k| k.schemes.contains(&name.as_str())) else {
        let mut all: Vec<&str> = KNOWN.iter().flat_map(|k| k.schemes).copied().collect();
        let registered = registered();
        all.extend(registered.iter().flat_map(|d| d.schemes()).map(|s| s.name));
        return Err(Error::config(format!(
            "{shown}: unknown scheme {name:?}; known: {}",
            all.join(", ")
        )));
    };
    known
        .driver
        .and_then(|d| Some((*d.scheme(&name)?, d)))
        .ok_or_else(|| {
            Error::config(format!(
                "{shown}: {} support is not compiled in; enable cargo feature `{}`",
                known.store, known.feature
            ))
        })
}

/// What a URL's scheme names: the store, and the port of a server
/// written without one.
///
/// ```
/// let s = lockwright::backend::scheme("memory://").unwrap();
/// assert_eq!((s.store, s.default_port), ("in-process memory", None));
/// assert!(lockwright::backend::scheme("ftp://h").is_err());
/// ```
///
/// # Errors
/// As [`driver`].
pub fn scheme(url: &str) -> Result<Scheme> {
    driver(url).map(|(scheme, _)| scheme)
}

/// Fails the deployment `url` names over to a replica and waits until
/// the new primary serves; says which node took over from which. Only a
/// store whose driver has the hook ([`Driver::with_failover`]; here,
/// Redis under Sentinel and a Redis Cluster). It changes the deployment:
/// `lockwright check --faults …,failover` makes failovers with it only
/// when asked.
///
/// # Errors
/// As [`scheme`]; `Unsupported` for a store without the hook;
/// `Unavailable` when no failover could be made, or it did not finish
/// within a minute.
pub async fn failover(url: &str) -> Result<String> {
    let (scheme, driver) = driver(url)?;
    match driver.failover() {
        Some(fail_over) => fail_over(url.to_owned()).await,
        None => Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "{}: no failover to make on {}",
                RedactedUrl::new(url),
                scheme.store
            ),
        )),
    }
}

/// Checks the store `url` names, through `backend` opened on it
/// ([`LockBackend::verify`]); a failure that a server of another kind
/// explains (a `memcache://` URL pointed at Redis) is a `Config` error
/// naming what answered, since no retry mends it.
///
/// # Errors
/// As [`LockBackend::verify`], or `Config` as said.
pub async fn verify(url: &str, backend: &dyn LockBackend) -> Result<()> {
    let Err(e) = backend.verify().await else {
        return Ok(());
    };
    if matches!(e.kind(), ErrorKind::Config | ErrorKind::InvalidOptions) {
        return Err(e);
    }
    // Only this repository's stores are told apart by what answers: a
    // registered store may speak any protocol under a name of its own.
    let Ok(scheme) = scheme(url) else {
        return Err(e);
    };
    if !KNOWN.iter().any(|k| k.schemes.contains(&scheme.name)) {
        return Err(e);
    }
    let first = scheme
        .default_port
        .and_then(|port| ServerUrl::parse(url, port).ok())
        .and_then(|u| u.hosts().first().cloned());
    let Some(first) = first else {
        return Err(e);
    };
    match crate::identify::identify(first.host(), first.port()).await {
        Some(what) if !what.serves(scheme.store) => Err(Error::config(format!(
            "{}:{} answered as {}, not {}",
            first.host(),
            first.port(),
            what.name(),
            scheme.store
        ))
        .with_source(e)),
        _ => Err(e),
    }
}

/// Opens the backend a URL names, without a [`Locker`](crate::Locker) on top.
///
/// # Errors
/// As [`scheme`], then `Config`/`InvalidOptions` for what the backend
/// refuses in the URL. Nothing is sent to the store yet: call
/// [`LockBackend::verify`] to check it now.
pub async fn open(url: &str) -> Result<Arc<dyn LockBackend>> {
    driver(url)?.1.open(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list's scheme names are the ones each built-in crate declares,
    /// no more and no fewer.
    #[test]
    fn the_registry_matches_what_each_backend_declares() {
        for known in KNOWN {
            let Some(driver) = known.driver else { continue };
            let declared: Vec<&str> = driver
                .schemes()
                .iter()
                .filter(|s| s.store == known.store)
                .map(|s| s.name)
                .collect();
            assert_eq!(declared, known.schemes, "{}", known.store);
        }
        let mut all: Vec<&str> = KNOWN.iter().flat_map(|k| k.schemes).copied().collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a scheme is registered twice");
    }

    /// A built-in scheme cannot be taken over, nor one registered twice.
    #[test]
    fn registration_refuses_a_scheme_already_answered() {
        fn memory(_: &str) -> Result<Arc<dyn LockBackend>> {
            Ok(Arc::new(MemoryBackend::new()))
        }
        const MEMORY_AGAIN: Driver = Driver::new(&[Scheme::new("memory", "x", None)], memory);
        const TWICE: Driver = Driver::new(&[Scheme::new("twice-test", "x", None)], memory);
        const BAD: Driver = Driver::new(&[Scheme::new("Bad Scheme", "x", None)], memory);
        const DIGIT: Driver = Driver::new(&[Scheme::new("9p", "x", None)], memory);
        const NONE: Driver = Driver::new(&[], memory);
        let e = register(MEMORY_AGAIN).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.to_string().contains("built into"), "{e}");
        register(TWICE).unwrap();
        let e = register(TWICE).unwrap_err();
        assert!(e.to_string().contains("registered before"), "{e}");
        for refused in [BAD, DIGIT, NONE] {
            assert_eq!(register(refused).unwrap_err().kind(), ErrorKind::Config);
        }
    }
}
