//! daemon: the daemon's [`Backend`]: one tree per configured agent (`[[agent]]`), all in one
//! process, sharing the MCP servers, the model endpoints, the metrics and the HTTP API. Each
//! agent's runs, lessons, SOPs and policy are its own, in its own store
//! ([`Config::agent_data_dir`]); an agent that calls another (`agent:NAME`) starts after it and
//! submits its child runs to that agent's tree. The first agent (or, with none, the simulated
//! workflow) is the default: the routes that name no agent serve it.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use hindsight::config::Config;
use hindsight::store::Store;
use hindsight::tools::Tool;
use hindsight::tools::mcp::McpServer;

use crate::agent_tool::AgentTool;
use crate::app::api::types::{
    AgentList, ExecuteRequest, ExecuteResponse, FeedbackRequest, FeedbackResponse, Health,
    MemoryBundle, MemoryRetrieveRequest, OrchestrateResponse, PlanResponse, PolicySuggestRequest,
    PolicySuggestResponse, PolicyUpdateRequest, PolicyUpdateResponse, RunView, TaskRequest,
    TenantSop, ValidateRequest, ValidateResponse,
};
use crate::app::api::{Backend, BackendResult, Principal};
use crate::app::metrics::Metrics;

use super::options::{config_error, mcp_tools, tree_options};
use super::{StartError, TreeBackend};

/// One tree of the daemon: the agent it hosts (`None`: the simulated workflow).
struct Hosted {
    agent: Option<String>,
    tree: TreeBackend,
}

/// The daemon's backend: its trees, the first the default.
pub struct Daemon {
    trees: Vec<Hosted>,
    /// The trees' indices in the order they started (each agent after those it calls).
    started: Vec<usize>,
    servers: Vec<McpServer>,
}

impl Daemon {
    /// Starts the MCP servers and a tree per configured agent (each after the agents it calls),
    /// or one tree over the simulated workflow when no agent is configured. Nothing is left
    /// running when a tree cannot start.
    pub async fn start(config: &Config) -> Result<Daemon, StartError> {
        for (i, t) in config.api.tenants.iter().enumerate() {
            if let Some(problem) = hindsight::config::tenant_name_problem(&t.name) {
                return Err(config_error(format!("api.tenants[{i}].name"), problem));
            }
        }
        let (tools, servers) = mcp_tools(config).await?;
        let mut started: Vec<Option<TreeBackend>> = Vec::new();
        let mut order = Vec::new();
        match start_trees(config, &tools, &mut started, &mut order).await {
            Ok(()) => {
                let mut trees = Vec::with_capacity(started.len());
                for (i, tree) in started.into_iter().enumerate() {
                    let Some(tree) = tree else { continue };
                    let agent = config.agents.get(i).map(|a| a.name.clone());
                    trees.push(Hosted { agent, tree });
                }
                Ok(Daemon {
                    trees,
                    started: order,
                    servers,
                })
            }
            Err(e) => {
                for &i in order.iter().rev() {
                    if let Some(tree) = &started[i] {
                        tree.shutdown().await;
                    }
                }
                for s in &servers {
                    s.shutdown().await;
                }
                Err(e)
            }
        }
    }

    /// Stops every tree (runs in flight stay checkpointed and resume at the next start), the
    /// callers first so that none is left waiting on a child run, then the MCP servers.
    /// Requests after this are answered 503.
    pub async fn shutdown(&self) {
        for &i in self.started.iter().rev() {
            if let Some(hosted) = self.trees.get(i) {
                hosted.tree.shutdown().await;
            }
        }
        for s in &self.servers {
            s.shutdown().await;
        }
    }

    /// The default tree's store.
    pub fn store(&self) -> &Store {
        self.default_tree().store()
    }

    /// The store of agent `name`'s tree.
    pub fn agent_store(&self, name: &str) -> Option<&Store> {
        self.agent_tree(name).map(TreeBackend::store)
    }

    /// Runs `task` on agent `name` as given (no tenant namespace: the CLI's and an embedder's
    /// way in), and waits for its outcome.
    pub async fn run_task(
        &self,
        name: &str,
        task: hindsight::Task,
    ) -> Result<crate::run::RunOutcome, crate::runtime::RuntimeError> {
        match self.agent_tree(name) {
            Some(tree) => tree.submitter().orchestrate(task).await,
            None => Err(crate::runtime::RuntimeError::Invalid(format!(
                "no agent `{name}` is hosted"
            ))),
        }
    }

    fn default_tree(&self) -> &TreeBackend {
        // `start` makes at least one tree: the simulated workflow's when no agent is configured.
        &self.trees[0].tree
    }

    fn agent_tree(&self, name: &str) -> Option<&TreeBackend> {
        self.trees
            .iter()
            .find(|h| h.agent.as_deref() == Some(name))
            .map(|h| &h.tree)
    }
}

/// Starts the trees into `started` (indexed as `[[agent]]`), callees first, noting in `order`
/// each index as its tree starts.
async fn start_trees(
    config: &Config,
    tools: &[Arc<dyn Tool>],
    started: &mut Vec<Option<TreeBackend>>,
    order: &mut Vec<usize>,
) -> Result<(), StartError> {
    let metrics = Metrics::new();
    let ids = (Arc::new(AtomicU64::new(0)), hindsight::now_ms());
    if config.agents.is_empty() {
        let opts = tree_options(config, None, tools.to_vec())?;
        started.push(Some(
            TreeBackend::start_tree(config, opts, metrics, ids).await?,
        ));
        order.push(0);
        return Ok(());
    }
    let calls = config.agent_calls();
    // The configuration refuses a cycle when it is read; an embedder's `Config` may not have
    // been read from a file.
    let callees_first = hindsight::run::workflow::callees_first(&calls)
        .map_err(|_| config_error("agent", "the agents call each other in a cycle"))?;
    started.resize_with(config.agents.len(), || None);
    for i in callees_first {
        let mut own = tools.to_vec();
        for &k in &calls[i] {
            let callee = &config.agents[k];
            let Some(tree) = started[k].as_ref() else {
                return Err(config_error(
                    format!("agent[{i}]"),
                    format!("agent `{}` is not started", callee.name),
                ));
            };
            own.push(Arc::new(AgentTool::new(
                &callee.name,
                &callee.stage.description,
                tree.submitter(),
            )));
        }
        let opts = tree_options(config, Some(i), own)?;
        started[i] =
            Some(TreeBackend::start_tree(config, opts, metrics.clone(), ids.clone()).await?);
        order.push(i);
    }
    Ok(())
}

impl Backend for Daemon {
    async fn orchestrate(
        &self,
        tenant: &str,
        request: TaskRequest,
    ) -> BackendResult<OrchestrateResponse> {
        self.default_tree().orchestrate(tenant, request).await
    }

    async fn plan(&self, tenant: &str, request: TaskRequest) -> BackendResult<PlanResponse> {
        self.default_tree().plan(tenant, request).await
    }

    async fn execute(
        &self,
        tenant: &str,
        request: ExecuteRequest,
    ) -> BackendResult<ExecuteResponse> {
        self.default_tree().execute(tenant, request).await
    }

    async fn validate(
        &self,
        tenant: &str,
        request: ValidateRequest,
    ) -> BackendResult<ValidateResponse> {
        self.default_tree().validate(tenant, request).await
    }

    async fn memory_retrieve(
        &self,
        tenant: &str,
        request: MemoryRetrieveRequest,
    ) -> BackendResult<MemoryBundle> {
        self.default_tree().memory_retrieve(tenant, request).await
    }

    async fn policy_suggest(
        &self,
        tenant: &str,
        request: PolicySuggestRequest,
    ) -> BackendResult<PolicySuggestResponse> {
        self.default_tree().policy_suggest(tenant, request).await
    }

    async fn policy_update(
        &self,
        tenant: &str,
        request: PolicyUpdateRequest,
    ) -> BackendResult<PolicyUpdateResponse> {
        self.default_tree().policy_update(tenant, request).await
    }

    async fn sop(&self, tenant: &str, sop_id: &str) -> BackendResult<Option<TenantSop>> {
        for hosted in &self.trees {
            if let Some(sop) = hosted.tree.sop(tenant, sop_id).await? {
                return Ok(Some(sop));
            }
        }
        Ok(None)
    }

    async fn agents(&self) -> BackendResult<AgentList> {
        let mut agents = Vec::new();
        for hosted in &self.trees {
            agents.extend(hosted.tree.agents().await?.agents);
        }
        Ok(AgentList { agents })
    }

    async fn agent_run(
        &self,
        tenant: &str,
        name: &str,
        request: TaskRequest,
    ) -> BackendResult<OrchestrateResponse> {
        // An agent no tree hosts is refused by the default tree, as any tree refuses one.
        self.agent_tree(name)
            .unwrap_or_else(|| self.default_tree())
            .agent_run(tenant, name, request)
            .await
    }

    async fn sops(&self, tenant: &str) -> BackendResult<Vec<TenantSop>> {
        let mut sops = Vec::new();
        for hosted in &self.trees {
            sops.extend(hosted.tree.sops(tenant).await?);
        }
        Ok(sops)
    }

    async fn run(&self, tenant: &str, run_id: &str) -> BackendResult<Option<RunView>> {
        for hosted in &self.trees {
            if let Some(run) = hosted.tree.run(tenant, run_id).await? {
                return Ok(Some(run));
            }
        }
        Ok(None)
    }

    /// A correction goes to the agent whose run it names, else to the agent that offers the tool
    /// it names, else to the default agent.
    async fn feedback(
        &self,
        principal: &Principal,
        request: FeedbackRequest,
    ) -> BackendResult<FeedbackResponse> {
        let tenant = principal.tenant.as_str();
        let mut target = None;
        if let Some(run_id) = &request.run_id {
            for hosted in &self.trees {
                if hosted.tree.own_run(tenant, run_id).await?.is_some() {
                    target = Some(&hosted.tree);
                    break;
                }
            }
        } else if let Some(tool) = &request.tool {
            target = self
                .trees
                .iter()
                .find(|h| h.tree.offers_tool(tool))
                .map(|h| &h.tree);
        }
        target
            .unwrap_or_else(|| self.default_tree())
            .feedback(principal, request)
            .await
    }

    /// Every tree's components (another agent's under `agent:NAME/`), and the MCP servers'.
    async fn health(&self) -> Health {
        let mut health = self.default_tree().health().await;
        for hosted in self.trees.iter().skip(1) {
            let other = hosted.tree.health().await;
            let name = hosted.agent.as_deref().unwrap_or_default();
            if !other.is_ok() && health.is_ok() {
                health.status = other.status.clone();
            }
            for (component, status) in other.components {
                health
                    .components
                    .insert(format!("agent:{name}/{component}"), status);
            }
        }
        for s in &self.servers {
            health.components.insert(
                format!("mcp:{}", s.name()),
                format!("{:?}", s.health()).to_lowercase(),
            );
        }
        health
    }

    /// The metrics every tree counts in; the learning figures are the default agent's.
    async fn metrics_text(&self) -> String {
        self.default_tree().metrics_text().await
    }

    fn metrics(&self) -> Option<&Metrics> {
        self.default_tree().metrics()
    }

    fn openapi(&self) -> std::borrow::Cow<'_, str> {
        self.default_tree().openapi()
    }
}
