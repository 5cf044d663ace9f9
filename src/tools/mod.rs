//! tools (to be written).
