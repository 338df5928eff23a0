//! ZooKeeper backend for locksmith: ephemeral sequential nodes, watching
//! only the predecessor. Not implemented yet; the crate exists so the
//! workspace layout is the one the design names.
