//! locksmith facade (being written).
