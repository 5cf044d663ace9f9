//! fit_window: the newest experiences as the ranker's fit reads them (first-attempt log
//! records), kept by the planner as it learns them, so that a fit every
//! [`DistillConfig::every`] experiences does not read and decode the newest
//! [`DistillConfig::window`] rows of the experience log again.
//!
//! [`DistillConfig::every`]: crate::learn::distill::DistillConfig::every
//! [`DistillConfig::window`]: crate::learn::distill::DistillConfig::window

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::ExperienceTuple;
use crate::learn::bandit::RewardParams;
use crate::learn::ope::{LogRecord, Objective};

/// The usable log records of the experiences after some sequence number, by sequence number.
#[derive(Debug, Clone, Default)]
pub struct FitWindow {
    records: BTreeMap<u64, Arc<LogRecord>>,
    /// Whether it holds every experience of the log after [`FitWindow::from`]: it was filled
    /// from the log once, and has been given every experience since. Until then a fit reads
    /// the log.
    complete: bool,
    /// The experiences at or before this are dropped.
    from: u64,
}

impl FitWindow {
    /// Keeps experience `seq`'s record, when it is usable and after the window's start.
    pub fn insert(&mut self, seq: u64, exp: &ExperienceTuple, reward: &RewardParams) {
        if seq <= self.from {
            return;
        }
        if let Some(r) = LogRecord::for_objective(exp, Objective::FirstAttempt, reward) {
            self.records.insert(seq, Arc::new(r));
        }
    }

    /// Starts the window after experience `from`: what is at or before it is dropped.
    pub fn start_after(&mut self, from: u64) {
        if from > self.from {
            self.from = from;
            self.records = self.records.split_off(&(from + 1));
        }
    }

    /// Whether it holds every experience of the log after `from`.
    pub fn covers(&self, from: u64) -> bool {
        self.complete && from >= self.from
    }

    /// A complete window of the experiences of the log after `from`, read from the log.
    pub fn read<'a>(
        from: u64,
        rows: impl IntoIterator<Item = (u64, &'a ExperienceTuple)>,
        reward: &RewardParams,
    ) -> FitWindow {
        let mut window = FitWindow {
            from,
            ..FitWindow::default()
        };
        for (seq, exp) in rows {
            window.insert(seq, exp, reward);
        }
        window.complete = true;
        window
    }

    /// Takes in a window read from the log ([`FitWindow::read`]): its records after this
    /// window's start that this one lacks; from then on this one is complete.
    pub fn merge(&mut self, read: FitWindow) {
        for (seq, r) in read.records.range(self.from.saturating_add(1)..) {
            self.records.entry(*seq).or_insert_with(|| Arc::clone(r));
        }
        self.complete = true;
    }

    /// The records after `from`, oldest first.
    pub fn after(&self, from: u64) -> Vec<Arc<LogRecord>> {
        self.records
            .range(from.saturating_add(1)..)
            .map(|(_, r)| Arc::clone(r))
            .collect()
    }

    /// How many records it holds.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether it holds no record.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}
