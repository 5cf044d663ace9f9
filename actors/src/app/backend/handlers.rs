//! handlers: the HTTP API's operations over the running tree ([`Backend`] for [`TreeBackend`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hindsight::Task;
use hindsight::learn::bandit::{Arm, Observation, StageObservation, StageOutcome};

use crate::app::api::types::{
    ExecuteRequest, ExecuteResponse, FeedbackRequest, FeedbackResponse, Health, MemoryBundle,
    MemoryItem, MemoryRetrieveRequest, OrchestrateResponse, PlanResponse, PolicySuggestRequest,
    PolicySuggestResponse, PolicyUpdateRequest, PolicyUpdateResponse, RankedArm, RunView,
    StageArms, TaskRequest, TenantSop, ValidateRequest, ValidateResponse,
};
use crate::app::api::{Backend, BackendError, BackendResult, Principal};
use crate::app::metrics::Metrics;
use crate::memory::{MemoryMsg, Query};
use crate::orchestrator::OrchestratorMsg;
use crate::policy::PolicyMsg;
use crate::reflector::{FeedbackRefused, ReflectorMsg};
use crate::validator::ValidatorMsg;

use super::{
    TreeBackend, call_error, category_of, check_arm, slot_status, stage_propensities,
    tenant_task_id,
};

impl Backend for TreeBackend {
    async fn agents(&self) -> BackendResult<crate::app::api::types::AgentList> {
        let workflow = &self.ctx.workflow;
        let agents = workflow
            .stages()
            .iter()
            .filter_map(|s| s.agent.as_ref().map(|a| (s, a)))
            .map(|(stage, agent)| crate::app::api::types::AgentView {
                name: stage.name.clone(),
                description: agent.description.clone(),
                variants: agent
                    .variants
                    .iter()
                    .map(|v| crate::app::api::types::AgentVariantView {
                        name: v.name.clone(),
                        model: v.model.clone(),
                        tools: workflow
                            .toolset(&stage.name, &v.name)
                            .offered
                            .iter()
                            .map(|t| t.name.clone())
                            .collect(),
                    })
                    .collect(),
                max_turns: agent.max_turns,
            })
            .collect();
        Ok(crate::app::api::types::AgentList { agents })
    }

    async fn agent_run(
        &self,
        tenant: &str,
        name: &str,
        request: TaskRequest,
    ) -> BackendResult<OrchestrateResponse> {
        if self.ctx.workflow.agent(name).is_none() {
            return Err(BackendError::NotFound {
                what: "agent".into(),
                id: name.to_string(),
            });
        }
        self.orchestrate(tenant, request).await
    }

    async fn orchestrate(
        &self,
        tenant: &str,
        request: TaskRequest,
    ) -> BackendResult<OrchestrateResponse> {
        self.check_running()?;
        let key = request.idempotency_key.clone();
        let task = self.task_of(tenant, request, "")?;
        self.claim_key(tenant, key.as_deref(), &task).await?;
        let (o, _) = self.submit(task, None).await?;
        let visible = self.visible(tenant).await?;
        let (sop_id, plan_id) = visible.provenance(o.sop_id, o.plan_id, &o.final_arms);
        Ok(OrchestrateResponse {
            run_id: o.run_id,
            task_id: o.task_id,
            plan_id,
            sop_id,
            state: o.state,
            passed: o.passed,
            attempts: o.attempts,
            reflect_retries: o.reflect_retries,
            arms: o.arms,
            reward: Some(o.reward),
            output: o.output,
            reason: o.reason,
            latency_ms: o.latency_ms,
            cost: o.cost,
            citations: o
                .citations
                .into_iter()
                .filter(|c| visible.allows_citation(c))
                .collect(),
        })
    }

    async fn plan(&self, tenant: &str, request: TaskRequest) -> BackendResult<PlanResponse> {
        self.check_running()?;
        let task = Arc::new(self.task_of(tenant, request, "")?);
        let bundle = self
            .ctx
            .dir
            .memory
            .call(|reply| MemoryMsg::Retrieve {
                task: task.clone(),
                reply,
            })
            .await
            .map_err(call_error)?;
        let choice = self
            .ctx
            .dir
            .policy
            .call(|reply| PolicyMsg::Choose {
                task: task.clone(),
                base: None,
                exclude: Vec::new(),
                reply,
            })
            .await
            .map_err(call_error)?
            .map_err(|e| BackendError::Invalid {
                field: "features".into(),
                reason: e.to_string(),
            })?;
        let context = self.ctx.lessons.context_for(&task);
        let visible = self.visible(tenant).await?;
        // An SOP the tenant may not see is not named (its plan is still the policy's choice).
        let (sop_id, plan_id) =
            visible.provenance(choice.sop_id, Some(choice.plan_id), &choice.arms);
        Ok(PlanResponse {
            plan_id: plan_id.unwrap_or_default(),
            sop_id,
            cluster: hindsight::learn::cluster::cluster_key(&task.features),
            arms: choice.arms,
            strategy_context: context,
            citations: bundle
                .citations()
                .into_iter()
                .filter(|c| visible.allows_citation(c))
                .collect(),
        })
    }

    async fn execute(
        &self,
        tenant: &str,
        request: ExecuteRequest,
    ) -> BackendResult<ExecuteResponse> {
        self.check_running()?;
        let plan = self.check_plan(&request.plan)?;
        let key = request.task.idempotency_key.clone();
        let task = self.task_of(tenant, request.task, "task.")?;
        self.claim_key(tenant, key.as_deref(), &task).await?;
        let (o, steps) = self.submit(task, Some(plan)).await?;
        Ok(ExecuteResponse {
            run_id: o.run_id,
            state: o.state,
            passed: o.passed,
            steps,
            output: o.output,
            latency_ms: o.latency_ms,
            cost: o.cost,
        })
    }

    async fn validate(
        &self,
        tenant: &str,
        request: ValidateRequest,
    ) -> BackendResult<ValidateResponse> {
        self.check_running()?;
        self.check_stage("stage", &request.stage)?;
        // The run's task, when a run is named (an agent's answer is checked against its task).
        let mut task = hindsight::Task::default();
        if let Some(run_id) = &request.run_id {
            let Some(run) = self.own_run(tenant, run_id).await? else {
                return Err(BackendError::NotFound {
                    what: "run".into(),
                    id: run_id.clone(),
                });
            };
            if let Some(stored) = self
                .ctx
                .store
                .get::<hindsight::Task>(crate::orchestrator::TASKS, &run.task_id)
                .map_err(|e| BackendError::Internal(e.to_string()))?
            {
                task = stored;
            }
        }
        let task = std::sync::Arc::new(task);
        let outputs: std::sync::Arc<[(String, serde_json::Value)]> =
            std::sync::Arc::new([(request.stage.clone(), request.output.clone())]);
        let verdict = self
            .ctx
            .dir
            .validator
            .call(|reply| ValidatorMsg::Validate {
                task: task.clone(),
                outputs: outputs.clone(),
                reply,
            })
            .await
            .map_err(call_error)?;
        let result = verdict
            .into_iter()
            .find(|(s, _)| s == &request.stage)
            .map(|(_, r)| r)
            .ok_or_else(|| BackendError::Internal("the validator gave no verdict".into()))?;
        Ok(match result {
            Ok(()) => ValidateResponse {
                valid: true,
                reason: None,
            },
            Err(reason) => ValidateResponse {
                valid: false,
                reason: Some(reason),
            },
        })
    }

    async fn memory_retrieve(
        &self,
        tenant: &str,
        request: MemoryRetrieveRequest,
    ) -> BackendResult<MemoryBundle> {
        self.check_running()?;
        let query = Query {
            text: request.query.clone(),
            features: request.features.clone(),
            tools: request.tools.clone(),
            k: request.k.saturating_mul(4).min(400),
        };
        let bundle = self
            .ctx
            .dir
            .memory
            .call(|reply| MemoryMsg::Query {
                query: Box::new(query.clone()),
                reply,
            })
            .await
            .map_err(call_error)?;
        let visible = self.visible(tenant).await?;
        let items = bundle
            .items
            .into_iter()
            .filter(|i| visible.allows(&i.citation.kind, &i.citation.id))
            .take(request.k)
            .map(|i| MemoryItem {
                citation: format!("{}:{}", i.citation.kind, i.citation.id),
                kind: i.citation.kind,
                id: i.citation.id,
                text: i.text,
                score: i.citation.score,
            })
            .collect();
        Ok(MemoryBundle { items })
    }

    async fn policy_suggest(
        &self,
        _tenant: &str,
        request: PolicySuggestRequest,
    ) -> BackendResult<PolicySuggestResponse> {
        self.check_running()?;
        if let Some(stage) = &request.stage {
            self.check_stage("stage", stage)?;
        }
        let ranked = self
            .ctx
            .dir
            .policy
            .call(|reply| PolicyMsg::Suggest {
                features: request.features.clone(),
                reply,
            })
            .await
            .map_err(call_error)?;
        let cluster = hindsight::learn::cluster::cluster_key(&request.features);
        let seed = hindsight::run::workflow::stable_hash(&cluster);
        let stages = ranked
            .into_iter()
            .filter(|(stage, _)| request.stage.as_ref().is_none_or(|s| s == stage))
            .map(|(stage, arms)| {
                // The value deviation scales with the success deviation by value/mean.
                let values: Vec<(f64, f64)> = arms
                    .iter()
                    .map(|(_, _, m, sd, v)| {
                        let scale = if *m > 0.0 { v / m } else { 1.0 };
                        (*v, sd * scale)
                    })
                    .collect();
                let shares = stage_propensities(
                    &values,
                    512,
                    seed ^ hindsight::run::workflow::stable_hash(&stage),
                );
                let arms = arms
                    .into_iter()
                    .zip(shares)
                    .take(request.k)
                    .map(
                        |((tool, strategy, mean, std_dev, _), propensity)| RankedArm {
                            n: self.effective_n(mean, std_dev),
                            tool,
                            strategy,
                            mean,
                            std_dev,
                            propensity,
                        },
                    )
                    .collect();
                StageArms { stage, arms }
            })
            .collect();
        Ok(PolicySuggestResponse { cluster, stages })
    }

    async fn policy_update(
        &self,
        _tenant: &str,
        request: PolicyUpdateRequest,
    ) -> BackendResult<PolicyUpdateResponse> {
        self.check_running()?;
        self.check_stage("stage", &request.stage)?;
        let stage = self
            .ctx
            .workflow
            .stages()
            .iter()
            .find(|s| s.name == request.stage)
            .ok_or_else(|| BackendError::Internal("stage vanished".into()))?;
        check_arm(stage, &request.tool, &request.strategy, "")?;
        if request.passed && request.error_class.is_some() {
            return Err(BackendError::Invalid {
                field: "error_class".into(),
                reason: "must be absent when passed is true".into(),
            });
        }
        let cluster = hindsight::learn::cluster::cluster_key(&request.features);
        let outcome = match (request.passed, request.error_class) {
            (true, _) => StageOutcome::Valid,
            (false, Some(class)) => StageOutcome::Failed(category_of(class)),
            (false, None) => StageOutcome::Invalid,
        };
        // The request carries a reward, not latency and cost: its shortfall from the success
        // value is given to the policy as the equivalent latency, so the arm's estimated value
        // matches the reward reported.
        let r = self.ctx.workflow.reward_config();
        let shortfall = (r.success - request.reward).max(0.0);
        let lat_frac = if r.latency > 0.0 {
            (shortfall / r.latency).min(1.0)
        } else {
            0.0
        };
        let observation = Observation {
            features: request.features.clone(),
            stages: vec![StageObservation {
                stage: request.stage.clone(),
                arm: Arm::new(request.tool.clone(), request.strategy.clone()),
                outcome,
                latency_ms: lat_frac * r.sla_ms,
                cost: 0.0,
            }],
        };
        let summary = self
            .ctx
            .dir
            .policy
            .call(|reply| PolicyMsg::Learn {
                observation: Box::new(observation.clone()),
                reply,
            })
            .await
            .map_err(call_error)?;
        let applied = summary.learned > 0;
        let reason = if applied {
            None
        } else if summary.infra_ignored > 0 {
            Some(format!(
                "{} is an infrastructure failure; infrastructure failures are not learned from",
                request
                    .error_class
                    .map_or("the error".to_string(), |c| c.to_string())
            ))
        } else if summary.unknown_arm > 0 {
            Some("the policy does not know this stage and arm".to_string())
        } else {
            Some("nothing to learn from this outcome".to_string())
        };
        Ok(PolicyUpdateResponse {
            cluster,
            applied,
            reason,
        })
    }

    async fn sop(&self, tenant: &str, sop_id: &str) -> BackendResult<Option<TenantSop>> {
        self.check_running()?;
        let (id, version) = match sop_id.rsplit_once('@') {
            Some((id, v)) => match v.parse::<u32>() {
                Ok(v) => (id, Some(v)),
                Err(_) => (sop_id, None),
            },
            None => (sop_id, None),
        };
        let best = self
            .tenant_sops(tenant)?
            .into_iter()
            .filter(|s| s.sop_id == id && version.is_none_or(|v| s.version == v))
            .max_by_key(|s| s.version);
        Ok(best.map(|sop| TenantSop {
            tenant: tenant.to_string(),
            sop,
        }))
    }

    async fn sops(&self, tenant: &str) -> BackendResult<Vec<TenantSop>> {
        self.check_running()?;
        let mut sops = self.tenant_sops(tenant)?;
        sops.sort_by(|a, b| (&a.sop_id, a.version).cmp(&(&b.sop_id, b.version)));
        Ok(sops
            .into_iter()
            .map(|sop| TenantSop {
                tenant: tenant.to_string(),
                sop,
            })
            .collect())
    }

    async fn run(&self, tenant: &str, run_id: &str) -> BackendResult<Option<RunView>> {
        self.check_running()?;
        let Some(mut run) = self.own_run(tenant, run_id).await? else {
            return Ok(None);
        };
        let outcome = self
            .ctx
            .dir
            .orchestrator
            .call(|reply| OrchestratorMsg::Outcome {
                run_id: run_id.to_string(),
                reply,
            })
            .await
            .map_err(call_error)?;
        if run.sop_id.is_some() {
            let visible = self.visible(tenant).await?;
            let last = outcome
                .as_ref()
                .map(|o| o.final_arms.clone())
                .unwrap_or_default();
            let (sop_id, plan_id) =
                visible.provenance(run.sop_id.take(), run.plan_id.take(), &last);
            run.sop_id = sop_id;
            run.plan_id = plan_id;
        }
        Ok(Some(RunView {
            arms: outcome.map(|o| o.arms).unwrap_or_default(),
            steps: self.steps_of(run_id),
            run,
        }))
    }

    async fn feedback(
        &self,
        principal: &Principal,
        request: FeedbackRequest,
    ) -> BackendResult<FeedbackResponse> {
        self.check_running()?;
        let tenant = principal.tenant.as_str();
        if let Some(run_id) = &request.run_id
            && self.own_run(tenant, run_id).await?.is_none()
        {
            return Err(BackendError::NotFound {
                what: "run".into(),
                id: run_id.clone(),
            });
        }
        // The scope comes from the tenant and the user; the principal only from the key.
        let user = request
            .user_id
            .clone()
            .unwrap_or_else(|| format!("key-{}", principal.key_id));
        let scope_task = Task {
            task_id: tenant_task_id(tenant, "feedback"),
            goal: request.correction.clone(),
            features: request.features.clone(),
            constraints: Default::default(),
            user_id: Some(tenant_task_id(tenant, &user)),
            tenant: Some(tenant.to_string()),
            session_id: None,
            input: None,
        };
        let answer = self
            .ctx
            .dir
            .reflector
            .call(|reply| ReflectorMsg::Feedback {
                principal: Some(principal.key_id.clone()),
                scope_of: Box::new(scope_task.clone()),
                tool: request.tool.clone(),
                text: request.correction.clone(),
                run_id: request.run_id.clone(),
                reply,
            })
            .await
            .map_err(call_error)?;
        match answer {
            Ok(lesson) => Ok(FeedbackResponse {
                accepted: true,
                lesson_id: Some(lesson.lesson_id),
                confidence: Some(lesson.confidence),
                reason: None,
            }),
            Err(FeedbackRefused::RateLimited { retry_after_secs }) => {
                Err(BackendError::RateLimited { retry_after_secs })
            }
            Err(FeedbackRefused::Rejected { reason }) => Ok(FeedbackResponse {
                accepted: false,
                lesson_id: None,
                confidence: None,
                reason: Some(reason),
            }),
            Err(FeedbackRefused::Unauthenticated) => Err(BackendError::Internal(
                "the reflector saw no principal".into(),
            )),
        }
    }

    async fn health(&self) -> Health {
        let d = &self.ctx.dir;
        let mut components = BTreeMap::new();
        components.insert("orchestrator".to_string(), slot_status(&d.orchestrator));
        components.insert("executor".to_string(), slot_status(&d.executor));
        components.insert("validator".to_string(), slot_status(&d.validator));
        components.insert("policy".to_string(), slot_status(&d.policy));
        components.insert("memory".to_string(), slot_status(&d.memory));
        components.insert("reflector".to_string(), slot_status(&d.reflector));
        components.insert("reflect_retry".to_string(), slot_status(&d.reflect_retry));
        for p in &d.plugins {
            components.insert(format!("plugin:{}", p.name), slot_status(&p.slot));
        }
        components.insert(
            "store".to_string(),
            match (self.store().get_run(""), self.damage_seen()) {
                (Err(e), _) => format!("error: {e}"),
                (Ok(_), Some(damage)) => damage,
                (Ok(_), None) => "ok".to_string(),
            },
        );
        let stopping = self.stopping.load(Ordering::SeqCst);
        let all_ok = components
            .iter()
            .filter(|(k, _)| !k.starts_with("mcp:"))
            .all(|(_, v)| v == "ok");
        Health {
            status: if stopping {
                "stopping".to_string()
            } else if all_ok {
                "ok".to_string()
            } else {
                "degraded".to_string()
            },
            version: env!("CARGO_PKG_VERSION").to_string(),
            components,
        }
    }

    async fn metrics_text(&self) -> String {
        // The learning figures are the policy actor's; a scrape that cannot reach it (a restart
        // in progress) shows the last ones read.
        let policy = &self.ctx.dir.policy;
        let wait = std::time::Duration::from_secs(2);
        let stats = policy
            .call_with_timeout(|reply| PolicyMsg::Stats { reply }, wait)
            .await;
        let ranker = policy
            .call_with_timeout(|reply| PolicyMsg::Distillation { reply }, wait)
            .await;
        if let (Ok(s), Ok(r)) = (stats, ranker) {
            self.metrics
                .learning(&crate::app::metrics::LearningFigures {
                    learned: s.learned,
                    infra_ignored: s.infra_ignored,
                    infra_learned: s.infra_learned,
                    changes_detected: s.changes_detected,
                    ranker_fits: r.fits,
                    ranker_promotions: r.promotions,
                    ranker_in_force: r.in_force,
                });
        }
        self.metrics.encode()
    }

    fn metrics(&self) -> Option<&Metrics> {
        Some(&self.metrics)
    }

    fn openapi(&self) -> std::borrow::Cow<'_, str> {
        std::borrow::Cow::Borrowed(&self.openapi)
    }
}
