//! The whole conformance suite on PostgreSQL, in lease and in session mode.
#![cfg(feature = "postgres")]

mod common;

use common::ServerHarness;
use locksmith_sql::Dialect;

mod lease {
    locksmith_conformance::conformance_tests!(super::ServerHarness::new(
        super::Dialect::Postgres,
        ""
    ));
}

mod session {
    locksmith_conformance::conformance_tests!(super::ServerHarness::new(
        super::Dialect::Postgres,
        "mode=session"
    ));
}
