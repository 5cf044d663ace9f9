//! cycle: a scope's synthesis cycle: the lease that keeps one synthesiser per scope, beginning
//! a synthesis on the failures gathered, completing it (vetting, merging, reinforcing, decaying,
//! capping the lessons; consuming only the failures used) or aborting it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::synth::{self, LessonDraft, OfflineSynthesiser, SynthesisInput, vet_lesson};
use super::{
    AdaptiveError, AdaptiveStrategies, FailureRecord, ScopeState, SynthesisJob, SynthesisReport,
};
use crate::model::cosine;
use crate::model::embed::embed_one;
use crate::record::Lesson;
use crate::taxonomy::Step;

/// A lease on a scope's synthesis: only its owner may complete a synthesis there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The worker holding it.
    pub owner: String,
    /// The job token it was granted with.
    pub token: u64,
    /// When it expires (ms).
    pub expires_ms: u64,
}

/// Check-and-set of a scope's synthesis lease: grants `owner` a lease with `token` unless
/// another owner holds an unexpired one. A caller that keeps the lease as its own record (for
/// example under its own key in the store) calls this with the record it read and writes the
/// result back in the same serialised step.
pub fn acquire_lease(
    scope: &str,
    current: Option<&Lease>,
    owner: &str,
    token: u64,
    now_ms: u64,
    lease_ms: u64,
) -> Result<Lease, AdaptiveError> {
    if let Some(lease) = current
        && lease.owner != owner
        && lease.expires_ms > now_ms
    {
        return Err(AdaptiveError::LeaseHeld {
            scope: scope.to_string(),
            owner: lease.owner.clone(),
            expires_ms: lease.expires_ms,
        });
    }
    Ok(Lease {
        owner: owner.to_string(),
        token,
        expires_ms: now_ms.saturating_add(lease_ms),
    })
}

impl AdaptiveStrategies {
    /// Whether a scope has enough strategy failures for a synthesis.
    pub fn synthesis_due(&self, scope: &str) -> bool {
        self.scope(scope)
            .is_some_and(|s| s.pending_strategy() >= self.state.config.synthesis_threshold)
    }

    /// Starts a synthesis in `scope` for worker `owner`: takes the scope's lease (refused while
    /// another owner holds an unexpired one) and returns the batch (the oldest
    /// `max_failures_per_synthesis` pending failures). The caller persists the snapshot right
    /// after, so a second worker loading the store sees the lease.
    pub fn begin_synthesis(
        &mut self,
        scope: &str,
        owner: &str,
        now_ms: u64,
    ) -> Result<SynthesisJob, AdaptiveError> {
        let threshold = self.state.config.synthesis_threshold;
        let pending = self.scope(scope).map_or(0, ScopeState::pending_strategy);
        if pending < threshold {
            return Err(AdaptiveError::NotDue {
                scope: scope.to_string(),
                pending,
                threshold,
            });
        }
        let current = self.scope(scope).and_then(|s| s.lease.clone());
        let token = self.next_id();
        let lease = acquire_lease(
            scope,
            current.as_ref(),
            owner,
            token,
            now_ms,
            self.state.config.lease_ms,
        )?;
        let max = self.state.config.max_failures_per_synthesis;
        let known_tools: BTreeSet<String> = self
            .scope(scope)
            .map(|s| {
                s.pending
                    .iter()
                    .chain(s.evidence.iter())
                    .map(|f| f.tool.clone())
                    .chain(s.lessons.iter().filter_map(|l| l.tool.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let s = self.scope_mut(scope);
        s.lease = Some(lease);
        let failures: Vec<FailureRecord> = s.pending.iter().take(max).cloned().collect();
        Ok(SynthesisJob {
            owner: owner.to_string(),
            token,
            input: SynthesisInput {
                scope: scope.to_string(),
                failures,
                known_tools,
                lesson_chars: (
                    self.state.config.lesson_min_chars,
                    self.state.config.lesson_max_chars,
                ),
            },
        })
    }

    fn check_lease(&self, job: &SynthesisJob, now_ms: u64) -> Result<(), AdaptiveError> {
        let held = self
            .scope(&job.input.scope)
            .and_then(|s| s.lease.as_ref())
            .is_some_and(|l| l.owner == job.owner && l.token == job.token && l.expires_ms > now_ms);
        if held {
            Ok(())
        } else {
            Err(AdaptiveError::LeaseLost {
                scope: job.input.scope.clone(),
                owner: job.owner.clone(),
                token: job.token,
            })
        }
    }

    /// Gives up a synthesis (for example after a model error): releases the lease if the job
    /// still holds it, consumes nothing.
    pub fn abort_synthesis(&mut self, job: &SynthesisJob, now_ms: u64) {
        if self.check_lease(job, now_ms).is_ok() && self.state.scopes.contains_key(&job.input.scope)
        {
            self.scope_mut(&job.input.scope).lease = None;
        }
    }

    /// Completes a synthesis: refused unless the job still holds the lease. Vets the drafts,
    /// adds new lessons (or reinforces a near-duplicate about the same tool, keeping only the
    /// preconditions both share), decays every lesson not reinforced in
    /// this cycle, removes those below the floor, expired ones and the excess over
    /// `max_strategies`, consumes exactly the batch's failures and releases the lease.
    pub fn complete_synthesis(
        &mut self,
        job: &SynthesisJob,
        drafts: Vec<LessonDraft>,
        now_ms: u64,
    ) -> Result<SynthesisReport, AdaptiveError> {
        self.check_lease(job, now_ms)?;
        let cfg = self.state.config.clone();
        let failing = job.input.failing_tools();
        let mut report = SynthesisReport::default();
        let mut touched: BTreeSet<String> = BTreeSet::new();
        for draft in drafts {
            if let Err(why) = vet_lesson(
                &draft,
                &failing,
                &job.input.known_tools,
                cfg.lesson_min_chars,
                cfg.lesson_max_chars,
            ) {
                report.rejected.push((draft.tool.clone(), why));
                continue;
            }
            let tool_failures: Vec<&FailureRecord> = job
                .input
                .failures
                .iter()
                .filter(|f| f.tool == draft.tool)
                .collect();
            let preconditions = if draft.preconditions.is_empty() {
                synth::common_features(tool_failures.iter().copied())
            } else {
                draft.preconditions.clone()
            };
            let mut evidence: Vec<String> =
                tool_failures.iter().map(|f| f.run_id.clone()).collect();
            evidence.sort();
            evidence.dedup();
            let text = draft.lesson.trim().to_string();
            let vector = embed_one(&text);
            let id = self.next_id();
            let s = self.scope_mut(&job.input.scope);
            // The same lesson about the same tool, whatever conditions its failures shared:
            // one cause is one lesson, its conditions those every failure of it shared.
            let existing = s.lessons.iter_mut().find(|l| {
                l.superseded_by.is_none()
                    && l.tool.as_deref() == Some(draft.tool.as_str())
                    && (l.action == text
                        || cosine(&embed_one(&l.action), &vector) > cfg.duplicate_cosine)
            });
            match existing {
                Some(l) => {
                    // A feature that held in one batch's failures and not in another's was
                    // chance, not a condition of the failure.
                    l.preconditions
                        .retain(|k, v| preconditions.get(k) == Some(&*v));
                    l.confidence = (l.confidence + cfg.decay_per_cycle)
                        .max(cfg.synthesised_confidence)
                        .min(1.0);
                    l.reinforced_ms = now_ms;
                    for r in evidence {
                        if !l.evidence.contains(&r) {
                            l.evidence.push(r);
                        }
                    }
                    touched.insert(l.lesson_id.clone());
                    report.reinforced.push(l.lesson_id.clone());
                }
                None => {
                    let lesson_id = format!("adaptive-{id}");
                    s.lessons.push(Lesson {
                        lesson_id: lesson_id.clone(),
                        preconditions,
                        tool: Some(draft.tool.clone()),
                        action: text,
                        confidence: cfg.synthesised_confidence,
                        evidence,
                        source: "synthesis".into(),
                        scope: job.input.scope.clone(),
                        created_ms: now_ms,
                        reinforced_ms: now_ms,
                        superseded_by: None,
                    });
                    touched.insert(lesson_id.clone());
                    report.added.push(lesson_id);
                }
            }
        }
        let s = self.scope_mut(&job.input.scope);
        for l in s.lessons.iter_mut() {
            if !touched.contains(&l.lesson_id) {
                let decayed = (l.confidence - cfg.decay_per_cycle).max(0.0);
                if decayed != l.confidence {
                    l.confidence = decayed;
                    touched.insert(l.lesson_id.clone());
                }
            }
        }
        // Floating-point: 0.8 - 5 * 0.1 must count as below 0.3.
        let floor = cfg.min_confidence - 1e-9;
        let mut removed = Vec::new();
        s.lessons.retain(|l| {
            let expired = cfg.strategy_ttl_ms > 0
                && now_ms.saturating_sub(l.reinforced_ms) > cfg.strategy_ttl_ms;
            let keep = l.confidence >= floor && !expired;
            if !keep {
                removed.push(l.lesson_id.clone());
            }
            keep
        });
        if s.lessons.len() > cfg.max_strategies {
            s.lessons.sort_by(|a, b| {
                b.confidence
                    .total_cmp(&a.confidence)
                    .then(b.reinforced_ms.cmp(&a.reinforced_ms))
                    .then(a.lesson_id.cmp(&b.lesson_id))
            });
            for l in s.lessons.drain(cfg.max_strategies..) {
                removed.push(l.lesson_id);
            }
        }
        report.removed = removed;
        let used: BTreeSet<u64> = job.input.failures.iter().map(|f| f.id).collect();
        let mut consumed = Vec::new();
        let mut kept = Vec::new();
        for f in s.pending.drain(..) {
            if used.contains(&f.id) {
                consumed.push(f.id);
                s.evidence.push(f);
            } else {
                kept.push(f);
            }
        }
        s.pending = kept;
        if s.evidence.len() > cfg.failure_retention {
            let excess = s.evidence.len() - cfg.failure_retention;
            s.evidence.drain(..excess);
        }
        report.consumed = consumed;
        s.cycles += 1;
        s.lease = None;
        self.changed_lessons.extend(touched);
        Ok(report)
    }

    /// Lessons a finished run bore out: every active lesson of `scope` whose preconditions all
    /// hold in `features` and whose tool the run called with success and never with a failure
    /// is reinforced (a fresh lesson's confidence, `reinforced_ms` now) if it had decayed below
    /// that confidence. Evidence of a lesson working reinforces it as its failures did; without
    /// this a lesson that stopped its failures would decay for want of them and be dropped, and
    /// the failures would come back. A lesson at full confidence is left as it is, so that the
    /// lessons written and sent to memory are only those that changed. Returns the ids of the
    /// lessons reinforced.
    pub fn confirm(
        &mut self,
        scope: &str,
        features: &BTreeMap<String, String>,
        steps: &[Step],
        now_ms: u64,
    ) -> Vec<String> {
        let called = |failed: bool| -> BTreeSet<&str> {
            steps
                .iter()
                .filter(|s| s.error.is_some() == failed)
                .filter_map(|s| s.tool_called.as_deref())
                .collect()
        };
        let (succeeded, failed) = (called(false), called(true));
        let fresh = self.state.config.synthesised_confidence;
        let Some(s) = self.state.scopes.get_mut(scope) else {
            return Vec::new();
        };
        let mut changed = Vec::new();
        for l in s.lessons.iter_mut().filter(|l| l.superseded_by.is_none()) {
            let Some(tool) = l.tool.as_deref() else {
                continue;
            };
            let applies = l
                .preconditions
                .iter()
                .all(|(k, v)| features.get(k) == Some(v));
            if applies && l.confidence < fresh && succeeded.contains(tool) && !failed.contains(tool)
            {
                l.confidence = fresh;
                l.reinforced_ms = l.reinforced_ms.max(now_ms);
                changed.push(l.lesson_id.clone());
            }
        }
        if !changed.is_empty() {
            self.touch(scope);
            self.changed_lessons.extend(changed.iter().cloned());
        }
        changed
    }

    /// Runs a whole synthesis with the offline synthesiser (begin, derive, complete).
    pub fn synthesise_offline(
        &mut self,
        scope: &str,
        owner: &str,
        now_ms: u64,
    ) -> Result<SynthesisReport, AdaptiveError> {
        let job = self.begin_synthesis(scope, owner, now_ms)?;
        let drafts = OfflineSynthesiser.derive(&job.input, self.state.config.lesson_max_chars);
        self.complete_synthesis(&job, drafts, now_ms)
    }
}
