//! The Reflector actor: consolidates finished runs into lessons (preconditions -> action, with
//! confidence and evidence; near-duplicates merged, contradictions superseding) and runs the
//! adaptive strategies (strategy failures per scope, synthesis into vetted lessons, the fenced
//! `<strategy_context>` injected before a run, verified human corrections). Its state is
//! event-sourced like the policy's: a snapshot plus the experience log since its watermark.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hindsight::learn::Mechanism;
use hindsight::learn::adaptive::{
    AdaptiveConfig, AdaptiveSnapshot, AdaptiveStrategies, Correction, CorrectionError,
    FailureObservation, LessonDraft, OfflineVerifier, PreparedCorrection, ScopeState, SynthesisJob,
    Synthesiser, Verdict, Verifier,
};
use hindsight::learn::reflector::{
    Bucket, Reflector, ReflectorConfig, ReflectorSnapshot, reads_the_same,
};
use hindsight::store::{KvTable, Store, WriteOp};
use hindsight::{ExperienceTuple, Lesson, Task, now_ms};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::applied::{Applied, SNAPSHOT_EVERY, read_snapshot, write_behind};
use crate::chaos_hook::ChaosHook;
use crate::directory::Slot;
use crate::lesson_board::LessonBoard;
use crate::memory::MemoryMsg;
use crate::scope_rows;

/// The table of the reflector's snapshot.
pub const REFLECTOR: KvTable = KvTable::new("reflector");
/// Every lesson (reflected, synthesised or corrected), by id, for the API and reports; the
/// adaptive strategies' scopes name theirs (`scope_rows`), each written as it changes, in the
/// batch of the snapshot it belongs to.
pub const LESSONS: KvTable = KvTable::new("lessons");
/// The reflection's outcome statistics, a row per bucket (the snapshot holds the lessons).
pub const BUCKETS: KvTable = KvTable::new("reflector_buckets");
const SNAPSHOT_KEY: &str = "state";
/// Runs between two consolidations (lessons made from the statistics and handed to memory).
const CONSOLIDATE_EVERY: u64 = 25;

/// Whom a consolidation hands its lessons to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tell {
    /// Memory, waiting for one that is restarting.
    Memory,
    /// Memory if it is up, without waiting (at start, where the memory's own restart may be
    /// waiting for this actor's).
    MemoryIfUp,
    /// No one (at a stop: the memory of the next start is sent every lesson in force).
    Nobody,
}

/// Why a human correction was not accepted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FeedbackRefused {
    /// No authenticated principal.
    Unauthenticated,
    /// Too many corrections from this principal.
    RateLimited {
        /// Seconds until another may be accepted.
        retry_after_secs: u64,
    },
    /// The correction was rejected (injection, length, or not supported by evidence).
    Rejected {
        /// Why.
        reason: String,
    },
}

/// Messages of the reflector.
pub enum ReflectorMsg {
    /// A run finished and its experience is logged at `seq`.
    Consolidate {
        /// The experience's sequence number.
        seq: u64,
        /// The experience.
        experience: Arc<ExperienceTuple>,
        /// The task (its scope: user, tenant, session).
        task: Arc<Task>,
    },
    /// A human correction from an authenticated principal; answered once it is on disk.
    Feedback {
        /// The authenticated principal (never from the request body).
        principal: Option<String>,
        /// The task the correction's scope is taken from (user, tenant, session).
        scope_of: Box<Task>,
        /// The tool it is about.
        tool: Option<String>,
        /// The correction.
        text: String,
        /// The run it is about.
        run_id: Option<String>,
        /// The stored lesson, or why not.
        reply: RpcReplyPort<Result<Lesson, FeedbackRefused>>,
    },
    /// The judge's verdict on a correction came back (sent by the reflector to itself).
    Judged {
        /// The correction, as prepared.
        prepared: Box<PreparedCorrection>,
        /// The verdict.
        verdict: Verdict,
        /// Where the answer goes.
        reply: RpcReplyPort<Result<Lesson, FeedbackRefused>>,
    },
    /// A model-backed synthesis came back (sent by the reflector to itself).
    Synthesised {
        /// The job (its lease).
        job: Box<SynthesisJob>,
        /// The model's drafts, or why there are none.
        drafts: Result<Vec<LessonDraft>, String>,
    },
    /// Lessons, active ones first.
    Lessons {
        /// Only lessons whose scope starts with this (e.g. `tenant:acme`), if given.
        scope_prefix: Option<String>,
        /// The lessons.
        reply: RpcReplyPort<Vec<Lesson>>,
    },
}

/// The reflector actor.
pub struct ReflectorActor;

/// Start-up arguments.
pub struct ReflectorArgs {
    /// Adaptive strategies' configuration (the one in force, also over a restored snapshot).
    pub adaptive: AdaptiveConfig,
    /// The store.
    pub store: Store,
    /// The memory actor, which indexes new lessons.
    pub memory: Arc<Slot<MemoryMsg>>,
    /// Where it publishes itself.
    pub slot: Arc<Slot<ReflectorMsg>>,
    /// Where it publishes each scope's lessons for the runs to read.
    pub board: Arc<LessonBoard>,
    /// A model-backed synthesiser (`[model]`), if any; lessons are derived offline otherwise,
    /// and when the model fails.
    pub synthesiser: Option<Arc<dyn Synthesiser>>,
    /// The judge of human corrections (a model, `[model]`), if any: a correction the evidence
    /// check passes must also be judged supported by it. The evidence check alone otherwise,
    /// and when the judge cannot answer.
    pub verifier: Option<Arc<dyn Verifier>>,
    /// Fault injection.
    pub chaos: Option<ChaosHook>,
    /// Learning mechanisms switched off: `Lessons` (failures are kept as evidence, but no
    /// lesson is synthesised from them) and `Corrections` (every correction is refused).
    pub ablate: BTreeSet<Mechanism>,
}

#[derive(Serialize, Deserialize)]
struct Persisted {
    reflector: ReflectorSnapshot,
    adaptive: AdaptiveSnapshot,
    applied: Applied,
}

/// The reflector's state.
pub struct ReflectorState {
    store: Store,
    reflector: Reflector,
    adaptive: AdaptiveStrategies,
    applied: Applied,
    memory: Arc<Slot<MemoryMsg>>,
    board: Arc<LessonBoard>,
    since_consolidation: u64,
    /// Experiences learned since the last snapshot.
    since_persist: u64,
    /// Scopes changed since the last snapshot (which writes each as it is then).
    unwritten_scopes: BTreeSet<String>,
    /// The reflection's lessons made or changed since the last snapshot, written as they are
    /// then (the strategies' are written from their scopes:
    /// [`AdaptiveStrategies::take_changed_lessons`]).
    unwritten_lessons: BTreeSet<String>,
    synthesiser: Option<Arc<dyn Synthesiser>>,
    verifier: Option<Arc<dyn Verifier>>,
    chaos: Option<ChaosHook>,
    ablate: BTreeSet<Mechanism>,
    /// The strategies (the adaptive lessons of each scope) as last handed to memory, and the
    /// memory actor they were handed to: a consolidation sends only those of the scopes changed
    /// since (`unsent`) that read differently, and all of them to a memory that has started
    /// again since.
    sent: BTreeMap<String, Vec<Lesson>>,
    sent_to: Option<ractor::ActorId>,
    /// Scopes written since the last consolidation.
    unsent: BTreeSet<String>,
}

impl Actor for ReflectorActor {
    type Msg = ReflectorMsg;
    type State = ReflectorState;
    type Arguments = ReflectorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        crate::applied::after_queued_writes(&args.store, "reflector").await;
        scope_rows::move_inline_rows(&args.store).await?;
        let stored: Option<Persisted> = read_snapshot(&args.store, REFLECTOR, SNAPSHOT_KEY);
        let rows = scope_rows::read_all(&args.store)?;
        let keys: Vec<String> = rows.iter().map(|(k, _)| k.clone()).collect();
        let bucket_rows = args.store.scan::<Bucket>(BUCKETS)?;
        let bucket_keys: Vec<String> = bucket_rows.iter().map(|(k, _)| k.clone()).collect();
        // A snapshot of an earlier build holds its scopes and buckets inline: they become rows
        // (below).
        let mut inline: Vec<String> = Vec::new();
        let mut inline_buckets = false;
        let stored = stored.map(|mut p| {
            inline = p.adaptive.scopes.keys().cloned().collect();
            inline_buckets = !p.reflector.buckets.is_empty();
            p.adaptive.scopes.extend(rows.into_iter().filter_map(|(scope, state)| match state {
                Ok(state) => Some((scope, state)),
                Err(e) => {
                    tracing::error!(scope, error = %e, "a scope of the adaptive strategies cannot be read; its lessons are lost");
                    None
                }
            }));
            // A bucket that cannot be read counts from nothing again (its lesson stays).
            p.reflector.buckets.extend(bucket_rows.into_iter().filter_map(|(key, bucket)| match bucket {
                Ok(bucket) => Some((key, bucket)),
                Err(e) => {
                    tracing::error!(key, error = %e, "a bucket of the reflection cannot be read; its counts start again");
                    None
                }
            }));
            p
        });
        let restored = stored.and_then(|p| {
            Some((
                Reflector::restore(p.reflector).ok()?,
                AdaptiveStrategies::restore(p.adaptive).ok()?,
                p.applied,
            ))
        });
        let (reflector, adaptive, applied) = match restored {
            Some((mut reflector, mut adaptive, applied)) => {
                // The lessons come back; the configuration is the one in force now.
                adaptive.set_config(args.adaptive.clone())?;
                for scope in &inline {
                    adaptive.note_changed(scope);
                }
                if inline_buckets {
                    reflector.note_all_buckets_changed();
                }
                (reflector, adaptive, applied)
            }
            None => {
                // Rebuilt from the log: the scopes and buckets of a snapshot that cannot be used
                // go (queued before any later snapshot, so committed first).
                let stale: Vec<WriteOp> = keys
                    .iter()
                    .map(|k| WriteOp::delete(scope_rows::SCOPES, k))
                    .chain(bucket_keys.iter().map(|k| WriteOp::delete(BUCKETS, k)))
                    .collect();
                if !stale.is_empty() {
                    write_behind(
                        &args.store,
                        stale,
                        "the removal of an unusable reflector snapshot's scopes and buckets",
                    );
                }
                (
                    Reflector::new(ReflectorConfig::default()),
                    AdaptiveStrategies::new(args.adaptive.clone())?,
                    Applied::default(),
                )
            }
        };
        let mut state = ReflectorState {
            store: args.store,
            reflector,
            adaptive,
            applied,
            memory: args.memory,
            board: args.board,
            since_consolidation: 0,
            since_persist: 0,
            unwritten_scopes: BTreeSet::new(),
            unwritten_lessons: BTreeSet::new(),
            synthesiser: args.synthesiser,
            verifier: args.verifier,
            chaos: args.chaos,
            ablate: args.ablate,
            sent: BTreeMap::new(),
            sent_to: None,
            unsent: BTreeSet::new(),
        };
        if !inline.is_empty() || inline_buckets {
            // The scopes and buckets as rows and the snapshot without them, in one batch.
            let ops = state.snapshot_ops()?;
            state.store.write_batch(ops).await?;
        }
        let mut replayed = 0u64;
        for (seq, exp) in state.store.experience_since(state.applied.watermark)? {
            match exp {
                Ok(exp) => {
                    let task = Task {
                        user_id: exp.user_id.clone(),
                        features: exp.context_features.clone(),
                        ..Task::default()
                    };
                    state.learn(seq, &exp, &task, None);
                    replayed += 1;
                }
                Err(_) => state.applied.mark(seq),
            }
        }
        // What the log taught since the snapshot becomes lessons now, as it would have at its
        // consolidation, rather than after the next 25 runs (or never, if none come). Memory,
        // which may have lost what it was sent after its last snapshot, hears every lesson in
        // force now, while the tree starts: at the first consolidation, the 10,000 lessons of a
        // store in use held the retrieval of the run after it 5-10 ms.
        state.consolidate(Tell::MemoryIfUp, replayed > 0).await?;
        state.adaptive.take_unpublished_scopes();
        state.board.publish_all(
            state
                .adaptive
                .scopes()
                .map(|scope| (scope, state.adaptive.lessons(scope))),
        );
        args.slot.publish(myself);
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(chaos) = &state.chaos {
            chaos.on_message();
        }
        let handled = state.handle(myself, msg).await;
        state.publish();
        handled
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        state.persist_at_stop().await?;
        Ok(())
    }
}

impl ReflectorState {
    /// Handles one message.
    async fn handle(
        &mut self,
        myself: ActorRef<ReflectorMsg>,
        msg: ReflectorMsg,
    ) -> Result<(), ActorProcessingErr> {
        let state = self;
        match msg {
            ReflectorMsg::Consolidate {
                seq,
                experience,
                task,
            } => {
                if !state.applied.is_new(seq) {
                    return Ok(());
                }
                let changed = state.learn(seq, &experience, &task, Some(&myself));
                state.since_consolidation += 1;
                state.since_persist += 1;
                if changed || state.since_consolidation >= CONSOLIDATE_EVERY {
                    state.since_consolidation = 0;
                    // A snapshot every `SNAPSHOT_EVERY` experiences, and when the lessons
                    // changed, a correction is accepted (`settle_feedback`) or the actor stops.
                    let persist = changed || state.since_persist >= SNAPSHOT_EVERY;
                    state.consolidate(Tell::Memory, persist).await?;
                }
            }
            ReflectorMsg::Synthesised { job, drafts } => {
                if state.finish_synthesis(&job, drafts) {
                    state.since_consolidation = 0;
                    state.consolidate(Tell::Memory, true).await?;
                }
            }
            ReflectorMsg::Feedback {
                principal,
                scope_of,
                tool,
                text,
                run_id,
                reply,
            } => {
                let prepared =
                    match state.prepare_feedback(principal, &scope_of, tool, text, run_id) {
                        Ok(prepared) => prepared,
                        Err(refused) => {
                            let _ = reply.send(state.settle_feedback(Err(refused)).await);
                            return Ok(());
                        }
                    };
                match state.verifier.clone() {
                    None => {
                        let verdict = OfflineVerifier.check(&prepared);
                        let answer = state.judged(prepared, verdict).await;
                        let _ = reply.send(answer);
                    }
                    // The judge is a model: asked off the actor, so that lessons and contexts
                    // are served meanwhile.
                    Some(judge) => {
                        tokio::spawn(async move {
                            let verdict = match judge.verify(&prepared).await {
                                Ok(verdict) => verdict,
                                Err(e) => {
                                    tracing::warn!(error = %e, judge = judge.name(), "the judge of a correction did not answer; the evidence check decides");
                                    OfflineVerifier.check(&prepared)
                                }
                            };
                            let _ = myself.cast(ReflectorMsg::Judged {
                                prepared: Box::new(prepared),
                                verdict,
                                reply,
                            });
                        });
                    }
                }
            }
            ReflectorMsg::Judged {
                prepared,
                verdict,
                reply,
            } => {
                let answer = state.judged(*prepared, verdict).await;
                let _ = reply.send(answer);
            }
            ReflectorMsg::Lessons {
                scope_prefix,
                reply,
            } => {
                let mut all: Vec<Lesson> = state.reflector.lessons().cloned().collect();
                for scope in state
                    .adaptive
                    .scopes()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
                {
                    all.extend(state.adaptive.lessons(&scope).iter().cloned());
                }
                if let Some(p) = scope_prefix {
                    all.retain(|l| l.scope.starts_with(&p));
                }
                all.sort_by(|a, b| {
                    (a.superseded_by.is_some(), -a.confidence)
                        .partial_cmp(&(b.superseded_by.is_some(), -b.confidence))
                        .unwrap_or(std::cmp::Ordering::Equal)
                });
                let _ = reply.send(all);
            }
        }
        Ok(())
    }

    /// Publishes the lessons of the scopes changed since they were last published.
    fn publish(&mut self) {
        for scope in self.adaptive.take_unpublished_scopes() {
            self.board.publish(&scope, self.adaptive.lessons(&scope));
        }
    }

    /// At a stop: what was learned since the last consolidation becomes lessons, and what
    /// changed since the last snapshot is written (awaited, before the store closes).
    async fn persist_at_stop(&mut self) -> Result<(), hindsight::store::StoreError> {
        if self.since_persist == 0 {
            return Ok(());
        }
        self.since_consolidation = 0;
        self.consolidate(Tell::Nobody, false).await?;
        let ops = self.snapshot_ops()?;
        self.store.write_batch(ops).await.map(drop)
    }

    /// Learns an experience; true when lessons were added or removed (a lesson the run bore
    /// out is reinforced at once, and persisted with the next snapshot: until then the log
    /// replays it). A synthesis that falls due runs offline, or, with a model and `myself`
    /// (live, not in a replay), on the model in the background: its lease keeps the scope to
    /// this one synthesis until it comes back.
    fn learn(
        &mut self,
        seq: u64,
        exp: &ExperienceTuple,
        task: &Task,
        myself: Option<&ActorRef<ReflectorMsg>>,
    ) -> bool {
        if !self.applied.is_new(seq) {
            return false;
        }
        self.applied.mark(seq);
        self.reflector.observe_experience(exp);
        let Ok(scope) = self.adaptive.config().scope_of(task) else {
            return false;
        };
        let now = exp.time_ms;
        let mut due = false;
        // A lesson is about a tool: a failed step that called none (an answer the validator
        // refused, a model error) has the run's triage and ReflectRetry for it instead.
        let tool_failures = exp.steps.iter().filter_map(|s| {
            let tool = s.tool_called.as_deref().filter(|t| !t.is_empty())?;
            s.error.is_some().then_some((s, tool))
        });
        for (step, tool) in tool_failures {
            let obs = FailureObservation {
                run_id: exp.run_id.clone(),
                tool: tool.to_string(),
                error_type: step.error_class.map(|c| c.to_string()),
                message: step.error.clone().unwrap_or_default(),
                arguments: step.tool_input.clone(),
                features: exp.context_features.clone(),
            };
            if let hindsight::learn::adaptive::FailureOutcome::Stored { synthesis_due, .. } =
                self.adaptive.record_failure(&scope, &obs, now)
            {
                due |= synthesis_due;
            }
        }
        self.adaptive
            .confirm(&scope, &exp.context_features, &exp.steps, now);
        if !due || self.ablate.contains(&Mechanism::Lessons) {
            return false;
        }
        if let (Some(model), Some(myself)) = (self.synthesiser.clone(), myself) {
            match self.adaptive.begin_synthesis(&scope, "reflector", now_ms()) {
                Ok(job) => {
                    let myself = myself.clone();
                    tokio::spawn(async move {
                        let drafts = model
                            .synthesise(&job.input)
                            .await
                            .map_err(|e| e.to_string());
                        let _ = myself.cast(ReflectorMsg::Synthesised {
                            job: Box::new(job),
                            drafts,
                        });
                    });
                }
                Err(e) => tracing::debug!(error = %e, "no synthesis"),
            }
            return false;
        }
        match self.adaptive.synthesise_offline(&scope, "reflector", now) {
            Ok(report) => !report.added.is_empty() || !report.removed.is_empty(),
            Err(e) => {
                tracing::debug!(error = %e, "no synthesis");
                false
            }
        }
    }

    /// Completes a model-backed synthesis; when the model failed, gives its lease up and
    /// derives the lessons offline instead. True when the lessons changed.
    fn finish_synthesis(
        &mut self,
        job: &SynthesisJob,
        drafts: Result<Vec<LessonDraft>, String>,
    ) -> bool {
        let now = now_ms();
        let report = match drafts {
            Ok(drafts) => self.adaptive.complete_synthesis(job, drafts, now),
            Err(e) => {
                tracing::warn!(scope = %job.input.scope, error = %e, "the model's synthesis failed; lessons are derived offline");
                self.adaptive.abort_synthesis(job, now);
                self.adaptive
                    .synthesise_offline(&job.input.scope, "reflector", now)
            }
        };
        match report {
            Ok(r) => !r.added.is_empty() || !r.removed.is_empty() || !r.reinforced.is_empty(),
            Err(e) => {
                tracing::warn!(scope = %job.input.scope, error = %e, "a synthesis was not completed");
                false
            }
        }
    }

    /// Turns statistics into lessons, drops the adaptive lessons past their TTL, and hands the
    /// new lessons to memory as `tell` says (and tells it which are in force; a memory that
    /// started again since is sent every lesson in force). Everything changed since the last
    /// snapshot is written when `persist`; until then the log replays it.
    async fn consolidate(
        &mut self,
        tell: Tell,
        persist: bool,
    ) -> Result<(), hindsight::store::StoreError> {
        let now = now_ms();
        let report = self.reflector.consolidate(now);
        // Lessons past their TTL in scopes that no synthesis has run in since.
        self.adaptive.expire(now);
        let mut fresh: Vec<Lesson> = report
            .created
            .iter()
            .chain(&report.updated)
            .filter_map(|id| self.reflector.lesson(id).cloned())
            .collect();
        self.unwritten_lessons
            .extend(fresh.iter().map(|l| l.lesson_id.clone()));
        // The strategies that changed since they were last sent, in the scopes changed since,
        // are sent to memory; a memory that has started again since (it may have lost what it
        // was sent after its last snapshot) is sent all of them.
        self.note_scope_changes();
        let memory_now = self.memory.current().map(|a| a.get_id());
        let all = memory_now.is_none() || memory_now != self.sent_to;
        let unsent = std::mem::take(&mut self.unsent);
        let scopes: Vec<String> = if all {
            self.adaptive.scopes().map(str::to_string).collect()
        } else {
            unsent.into_iter().collect()
        };
        // The lessons that left force since memory last heard: the reflection's superseded
        // ones, and those gone from the scopes written since.
        let mut gone: Vec<String> = report.superseded.clone();
        // Memory hears of a strategy's lesson when it reads differently; one that only decayed
        // or was reinforced is indexed as it was.
        let mut resent: Vec<Lesson> = Vec::new();
        for scope in scopes {
            let now_lessons = self.adaptive.lessons(&scope);
            // What was sent of the scope is taken apart: a lesson that did not change keeps
            // its copy (most of a changed scope's lessons are as they were), the others are
            // copied, and what is left over left force.
            let mut before = self.sent.remove(&scope).unwrap_or_default();
            let mut sent = Vec::with_capacity(now_lessons.len());
            for l in now_lessons {
                let was = before
                    .iter()
                    .position(|b| b.lesson_id == l.lesson_id)
                    .map(|i| before.swap_remove(i));
                match was {
                    Some(b) if b == *l => {
                        if all {
                            resent.push(l.clone());
                        }
                        sent.push(b);
                    }
                    Some(b) if reads_the_same(&b, l) && !all => sent.push(l.clone()),
                    _ => {
                        fresh.push(l.clone());
                        sent.push(l.clone());
                    }
                }
            }
            gone.extend(before.into_iter().map(|b| b.lesson_id));
            self.sent.insert(scope, sent);
        }
        self.sent_to = memory_now;
        fresh.append(&mut resent);
        if persist {
            // Committed by the group-commit writer in the order queued (before anything memory
            // writes for these lessons); the actor does not wait for it.
            let ops = self.snapshot_ops()?;
            write_behind(&self.store, ops, "the reflector's snapshot");
        }
        let index = (!fresh.is_empty()).then(|| MemoryMsg::IndexLessons(fresh));
        // A memory that started again since hears every lesson in force (the reflection's not
        // superseded, and every scope's strategies), so that it drops what left force while it
        // was down; otherwise it hears only which left.
        let retain = if all {
            Some(MemoryMsg::RetainLessons(
                self.reflector
                    .active_lessons()
                    .map(|l| l.lesson_id.clone())
                    .chain(self.adaptive.scopes().flat_map(|scope| {
                        self.adaptive
                            .lessons(scope)
                            .iter()
                            .map(|l| l.lesson_id.clone())
                    }))
                    .collect(),
            ))
        } else {
            (!gone.is_empty()).then(|| MemoryMsg::ForgetLessons(gone))
        };
        for msg in index.into_iter().chain(retain) {
            match tell {
                Tell::Memory => {
                    let _ = self.memory.cast(msg).await;
                }
                Tell::MemoryIfUp => self.memory.tell(msg),
                Tell::Nobody => {}
            }
        }
        Ok(())
    }

    /// Notes the scopes changed since this was last called: to be looked at by the next
    /// consolidation (their lessons sent to memory) and written by the next snapshot.
    fn note_scope_changes(&mut self) {
        for scope in self.adaptive.take_changed_scopes() {
            self.unsent.insert(scope.clone());
            self.unwritten_scopes.insert(scope);
        }
    }

    /// The writes of a snapshot: the scopes, buckets and lessons changed since the last one,
    /// and the rest of the state (one batch, so that what is on disk is always one snapshot's).
    fn snapshot_ops(&mut self) -> Result<Vec<WriteOp>, hindsight::store::StoreError> {
        let mut ops = Vec::new();
        self.note_scope_changes();
        // A changed lesson is in a changed scope; one that left its scope since is not written.
        let changed = self.adaptive.take_changed_lessons();
        for scope in std::mem::take(&mut self.unwritten_scopes) {
            if let Some(state) = self.adaptive.scope(&scope) {
                for lesson in state
                    .lessons
                    .iter()
                    .filter(|l| changed.contains(&l.lesson_id))
                {
                    ops.push(scope_rows::put_lesson(lesson)?);
                }
                ops.push(scope_rows::put(&scope, state)?);
            }
        }
        for id in std::mem::take(&mut self.unwritten_lessons) {
            if let Some(lesson) = self.reflector.lesson(&id) {
                ops.push(scope_rows::put_lesson(lesson)?);
            }
        }
        for (key, bucket) in self.reflector.take_bucket_changes() {
            ops.push(WriteOp::put(BUCKETS, &key, &bucket)?);
        }
        ops.push(WriteOp::put(
            REFLECTOR,
            SNAPSHOT_KEY,
            &Persisted {
                reflector: self.reflector.snapshot_without_buckets(),
                adaptive: self.adaptive.snapshot_without_scopes(),
                applied: self.applied.clone(),
            },
        )?);
        self.since_persist = 0;
        Ok(ops)
    }

    /// A correction checked for who sent it and where it belongs, ready to be judged; the
    /// refusal otherwise (switched off, no scope, no principal, rate-limited, an injection).
    fn prepare_feedback(
        &mut self,
        principal: Option<String>,
        scope_of: &Task,
        tool: Option<String>,
        text: String,
        run_id: Option<String>,
    ) -> Result<PreparedCorrection, CorrectionError> {
        if self.ablate.contains(&Mechanism::Corrections) {
            return Err(CorrectionError::Rejected {
                reason: "corrections are switched off in this runtime".into(),
            });
        }
        let scope =
            self.adaptive
                .config()
                .scope_of(scope_of)
                .map_err(|e| CorrectionError::Rejected {
                    reason: e.to_string(),
                })?;
        let correction = Correction {
            principal,
            scope,
            tool,
            text,
            run_id,
        };
        self.adaptive.prepare_correction(&correction, now_ms())
    }

    /// Commits a judged correction (a lesson when it was verified) and answers.
    async fn judged(
        &mut self,
        prepared: PreparedCorrection,
        verdict: Verdict,
    ) -> Result<Lesson, FeedbackRefused> {
        let result = self.adaptive.commit_correction(prepared, verdict, now_ms());
        self.settle_feedback(result).await
    }

    /// Persists what a correction changed (the rate limiter's count, the lesson) before the
    /// answer, and has memory index the lesson.
    async fn settle_feedback(
        &mut self,
        result: Result<Lesson, CorrectionError>,
    ) -> Result<Lesson, FeedbackRefused> {
        let persisted = async {
            let mut ops = self.snapshot_ops()?;
            if let Ok(lesson) = &result {
                ops.push(scope_rows::put_lesson(lesson)?);
            }
            self.store.write_batch(ops).await
        }
        .await;
        if let Err(e) = persisted {
            return Err(FeedbackRefused::Rejected {
                reason: format!("the correction could not be stored: {e}"),
            });
        }
        // A run started once the answer is out reads the lesson.
        self.publish();
        match result {
            Ok(lesson) => {
                let _ = self
                    .memory
                    .cast(MemoryMsg::IndexLessons(vec![lesson.clone()]))
                    .await;
                Ok(lesson)
            }
            Err(e) => Err(refusal(&e)),
        }
    }
}

/// Why lessons could not be added to a store.
#[derive(Debug, thiserror::Error)]
pub enum StoredLessonsError {
    /// The store could not be read or written.
    #[error(transparent)]
    Store(#[from] hindsight::store::StoreError),
    /// The store holds no reflector snapshot.
    #[error(
        "table `reflector` key `state`: there is none (start and stop a tree on the store first)"
    )]
    Missing,
}

/// Adds lessons to the stored adaptive strategies, for a store prepared offline (an import, or
/// the overhead bench's): each joins its scope's lessons (`lesson.scope`) in the persisted
/// snapshot, and the lesson table, in one transaction; the reflector reads them at the next
/// start (memory indexes lessons as it is sent them: [`MemoryMsg::IndexLessons`]). Fails when
/// the store holds no reflector snapshot (start and stop a tree on it first).
pub async fn add_stored_lessons(
    store: &Store,
    lessons: &[Lesson],
) -> Result<(), StoredLessonsError> {
    if store.get::<Persisted>(REFLECTOR, SNAPSHOT_KEY)?.is_none() {
        return Err(StoredLessonsError::Missing);
    }
    scope_rows::move_inline_rows(store).await?;
    let mut scopes: BTreeMap<String, ScopeState<String>> = BTreeMap::new();
    let mut ops = Vec::with_capacity(lessons.len() + 1);
    for lesson in lessons {
        ops.push(scope_rows::put_lesson(lesson)?);
        let scope = match scopes.entry(lesson.scope.clone()) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let stored = scope_rows::get_named(store, &lesson.scope)?;
                e.insert(stored.unwrap_or_default())
            }
        };
        scope.lessons.push(lesson.lesson_id.clone());
    }
    for (key, scope) in &scopes {
        ops.push(scope_rows::put_named(key, scope)?);
    }
    store.write_batch(ops).await?;
    Ok(())
}

fn refusal(e: &hindsight::learn::adaptive::correction::CorrectionError) -> FeedbackRefused {
    use hindsight::learn::adaptive::correction::CorrectionError as E;
    match e {
        E::Unauthenticated => FeedbackRefused::Unauthenticated,
        E::RateLimited { retry_after_ms, .. } => FeedbackRefused::RateLimited {
            retry_after_secs: retry_after_ms.div_ceil(1000),
        },
        other => FeedbackRefused::Rejected {
            reason: other.to_string(),
        },
    }
}

/// A lesson as stored for the API (JSON-free, so postcard stores it exactly).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LessonRecord {
    /// The lesson.
    pub lesson: Lesson,
}

/// [`LessonRecord`] as it is written: the same bytes, from the lesson where it is kept.
#[derive(Serialize)]
pub(crate) struct LessonRecordRef<'a> {
    /// The lesson.
    pub(crate) lesson: &'a Lesson,
}
