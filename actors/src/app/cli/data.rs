//! The data directory: opening its database for a command, and printing times.

use std::path::Path;

use hindsight::store::{FILE_NAME, Store, StoreOptions};

use super::Failure;

/// Opens the database of an existing data directory (commands that read or maintain it must
/// not silently create an empty one).
pub fn open_existing(data: &Path, options: StoreOptions) -> Result<Store, Failure> {
    let file = data.join(FILE_NAME);
    if !file.is_file() {
        return Err(Failure::new(format!(
            "there is no database at {}: pass --data DIR naming a hindsight data directory",
            file.display()
        )));
    }
    open(data, options)
}

/// Opens (creating if needed) the database of a data directory (one another process holds is
/// refused in words by the store itself).
pub fn open(data: &Path, options: StoreOptions) -> Result<Store, Failure> {
    Store::open(data, options).map_err(Failure::from)
}

/// `ms` since the Unix epoch as an RFC 3339 UTC time, `2026-11-22T01:50:00.123Z`.
pub fn format_time(ms: u64) -> String {
    hindsight_actors::app::report::format_time(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        assert_eq!(format_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_time(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(format_time(1_795_311_000_000), "2026-11-22T01:30:00.000Z");
    }

    #[test]
    fn a_missing_database_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = open_existing(dir.path(), StoreOptions::default()).unwrap_err();
        assert!(err.to_string().contains("hindsight.redb"), "{err}");
    }
}
