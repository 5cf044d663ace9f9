//! The reflector: consolidates experience into lessons (preconditions -> action, with
//! confidence and evidence run ids) from the stage outcomes of runs per cluster ("for
//! filetype=png avoid pdfminer/direct at stage extract: ToolNotFit 9 of 10"), merges
//! near-duplicates (cosine above 0.92 on the offline embedder) and lets a contradicting lesson
//! supersede the older one (`superseded_by`) instead of deleting it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::model::cosine;
use crate::model::embed::embed_one;
use crate::record::{ExperienceTuple, Lesson};
use crate::taxonomy::{ErrorClass, FailureCategory};
use crate::triage::classify_error;

/// Version of [`ReflectorSnapshot`].
pub const SNAPSHOT_VERSION: u32 = 1;

/// Features that describe the request, not the input; never preconditions.
const IGNORED_FEATURES: [&str; 1] = ["tools"];

/// Thresholds of consolidation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ReflectorConfig {
    /// Outcomes a (cluster, stage, arm) needs before it yields a lesson.
    pub min_samples: u64,
    /// Failure rate at or above which the arm is to be avoided.
    pub avoid_failure_rate: f64,
    /// Success rate at or above which the arm is to be preferred.
    pub prefer_success_rate: f64,
    /// Cosine above which two lessons with the same preconditions and tool are merged.
    pub duplicate_cosine: f32,
    /// Evidence run ids kept per lesson and per bucket (most recent).
    pub max_evidence: usize,
    /// z of the Wilson lower bound used as confidence (1.96: 95%).
    pub z: f64,
}

impl Default for ReflectorConfig {
    fn default() -> Self {
        ReflectorConfig {
            min_samples: 5,
            avoid_failure_rate: 0.7,
            prefer_success_rate: 0.8,
            duplicate_cosine: 0.92,
            max_evidence: 50,
            z: 1.96,
        }
    }
}

/// How one stage of a run went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageOutcome {
    /// The stage.
    pub stage: String,
    /// The tool used.
    pub tool: String,
    /// The strategy used.
    pub strategy: String,
    /// Whether the stage succeeded.
    pub passed: bool,
    /// The error class when it failed.
    pub error_class: Option<ErrorClass>,
    /// The failure category when it failed (infrastructure outcomes are not learned from).
    pub category: Option<FailureCategory>,
}

/// The stage outcomes of one run with the task's features.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// The run.
    pub run_id: String,
    /// The task's features.
    pub features: BTreeMap<String, String>,
    /// One outcome per stage of the first attempt.
    pub stages: Vec<StageOutcome>,
}

impl RunOutcome {
    /// Derives the stage outcomes from an experience tuple: for each chosen arm, the last step
    /// that called its tool (in its stage, when steps carry a `stage` metadata entry) decides;
    /// an arm with no such step is left out.
    pub fn from_experience(exp: &ExperienceTuple) -> RunOutcome {
        let mut stages = Vec::new();
        for arm in &exp.arms {
            let last = exp.steps.iter().rfind(|s| {
                s.tool_called.as_deref() == Some(arm.tool.as_str())
                    && s.metadata
                        .get("stage")
                        .and_then(|v| v.as_str())
                        .is_none_or(|st| st == arm.stage)
            });
            let Some(step) = last else { continue };
            let (passed, error_class, category) = match &step.error {
                None => (true, None, None),
                Some(msg) => {
                    let c = classify_error(step.exception_type.as_deref(), msg);
                    (
                        false,
                        Some(step.error_class.unwrap_or(c.error_class)),
                        Some(c.category),
                    )
                }
            };
            stages.push(StageOutcome {
                stage: arm.stage.clone(),
                tool: arm.tool.clone(),
                strategy: arm.strategy.clone(),
                passed,
                error_class,
                category,
            });
        }
        RunOutcome {
            run_id: exp.run_id.clone(),
            features: exp.context_features.clone(),
            stages,
        }
    }
}

/// Statistics of one (preconditions, stage, tool, strategy).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Bucket {
    /// The feature conditions.
    pub preconditions: BTreeMap<String, String>,
    /// The stage.
    pub stage: String,
    /// The tool.
    pub tool: String,
    /// The strategy.
    pub strategy: String,
    /// Outcomes counted (infrastructure failures excluded).
    pub n: u64,
    /// Successes.
    pub passed: u64,
    /// Failures per error class.
    pub failures: BTreeMap<ErrorClass, u64>,
    /// Recent runs that passed.
    pub pass_runs: Vec<String>,
    /// Recent runs that failed.
    pub fail_runs: Vec<String>,
}

/// Whether a lesson says to do or to avoid something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Polarity {
    /// Do it.
    Prefer,
    /// Do not.
    Avoid,
}

/// Leading phrases of an action and their polarity (longest first).
const VERBS: [(&str, Polarity); 10] = [
    ("avoid using", Polarity::Avoid),
    ("do not use", Polarity::Avoid),
    ("don't use", Polarity::Avoid),
    ("never use", Polarity::Avoid),
    ("stop using", Polarity::Avoid),
    ("avoid", Polarity::Avoid),
    ("never", Polarity::Avoid),
    ("prefer", Polarity::Prefer),
    ("always use", Polarity::Prefer),
    ("use", Polarity::Prefer),
];

/// The polarity of an action ("avoid x" / "do not use x" are avoid; anything else prefer).
pub fn polarity(action: &str) -> Polarity {
    let a = action.trim().to_lowercase();
    VERBS
        .iter()
        .find(|(v, _)| a.starts_with(v))
        .map_or(Polarity::Prefer, |(_, p)| *p)
}

/// What an action is about: the token after its verb (`pdfminer/direct`), if it has a verb.
pub fn target(action: &str) -> Option<String> {
    let a = action.trim().to_lowercase();
    let (verb, _) = VERBS.iter().find(|(v, _)| a.starts_with(v))?;
    a[verb.len()..]
        .split_whitespace()
        .next()
        .map(|t| t.trim_end_matches([':', ',', ';', '.']).to_string())
        .filter(|t| !t.is_empty())
}

/// The lesson as one sentence: `for k=v, ... <action>`.
pub fn describe(lesson: &Lesson) -> String {
    if lesson.preconditions.is_empty() {
        return lesson.action.clone();
    }
    let when: Vec<String> = lesson
        .preconditions
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!("for {} {}", when.join(", "), lesson.action)
}

/// Whether two versions of a lesson read the same to memory, which indexes its [`describe`]
/// text in its scope (a lesson whose confidence or evidence alone changed is indexed as it was).
pub fn reads_the_same(a: &Lesson, b: &Lesson) -> bool {
    a.scope == b.scope
        && ((a.action == b.action && a.preconditions == b.preconditions)
            || describe(a) == describe(b))
}

/// The lower bound of the Wilson score interval of `k` successes in `n`.
pub fn wilson_lower(k: u64, n: u64, z: f64) -> f64 {
    if n == 0 {
        return 0.0;
    }
    let n = n as f64;
    let p = k as f64 / n;
    let z2 = z * z;
    let centre = p + z2 / (2.0 * n);
    let margin = z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - margin) / (1.0 + z2 / n)).clamp(0.0, 1.0)
}

/// What adding a lesson did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LessonChange {
    /// Stored as a new lesson.
    Inserted(String),
    /// Merged into an existing near-duplicate.
    Merged {
        /// The lesson it was merged into.
        into: String,
    },
    /// Stored, superseding contradicting older lessons.
    Superseded {
        /// The new lesson.
        new: String,
        /// The lessons it superseded.
        old: Vec<String>,
    },
}

/// What a consolidation did.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ConsolidationReport {
    /// Lessons created.
    pub created: Vec<String>,
    /// Existing lessons updated from their bucket's statistics.
    pub updated: Vec<String>,
    /// Lessons a new one was merged into.
    pub merged: Vec<String>,
    /// Lessons superseded by a contradiction.
    pub superseded: Vec<String>,
    /// Candidates skipped because a more general lesson says the same.
    pub redundant: usize,
}

/// The persisted state of a [`Reflector`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReflectorSnapshot {
    /// Format version.
    pub version: u32,
    /// Configuration (JSON text when stored, so that a setting added in a later build does not
    /// make the snapshot unreadable).
    #[serde(with = "crate::store::envelope::as_json")]
    pub config: ReflectorConfig,
    /// Every lesson, superseded ones included, by id.
    pub lessons: BTreeMap<String, Lesson>,
    /// Outcome statistics by bucket key.
    pub buckets: BTreeMap<String, Bucket>,
    /// The lesson each bucket produced.
    pub bucket_lessons: BTreeMap<String, String>,
    /// Next lesson number.
    pub next_id: u64,
}

/// Errors of the reflector.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReflectorError {
    /// A snapshot of an unknown version.
    #[error("reflector snapshot version {0} is not supported (expected {SNAPSHOT_VERSION})")]
    SnapshotVersion(u32),
}

/// Consolidates experience into lessons (a pure struct the Reflector actor owns). It notes the
/// buckets each run changes, so that a consolidation looks again only at those (a full pass
/// after a restore, or when a lesson was superseded: a bucket that was redundant may then need
/// its own), and its owner can persist buckets one by one ([`Reflector::take_bucket_changes`]).
#[derive(Debug, Clone)]
pub struct Reflector {
    state: ReflectorSnapshot,
    /// Buckets changed since the last consolidation.
    unconsolidated: BTreeSet<String>,
    /// Buckets changed since they were last handed over to be persisted.
    unpersisted: BTreeSet<String>,
    /// Whether the next consolidation looks at every bucket.
    full_pass: bool,
}

/// Two reflectors are equal when their states are (what is still to do aside).
impl PartialEq for Reflector {
    fn eq(&self, other: &Reflector) -> bool {
        self.state == other.state
    }
}

fn cluster_key(pre: &BTreeMap<String, String>) -> String {
    pre.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn push_bounded(list: &mut Vec<String>, item: &str, max: usize) {
    if !list.iter().any(|r| r == item) {
        list.push(item.to_string());
    }
    if list.len() > max {
        let excess = list.len() - max;
        list.drain(..excess);
    }
}

fn is_subset(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> bool {
    a.iter().all(|(k, v)| b.get(k) == Some(v))
}

impl Reflector {
    /// An empty reflector.
    pub fn new(config: ReflectorConfig) -> Reflector {
        Reflector {
            state: ReflectorSnapshot {
                version: SNAPSHOT_VERSION,
                config,
                lessons: BTreeMap::new(),
                buckets: BTreeMap::new(),
                bucket_lessons: BTreeMap::new(),
                next_id: 1,
            },
            unconsolidated: BTreeSet::new(),
            unpersisted: BTreeSet::new(),
            full_pass: false,
        }
    }

    /// The persisted state.
    pub fn snapshot(&self) -> ReflectorSnapshot {
        self.state.clone()
    }

    /// The persisted state without its buckets, which an owner persisting them one by one
    /// ([`Reflector::take_bucket_changes`]) keeps apart: the snapshot stays the size of the
    /// lessons however much experience the buckets count.
    pub fn snapshot_without_buckets(&self) -> ReflectorSnapshot {
        ReflectorSnapshot {
            version: self.state.version,
            config: self.state.config.clone(),
            lessons: self.state.lessons.clone(),
            buckets: BTreeMap::new(),
            bucket_lessons: self.state.bucket_lessons.clone(),
            next_id: self.state.next_id,
        }
    }

    /// The buckets changed since the last call (each once, as it is now), and forgets them:
    /// what the owner writes to persist them.
    pub fn take_bucket_changes(&mut self) -> Vec<(String, Bucket)> {
        std::mem::take(&mut self.unpersisted)
            .into_iter()
            .filter_map(|k| self.state.buckets.get(&k).cloned().map(|b| (k, b)))
            .collect()
    }

    /// Notes every bucket as changed, so that the next [`Reflector::take_bucket_changes`]
    /// hands them all over (a snapshot of an earlier build held them inline).
    pub fn note_all_buckets_changed(&mut self) {
        self.unpersisted = self.state.buckets.keys().cloned().collect();
    }

    /// Rebuilds from a snapshot (whose buckets are those persisted with it); its first
    /// consolidation looks at every bucket.
    pub fn restore(snapshot: ReflectorSnapshot) -> Result<Reflector, ReflectorError> {
        if snapshot.version != SNAPSHOT_VERSION {
            return Err(ReflectorError::SnapshotVersion(snapshot.version));
        }
        Ok(Reflector {
            state: snapshot,
            unconsolidated: BTreeSet::new(),
            unpersisted: BTreeSet::new(),
            full_pass: true,
        })
    }

    /// A lesson by id (superseded ones included).
    pub fn lesson(&self, id: &str) -> Option<&Lesson> {
        self.state.lessons.get(id)
    }

    /// Every lesson, superseded ones included.
    pub fn lessons(&self) -> impl Iterator<Item = &Lesson> {
        self.state.lessons.values()
    }

    /// Lessons not superseded.
    pub fn active_lessons(&self) -> impl Iterator<Item = &Lesson> {
        self.state
            .lessons
            .values()
            .filter(|l| l.superseded_by.is_none())
    }

    /// Active lessons whose preconditions all hold for `features`, most confident first.
    pub fn matching(&self, features: &BTreeMap<String, String>) -> Vec<&Lesson> {
        let mut out: Vec<&Lesson> = self
            .active_lessons()
            .filter(|l| is_subset(&l.preconditions, features))
            .collect();
        out.sort_by(|a, b| {
            b.confidence
                .total_cmp(&a.confidence)
                .then(a.lesson_id.cmp(&b.lesson_id))
        });
        out
    }

    /// The outcome statistics.
    pub fn buckets(&self) -> &BTreeMap<String, Bucket> {
        &self.state.buckets
    }

    /// Counts a run's stage outcomes per cluster: each single feature and the full feature
    /// set. Infrastructure failures are not counted (never learned from).
    pub fn observe(&mut self, run: &RunOutcome) {
        let features: BTreeMap<String, String> = run
            .features
            .iter()
            .filter(|(k, _)| !IGNORED_FEATURES.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut clusters: Vec<BTreeMap<String, String>> = features
            .iter()
            .map(|(k, v)| BTreeMap::from([(k.clone(), v.clone())]))
            .collect();
        if features.len() > 1 || clusters.is_empty() {
            clusters.push(features.clone());
        }
        let max = self.state.config.max_evidence;
        for st in &run.stages {
            if st.category == Some(FailureCategory::Infrastructure) {
                continue;
            }
            for pre in &clusters {
                let key = format!(
                    "{}|{}|{}/{}",
                    cluster_key(pre),
                    st.stage,
                    st.tool,
                    st.strategy
                );
                self.unconsolidated.insert(key.clone());
                self.unpersisted.insert(key.clone());
                let b = self.state.buckets.entry(key).or_insert_with(|| Bucket {
                    preconditions: pre.clone(),
                    stage: st.stage.clone(),
                    tool: st.tool.clone(),
                    strategy: st.strategy.clone(),
                    ..Bucket::default()
                });
                b.n += 1;
                if st.passed {
                    b.passed += 1;
                    push_bounded(&mut b.pass_runs, &run.run_id, max);
                } else {
                    let class = st.error_class.unwrap_or(ErrorClass::DeterministicFailure);
                    *b.failures.entry(class).or_insert(0) += 1;
                    push_bounded(&mut b.fail_runs, &run.run_id, max);
                }
            }
        }
    }

    /// [`Reflector::observe`] on an experience tuple.
    pub fn observe_experience(&mut self, exp: &ExperienceTuple) {
        self.observe(&RunOutcome::from_experience(exp));
    }

    /// Turns bucket statistics into lessons: an arm failing at least `avoid_failure_rate` of
    /// at least `min_samples` outcomes becomes "avoid tool/strategy at stage s: Class k of n",
    /// one passing at least `prefer_success_rate` becomes "prefer ...: passed k of n"; the
    /// confidence is the Wilson lower bound. A bucket's existing lesson is updated in place;
    /// one whose polarity flipped is superseded by the new lesson.
    pub fn consolidate(&mut self, now_ms: u64) -> ConsolidationReport {
        let cfg = self.state.config.clone();
        let mut report = ConsolidationReport::default();
        let changed = std::mem::take(&mut self.unconsolidated);
        let full = std::mem::take(&mut self.full_pass);
        let mut keys: Vec<(usize, String)> = self
            .state
            .buckets
            .iter()
            .filter(|(k, b)| b.n >= cfg.min_samples && (full || changed.contains(*k)))
            .map(|(k, b)| (b.preconditions.len(), k.clone()))
            .collect();
        keys.sort();
        for (_, key) in keys {
            // Read in place: a bucket holds its recent runs, and only a lesson made or updated
            // from it takes a copy of them.
            let Some(b) = self.state.buckets.get(&key) else {
                continue;
            };
            let failed = b.n - b.passed;
            let arm = format!("{}/{}", b.tool, b.strategy);
            let candidate = if failed as f64 >= cfg.avoid_failure_rate * b.n as f64 {
                let (class, count) = b
                    .failures
                    .iter()
                    .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                    .map(|(c, k)| (*c, *k))
                    .unwrap_or((ErrorClass::DeterministicFailure, failed));
                Some((
                    format!(
                        "avoid {arm} at stage {}: {class} {count} of {}",
                        b.stage, b.n
                    ),
                    wilson_lower(failed, b.n, cfg.z),
                    &b.fail_runs,
                ))
            } else if b.passed as f64 >= cfg.prefer_success_rate * b.n as f64 {
                Some((
                    format!(
                        "prefer {arm} at stage {}: passed {} of {}",
                        b.stage, b.passed, b.n
                    ),
                    wilson_lower(b.passed, b.n, cfg.z),
                    &b.pass_runs,
                ))
            } else {
                None
            };
            let existing = self
                .state
                .bucket_lessons
                .get(&key)
                .and_then(|id| self.state.lessons.get(id))
                .filter(|l| l.superseded_by.is_none())
                .map(|l| (l.lesson_id.clone(), polarity(&l.action)));
            let Some((action, confidence, evidence)) = candidate else {
                // Neither rule holds any more: the bucket's lesson loses its confidence to
                // what the statistics still support.
                if let Some((id, pol)) = existing {
                    let k = match pol {
                        Polarity::Avoid => failed,
                        Polarity::Prefer => b.passed,
                    };
                    if let Some(m) = self.state.lessons.get_mut(&id) {
                        m.confidence = wilson_lower(k, b.n, cfg.z);
                        report.updated.push(id);
                    }
                }
                continue;
            };
            if let Some((id, pol)) = &existing
                && *pol == polarity(&action)
            {
                if let Some(m) = self.state.lessons.get_mut(id) {
                    m.action = action;
                    m.confidence = confidence;
                    m.evidence.clone_from(evidence);
                    m.reinforced_ms = now_ms;
                    report.updated.push(id.clone());
                }
                continue;
            }
            let redundant = self.active_lessons().any(|g| {
                g.preconditions.len() < b.preconditions.len()
                    && is_subset(&g.preconditions, &b.preconditions)
                    && g.tool.as_deref() == Some(b.tool.as_str())
                    && target(&g.action) == target(&action)
                    && polarity(&g.action) == polarity(&action)
                    && g.action.contains(&format!("at stage {}", b.stage))
            });
            if redundant && existing.is_none() {
                report.redundant += 1;
                continue;
            }
            let lesson = Lesson {
                lesson_id: String::new(),
                preconditions: b.preconditions.clone(),
                tool: Some(b.tool.clone()),
                action,
                confidence,
                evidence: evidence.clone(),
                source: "reflection".into(),
                scope: "shared".into(),
                created_ms: now_ms,
                reinforced_ms: now_ms,
                superseded_by: None,
            };
            match self.add_lesson(lesson, now_ms) {
                LessonChange::Inserted(id) => {
                    self.state.bucket_lessons.insert(key, id.clone());
                    report.created.push(id);
                }
                LessonChange::Merged { into } => {
                    self.state.bucket_lessons.insert(key, into.clone());
                    report.merged.push(into);
                }
                LessonChange::Superseded { new, old } => {
                    self.state.bucket_lessons.insert(key, new.clone());
                    report.created.push(new);
                    report.superseded.extend(old);
                }
            }
        }
        report
    }

    /// Adds a lesson from any source (an empty `lesson_id` gets a fresh one). Active lessons
    /// with the same preconditions and tool and the opposite action on the same target are
    /// superseded by it; otherwise a near-duplicate (same preconditions, tool and polarity,
    /// cosine above `duplicate_cosine`) absorbs it: evidence united, confidence the
    /// evidence-weighted mean, the newer wording kept.
    pub fn add_lesson(&mut self, mut lesson: Lesson, now_ms: u64) -> LessonChange {
        if lesson.lesson_id.is_empty() || self.state.lessons.contains_key(&lesson.lesson_id) {
            lesson.lesson_id = format!("reflection-{}", self.state.next_id);
            self.state.next_id += 1;
        }
        let pol = polarity(&lesson.action);
        let tgt = target(&lesson.action);
        let same_subject = |l: &Lesson| {
            l.superseded_by.is_none()
                && l.preconditions == lesson.preconditions
                && l.tool == lesson.tool
        };
        let contradicted: Vec<String> = self
            .state
            .lessons
            .values()
            .filter(|l| same_subject(l))
            .filter(|l| polarity(&l.action) != pol)
            .filter(|l| match (target(&l.action), &tgt) {
                (Some(a), Some(b)) => &a == b,
                _ => true,
            })
            .map(|l| l.lesson_id.clone())
            .collect();
        if !contradicted.is_empty() {
            let new = lesson.lesson_id.clone();
            for id in &contradicted {
                if let Some(l) = self.state.lessons.get_mut(id) {
                    l.superseded_by = Some(new.clone());
                }
            }
            self.state.lessons.insert(new.clone(), lesson);
            // A bucket left without a lesson because the superseded one said the same may
            // need one now.
            self.full_pass = true;
            return LessonChange::Superseded {
                new,
                old: contradicted,
            };
        }
        let v = embed_one(&lesson.action);
        let dup = self
            .state
            .lessons
            .values()
            .filter(|l| same_subject(l) && polarity(&l.action) == pol)
            .map(|l| (cosine(&embed_one(&l.action), &v), l.lesson_id.clone()))
            .filter(|(s, _)| *s > self.state.config.duplicate_cosine)
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((_, id)) = dup {
            let max = self.state.config.max_evidence;
            if let Some(l) = self.state.lessons.get_mut(&id) {
                let n_old = l.evidence.len().max(1) as f64;
                let n_new = lesson.evidence.len().max(1) as f64;
                l.confidence = ((l.confidence * n_old + lesson.confidence * n_new)
                    / (n_old + n_new))
                    .clamp(0.0, 1.0);
                let mut union: BTreeSet<String> = l.evidence.iter().cloned().collect();
                for r in &lesson.evidence {
                    if union.insert(r.clone()) {
                        l.evidence.push(r.clone());
                    }
                }
                if l.evidence.len() > max {
                    let excess = l.evidence.len() - max;
                    l.evidence.drain(..excess);
                }
                l.action = lesson.action;
                l.reinforced_ms = now_ms;
            }
            return LessonChange::Merged { into: id };
        }
        let id = lesson.lesson_id.clone();
        self.state.lessons.insert(id.clone(), lesson);
        LessonChange::Inserted(id)
    }
}
