//! The redb tables of the store and the names that errors report.

use redb::TableDefinition;

/// Runs by `run_id`.
pub(crate) const RUNS: TableDefinition<&str, &[u8]> = TableDefinition::new("runs");
/// Checkpoints by `(run_id, seq)`: a run's checkpoints range-scan oldest first.
pub(crate) const CHECKPOINTS: TableDefinition<(&str, u64), &[u8]> =
    TableDefinition::new("checkpoints");
/// The episodic diary by sequence number (append-only).
pub(crate) const DIARY: TableDefinition<u64, &[u8]> = TableDefinition::new("diary");
/// The experience log by sequence number (append-only).
pub(crate) const EXPERIENCE: TableDefinition<u64, &[u8]> = TableDefinition::new("experience");
/// Results of idempotent tool calls by idempotency key.
pub(crate) const IDEMPOTENCY: TableDefinition<&str, &[u8]> = TableDefinition::new("idempotency");
/// The runs not yet in a terminal state, by `run_id` (a set: the run record holds the rest):
/// what a restart resumes, without a scan of every run ever kept.
pub(crate) const OPEN_RUNS: TableDefinition<&str, ()> = TableDefinition::new("open_runs");
/// The store's counters (next sequence numbers); plain `u64`, not envelopes.
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

/// Meta key of the next diary sequence number.
pub(crate) const NEXT_DIARY: &str = "next_diary_seq";
/// Meta key of the next experience sequence number.
pub(crate) const NEXT_EXPERIENCE: &str = "next_experience_seq";
/// Meta key of the next checkpoint sequence number.
pub(crate) const NEXT_CHECKPOINT: &str = "next_checkpoint_seq";

/// Meta key set once the open-runs index holds every unfinished run (a store written by an
/// earlier build gets the index built at its first open).
pub(crate) const OPEN_RUNS_INDEXED: &str = "open_runs_indexed";

/// Prefix of the redb table that holds a [`KvTable`]'s records.
pub(crate) const KV_PREFIX: &str = "kv.";

/// A named table of generic records, declared by any module:
/// `const POSTERIORS: KvTable = KvTable::new("posteriors");`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KvTable(&'static str);

impl KvTable {
    /// A table called `name` (stored as the redb table `kv.<name>`).
    pub const fn new(name: &'static str) -> KvTable {
        KvTable(name)
    }

    /// The name given to [`KvTable::new`].
    pub fn name(self) -> &'static str {
        self.0
    }

    /// The name of the redb table that holds it.
    pub(crate) fn redb_name(self) -> String {
        format!("{KV_PREFIX}{}", self.0)
    }
}

/// The key of a checkpoint, as errors report it: `run_id#seq`.
pub(crate) fn checkpoint_key(run_id: &str, seq: u64) -> String {
    format!("{run_id}#{seq}")
}
