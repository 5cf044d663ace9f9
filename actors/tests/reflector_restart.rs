//! The reflector across restarts: each scope of the adaptive strategies (a user's failures,
//! lessons named, and lease), each lesson, and each bucket of the reflection's statistics is
//! written as a row of its own as it changes, so a consolidation writes what changed rather
//! than every user's lessons and every count, and a new tree reads the rows back. A store an
//! earlier build wrote, with the scopes and buckets inside the snapshot, or with scope rows
//! that carried their lessons, loses nothing either.

mod correction_support;

use hindsight::learn::adaptive::{AdaptiveSnapshot, ScopeState};
use hindsight::learn::reflector::{Bucket, ReflectorSnapshot};
use hindsight::store::{Durability, KvTable, Store, WriteOp};
use hindsight::tools::sim::SimEnv;
use hindsight::tools::sim::agent::AgentEnv;
use hindsight_actors::app::workload;
use hindsight_actors::applied::Applied;
use hindsight_actors::reflector::{BUCKETS, LESSONS, REFLECTOR, ReflectorMsg};
use hindsight_actors::scope_rows::{self, SCOPES};
use hindsight_actors::{Runtime, RuntimeOptions};
use serde::{Deserialize, Serialize};

const SCOPE: &str = "user:u";

/// The reflector's snapshot as every build writes it (its scopes empty since this one).
#[derive(Serialize, Deserialize)]
struct Snapshot {
    reflector: ReflectorSnapshot,
    adaptive: AdaptiveSnapshot,
    applied: Applied,
}

fn options(dir: &std::path::Path, env: &AgentEnv) -> RuntimeOptions {
    let mut opts = RuntimeOptions::new(dir, env.clone());
    opts.durability = Durability::None;
    opts
}

/// Whether the lesson board of `rt` shows `lesson` to a task of user `u` where it holds, as a
/// run reads it.
fn on_the_board(rt: &Runtime, env: &AgentEnv, lesson: &hindsight::Lesson) -> bool {
    let task = hindsight::Task {
        features: lesson.preconditions.clone(),
        ..correction_support::task(env, 61)
    };
    rt.ctx()
        .lessons
        .context_for(&task)
        .is_some_and(|context| context.contains(&lesson.action))
}

/// The lesson ids of user `u`'s scope a tree on `dir` holds, and whether its lesson board shows
/// `lesson` to the user's next task.
async fn lessons_after_start(
    dir: &std::path::Path,
    env: &AgentEnv,
    lesson: &hindsight::Lesson,
) -> (Vec<String>, bool) {
    let rt = Runtime::start(options(dir, env)).await.unwrap();
    let shown = on_the_board(&rt, env, lesson);
    let lessons = rt
        .ctx()
        .dir
        .reflector
        .call(|reply| ReflectorMsg::Lessons {
            scope_prefix: Some(SCOPE.into()),
            reply,
        })
        .await
        .unwrap();
    rt.shutdown().await;
    (lessons.into_iter().map(|l| l.lesson_id).collect(), shown)
}

/// Starts a tree on `dir` and checks that it holds `lesson` in user `u`'s scope and shows it on
/// its board.
async fn assert_back_after_start(
    dir: &std::path::Path,
    env: &AgentEnv,
    lesson: &hindsight::Lesson,
) {
    let (held, shown) = lessons_after_start(dir, env, lesson).await;
    assert!(held.contains(&lesson.lesson_id), "{held:?}");
    assert!(
        shown,
        "a started reflector publishes the lessons it read back"
    );
}

/// Every scope's state as read back from its row and its lessons' rows.
fn scopes(store: &Store) -> Vec<(String, ScopeState)> {
    scope_rows::read_all(store)
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_is_its_own_row_and_comes_back_after_a_restart_and_an_upgrade() {
    let env = AgentEnv::load(std::path::Path::new("../config/envs/support_desk.toml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let rt = Runtime::start(options(dir.path(), &env)).await.unwrap();
    let accepted = correction_support::run_and_correct(&rt, &env)
        .await
        .unwrap();
    // Published before the answer: the user's next run reads it.
    assert!(on_the_board(&rt, &env, &accepted));
    rt.shutdown().await;

    // On disk: the scope's row names the correction, whose row holds it; the snapshot holds
    // no scope.
    let store = Store::open(dir.path(), Default::default()).unwrap();
    let row = store
        .get::<ScopeState<String>>(SCOPES, SCOPE)
        .unwrap()
        .unwrap();
    assert!(row.lessons.contains(&accepted.lesson_id));
    let lesson: hindsight_actors::reflector::LessonRecord =
        store.get(LESSONS, &accepted.lesson_id).unwrap().unwrap();
    assert_eq!(lesson.lesson, accepted);
    let mut snapshot: Snapshot = store.get(REFLECTOR, "state").unwrap().unwrap();
    assert!(snapshot.adaptive.scopes.is_empty());
    drop(store);
    assert_back_after_start(dir.path(), &env, &accepted).await;

    // A store the build before wrote: scope rows that carry their lessons, in a table of their
    // own, and no lesson rows. Nothing is lost, and the rows name their lessons again.
    let store = Store::open(dir.path(), Default::default()).unwrap();
    let written = scopes(&store);
    const INLINE: KvTable = KvTable::new("reflector_scopes");
    let mut ops = Vec::new();
    for (key, state) in &written {
        ops.push(WriteOp::put(INLINE, key, state).unwrap());
        ops.push(WriteOp::delete(SCOPES, key));
        for l in &state.lessons {
            ops.push(WriteOp::delete(LESSONS, &l.lesson_id));
        }
    }
    store.write_batch(ops).await.unwrap();
    drop(store);
    assert_back_after_start(dir.path(), &env, &accepted).await;
    let store = Store::open(dir.path(), Default::default()).unwrap();
    assert!(store.scan::<ScopeState>(INLINE).unwrap().is_empty());
    let back = scopes(&store);
    assert_eq!(back, written);

    // A store an earlier build wrote: the scopes inside the snapshot, no rows. Nothing is lost,
    // and the scopes are rows again.
    let mut ops = Vec::new();
    for (key, state) in back {
        ops.push(WriteOp::delete(SCOPES, &key));
        snapshot.adaptive.scopes.insert(key, state);
    }

    ops.push(WriteOp::put(REFLECTOR, "state", &snapshot).unwrap());
    store.write_batch(ops).await.unwrap();
    drop(store);
    assert_back_after_start(dir.path(), &env, &accepted).await;
    let store = Store::open(dir.path(), Default::default()).unwrap();
    assert!(
        store
            .scan::<ScopeState<String>>(SCOPES)
            .unwrap()
            .iter()
            .any(|(k, _)| k == SCOPE)
    );
}

/// The buckets of the reflection's statistics (a tool workflow's: the support desk's agents
/// count none).
fn buckets(store: &Store) -> Vec<(String, Bucket)> {
    store
        .scan::<Bucket>(BUCKETS)
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_is_its_own_row_and_comes_back_after_a_restart_and_an_upgrade() {
    let path = std::path::Path::new("../config/envs/bank_statements.toml");
    let env = SimEnv::load(path).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let options = || {
        let mut opts = RuntimeOptions::new(dir.path(), env.clone());
        opts.durability = Durability::None;
        opts
    };
    let rt = Runtime::start(options()).await.unwrap();
    for i in 0..60 {
        rt.orchestrate(workload::sim_task(&env, 3, i))
            .await
            .unwrap();
    }
    rt.shutdown().await;
    // A start replays what the log holds since the last consolidation, and writes it.
    Runtime::start(options()).await.unwrap().shutdown().await;
    let store = Store::open(dir.path(), Default::default()).unwrap();
    let counted = buckets(&store);
    assert!(
        !counted.is_empty(),
        "the runs' outcomes are counted in rows"
    );
    let mut snapshot: Snapshot = store.get(REFLECTOR, "state").unwrap().unwrap();
    assert!(snapshot.reflector.buckets.is_empty());
    // A store an earlier build wrote: the buckets inside the snapshot, no rows.
    let mut ops = Vec::new();
    for (key, bucket) in counted.clone() {
        ops.push(WriteOp::delete(BUCKETS, &key));
        snapshot.reflector.buckets.insert(key, bucket);
    }
    ops.push(WriteOp::put(REFLECTOR, "state", &snapshot).unwrap());
    store.write_batch(ops).await.unwrap();
    drop(store);
    let rt = Runtime::start(options()).await.unwrap();
    rt.shutdown().await;
    // The counts are rows again, as they were, and no longer in the snapshot.
    let store = Store::open(dir.path(), Default::default()).unwrap();
    assert_eq!(buckets(&store), counted);
    let snapshot: Snapshot = store.get(REFLECTOR, "state").unwrap().unwrap();
    assert!(snapshot.reflector.buckets.is_empty());
}
