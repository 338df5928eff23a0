//! The whole conformance suite on one Redis server and on a 5-node Redlock.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use lockwright_conformance::kit::servers::{redis_url, redlock_ports};
use lockwright_conformance::Harness;
use lockwright_core::backend::LockBackend;
use lockwright_redis::{RedisBackend, RedlockBackend};

struct Single;

#[async_trait]
impl Harness for Single {
    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect(&redis_url()).unwrap())
    }
    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect("redis://127.0.0.1:1").unwrap())
    }
    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        let keys = common::scan(&redis_url(), &common::names_pattern(prefix)).await;
        Ok(keys.len() as u64)
    }
}

struct Redlock;

#[async_trait]
impl Harness for Redlock {
    async fn client(&self) -> Arc<dyn LockBackend> {
        // A per-node budget above the 100 ms default: each case's clients
        // connect inside their first request's budget, and on a loaded
        // 2-core CI host all five nodes once missed 100 ms together. The
        // cases adapt to the larger minimum TTL this gives; the quorum
        // tests keep the default.
        let url = format!("{}?timeout=250ms", common::redlock_url(&redlock_ports()));
        Arc::new(RedlockBackend::connect(&url).unwrap())
    }
    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedlockBackend::connect(&common::redlock_url(&[1, 1, 1, 1, 1])).unwrap())
    }
    async fn stored_names(&self, prefix: &str) -> anyhow::Result<u64> {
        let mut most = 0;
        for port in redlock_ports() {
            let url = format!("redis://127.0.0.1:{port}");
            let keys = common::scan(&url, &common::names_pattern(prefix)).await;
            most = most.max(keys.len() as u64);
        }
        Ok(most)
    }
}

mod single {
    lockwright_conformance::conformance_tests!(super::Single);
}

mod redlock {
    lockwright_conformance::conformance_tests!(super::Redlock);
}
