//! memcached backend for locksmith: `add` with exptime and owner-checked
//! release through `gets` + `cas`. Not implemented yet; the crate exists so
//! the workspace layout is the one the design names.
