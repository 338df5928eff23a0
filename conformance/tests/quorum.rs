//! The generic quorum combinator passes the whole suite over three
//! in-memory stores, one of them down throughout (its clients offering no
//! permits or shared holds, which over three nodes need all three), and
//! over five, one down, with everything.

use lockwright_conformance::QuorumHarness;

mod conformance {
    lockwright_conformance::conformance_tests!(super::QuorumHarness::new());
}

mod five {
    lockwright_conformance::conformance_tests!(super::QuorumHarness::five());
}
