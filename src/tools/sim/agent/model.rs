//! The simulated model of an agent environment (AGENT-FORMAT.md, A turn): it reads the request
//! (tokens, what it knows by the cue rule or from a tool's failure, the calls made so far),
//! follows the first matching plan, applies the fixes and corrections it knows (each by its own
//! draw, corrections first), retries a failed call at most `retries` times, and has the quirks
//! drawn once per attempt.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::AgentEnv;
use super::knows::{Made, Outcome, calls_made, cued, line_words, request_tokens};
use super::spec::{Edit, Plan, ToolDecl, matches};
use super::template::Values;
use super::tool::strings_of;
use crate::model::{
    ChatRequest, LanguageModel, ModelError, ModelFuture, ModelReply, ToolCall, ToolChoice,
    TurnContext, Usage,
};
use crate::tools::sim::fill_goal;
use crate::tools::sim::rng::agent_rng;

/// The quirks of one attempt, drawn once from `(seed, task, attempt)`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Quirks {
    /// Repeats the first successful call instead of moving on (LOOP_DETECTED).
    pub looping: bool,
    /// Cites `ref-<claim>` in its answer (HALLUCINATED_STATE).
    pub claim: Option<u64>,
    /// Answers right after its first call (PLAN_INCOMPLETE).
    pub stop: bool,
    /// Answers about this value of the goal's first feature instead (GOAL_DRIFT).
    pub drift: Option<usize>,
}

/// The simulated language model of an agent environment.
#[derive(Debug, Clone)]
pub struct SimModel {
    env: AgentEnv,
    oracle: bool,
    name: String,
}

/// The state of one plan call in the conversation.
#[derive(Debug, Clone, Default)]
struct Step {
    /// The tool is not offered: the call is skipped.
    skipped: bool,
    /// It succeeded.
    done: bool,
    /// Its failures so far.
    failures: u32,
    /// The text of its last failure.
    last_error: String,
}

impl SimModel {
    /// The model of `env` as its `[model]` describes it.
    pub fn new(env: AgentEnv) -> SimModel {
        let name = format!("sim-agent:{}", env.name());
        SimModel {
            env,
            oracle: false,
            name,
        }
    }

    /// The oracle of `env`: knows every rule's fix, follows each with probability 1, follows no
    /// poisoned correction, has no quirks.
    pub fn oracle(env: AgentEnv) -> SimModel {
        let name = format!("sim-agent-oracle:{}", env.name());
        SimModel {
            env,
            oracle: true,
            name,
        }
    }

    /// The quirks of an attempt (none for the oracle).
    pub fn quirks(&self, task_index: u64, attempt: u32) -> Quirks {
        if self.oracle {
            return Quirks::default();
        }
        let m = &self.env.spec().model;
        let mut rng = agent_rng("quirks", self.env.seed(), task_index, attempt, 0, 0);
        let (u_loop, u_claim, u_stop, u_drift) = (rng.f64(), rng.f64(), rng.f64(), rng.f64());
        let (u_ref, u_value) = (rng.u64(1000..100_000), rng.f64());
        let drift = (u_drift < m.p_drift)
            .then(|| {
                let spec = self.env.spec();
                let name = spec.goal_first_feature.as_ref()?;
                let feature = spec.features.iter().find(|f| &f.name == name)?;
                let current = self.env.features(task_index).get(name).cloned()?;
                let others: Vec<usize> = (0..feature.values.len())
                    .filter(|&i| feature.values[i] != current)
                    .collect();
                let pick =
                    ((u_value * others.len() as f64) as usize).min(others.len().checked_sub(1)?);
                others.get(pick).copied()
            })
            .flatten();
        Quirks {
            looping: u_loop < m.p_loop,
            claim: (u_claim < m.p_claim).then_some(u_ref),
            stop: u_stop < m.p_stop,
            drift,
        }
    }

    fn url(&self) -> String {
        format!("sim://{}", self.env.name())
    }

    /// One turn (see the module's doc).
    fn reply(&self, req: &ChatRequest, ctx: &TurnContext) -> Result<ModelReply, ModelError> {
        let spec = self.env.spec();
        let cfg = &spec.model;
        let tokens = request_tokens(req);
        if tokens > cfg.context_window {
            let message = format!(
                "context length exceeded: {tokens} tokens > {}",
                cfg.context_window
            );
            let class = crate::triage::classify_error(None, &message).error_class;
            return Err(ModelError::Request {
                url: self.url(),
                message,
                class,
            });
        }
        let usage = Some(Usage {
            prompt_tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
            completion_tokens: cfg.completion_tokens,
        });
        let say = |content: String| ModelReply {
            content,
            tool_calls: Vec::new(),
            usage,
        };
        let index = ctx.task_index;
        let features = if ctx.features.is_empty() {
            self.env.features(index)
        } else {
            ctx.features.clone()
        };
        let input = match ctx.input.as_ref().and_then(Value::as_object) {
            Some(m) => strings_of(m),
            None => self.env.input(index, &features),
        };
        let Some(plan) = spec.plan_for(&features) else {
            return Ok(say("I have no way to handle this task.".to_string()));
        };
        let offered: BTreeSet<&str> = req.tools.iter().map(|t| t.name.as_str()).collect();
        let quirks = self.quirks(index, ctx.attempt);
        let made = calls_made(req);

        // Walk the calls made against the plan: each result belongs to the current call.
        let mut steps: Vec<Step> = plan
            .calls
            .iter()
            .map(|c| Step {
                skipped: !offered.contains(c.tool.as_str()),
                ..Step::default()
            })
            .collect();
        let mut fields: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for m in &made {
            let Some(cur) = steps.iter().position(|s| !s.skipped && !s.done) else {
                break;
            };
            if m.tool != plan.calls[cur].tool {
                continue;
            }
            match &m.outcome {
                Some(Outcome::Ok(f)) => {
                    steps[cur].done = true;
                    fields.insert(m.tool.clone(), f.clone());
                }
                Some(Outcome::Failed(text)) => {
                    steps[cur].failures += 1;
                    steps[cur].last_error = text.clone();
                }
                None => {}
            }
        }

        if quirks.looping
            && let Some(first) = made
                .iter()
                .find(|m| matches!(m.outcome, Some(Outcome::Ok(_))))
        {
            return Ok(self.call(ctx, &first.tool, first.args.clone(), usage));
        }
        let answered = made.iter().any(|m| m.outcome.is_some());
        let current = steps.iter().position(|s| !s.skipped && !s.done);
        let finish = (quirks.stop && answered) || req.tool_choice == ToolChoice::None;
        let Some(cur) = current.filter(|_| !finish) else {
            return Ok(say(
                self.answer(plan, index, &features, &input, &fields, quirks)
            ));
        };
        let step = &steps[cur];
        if step.failures > cfg.retries {
            return Ok(say(format!(
                "I could not finish: {} kept failing ({})",
                plan.calls[cur].tool,
                step.last_error.trim()
            )));
        }
        let call = &plan.calls[cur];
        let Some(decl) = spec.tool(&call.tool) else {
            return Ok(say(format!("I could not finish: no tool {}", call.tool)));
        };
        let v = Values {
            index,
            features: &features,
            input: &input,
            fields: &fields,
        };
        let mut args: BTreeMap<String, Value> = call
            .args
            .iter()
            .map(|(k, t)| (k.clone(), typed(decl, k, t.render(&v))))
            .collect();
        self.apply_known(req, ctx, decl, &made, &v, tokens, &mut args);
        Ok(self.call(
            ctx,
            &call.tool,
            Value::Object(args.into_iter().collect()),
            usage,
        ))
    }

    /// Applies the corrections and then the rule fixes of `decl` that the request makes known,
    /// each with probability `p_follow * min(1, crowd / tokens)` (1 for the oracle).
    #[allow(clippy::too_many_arguments)]
    fn apply_known(
        &self,
        req: &ChatRequest,
        ctx: &TurnContext,
        decl: &ToolDecl,
        made: &[Made],
        v: &Values<'_>,
        tokens: u64,
        args: &mut BTreeMap<String, Value>,
    ) {
        let spec = self.env.spec();
        let cfg = &spec.model;
        let p = if self.oracle {
            1.0
        } else {
            cfg.p_follow * (cfg.crowd / tokens.max(1) as f64).min(1.0)
        };
        let lines = line_words(req);
        let mut rng = agent_rng(
            "follow",
            self.env.seed(),
            ctx.task_index,
            ctx.attempt,
            ctx.turn,
            0,
        );
        let mut follow = |known: bool| known && rng.f64() < p;
        for c in spec.corrections.iter().filter(|c| c.tool == decl.name) {
            if self.oracle && c.poisoned {
                continue;
            }
            if follow(cued(&lines, &decl.name, &c.cue)) {
                edit(decl, &c.edit, v, args);
            }
        }
        for r in decl.rules.iter().filter(|r| matches(&r.when, v.features)) {
            let failed_with = || {
                made.iter().any(|m| {
                    m.tool == decl.name
                        && matches!(&m.outcome, Some(Outcome::Failed(t)) if t.contains(&r.message))
                })
            };
            let known = self.oracle || cued(&lines, &decl.name, &r.cue) || failed_with();
            if follow(known) {
                edit(decl, &r.fix, v, args);
            }
        }
    }

    /// A turn that calls `tool` with `arguments`, with a deterministic id.
    fn call(
        &self,
        ctx: &TurnContext,
        tool: &str,
        arguments: Value,
        usage: Option<Usage>,
    ) -> ModelReply {
        ModelReply {
            content: String::new(),
            tool_calls: vec![ToolCall {
                id: format!("call_{}_{}_{}", ctx.task_index, ctx.attempt, ctx.turn),
                name: tool.to_string(),
                arguments,
            }],
            usage,
        }
    }

    /// The final answer: the plan's answer with the results it has (a drifted attempt answers
    /// about another value instead, with no results; a claiming one cites a reference).
    fn answer(
        &self,
        plan: &Plan,
        index: u64,
        features: &BTreeMap<String, String>,
        input: &BTreeMap<String, String>,
        fields: &BTreeMap<String, BTreeMap<String, String>>,
        quirks: Quirks,
    ) -> String {
        let spec = self.env.spec();
        let drifted = quirks.drift.and_then(|i| {
            let name = spec.goal_first_feature.as_ref()?;
            let value = spec
                .features
                .iter()
                .find(|f| &f.name == name)?
                .values
                .get(i)?;
            let mut f = features.clone();
            f.insert(name.clone(), value.clone());
            Some(f)
        });
        let mut text = match drifted {
            Some(f) => {
                let other = spec.plan_for(&f).unwrap_or(plan);
                let none = BTreeMap::new();
                let about = other.answer.render(&Values {
                    index,
                    features: &f,
                    input,
                    fields: &none,
                });
                format!("{}: {about}", fill_goal(&spec.goal, &f))
            }
            None => plan.answer.render(&Values {
                index,
                features,
                input,
                fields,
            }),
        };
        if let Some(n) = quirks.claim {
            text.push_str(&format!(" (see ref-{n})"));
        }
        text
    }
}

/// A rendered value as its parameter's type (left a string when it does not convert: the tool
/// refuses it).
fn typed(decl: &ToolDecl, key: &str, rendered: String) -> Value {
    match decl.param(key).and_then(|p| p.ty.convert(&rendered)) {
        Some(v) => v,
        None => Value::String(rendered),
    }
}

/// Applies an edit: `set` then `remove`.
fn edit(decl: &ToolDecl, e: &Edit, v: &Values<'_>, args: &mut BTreeMap<String, Value>) {
    for (k, t) in &e.set {
        args.insert(k.clone(), typed(decl, k, t.render(v)));
    }
    for k in &e.remove {
        args.remove(k);
    }
}

impl LanguageModel for SimModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn complete<'a>(&'a self, _request: &'a ChatRequest) -> ModelFuture<'a, String> {
        Box::pin(async move {
            Err(ModelError::InvalidInput(format!(
                "{} answers agent turns only (it needs the task's TurnContext)",
                self.name
            )))
        })
    }

    fn turn<'a>(
        &'a self,
        request: &'a ChatRequest,
        ctx: &'a TurnContext,
    ) -> ModelFuture<'a, ModelReply> {
        Box::pin(async move { self.reply(request, ctx) })
    }
}
