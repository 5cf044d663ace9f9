//! stats (in progress).
