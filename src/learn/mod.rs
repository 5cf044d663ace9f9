//! learn (to be written).
