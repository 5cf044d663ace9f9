//! What a run reads from memory is its tenant's: lessons of its scopes, postmortems and diary
//! notes of its runs, SOPs promoted from its runs; never another tenant's, in a tree that serves
//! several (the daemon's); and never another user's lessons, tenant or not.

use hindsight::Task;
use hindsight::store::Durability;
use hindsight::tools::sim::agent::AgentEnv;
use hindsight_actors::memory::MemoryMsg;
use hindsight_actors::{Runtime, RuntimeOptions};

/// Task `i` of the support desk as the API namespaces it for `tenant`.
fn task(env: &AgentEnv, tenant: &str, i: u64) -> Task {
    let t = env.task(i);
    Task {
        task_id: format!("{tenant}/{}", t.task_id),
        user_id: Some(format!("{tenant}/u")),
        tenant: Some(tenant.into()),
        ..t
    }
}

/// The support desk's environment and a directory for its store.
fn support_desk() -> (AgentEnv, tempfile::TempDir) {
    let env = AgentEnv::load(std::path::Path::new("../config/envs/support_desk.toml")).unwrap();
    (env, tempfile::tempdir().unwrap())
}

/// A tree of `env` on a store in `dir` that does not sync.
async fn start(env: &AgentEnv, dir: &std::path::Path) -> Runtime {
    let mut opts = RuntimeOptions::new(dir, env.clone());
    opts.durability = Durability::None;
    Runtime::start(opts).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_reads_nothing_of_another_tenant_from_memory() {
    let (env, dir) = support_desk();
    let rt = start(&env, dir.path()).await;
    // Tenant a's runs fail and learn (postmortems, diary notes, lessons of user a/u).
    for i in 0..80 {
        rt.orchestrate(task(&env, "a", i)).await.unwrap();
    }
    let retrieve = |t: Task| {
        let rt = &rt;
        async move {
            rt.ctx()
                .dir
                .memory
                .call(|reply| MemoryMsg::Retrieve {
                    task: std::sync::Arc::new(t.clone()),
                    reply,
                })
                .await
                .unwrap()
        }
    };
    let own = retrieve(task(&env, "a", 80)).await;
    assert!(
        own.items
            .iter()
            .any(|i| i.citation.kind != "strategy" && i.citation.kind != "failure_mode"),
        "tenant a reads its own: {:?}",
        own.items
    );
    let other = retrieve(task(&env, "b", 80)).await;
    assert!(
        other.items.is_empty(),
        "tenant b reads nothing of tenant a: {:?}",
        other.items
    );
    // A task of no tenant (an embedder's own tree) reads everything but other users' lessons.
    let mut untenanted = env.task(80);
    untenanted.user_id = Some("a/u".into());
    let lessons = |items: &[hindsight_actors::memory::RetrievedItem]| -> Vec<String> {
        items
            .iter()
            .filter(|i| i.citation.kind == "lesson")
            .map(|i| i.citation.id.clone())
            .collect()
    };
    let user_u = retrieve(untenanted.clone()).await;
    assert!(!lessons(&user_u.items).is_empty(), "{:?}", user_u.items);
    // Another user of the same tenant reads none of user a/u's lessons.
    let mut colleague = task(&env, "a", 80);
    colleague.user_id = Some("a/v".into());
    let read = lessons(&retrieve(colleague).await.items);
    assert!(
        read.iter().all(|l| !lessons(&user_u.items).contains(l)),
        "{read:?}"
    );
    untenanted.user_id = Some("someone".into());
    let read = lessons(&retrieve(untenanted.clone()).await.items);
    assert!(
        read.iter().all(|l| !lessons(&user_u.items).contains(l)),
        "{read:?}"
    );
    // A shared lesson (an embedder's own, written for every run of its tree) is read by a
    // task of no tenant and by no tenant's run.
    let goal = env.task(80).goal;
    let shared = hindsight::Lesson {
        lesson_id: "shared-lesson".into(),
        preconditions: Default::default(),
        tool: None,
        action: goal.clone(),
        confidence: 0.9,
        evidence: vec!["run-shared".into()],
        source: "correction".into(),
        scope: "shared".into(),
        created_ms: hindsight::now_ms(),
        reinforced_ms: hindsight::now_ms(),
        superseded_by: None,
    };
    rt.ctx()
        .dir
        .memory
        .cast(MemoryMsg::IndexLessons(vec![shared]))
        .await
        .unwrap();
    let read = lessons(&retrieve(untenanted).await.items);
    assert!(read.contains(&"shared-lesson".to_string()), "{read:?}");
    let read = lessons(&retrieve(task(&env, "a", 80)).await.items);
    assert!(!read.contains(&"shared-lesson".to_string()), "{read:?}");
    rt.shutdown().await;
}

/// Retrievals that reach memory together are answered together (one search for the burst),
/// each as it is alone; a retrieval sent before a lesson is indexed does not read it, and one
/// sent after does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_retrievals_answers_each_as_alone_and_in_order() {
    let (env, dir) = support_desk();
    let rt = start(&env, dir.path()).await;
    for i in 0..40 {
        rt.orchestrate(task(&env, ["a", "b"][i as usize % 2], i))
            .await
            .unwrap();
    }
    let memory = rt.ctx().dir.memory.clone();
    // Memory has taken in every run's experience, and its writes have landed.
    memory
        .call(|reply| MemoryMsg::Query {
            query: Box::new(hindsight_actors::memory::Query {
                text: "settle".into(),
                features: Default::default(),
                tools: Vec::new(),
                k: 1,
            }),
            reply,
        })
        .await
        .unwrap();
    rt.store().settled().await.unwrap();
    // Tasks of both tenants, several users, and some asked twice.
    let tasks: Vec<Task> = (0..24)
        .map(|i| {
            let mut t = task(&env, ["a", "b"][i % 2], 40 + (i % 9) as u64);
            t.user_id = Some(format!("{}/u{}", ["a", "b"][i % 2], i % 3));
            t
        })
        .collect();
    let mut alone = Vec::new();
    for t in &tasks {
        alone.push(
            memory
                .call(|reply| MemoryMsg::Retrieve {
                    task: std::sync::Arc::new(t.clone()),
                    reply,
                })
                .await
                .unwrap(),
        );
    }
    // The burst: every retrieval queued before any answer is awaited, then a lesson every task
    // of no tenant reads, then one more retrieval.
    let mut untenanted = env.task(40);
    untenanted.user_id = Some("someone".into());
    let lesson = hindsight::Lesson {
        lesson_id: "late-lesson".into(),
        preconditions: Default::default(),
        tool: None,
        action: untenanted.goal.clone(),
        confidence: 0.9,
        evidence: vec!["run-late".into()],
        source: "correction".into(),
        scope: "shared".into(),
        created_ms: hindsight::now_ms(),
        reinforced_ms: hindsight::now_ms(),
        superseded_by: None,
    };
    // Memory busy embedding lessons while the burst queues behind them (of another user, so
    // that no retrieval reads them).
    let busy: Vec<hindsight::Lesson> = (0..2_000)
        .map(|i| hindsight::Lesson {
            lesson_id: format!("busy-{i}"),
            scope: "user:nobody".into(),
            action: format!("lesson {i} of nobody's about {}", untenanted.goal),
            ..lesson.clone()
        })
        .collect();
    memory.cast(MemoryMsg::IndexLessons(busy)).await.unwrap();
    let mut answers = Vec::new();
    for (i, t) in tasks.iter().chain([&untenanted, &untenanted]).enumerate() {
        if i == tasks.len() + 1 {
            memory
                .cast(MemoryMsg::IndexLessons(vec![lesson.clone()]))
                .await
                .unwrap();
        }
        let (tx, rx) = ractor::concurrency::oneshot();
        memory
            .cast(MemoryMsg::Retrieve {
                task: std::sync::Arc::new(t.clone()),
                reply: tx.into(),
            })
            .await
            .unwrap();
        answers.push(rx);
    }
    let after = answers.pop().unwrap();
    let before = answers.pop().unwrap();
    let mut burst = Vec::new();
    for rx in answers.drain(..) {
        burst.push(rx.await.unwrap());
    }
    for (i, (got, want)) in burst.iter().zip(&alone).enumerate() {
        assert_eq!(
            format!("{:?}", got.items),
            format!("{:?}", want.items),
            "retrieval {i}"
        );
    }
    let cites = |b: &hindsight_actors::memory::RetrievalBundle| {
        b.items.iter().any(|i| i.citation.id == "late-lesson")
    };
    assert!(!cites(&before.await.unwrap()), "sent before the lesson");
    assert!(cites(&after.await.unwrap()), "sent after the lesson");
    rt.shutdown().await;
}
