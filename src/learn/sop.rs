//! sop (in progress).
