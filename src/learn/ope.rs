//! ope (in progress).
