//! guard (to be written).
