//! The model judge of human corrections, wired into the tree: with a judge, a correction the
//! evidence check passes is taken only when the judge also finds it supported; a judge that
//! cannot answer leaves it to the evidence check.

mod correction_support;

use std::sync::Arc;

use hindsight::learn::adaptive::ModelVerifier;
use hindsight::model::{ChatRequest, LanguageModel, ModelError, ModelFuture};
use hindsight::store::Durability;
use hindsight::tools::sim::agent::AgentEnv;
use hindsight_actors::reflector::FeedbackRefused;
use hindsight_actors::{Runtime, RuntimeOptions};

/// A judge that always answers `answer` (or fails when `None`), counting its calls.
struct Judge {
    answer: Option<&'static str>,
    asked: std::sync::atomic::AtomicU32,
}

impl LanguageModel for Judge {
    fn name(&self) -> &str {
        "judge"
    }

    fn complete<'a>(&'a self, _: &'a ChatRequest) -> ModelFuture<'a, String> {
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            self.answer
                .map(str::to_string)
                .ok_or(ModelError::BadResponse {
                    url: "judge".into(),
                    message: "down".into(),
                })
        })
    }
}

/// Runs user `u`'s support-desk tasks, then submits the file's right correction with `judge`
/// as the tree's verifier.
async fn submit_with(judge: Arc<Judge>) -> Result<hindsight::Lesson, FeedbackRefused> {
    let env = AgentEnv::load(std::path::Path::new("../config/envs/support_desk.toml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = RuntimeOptions::new(dir.path(), env.clone());
    opts.durability = Durability::None;
    opts.verifier = Some(Arc::new(ModelVerifier::new(judge)));
    let rt = Runtime::start(opts).await.unwrap();
    let answer = correction_support::run_and_correct(&rt, &env).await;
    rt.shutdown().await;
    answer
}

fn asked(judge: &Judge) -> u32 {
    judge.asked.load(std::sync::atomic::Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_correction_the_evidence_supports_is_taken_only_if_the_judge_agrees() {
    let no = Arc::new(Judge {
        answer: Some(r#"{"valid": false, "reason": "the failures say nothing of the year"}"#),
        asked: Default::default(),
    });
    match submit_with(no.clone()).await {
        Err(FeedbackRefused::Rejected { reason }) => {
            assert!(reason.contains("nothing of the year"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(asked(&no), 1);

    let yes = Arc::new(Judge {
        answer: Some(r#"{"valid": true, "reason": "the since failures"}"#),
        asked: Default::default(),
    });
    let lesson = submit_with(yes.clone()).await.unwrap();
    assert_eq!(lesson.tool.as_deref(), Some("list_invoices"));
    assert_eq!(asked(&yes), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_judge_that_cannot_answer_leaves_it_to_the_evidence_check() {
    let down = Arc::new(Judge {
        answer: None,
        asked: Default::default(),
    });
    let lesson = submit_with(down.clone()).await.unwrap();
    assert_eq!(lesson.tool.as_deref(), Some("list_invoices"));
    assert_eq!(asked(&down), 1);
}
