//! Shared by the tree tests whose workflow is made of tools of their own.

use std::sync::Arc;

use hindsight::run::workflow::{OutputCheck, WorkflowArm, WorkflowStage};
use hindsight::store::Durability;
use hindsight::tools::sim::RewardConfig;
use hindsight::tools::{Tool, ToolRegistry};
use hindsight_actors::runtime::{RuntimeOptions, WorkflowSource};

/// A tree on `dir` whose workflow `name` has one stage per `(stage, tool)`, in order, with the
/// tool as its only arm; every output passes, and writes are synced.
pub fn tool_stages(
    dir: &std::path::Path,
    name: &str,
    tools: Vec<(&str, Arc<dyn Tool>)>,
) -> RuntimeOptions {
    let mut registry = ToolRegistry::new();
    let mut stages = Vec::new();
    for (stage, tool) in tools {
        let arm = WorkflowArm {
            tool: tool.spec().name.clone(),
            strategy: "default".into(),
            params: serde_json::Map::new(),
        };
        registry.register(tool).unwrap();
        stages.push(WorkflowStage::tools(stage, vec![arm]));
    }
    let check: OutputCheck = Arc::new(|_, _, _| Ok(()));
    let mut opts = RuntimeOptions::new(
        dir,
        WorkflowSource::Custom {
            name: name.into(),
            stages,
            check,
            reward: RewardConfig {
                success: 1.0,
                latency: 0.0,
                cost: 0.0,
                max_cost: 1.0,
                sla_ms: 60_000.0,
            },
        },
    );
    opts.registry = registry;
    opts.durability = Durability::Immediate;
    opts
}
