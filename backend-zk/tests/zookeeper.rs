//! The whole conformance suite on a standalone ZooKeeper server.

mod common;

mod conformance {
    lockwright_conformance::conformance_tests!(super::common::ZkHarness::new("/lockwright-test"));
}
