//! The in-memory reference backend passes the whole suite.

use lockwright_conformance::MemoryHarness;

mod conformance {
    lockwright_conformance::conformance_tests!(super::MemoryHarness::new());
}
