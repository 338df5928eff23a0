//! The parts of the `lockwright` command that other workspace tools share
//! with it, so they mean the same thing. Not a stable API: the command is
//! the product; this library exists for `lockwright-bench`.

pub mod timing;
