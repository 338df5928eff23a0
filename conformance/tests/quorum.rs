//! The generic quorum combinator passes the whole suite over three
//! in-memory stores, one of them down throughout.

use locksmith_conformance::QuorumHarness;

mod conformance {
    locksmith_conformance::conformance_tests!(super::QuorumHarness::new());
}
