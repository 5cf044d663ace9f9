//! The Memory actor: owns triangulated memory (the knowledge graph with its statistics and the
//! vector index of lessons, SOPs and postmortems) and the episodic diary. It answers retrieval
//! with one deduplicated, cited bundle, writes a diary note for every finished run, and persists
//! the graph and vectors only when an experience is salient (novel or a material change); the
//! experience log, always written by the run, is replayed at start from the last snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use hindsight::memory::{
    IndexCandidate, ItemKind, LessonIndexed, Memory, MemorySnapshot, Scopes, TaskQuery, VectorItem,
};
use hindsight::store::{KvTable, NewDiaryEntry, Store, WriteOp};
use hindsight::{ExperienceTuple, Lesson, Sop, Task, now_ms};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use serde::{Deserialize, Serialize};

use crate::applied::{Applied, read_snapshot, write_behind};
use crate::chaos_hook::ChaosHook;
use crate::directory::Slot;
use crate::tenancy::{run_in_tenant, scope_in_tenant, sop_in_tenant};

/// The table of the memory snapshot.
pub const MEMORY: KvTable = KvTable::new("memory");
/// The table of the vector index's items (lessons, SOPs, postmortems), by `kind:id`, each
/// written as it changes, in the batch of the snapshot it belongs to.
pub const MEMORY_ITEMS: KvTable = KvTable::new("memory_items");
const SNAPSHOT_KEY: &str = "state";

/// Where a retrieved item comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Citation {
    /// The kind of source (`lesson`, `sop`, `postmortem`, `strategy`, `failure_mode`, `diary`).
    pub kind: String,
    /// Its identifier.
    pub id: String,
    /// How strongly it was retrieved.
    pub score: f64,
}

/// One retrieved item with its citation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrievedItem {
    /// The text.
    pub text: String,
    /// Where it comes from.
    pub citation: Citation,
}

/// What memory returns for a task: deduplicated items, each cited, and the strategy context.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RetrievalBundle {
    /// The task's cluster, if the graph knows it.
    pub cluster: Option<String>,
    /// The items, grouped by kind, best first.
    pub items: Vec<RetrievedItem>,
    /// The fenced strategy context to inject before the run, if any.
    pub strategy_context: Option<String>,
}

impl RetrievalBundle {
    /// The guidance to plan with, if any.
    pub fn guidance(&self) -> Option<String> {
        self.strategy_context.clone()
    }

    /// Every item's citation as `kind:id`.
    pub fn citations(&self) -> Vec<String> {
        self.items
            .iter()
            .map(|i| format!("{}:{}", i.citation.kind, i.citation.id))
            .collect()
    }
}

/// A retrieval query.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Query {
    /// The goal or question, in words.
    pub text: String,
    /// The task's features.
    pub features: BTreeMap<String, String>,
    /// The tools of interest.
    pub tools: Vec<String>,
    /// Items wanted.
    pub k: usize,
}

/// Messages of the memory actor.
pub enum MemoryMsg {
    /// What memory holds for a task (before it runs).
    Retrieve {
        /// The task.
        task: Arc<Task>,
        /// The bundle.
        reply: RpcReplyPort<RetrievalBundle>,
    },
    /// What memory holds for a query (the API's `/memory/retrieve`).
    Query {
        /// The query.
        query: Box<Query>,
        /// The bundle.
        reply: RpcReplyPort<RetrievalBundle>,
    },
    /// A run finished and its experience is logged at `seq`.
    Record {
        /// The experience's sequence number.
        seq: u64,
        /// The experience.
        experience: Arc<ExperienceTuple>,
        /// The task.
        task: Arc<Task>,
    },
    /// Index lessons (from the reflector).
    IndexLessons(Vec<Lesson>),
    /// Index an SOP and link it to its cluster (from the policy).
    IndexSop(Box<Sop>),
    /// Keep only these lessons (the ones in force, from the reflector): the rest were decayed,
    /// expired or superseded since they were indexed.
    RetainLessons(BTreeSet<String>),
    /// Forget these lessons, which left force (expired, superseded or dropped from their
    /// scope) since memory was last told (from the reflector).
    ForgetLessons(Vec<String>),
    /// Forget a rolled-back SOP: its vector and its APPLIES_TO edges (from the policy).
    ForgetSop(String),
    /// Answer the retrievals received since the last answer, together. Memory sends it to
    /// itself behind the first [`MemoryMsg::Retrieve`] it holds, so that the retrievals of a
    /// burst of runs (queued before it) are searched in one pass.
    AnswerRetrievals,
}

/// The memory actor.
pub struct MemoryActor;

/// Start-up arguments.
pub struct MemoryArgs {
    /// The store.
    pub store: Store,
    /// The tools of the workflow (retrieval ranks failure modes of these).
    pub tools: Vec<String>,
    /// Where it publishes itself.
    pub slot: Arc<Slot<MemoryMsg>>,
    /// Fault injection.
    pub chaos: Option<ChaosHook>,
    /// Whether a tenant's run may read what the graph learned from every tenant's runs (the
    /// best strategies and failure modes of its cluster: `api.shared_learning`).
    pub shared_learning: bool,
}

#[derive(Serialize, Deserialize)]
struct Persisted {
    memory: MemorySnapshot,
    applied: Applied,
}

/// The memory actor's state.
pub struct MemoryState {
    store: Store,
    memory: Memory,
    applied: Applied,
    tools: Vec<String>,
    since_snapshot: u64,
    chaos: Option<ChaosHook>,
    shared_learning: bool,
    /// The SOPs indexed, by id (whose runs they were promoted from decides who may read them).
    sops: BTreeMap<String, Sop>,
    /// Retrievals received and not answered yet (see [`MemoryMsg::AnswerRetrievals`]).
    pending: Vec<(Arc<Task>, RpcReplyPort<RetrievalBundle>)>,
}

impl Actor for MemoryActor {
    type Msg = MemoryMsg;
    type State = MemoryState;
    type Arguments = MemoryArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        crate::applied::after_queued_writes(&args.store, "memory").await;
        let stored: Option<Persisted> = read_snapshot(&args.store, MEMORY, SNAPSHOT_KEY);
        let (memory, applied, rebuilt) = restore(&args.store, stored)?;
        let mut state = MemoryState {
            store: args.store,
            memory,
            applied,
            tools: args.tools,
            since_snapshot: 0,
            chaos: args.chaos,
            shared_learning: args.shared_learning,
            sops: BTreeMap::new(),
            pending: Vec::new(),
        };
        for (seq, exp) in state.store.experience_since(state.applied.watermark)? {
            match exp {
                Ok(exp) => {
                    state.ingest(seq, &exp);
                }
                Err(e) => {
                    tracing::error!(seq, error = %e, "an experience record cannot be read; skipped");
                    state.applied.mark(seq);
                }
            }
        }
        if let Some(stale) = rebuilt.as_ref().filter(|k| !k.is_empty()) {
            // Items of a snapshot that could not be used: the index is rebuilt from the log, so
            // they go (queued before any later snapshot, so committed first).
            write_behind(
                &state.store,
                stale
                    .iter()
                    .map(|k| WriteOp::delete(MEMORY_ITEMS, k))
                    .collect(),
                "the removal of an unusable memory snapshot's items",
            );
        }
        state.sync_sops();
        if rebuilt.is_some() {
            // A memory rebuilt is a snapshot now, which the items written without one (lessons
            // and SOPs) are read back against at the next start.
            let ops = state.snapshot_ops()?;
            state.since_snapshot = 0;
            write_behind(&state.store, ops, "the memory snapshot");
        }
        args.slot.publish(myself);
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            MemoryMsg::Retrieve { task, reply } => {
                if let Some(chaos) = &state.chaos {
                    chaos.on_message();
                }
                state.pending.push((task, reply));
                // The first of a burst: the answer comes behind the retrievals queued after it.
                if state.pending.len() == 1 && myself.cast(MemoryMsg::AnswerRetrievals).is_err() {
                    state.answer_retrievals();
                }
                return Ok(());
            }
            MemoryMsg::AnswerRetrievals => {
                state.answer_retrievals();
                return Ok(());
            }
            _ => {}
        }
        // Whatever changes memory comes after the retrievals received before it.
        state.answer_retrievals();
        if let Some(chaos) = &state.chaos {
            chaos.on_message();
        }
        match msg {
            MemoryMsg::Retrieve { .. } | MemoryMsg::AnswerRetrievals => {}
            MemoryMsg::Query { query, reply } => {
                let _ = reply.send(
                    state
                        .retrieve_many(&[(&*query, None, Scopes::All)])
                        .pop()
                        .unwrap_or_default(),
                );
            }
            MemoryMsg::Record {
                seq,
                experience,
                task: _,
            } => {
                if !state.applied.is_new(seq) {
                    return Ok(());
                }
                let note = diary_note(seq, &experience);
                let salient = state.ingest(seq, &experience);
                let mut ops = vec![WriteOp::diary(&note)?];
                if salient || state.since_snapshot >= crate::applied::SNAPSHOT_EVERY {
                    ops.extend(state.snapshot_ops()?);
                    state.since_snapshot = 0;
                }
                // Written by the group-commit writer, in the order queued; the actor does not
                // wait for it.
                write_behind(&state.store, ops, "a diary note or the memory snapshot");
            }
            MemoryMsg::IndexLessons(lessons) => {
                let mut embedded = false;
                for lesson in lessons {
                    let text = hindsight::learn::reflector::describe(&lesson);
                    match state.memory.index_lesson(
                        &lesson.lesson_id,
                        text,
                        &lesson.scope,
                        now_ms(),
                    ) {
                        Ok(done) => embedded |= done == LessonIndexed::Embedded,
                        Err(e) => tracing::warn!(error = %e, "a lesson was not indexed"),
                    }
                }
                // A lesson whose numbers alone changed is written with the next write of the
                // items or the next snapshot: the reflector sends every lesson in force as it
                // starts, so a crash before then loses no count.
                if embedded {
                    state.persist_items_later()?;
                }
            }
            MemoryMsg::IndexSop(sop) => {
                state.index_sop(&sop);
                state.persist_items_later()?;
            }
            MemoryMsg::RetainLessons(active) => {
                if state.memory.retain_lessons(&active) > 0 {
                    state.persist_items_later()?;
                }
            }
            MemoryMsg::ForgetLessons(gone) => {
                let forgotten = gone
                    .iter()
                    .filter(|id| state.memory.forget(ItemKind::Lesson, id).is_some())
                    .count();
                if forgotten > 0 {
                    state.persist_items_later()?;
                }
            }
            MemoryMsg::ForgetSop(sop_id) => {
                if state.memory.forget_sop(&sop_id) {
                    state.persist_items_later()?;
                }
            }
        }
        Ok(())
    }
}

impl MemoryState {
    /// Indexes an SOP's plan (replacing an earlier version's) and links it to its cluster.
    fn index_sop(&mut self, sop: &Sop) {
        self.sops.insert(sop.sop_id.clone(), sop.clone());
        let cluster = hindsight::memory::graph_cluster_key(&sop.preconditions);
        self.memory.link_sop(&sop.sop_id, &cluster);
        let text = format!(
            "SOP {} v{}: {}",
            sop.sop_id,
            sop.version,
            sop.plan
                .iter()
                .map(|a| format!("{} with {}/{}", a.stage, a.tool, a.strategy))
                .collect::<Vec<_>>()
                .join(", then ")
        );
        if self.memory.holds(ItemKind::Sop, &sop.sop_id, &text, None) {
            return;
        }
        let item = VectorItem {
            kind: ItemKind::Sop,
            id: sop.sop_id.clone(),
            vector: self.memory.embed(&text),
            text,
            cluster: Some(cluster),
            time_ms: now_ms(),
            scope: None,
        };
        if let Err(e) = self.memory.index_item(item) {
            tracing::warn!(error = %e, "an SOP was not indexed");
        }
    }

    /// Brings the SOP index in line with the SOP table the policy writes (each SOP's latest
    /// version: indexed when stable, forgotten otherwise), whatever the snapshot held or lost
    /// (a promotion or a rollback while this actor was down reached the table, not it).
    fn sync_sops(&mut self) {
        let rows = match self.store.scan::<Sop>(crate::policy::SOPS) {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(error = %e, "the SOP table cannot be read; SOPs are indexed as they are promoted");
                return;
            }
        };
        let mut latest: BTreeMap<String, Sop> = BTreeMap::new();
        // Candidates on trial are not in force: the latest version that has been.
        for sop in rows
            .into_iter()
            .filter_map(|(_, s)| s.ok())
            .filter(|s| s.status != hindsight::SopStatus::Candidate)
        {
            if latest
                .get(&sop.sop_id)
                .is_none_or(|l| l.version < sop.version)
            {
                latest.insert(sop.sop_id.clone(), sop);
            }
        }
        for sop in latest.values() {
            if sop.status == hindsight::SopStatus::Stable {
                self.index_sop(sop);
            } else {
                self.memory.forget_sop(&sop.sop_id);
            }
        }
    }

    /// Applies an experience to the graph (and indexes a postmortem of a failed run); true when
    /// the change is salient enough to write the graph and vectors.
    fn ingest(&mut self, seq: u64, exp: &ExperienceTuple) -> bool {
        if !self.applied.is_new(seq) {
            return false;
        }
        let candidate = (!exp.result.passed).then(|| {
            let text = postmortem(exp);
            IndexCandidate {
                kind: ItemKind::Postmortem,
                id: exp.run_id.clone(),
                vector: self.memory.embed(&text),
                text,
            }
        });
        self.applied.mark(seq);
        self.since_snapshot += 1;
        match self.memory.ingest(exp, candidate) {
            Ok(decision) => {
                let salient = decision.write_graph || decision.write_vectors;
                self.memory.mark_written(&decision);
                salient
            }
            Err(e) => {
                tracing::warn!(error = %e, "an experience was not ingested into memory");
                false
            }
        }
    }

    /// The writes of the index items changed since the last ones (or removed).
    fn item_ops(&mut self) -> Result<Vec<WriteOp>, hindsight::store::StoreError> {
        self.memory
            .take_index_changes()
            .into_iter()
            .map(|(key, item)| match item {
                Some(item) => WriteOp::put(MEMORY_ITEMS, &key, &item),
                None => Ok(WriteOp::delete(MEMORY_ITEMS, &key)),
            })
            .collect()
    }

    /// The writes of a snapshot: the index items changed since the last write of them, and the
    /// rest of the state, in one batch.
    fn snapshot_ops(&mut self) -> Result<Vec<WriteOp>, hindsight::store::StoreError> {
        let mut ops = self.item_ops()?;
        ops.push(WriteOp::put(
            MEMORY,
            SNAPSHOT_KEY,
            &Persisted {
                memory: self.memory.snapshot(),
                applied: self.applied.clone(),
            },
        )?);
        Ok(ops)
    }

    /// Queues the index items that lessons and SOPs changed (their owners' sends, which the
    /// experience log does not hold) without a snapshot of the graph: what they change in the
    /// graph (an SOP's links) is made again from the SOP table at every start, so the graph
    /// waits for the next snapshot. Queued now, so that writes are committed in order.
    fn persist_items_later(&mut self) -> Result<(), hindsight::store::StoreError> {
        let ops = self.item_ops()?;
        if !ops.is_empty() {
            write_behind(&self.store, ops, "memory's index items");
        }
        Ok(())
    }

    /// Answers the retrievals received since the last answer, together.
    fn answer_retrievals(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        let asked: Vec<(Query, Vec<String>)> = pending
            .iter()
            .map(|(task, _)| {
                let query = Query {
                    text: task.goal.clone(),
                    features: task.features.clone(),
                    tools: self.tools.clone(),
                    k: 5,
                };
                (query, task.lesson_scopes())
            })
            .collect();
        let queries: Vec<(&Query, Option<&str>, Scopes<'_>)> = asked
            .iter()
            .zip(&pending)
            .map(|((query, scopes), (task, _))| {
                (query, task.tenant.as_deref(), Scopes::Only(scopes))
            })
            .collect();
        let bundles = self.retrieve_many(&queries);
        for ((_, reply), bundle) in pending.into_iter().zip(bundles) {
            let _ = reply.send(bundle);
        }
    }

    /// What memory holds for each query, as a run of its tenant may read it, with the lessons
    /// of its scopes.
    fn retrieve_many(
        &self,
        queries: &[(&Query, Option<&str>, Scopes<'_>)],
    ) -> Vec<RetrievalBundle> {
        let diary: Vec<hindsight::DiaryEntry> = self
            .store
            .diary_tail(5)
            .map(|v| v.into_iter().filter_map(Result::ok).collect())
            .unwrap_or_default();
        // Each tenant's own notes (all of them for a query over the whole store).
        let diaries: Vec<Vec<hindsight::DiaryEntry>> = queries
            .iter()
            .map(|(_, tenant, _)| {
                diary
                    .iter()
                    .filter(|e| {
                        tenant.is_none_or(|t| {
                            e.run_id.as_deref().is_some_and(|r| run_in_tenant(t, r))
                        })
                    })
                    .cloned()
                    .collect()
            })
            .collect();
        let tasks: Vec<TaskQuery<'_>> = queries
            .iter()
            .zip(&diaries)
            .map(|((q, _, scopes), diary)| TaskQuery {
                goal: &q.text,
                features: &q.features,
                tools: &q.tools,
                diary,
                k: q.k.max(1),
                scopes: *scopes,
            })
            .collect();
        let bundles = self.memory.retrieve_for_many(&tasks);
        queries
            .iter()
            .zip(bundles)
            .map(|((_, tenant, _), bundle)| RetrievalBundle {
                cluster: bundle.cluster,
                items: bundle
                    .items
                    .into_iter()
                    .map(|i| RetrievedItem {
                        text: i.text,
                        citation: Citation {
                            kind: serde_json::to_value(i.citation.kind)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_string))
                                .unwrap_or_else(|| "item".to_string()),
                            id: i.citation.id,
                            score: i.citation.score,
                        },
                    })
                    .filter(|i| tenant.is_none_or(|t| self.visible(t, &i.citation)))
                    .collect(),
                strategy_context: None,
            })
            .collect()
    }

    /// Whether a run of `tenant` may read the item `citation` names: its own lessons, SOPs
    /// promoted from its runs only, its postmortems and diary notes, and the graph's statistics
    /// over every tenant's runs only with `shared_learning` (the API's rules, `crate::tenancy`).
    fn visible(&self, tenant: &str, citation: &Citation) -> bool {
        let id = citation.id.as_str();
        match citation.kind.as_str() {
            // The scope the lesson was indexed with (a lesson's scope never changes).
            "lesson" => self
                .memory
                .index()
                .get(ItemKind::Lesson, id)
                .and_then(|item| item.scope.as_deref())
                .is_some_and(|scope| scope_in_tenant(tenant, scope)),
            "sop" => self.sops.get(id).is_some_and(|s| sop_in_tenant(tenant, s)),
            "postmortem" => run_in_tenant(tenant, id),
            // Taken from the tenant's own diary notes only (see `retrieve`).
            "diary" => true,
            "strategy" | "failure_mode" => self.shared_learning,
            _ => false,
        }
    }
}

/// Memory as its snapshot and items left it, with the experiences applied; an empty memory
/// (rebuilt from the log) when there is no usable snapshot, with the keys of the items left
/// from it, which no longer belong to anything (`Some`, empty when there were none; `None`
/// when the snapshot was used). An item that cannot be read is left out (and logged): the log
/// cannot bring back a lesson or an SOP, their owners send them again.
fn restore(
    store: &Store,
    stored: Option<Persisted>,
) -> Result<(Memory, Applied, Option<Vec<String>>), hindsight::store::StoreError> {
    let rows = store.scan::<VectorItem>(MEMORY_ITEMS)?;
    let keys: Vec<String> = rows.iter().map(|(k, _)| k.clone()).collect();
    let Some(stored) = stored else {
        return Ok((Memory::default(), Applied::default(), Some(keys)));
    };
    let items = rows.into_iter().filter_map(|(key, item)| match item {
        Ok(item) => Some(item),
        Err(e) => {
            tracing::error!(key, error = %e, "an item of memory's index cannot be read; skipped");
            None
        }
    });
    match Memory::restore(stored.memory, items) {
        Ok(memory) => Ok((memory, stored.applied, None)),
        Err(e) => {
            tracing::error!(error = %e, "memory's snapshot cannot be used; rebuilding it from the experience log");
            Ok((Memory::default(), Applied::default(), Some(keys)))
        }
    }
}

/// The postmortem of a failed run: what failed where.
fn postmortem(exp: &ExperienceTuple) -> String {
    let failures: Vec<String> = exp
        .steps
        .iter()
        .filter_map(|s| {
            let class = s.error_class?;
            Some(format!(
                "{} at {} ({})",
                s.tool_called.as_deref().unwrap_or("?"),
                s.metadata
                    .get("stage")
                    .and_then(|v| v.as_str())
                    .unwrap_or("?"),
                class
            ))
        })
        .collect();
    format!(
        "run {} of {} ended {}: {}",
        exp.run_id,
        exp.context_features
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
        exp.result.state,
        failures.join("; ")
    )
}

/// The diary note of a finished run.
pub fn diary_note(seq: u64, exp: &ExperienceTuple) -> NewDiaryEntry {
    NewDiaryEntry {
        time_ms: now_ms(),
        run_id: Some(exp.run_id.clone()),
        kind: "run_finished".to_string(),
        text: format!(
            "task {} ended {} after {} attempt(s) with plan {} (reward {:.3}; experience #{seq})",
            exp.task_id, exp.result.state, exp.result.attempts, exp.plan_id, exp.reward
        ),
        tags: exp
            .context_features
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
    }
}
