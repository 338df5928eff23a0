//! The whole conformance suite on a single etcd member.

mod common;

mod conformance {
    lockwright_conformance::conformance_tests!(super::common::EtcdHarness::new("/lockwright-test"));
}
