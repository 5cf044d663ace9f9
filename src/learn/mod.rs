//! learn (to be written).

pub mod adaptive;
pub mod reflector;
