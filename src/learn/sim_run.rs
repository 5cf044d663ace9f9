//! sim_run (in progress).
