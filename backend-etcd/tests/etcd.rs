//! The whole conformance suite on a single etcd member.

mod common;

mod conformance {
    locksmith_conformance::conformance_tests!(super::common::EtcdHarness::new("/locksmith-test"));
}
