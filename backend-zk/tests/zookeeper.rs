//! The whole conformance suite on a standalone ZooKeeper server.

mod common;

mod conformance {
    locksmith_conformance::conformance_tests!(super::common::ZkHarness::new("/locksmith-test"));
}
