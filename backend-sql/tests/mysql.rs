//! The whole conformance suite on MariaDB/MySQL, in lease and in session mode.
#![cfg(feature = "mysql")]

mod common;

use common::ServerHarness;
use lockwright_sql::Dialect;

mod lease {
    lockwright_conformance::conformance_tests!(super::ServerHarness::new(
        super::Dialect::MySql,
        ""
    ));
}

mod session {
    lockwright_conformance::conformance_tests!(super::ServerHarness::new(
        super::Dialect::MySql,
        "mode=session"
    ));
}

#[tokio::test]
async fn a_lone_permit_moves_out_when_the_group_grows() {
    let url = common::server_url(Dialect::MySql);
    common::a_lone_permit_moves_out_when_the_group_grows(&url).await;
}
