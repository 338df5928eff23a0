//! The whole conformance suite on MariaDB/MySQL, in lease and in session mode.
#![cfg(feature = "mysql")]

mod common;

use common::ServerHarness;
use locksmith_sql::Dialect;

mod lease {
    locksmith_conformance::conformance_tests!(super::ServerHarness::new(super::Dialect::MySql, ""));
}

mod session {
    locksmith_conformance::conformance_tests!(super::ServerHarness::new(
        super::Dialect::MySql,
        "mode=session"
    ));
}
