//! distill (in progress).
