//! memory (to be written).
