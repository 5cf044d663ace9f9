//! Reflector: to be written.
