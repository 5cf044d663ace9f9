//! finish: the end of a run: the experience logged durably (once), the learners fed.

use std::sync::Arc;

use hindsight::Task;
use hindsight::run::Finished;
use hindsight::store::WriteOp;

use crate::memory::MemoryMsg;
use crate::policy::PolicyMsg;
use crate::reflector::ReflectorMsg;

use super::{DriveError, LOGGED, RunOutcome, TreeCtx};

/// Ends the run: the experience is logged durably and the learners are fed; returns what the
/// caller gets.
pub(super) async fn finish(
    ctx: &TreeCtx,
    task: &Arc<Task>,
    finished: Finished,
) -> Result<RunOutcome, DriveError> {
    let Finished {
        outcome,
        experience,
    } = finished;
    let run_id = outcome.run_id.as_str();
    let attempt = outcome.attempts.saturating_sub(1);
    // The experience is logged once per run: a run resumed after a crash that fell between
    // logging it and recording the run's end finds its marker and does not log it again (the
    // learners already replayed it from the log at start).
    if ctx.store.get::<u64>(LOGGED, run_id)?.is_some() {
        return Ok(outcome);
    }
    let written = ctx
        .store
        .write_batch(vec![
            WriteOp::experience(&experience)?,
            WriteOp::put(LOGGED, run_id, &attempt)?,
        ])
        .await?;
    let Some(seq) = written.first().copied().flatten() else {
        return Ok(outcome);
    };
    let experience = Arc::new(experience);
    let _ = ctx
        .dir
        .policy
        .cast(PolicyMsg::Observe {
            seq,
            experience: experience.clone(),
        })
        .await;
    let _ = ctx
        .dir
        .reflector
        .cast(ReflectorMsg::Consolidate {
            seq,
            experience: experience.clone(),
            task: task.clone(),
        })
        .await;
    let _ = ctx
        .dir
        .memory
        .cast(MemoryMsg::Record {
            seq,
            experience,
            task: task.clone(),
        })
        .await;
    Ok(outcome)
}
