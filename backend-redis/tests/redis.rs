//! The whole conformance suite on one Redis server and on a 5-node Redlock.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use locksmith_conformance::Harness;
use locksmith_core::LockBackend;
use locksmith_redis::{RedisBackend, RedlockBackend};

struct Single;

#[async_trait]
impl Harness for Single {
    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect(&common::redis_url()).unwrap())
    }
    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedisBackend::connect("redis://127.0.0.1:1").unwrap())
    }
}

struct Redlock;

#[async_trait]
impl Harness for Redlock {
    async fn client(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedlockBackend::connect(&common::redlock_url(&common::redlock_ports())).unwrap())
    }
    async fn unreachable_client(&self) -> Arc<dyn LockBackend> {
        Arc::new(RedlockBackend::connect(&common::redlock_url(&[1, 1, 1, 1, 1])).unwrap())
    }
}

mod single {
    locksmith_conformance::conformance_tests!(super::Single);
}

mod redlock {
    locksmith_conformance::conformance_tests!(super::Redlock);
}
