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
    /// Whether it holds every experience of the log after `from`: it was filled from the log
    /// once, and has been given every experience since. Until then a fit reads the log.
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

    /// Usable experiences held.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether it holds no experience.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
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

    /// Takes in a window read from the log ([`FitWindow::read`]): this one starts where the
    /// later of the two starts, takes the read's records it lacks, and from then on is
    /// complete (it holds every experience after its start).
    pub fn merge(&mut self, read: FitWindow) {
        self.start_after(read.from);
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{ArmChoice, RunResult, RunState};

    /// Experience `seq`: one stage, valid on its first attempt (a usable record); or, when
    /// `usable` is false, without arms (not a record).
    fn experience(seq: u64, usable: bool) -> ExperienceTuple {
        let mut step = crate::taxonomy::Step::default();
        for (k, v) in [
            ("attempt", serde_json::json!(0)),
            ("stage", serde_json::json!("a")),
            ("outcome", serde_json::json!("valid")),
        ] {
            step.metadata.insert(k.into(), v);
        }
        ExperienceTuple {
            run_id: format!("run-{seq}"),
            task_id: format!("task-{seq}"),
            plan_id: "p".into(),
            user_id: None,
            context_features: [("k".to_string(), format!("v{seq}"))].into_iter().collect(),
            arms: if usable {
                vec![ArmChoice {
                    stage: "a".into(),
                    tool: "t".into(),
                    strategy: "x".into(),
                    propensity: 0.5,
                }]
            } else {
                Vec::new()
            },
            steps: vec![step],
            result: RunResult {
                state: RunState::Succeeded,
                passed: true,
                output: None,
                latency_ms: 1.0,
                cost: 0.0,
                attempts: 1,
            },
            reward: 0.7,
            user_feedback: None,
            time_ms: 0,
        }
    }

    fn seqs(window: &FitWindow, from: u64) -> Vec<String> {
        window
            .after(from)
            .iter()
            .map(|r| r.context["k"].clone())
            .collect()
    }

    #[test]
    fn a_window_keeps_the_usable_records_after_its_start_and_is_complete_once_read() {
        let reward = RewardParams::default();
        let mut window = FitWindow::default();
        for seq in 1..=6 {
            window.insert(seq, &experience(seq, seq != 4), &reward);
        }
        assert_eq!(seqs(&window, 0), ["v1", "v2", "v3", "v5", "v6"]);
        assert!(!window.covers(0), "not read from the log yet");
        window.start_after(2);
        assert_eq!(seqs(&window, 0), ["v3", "v5", "v6"]);
        // Inserting at or before the start keeps nothing.
        window.insert(2, &experience(2, true), &reward);
        assert_eq!(window.after(0).len(), 3);

        // The log read after 1 (rows 2..=7, the 7th not yet given to the window): what the
        // window lacks after its own start is taken in; from then on it covers its start.
        let rows: Vec<(u64, ExperienceTuple)> = (2..=7)
            .map(|seq| (seq, experience(seq, seq != 4)))
            .collect();
        let read = FitWindow::read(1, rows.iter().map(|(s, e)| (*s, e)), &reward);
        window.merge(read);
        assert_eq!(seqs(&window, 0), ["v3", "v5", "v6", "v7"]);
        assert!(window.covers(2) && window.covers(5));
        assert!(!window.covers(1), "the window starts after 2");
    }
}
