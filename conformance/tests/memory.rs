//! The in-memory reference backend passes the whole suite.

use locksmith_conformance::MemoryHarness;

mod conformance {
    locksmith_conformance::conformance_tests!(super::MemoryHarness::new());
}
