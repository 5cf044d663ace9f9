//! Shared by the tree tests: what a fresh policy on a simulated environment is made of.

/// The bandit's stages and arms of `env`'s workflow.
pub fn stage_arms(env: &hindsight::tools::sim::SimEnv) -> Vec<hindsight::learn::bandit::StageArms> {
    let mut registry = hindsight::tools::ToolRegistry::new();
    for tool in env.tools() {
        registry.register(tool).unwrap();
    }
    hindsight::run::Workflow::from_sim(env, &registry)
        .unwrap()
        .stage_arms()
}
