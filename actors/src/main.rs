//! The `hindsight` binary.
fn main() {}
