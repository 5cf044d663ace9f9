//! The reflector across restarts: each scope of the adaptive strategies (a user's failures,
//! lessons and lease) and each bucket of the reflection's statistics is written as a row of its
//! own as it changes, so a consolidation writes what changed rather than every user's lessons
//! and every count, and a new tree reads the rows back. A store an earlier build wrote, with
//! the scopes and buckets inside the snapshot, loses nothing either.

mod correction_support;

use hindsight::learn::adaptive::{AdaptiveSnapshot, ScopeState};
use hindsight::learn::reflector::{Bucket, ReflectorSnapshot};
use hindsight::store::{Durability, Store, WriteOp};
use hindsight::tools::sim::SimEnv;
use hindsight::tools::sim::agent::AgentEnv;
use hindsight_actors::app::workload;
use hindsight_actors::applied::Applied;
use hindsight_actors::reflector::{BUCKETS, REFLECTOR, ReflectorMsg, SCOPES};
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

    // On disk: the scope's row holds the correction; the snapshot holds no scope.
    let store = Store::open(dir.path(), Default::default()).unwrap();
    let rows: Vec<(String, ScopeState)> = store
        .scan::<ScopeState>(SCOPES)
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, v.unwrap()))
        .collect();
    let (_, row) = rows.iter().find(|(k, _)| k == SCOPE).unwrap();
    assert!(
        row.lessons
            .iter()
            .any(|l| l.lesson_id == accepted.lesson_id)
    );
    let mut snapshot: Snapshot = store.get(REFLECTOR, "state").unwrap().unwrap();
    assert!(snapshot.adaptive.scopes.is_empty());
    drop(store);
    let (held, shown) = lessons_after_start(dir.path(), &env, &accepted).await;
    assert!(held.contains(&accepted.lesson_id), "{held:?}");
    assert!(
        shown,
        "a started reflector publishes the lessons it read back"
    );

    // A store an earlier build wrote: the scopes inside the snapshot, no rows. Nothing is lost,
    // and the scopes are rows again.
    let store = Store::open(dir.path(), Default::default()).unwrap();
    let mut ops = Vec::new();
    for (key, row) in store.scan::<ScopeState>(SCOPES).unwrap() {
        snapshot.adaptive.scopes.insert(key.clone(), row.unwrap());
        ops.push(WriteOp::delete(SCOPES, &key));
    }

    ops.push(WriteOp::put(REFLECTOR, "state", &snapshot).unwrap());
    store.write_batch(ops).await.unwrap();
    drop(store);
    let (held, shown) = lessons_after_start(dir.path(), &env, &accepted).await;
    assert!(held.contains(&accepted.lesson_id), "{held:?}");
    assert!(shown);
    let store = Store::open(dir.path(), Default::default()).unwrap();
    assert!(
        store
            .scan::<ScopeState>(SCOPES)
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
