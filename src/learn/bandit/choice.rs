//! choice: how a policy chooses a plan (information-directed sampling with a share of Thompson
//! sampling, SOP and ranker routing), what it logs with it (its exact propensity given the
//! draws it was picked from), and its rankings and fallbacks within a stage.

use super::beliefs::Eff;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::learn::cluster::{Lattice, cluster_key};
use crate::learn::posterior::sample_beta;
use crate::record::ArmChoice;

use super::draws::{DrawTable, DrawTables};
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

/// Which way a routed choice went.
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
    /// Probability the policy had of choosing this plan, given the draws it was picked from.
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

/// The buffers of a rule's draws, reused across the draws of one table (each draw samples every
/// arm's posterior, `samples` times under information-directed sampling).
#[derive(Debug, Clone)]
pub(super) struct Scratch {
    /// One draw per arm (flat order).
    p: Vec<f64>,
    /// The `(stage, arm)` departures from the greedy plan in one stage: the information-directed
    /// candidates after the greedy plan itself.
    departures: Vec<(usize, usize)>,
    /// Each candidate's value under each draw (draw after draw).
    values: Vec<f64>,
    /// Each candidate's reward when it passes (the greedy plan's, then each departure's).
    passed: Vec<f64>,
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
            passed: Vec::new(),
            plan: Vec::with_capacity(greedy.len()),
        }
    }
}

impl Policy {
    /// Chooses a plan for a task with `features`: samples the posteriors, takes the greedy plan
    /// or the departure from it that information-directed sampling prefers (the plan with the
    /// highest sampled expected reward under [`ChoiceRule::Thompson`]), picked among
    /// [`PolicyConfig::propensity_draws`] + 1 such draws, with its propensity given them.
    ///
    /// [`PolicyConfig::propensity_draws`]: super::PolicyConfig::propensity_draws
    pub fn choose(&self, features: &BTreeMap<String, String>, rng: &mut fastrand::Rng) -> Choice {
        self.choose_with(features, None, rng)
    }

    /// [`Policy::choose`] with another scorer's plan for the exploit share: whenever the sampled
    /// plan is the greedy (posterior-mean) plan, `exploit` is taken instead (a promoted ranker's
    /// plan); exploration is the policy's as always. The propensity is that of the mixed
    /// choice.
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
    /// mixture, the router's coin included.
    pub fn choose_routed(
        &self,
        features: &BTreeMap<String, String>,
        routing: Routing<'_>,
        rng: &mut fastrand::Rng,
    ) -> Choice {
        self.choose_tabled(features, routing, &mut DrawTables::default(), rng)
    }

    /// [`Policy::choose_routed`] from the plans drawn for the same features since the policy
    /// last changed (see [`DrawTables`]): the first choice for them draws
    /// [`PolicyConfig::propensity_draws`] + 1 plans of the policy's rule, each later one draws
    /// one more; the plan is picked among all of them, each draw as likely, and routed. Its
    /// propensity is the probability it had given the draws, the router's coin included:
    /// exact, so that off-policy estimates weighing runs by it are unbiased.
    ///
    /// [`PolicyConfig::propensity_draws`]: super::PolicyConfig::propensity_draws
    pub fn choose_tabled(
        &self,
        features: &BTreeMap<String, String>,
        routing: Routing<'_>,
        tables: &mut DrawTables,
        rng: &mut fastrand::Rng,
    ) -> Choice {
        let routing = Routing {
            ranker: self.valid_plan(routing.ranker),
            sop: routing
                .sop
                .and_then(|(plan, s)| self.valid_plan(Some(plan)).map(|p| (p, s.clamp(0.0, 1.0)))),
            exploring: routing.exploring,
        };
        let table = tables.table(self, features, self.config.propensity_draws + 1, rng);
        let mut chosen = table.pick(rng).to_vec();
        let drawn = self.route(&table.greedy, routing, rng, &mut chosen);
        // Propensity: per stage, the probability of the chosen arm given that the earlier
        // stages matched (the product is the plan's), over the draws and the router's coin.
        let mut agree = vec![0.0; chosen.len()];
        for (raw, share) in table.shares() {
            self.routed_outcomes(raw, &table.greedy, routing, |plan, p, _| {
                for (s, &a) in chosen.iter().enumerate() {
                    if plan.get(s) != Some(&a) {
                        break;
                    }
                    agree[s] += share * p;
                }
            });
        }
        let (eff, greedy) = (&table.eff, &table.greedy);
        let (ranked, sop) = (drawn == Drawn::Ranker, drawn == Drawn::Sop);
        let explored = if drawn == Drawn::Policy {
            chosen
                .iter()
                .zip(greedy)
                .enumerate()
                .filter(|(_, (a, g))| a != g)
                .map(|(s, (a, _))| self.offsets[s] + a)
                .collect()
        } else {
            Vec::new()
        };
        let mean_value = self.plan_value(&eff.mean, eff, &chosen);
        let mut plan = Vec::with_capacity(chosen.len());
        let mut plan_propensity = 1.0;
        let mut before = 1.0;
        for (s, (&a, &reached)) in chosen.iter().zip(&agree).enumerate() {
            let j = self.offsets[s] + a;
            let prop = if before > 0.0 { reached / before } else { 0.0 };
            before = reached;
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
            greedy: ranked || sop || chosen == *greedy || mean_value >= table.greedy_value - 1e-12,
            ranked,
            sop,
            indices: chosen,
            explored,
            greedy_plan: greedy.clone(),
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

    /// One draw of the configured [`ChoiceRule`] into `out`: the information-directed choice
    /// (see [`Policy::ids_draw`]), or the plan of a posterior draw (departing from the greedy
    /// plan in one stage at most).
    pub(super) fn rule_draw(
        &self,
        eff: &Eff,
        greedy: &[usize],
        scratch: &mut Scratch,
        rng: &mut fastrand::Rng,
        out: &mut Vec<usize>,
    ) {
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
    }

    /// Routes the drawn plan `plan` in place: one of [`Policy::routed_outcomes`], by the
    /// router's coin when there are two.
    fn route(
        &self,
        greedy: &[usize],
        routing: Routing<'_>,
        rng: &mut fastrand::Rng,
        plan: &mut Vec<usize>,
    ) -> Drawn {
        let mut outcomes: Vec<(Vec<usize>, f64, Drawn)> = Vec::with_capacity(2);
        self.routed_outcomes(plan, greedy, routing, |to, p, drawn| {
            outcomes.push((to.to_vec(), p, drawn));
        });
        let pick = match outcomes.as_slice() {
            [(_, first, _), _] if rng.f64() >= *first => 1,
            _ => 0,
        };
        let (to, _, drawn) = outcomes.swap_remove(pick);
        *plan = to;
        drawn
    }

    /// What routing makes of the drawn plan `raw`, each plan it may give with its probability
    /// and which way it went, to `outcome`: an arm explored already keeps the greedy arm
    /// instead (see [`Routing::exploring`]); a plan that is then the greedy one goes to the
    /// SOP's plan with the SOP's share, the rest to the ranker's plan (or stays greedy).
    fn routed_outcomes(
        &self,
        raw: &[usize],
        greedy: &[usize],
        routing: Routing<'_>,
        mut outcome: impl FnMut(&[usize], f64, Drawn),
    ) {
        let mut plan = raw.to_vec();
        self.hold_back_explored(greedy, routing.exploring, &mut plan);
        if plan.as_slice() != greedy {
            return outcome(&plan, 1.0, Drawn::Policy);
        }
        let mut rest = 1.0;
        if let Some((sop, s)) = routing.sop {
            outcome(sop, s, Drawn::Sop);
            rest -= s;
        }
        match routing.ranker {
            Some(ranker) => outcome(ranker, rest, Drawn::Ranker),
            None => outcome(greedy, rest, Drawn::Policy),
        }
    }

    /// Puts the greedy arm back wherever `plan` would explore an arm in `exploring`.
    fn hold_back_explored(&self, greedy: &[usize], exploring: &[usize], plan: &mut [usize]) {
        for (s, a) in plan.iter_mut().enumerate() {
            if *a != greedy[s] && exploring.contains(&(self.offsets[s] + *a)) {
                *a = greedy[s];
            }
        }
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
            passed,
            plan,
        } = scratch;
        let k = departures.len() + 1;
        values.clear();
        plan.clear();
        plan.extend_from_slice(greedy);
        // The candidates' latency and cost do not change from draw to draw: their reward when
        // they pass is worked out once, and each draw only weighs it by the chance of passing.
        passed.clear();
        passed.push(self.passed_value(eff, plan));
        for &(s, a) in departures.iter() {
            plan[s] = a;
            passed.push(self.passed_value(eff, plan));
            plan[s] = greedy[s];
        }
        for _ in 0..samples {
            for (j, x) in p.iter_mut().enumerate() {
                *x = eff.sample_plain(j, rng);
            }
            values.push(Self::value_of(self.pass_chance(p, plan), passed[0]));
            for (&(s, a), &reward) in departures.iter().zip(&passed[1..]) {
                plan[s] = a;
                values.push(Self::value_of(self.pass_chance(p, plan), reward));
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
        let mut table = DrawTable::new(self, features);
        table.draw(self, draws, rng);
        let mut out: Vec<(Vec<usize>, f64)> = table
            .shares()
            .map(|(p, share)| (p.to_vec(), share))
            .collect();
        out.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
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
