//! The whole conformance suite on one memcached server, and on a quorum of
//! three.

mod common;

mod single {
    lockwright_conformance::conformance_tests!(super::common::McHarness::single());
}

mod quorum {
    lockwright_conformance::conformance_tests!(super::common::McHarness::quorum());
}
