//! Redis backend for locksmith: `SET NX PX` with an owner token, a reentrant
//! hash scheme and Redlock. Not implemented yet; the crate exists so the
//! workspace layout is the one the design names.
