//! triage (to be written).
