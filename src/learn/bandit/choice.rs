//! choice: how a policy chooses a plan (information-directed sampling with a share of Thompson
//! sampling, SOP and ranker routing), what it logs with it (propensities by resampling), and its
//! rankings and fallbacks within a stage.

use super::beliefs::Eff;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::learn::cluster::{Lattice, cluster_key};
use crate::learn::posterior::sample_beta;
use crate::record::ArmChoice;

use super::{Arm, ChoiceRule, Node, Policy};

/// One stage of a chosen plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChosenArm {
    /// The stage.
    pub stage: String,
    /// The arm.
    pub arm: Arm,
    /// Probability of this arm given the arms chosen for the earlier stages, so that the
    /// product over stages is the plan's propensity.
    pub propensity: f64,
    /// Posterior mean of "succeeds and is valid" in the task's cluster.
    pub p_mean: f64,
    /// Posterior standard deviation of it.
    pub p_std: f64,
}

/// What shapes a choice besides the posterior: who takes its exploit share (the posterior
/// draws that land on the greedy plan), and which explorations are already under way.
#[derive(Debug, Clone, Copy, Default)]
pub struct Routing<'a> {
    /// A promoted ranker's plan (arm indices), in the greedy plan's place.
    pub ranker: Option<&'a [usize]>,
    /// A stable SOP's plan (arm indices) and the share of those draws it takes (the A/B
    /// router's); the rest, the holdout, stay with the ranker's plan or the greedy one.
    pub sop: Option<(&'a [usize], f64)>,
    /// The arms (flat indices, stage after stage) that runs in flight are exploring. A draw that
    /// would explore such an arm again keeps the greedy arm at that stage: with several tasks
    /// in flight, the same untried arm would otherwise be tried in each of them before its
    /// first result is back (a specialist tried off its niche several times over, and judged by
    /// those failures). Empty = none.
    pub exploring: &'a [usize],
}

/// Which way one draw of [`Policy::mixed_draw`] went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Drawn {
    /// The policy's own plan (greedy or exploring).
    Policy,
    /// The ranker's plan, in the greedy plan's place.
    Ranker,
    /// The SOP's plan, in the greedy plan's place.
    Sop,
}

/// A plan chosen by the policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    /// The exact cluster's key.
    pub cluster: String,
    /// One arm per stage, in stage order.
    pub plan: Vec<ChosenArm>,
    /// Probability the policy had of choosing this plan (estimated by resampling).
    pub plan_propensity: f64,
    /// Expected reward of the plan under the posterior means.
    pub mean_value: f64,
    /// Whether the plan is also the greedy (posterior-mean) plan, or a promoted ranker's plan
    /// in its place; `false` = exploration.
    pub greedy: bool,
    /// Whether a promoted ranker's plan took the greedy plan's place.
    #[serde(default)]
    pub ranked: bool,
    /// Whether a stable SOP's plan took the greedy plan's place (the A/B router sent the task
    /// to the SOP).
    #[serde(default)]
    pub sop: bool,
    /// Arm index per stage (into the policy's stage arms).
    pub indices: Vec<usize>,
    /// The arms (flat index, stage after stage) where the plan departs from the greedy plan:
    /// what this choice explores (see [`Routing::exploring`]).
    #[serde(default)]
    pub explored: Vec<usize>,
    /// The policy's greedy plan for the task (arm index per stage, posterior means), whatever
    /// was chosen: what its beliefs alone would have planned.
    #[serde(default)]
    pub greedy_plan: Vec<usize>,
}

impl Choice {
    /// The plan as the experience log's [`ArmChoice`] list.
    pub fn arm_choices(&self) -> Vec<ArmChoice> {
        self.plan
            .iter()
            .map(|c| ArmChoice {
                stage: c.stage.clone(),
                tool: c.arm.tool.clone(),
                strategy: c.arm.strategy.clone(),
                propensity: c.propensity,
            })
            .collect()
    }

    /// The plan as `(tool, strategy)` pairs.
    pub fn arms(&self) -> Vec<(String, String)> {
        self.plan
            .iter()
            .map(|c| (c.arm.tool.clone(), c.arm.strategy.clone()))
            .collect()
    }
}

/// Per stage, the share of choices that agree with `plan` there among those that agreed with it
/// in every earlier stage: over `draws` choices made by `draw`, plus `counted` that are `plan`
/// itself (1 when `plan` is one of the choices). A stage no choice reached gets 0.
pub(super) fn conditional_frequencies(
    plan: &[usize],
    draws: usize,
    counted: usize,
    mut draw: impl FnMut(&mut Vec<usize>),
) -> Vec<f64> {
    let mut agree = vec![counted; plan.len()];
    let mut other = Vec::new();
    for _ in 0..draws {
        draw(&mut other);
        for (s, &a) in plan.iter().enumerate() {
            if other.get(s) != Some(&a) {
                break;
            }
            agree[s] += 1;
        }
    }
    let mut prev = (draws + counted) as f64;
    agree
        .iter()
        .map(|&n| {
            let n = n as f64;
            let share = if prev > 0.0 { n / prev } else { 0.0 };
            prev = n;
            share
        })
        .collect()
}

/// The buffers of a choice's draws, reused across the draws behind one choice and its
/// propensity (a choice and its propensity make `propensity_draws + 1` draws of every arm's
/// posterior, each `samples` times under information-directed sampling).
pub(super) struct Scratch {
    /// One draw per arm (flat order).
    p: Vec<f64>,
    /// The `(stage, arm)` departures from the greedy plan in one stage: the information-directed
    /// candidates after the greedy plan itself.
    departures: Vec<(usize, usize)>,
    /// Each candidate's value under each draw (draw after draw).
    values: Vec<f64>,
    /// The plan being valued.
    plan: Vec<usize>,
}

impl Scratch {
    /// Buffers for choices of `policy` around the greedy plan `greedy`.
    pub(super) fn new(policy: &Policy, greedy: &[usize]) -> Scratch {
        let mut departures = Vec::new();
        if greedy.len() == policy.stages.len() {
            for (s, st) in policy.stages.iter().enumerate() {
                departures.extend(
                    (0..st.arms.len())
                        .filter(|&a| a != greedy[s])
                        .map(|a| (s, a)),
                );
            }
        }
        Scratch {
            p: vec![0.0; policy.n_arms],
            departures,
            values: Vec::new(),
            plan: Vec::with_capacity(greedy.len()),
        }
    }
}

impl Policy {
    /// Chooses a plan for a task with `features`: samples the posteriors, takes the greedy plan
    /// or the departure from it that information-directed sampling prefers (the plan with the
    /// highest sampled expected reward under [`ChoiceRule::Thompson`]), and estimates its
    /// propensity by resampling.
    pub fn choose(&self, features: &BTreeMap<String, String>, rng: &mut fastrand::Rng) -> Choice {
        self.choose_with(features, None, rng)
    }

    /// [`Policy::choose`] with another scorer's plan for the exploit share: whenever the sampled
    /// plan is the greedy (posterior-mean) plan, `exploit` is taken instead (a promoted ranker's
    /// plan); exploration is the policy's as always. The propensity is that of the mixed
    /// choice, estimated by resampling it.
    pub fn choose_with(
        &self,
        features: &BTreeMap<String, String>,
        exploit: Option<&[usize]>,
        rng: &mut fastrand::Rng,
    ) -> Choice {
        let routing = Routing {
            ranker: exploit,
            ..Routing::default()
        };
        self.choose_routed(features, routing, rng)
    }

    /// [`Policy::choose`] with its exploit share (the draws that land on the greedy plan) given
    /// to a promoted ranker's plan and a stable SOP's, and without exploring again what is being
    /// explored already (see [`Routing`]). Exploration stays the policy's, so a cluster an
    /// SOP covers keeps exploring at the policy's own rate (an SOP promoted before a specialist
    /// was found does not starve the specialist of tries). The propensity is that of the whole
    /// mixture, the router's coin included, estimated by resampling it.
    pub fn choose_routed(
        &self,
        features: &BTreeMap<String, String>,
        routing: Routing<'_>,
        rng: &mut fastrand::Rng,
    ) -> Choice {
        let eff = self.effective(features);
        let n_stages = self.stages.len();
        let means = eff.mean.clone();
        let (greedy, greedy_value) = self.greedy_in(&eff);
        let routing = Routing {
            ranker: self.valid_plan(routing.ranker),
            sop: routing
                .sop
                .and_then(|(plan, s)| self.valid_plan(Some(plan)).map(|p| (p, s.clamp(0.0, 1.0)))),
            exploring: routing.exploring,
        };
        let mut scratch = Scratch::new(self, &greedy);
        let mut chosen = Vec::new();
        let drawn = self.mixed_draw(&eff, &greedy, routing, &mut scratch, rng, &mut chosen);
        // Propensity: the chosen draw plus `propensity_draws` more; per stage the frequency of
        // the chosen arm given that the earlier stages matched (the product is the plan's).
        let props = conditional_frequencies(&chosen, self.config.propensity_draws, 1, |out| {
            self.mixed_draw(&eff, &greedy, routing, &mut scratch, rng, out);
        });
        let (ranked, sop) = (drawn == Drawn::Ranker, drawn == Drawn::Sop);
        let explored = if drawn == Drawn::Policy {
            chosen
                .iter()
                .zip(&greedy)
                .enumerate()
                .filter(|(_, (a, g))| a != g)
                .map(|(s, (a, _))| self.offsets[s] + a)
                .collect()
        } else {
            Vec::new()
        };
        let mean_value = self.plan_value(&means, &eff, &chosen);
        let mut plan = Vec::with_capacity(n_stages);
        let mut plan_propensity = 1.0;
        for (s, (&a, &prop)) in chosen.iter().zip(&props).enumerate() {
            let j = self.offsets[s] + a;
            plan_propensity *= prop;
            plan.push(ChosenArm {
                stage: self.stages[s].stage.clone(),
                arm: self.stages[s].arms[a].clone(),
                propensity: prop,
                p_mean: eff.mean[j],
                p_std: eff.var[j].sqrt(),
            });
        }
        Choice {
            cluster: cluster_key(features),
            plan,
            plan_propensity,
            mean_value,
            greedy: ranked || sop || chosen == greedy || mean_value >= greedy_value - 1e-12,
            ranked,
            sop,
            indices: chosen,
            explored,
            greedy_plan: greedy,
        }
    }

    /// The greedy plan (posterior means) under `eff`, and its expected reward.
    pub(super) fn greedy_in(&self, eff: &Eff) -> (Vec<usize>, f64) {
        let mut plan = Vec::new();
        let v = self.best_plan(&eff.mean, eff, &mut plan);
        (plan, v)
    }

    /// `plan` when it has one known arm per stage.
    pub(super) fn valid_plan<'p>(&self, plan: Option<&'p [usize]>) -> Option<&'p [usize]> {
        plan.filter(|e| {
            e.len() == self.stages.len()
                && e.iter().zip(&self.stages).all(|(&a, s)| a < s.arms.len())
        })
    }

    /// One choice into `out` by the configured [`ChoiceRule`]: the information-directed choice
    /// (see [`Policy::ids_draw`]), or the plan of a posterior draw (departing from the greedy
    /// plan in one stage at most); when it is the greedy plan, the SOP's plan with the SOP's
    /// share, else the ranker's plan in its place.
    pub(super) fn mixed_draw(
        &self,
        eff: &Eff,
        greedy: &[usize],
        routing: Routing<'_>,
        scratch: &mut Scratch,
        rng: &mut fastrand::Rng,
        out: &mut Vec<usize>,
    ) -> Drawn {
        let ids = match self.config.choice {
            ChoiceRule::InformationDirected {
                samples,
                thompson_share,
            } => (!(thompson_share > 0.0 && rng.f64() < thompson_share)).then_some(samples),
            ChoiceRule::Thompson => None,
        };
        if let Some(samples) = ids {
            self.ids_draw(eff, greedy, samples, scratch, rng, out);
        } else {
            let p = &mut scratch.p;
            eff.sample_all(rng, p);
            self.best_plan(p, eff, out);
            let from = self.tuning.one_stage_exploration_from;
            if from > 0 && self.stages.len() >= from {
                self.keep_one_departure(p, eff, greedy, out);
            }
        }
        for (s, a) in out.iter_mut().enumerate() {
            if *a != greedy[s] && routing.exploring.contains(&(self.offsets[s] + *a)) {
                *a = greedy[s];
            }
        }
        if out.as_slice() != greedy {
            return Drawn::Policy;
        }
        let (plan, drawn) = match (routing.sop, routing.ranker) {
            (Some((sop, s)), _) if rng.f64() < s => (sop, Drawn::Sop),
            (_, Some(ranker)) => (ranker, Drawn::Ranker),
            _ => return Drawn::Policy,
        };
        out.clear();
        out.extend_from_slice(plan);
        drawn
    }

    /// One information-directed choice into `out` (see [`ChoiceRule::InformationDirected`]):
    /// the greedy plan or one of its departures in a single stage, from `samples` draws of the
    /// plain posteriors (`scratch` holds the departures of `greedy` and the buffers).
    pub(super) fn ids_draw(
        &self,
        eff: &Eff,
        greedy: &[usize],
        samples: usize,
        scratch: &mut Scratch,
        rng: &mut fastrand::Rng,
        out: &mut Vec<usize>,
    ) {
        out.clear();
        out.extend_from_slice(greedy);
        if greedy.len() != self.stages.len() {
            return;
        }
        // Candidate 0 is the greedy plan (ties go to it); then (stage, arm) departures.
        let Scratch {
            p,
            departures,
            values,
            plan,
        } = scratch;
        let k = departures.len() + 1;
        values.clear();
        plan.clear();
        plan.extend_from_slice(greedy);
        for _ in 0..samples {
            for (j, x) in p.iter_mut().enumerate() {
                *x = eff.sample_plain(j, rng);
            }
            values.push(self.plan_value(p, eff, plan));
            for &(s, a) in departures.iter() {
                plan[s] = a;
                values.push(self.plan_value(p, eff, plan));
                plan[s] = greedy[s];
            }
        }
        let chosen = crate::learn::ids::choose(values, k).and_then(|i| i.checked_sub(1));
        if let Some(&(s, a)) = chosen.and_then(|i| departures.get(i)) {
            out[s] = a;
        }
    }

    /// Reduces `plan` to the one departure from `greedy` worth most under the success draws
    /// `p` (unchanged when it departs in one stage or none).
    pub(super) fn keep_one_departure(
        &self,
        p: &[f64],
        eff: &Eff,
        greedy: &[usize],
        plan: &mut [usize],
    ) {
        if plan.len() != greedy.len() || plan.iter().zip(greedy).filter(|(a, b)| a != b).count() < 2
        {
            return;
        }
        let mut best: Option<(f64, usize)> = None;
        let mut candidate = greedy.to_vec();
        for s in 0..plan.len() {
            if plan[s] == greedy[s] {
                continue;
            }
            candidate[s] = plan[s];
            let v = self.plan_value(p, eff, &candidate);
            candidate[s] = greedy[s];
            if best.is_none_or(|(b, _)| v > b) {
                best = Some((v, s));
            }
        }
        if let Some((_, s)) = best {
            let keep = plan[s];
            plan.copy_from_slice(greedy);
            plan[s] = keep;
        }
    }

    /// The distribution of the policy's plan choice for `features`, estimated from `draws`
    /// posterior samples: `(arm index per stage, probability)`, most likely first.
    pub fn plan_distribution(
        &self,
        features: &BTreeMap<String, String>,
        draws: usize,
        rng: &mut fastrand::Rng,
    ) -> Vec<(Vec<usize>, f64)> {
        let eff = self.effective(features);
        let draws = draws.max(1);
        let (greedy, _) = self.greedy_in(&eff);
        let mut scratch = Scratch::new(self, &greedy);
        let mut plan = Vec::new();
        let mut counts: BTreeMap<Vec<usize>, usize> = BTreeMap::new();
        for _ in 0..draws {
            self.mixed_draw(
                &eff,
                &greedy,
                Routing::default(),
                &mut scratch,
                rng,
                &mut plan,
            );
            *counts.entry(plan.clone()).or_default() += 1;
        }
        let mut out: Vec<(Vec<usize>, f64)> = counts
            .into_iter()
            .map(|(k, c)| (k, c as f64 / draws as f64))
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1));
        out
    }

    /// Ranked arms of one stage for `features`: `(arm index, posterior mean of success, its
    /// standard deviation, standalone expected value)`, best first.
    pub fn rank_stage(
        &self,
        features: &BTreeMap<String, String>,
        stage: usize,
    ) -> Vec<(usize, f64, f64, f64)> {
        let Some(st) = self.stages.get(stage) else {
            return Vec::new();
        };
        let eff = self.effective(features);
        let mut out: Vec<(usize, f64, f64, f64)> = (0..st.arms.len())
            .map(|a| {
                let j = self.offsets[stage] + a;
                let m = eff.mean[j];
                let v = m * self.config.reward.passed_value(eff.latency[j], eff.cost[j]);
                (a, m, eff.var[j].sqrt(), v)
            })
            .collect();
        out.sort_by(|x, y| y.3.total_cmp(&x.3));
        out
    }

    /// A fallback arm for a stage that failed: the best by standalone value of the stage's arms
    /// not in `tried`, each valued at an upper bound of its success under the plain posterior
    /// (mean plus the tuning's `fallback_upper_sd` standard deviations), raised to its draws
    /// from its own counts in the task's busy single-feature cells (`fallback_local_visits`);
    /// `None` when every arm was tried.
    pub fn fallback(
        &self,
        features: &BTreeMap<String, String>,
        stage: usize,
        tried: &[usize],
        rng: &mut fastrand::Rng,
    ) -> Option<usize> {
        self.fallback_ranking(features, stage, tried)?.pick(rng)
    }

    /// [`Policy::fallback`] with the probability the policy had of choosing that arm: 1 when
    /// the choice involved no draw (upper bounds, no busy cell), else the chosen arm's share of
    /// [`PolicyConfig::propensity_draws`] more choices made the same way, the chosen one
    /// counted too (the first attempt's propensities are estimated alike). The resampling
    /// draws from its own generator, seeded from `rng`'s state without advancing it, so that
    /// `rng` goes on exactly as after [`Policy::fallback`]: logging the propensity changes no
    /// later choice.
    ///
    /// [`PolicyConfig::propensity_draws`]: super::PolicyConfig::propensity_draws
    pub fn fallback_with_propensity(
        &self,
        features: &BTreeMap<String, String>,
        stage: usize,
        tried: &[usize],
        rng: &mut fastrand::Rng,
    ) -> Option<(usize, f64)> {
        let ranking = self.fallback_ranking(features, stage, tried)?;
        let chosen = ranking.pick(rng)?;
        if !ranking.random() {
            return Some((chosen, 1.0));
        }
        let mut resample = fastrand::Rng::with_seed(rng.get_seed() ^ 0x9e37_79b9_7f4a_7c15);
        let draws = self.config.propensity_draws;
        let same = (0..draws)
            .filter(|_| ranking.pick(&mut resample) == Some(chosen))
            .count();
        Some((chosen, (same + 1) as f64 / (draws + 1) as f64))
    }

    /// What a fallback for `stage` chooses from (see [`Policy::fallback`]); `None` for an
    /// unknown stage.
    fn fallback_ranking(
        &self,
        features: &BTreeMap<String, String>,
        stage: usize,
        tried: &[usize],
    ) -> Option<FallbackRanking<'_>> {
        self.stages.get(stage)?;
        let t = &self.tuning;
        // The plain posterior, the levels' evidence unsharpened and without the structure
        // prior: a fallback's regret is not the first attempt's (the task's plan is chosen),
        // and most niches are found by fallbacks.
        let lattice = Lattice::new(features, t.full_lattice_max_features);
        let eff = self.effective_with(&lattice, 1.0, 1.0, 0.0, false);
        // The task's single-feature cells busy enough that what an arm did there is worth a
        // second look (the tuning's `fallback_local_visits`).
        let busy: Vec<&Node> = if t.fallback_local_visits > 0.0 {
            lattice
                .nodes
                .iter()
                .filter(|n| n.mask.count_ones() == 1)
                .filter_map(|n| self.nodes.get(&n.hash))
                .filter(|n| n.visits as f64 >= t.fallback_local_visits)
                .collect()
        } else {
            Vec::new()
        };
        Some(FallbackRanking {
            policy: self,
            stage,
            tried: tried.to_vec(),
            eff,
            busy,
        })
    }
}

/// A stage's untried arms as a fallback values them (see [`Policy::fallback`]).
struct FallbackRanking<'a> {
    policy: &'a Policy,
    stage: usize,
    tried: Vec<usize>,
    eff: Eff,
    busy: Vec<&'a Node>,
}

impl FallbackRanking<'_> {
    /// Whether a choice draws anything (a posterior draw, or an arm's own counts in a busy cell).
    fn random(&self) -> bool {
        self.policy.tuning.fallback_upper_sd <= 0.0 || !self.busy.is_empty()
    }

    /// One choice: the untried arm of the highest standalone value (`None` when there is none).
    fn pick(&self, rng: &mut fastrand::Rng) -> Option<usize> {
        let p = self.policy;
        let (c, t) = (&p.config, &p.tuning);
        let eff = &self.eff;
        let n = p.stages.get(self.stage)?.arms.len();
        let mut best: Option<(f64, usize)> = None;
        for a in (0..n).filter(|a| !self.tried.contains(a)) {
            let j = p.offsets[self.stage] + a;
            let mut x = if t.fallback_upper_sd > 0.0 {
                eff.mean[j] + t.fallback_upper_sd * eff.var[j].sqrt()
            } else {
                eff.sample(j, rng)
            };
            for s in self.busy.iter().filter_map(|n| n.arms.get(j)) {
                x = x.max(sample_beta(rng, 1.0 + s.successes, 1.0 + s.failures));
            }
            let v = x * c.reward.passed_value(eff.latency[j], eff.cost[j]);
            if best.is_none_or(|(b, _)| v > b) {
                best = Some((v, a));
            }
        }
        best.map(|(_, a)| a)
    }
}
