//! beliefs: what a policy believes of each arm for one task: the hierarchy's cells pooled by
//! Bayesian model averaging over its levels (weighted by their predictive evidence, the stage's
//! other arms' and the structure prior), sharpened by rarity; plan values and the greedy plan.

use std::collections::BTreeMap;

use crate::learn::cluster::Lattice;
use crate::learn::posterior::BetaDraw;
use crate::record::ArmChoice;

use super::{ModelEvidence, Node, Policy, PolicyConfig, StageArms};

/// Effective per-arm beliefs for one task: a mixture of Betas (one per hierarchy level) for
/// success, point estimates of latency and cost.
#[derive(Debug, Clone)]
pub(super) struct Eff {
    pub(super) n_nodes: usize,
    /// Per arm, per level: (cumulative weight, its Beta).
    pub(super) comps: Vec<(f64, BetaDraw)>,
    pub(super) mean: Vec<f64>,
    pub(super) var: Vec<f64>,
    pub(super) latency: Vec<f64>,
    pub(super) cost: Vec<f64>,
}

impl Eff {
    /// A draw of arm `j`'s success from its mixture posterior, floored at its mean (optimistic
    /// Thompson sampling: exploration only ever looks upward, so a leader that happens to draw
    /// low does not hand the task to an arm already known to be worse).
    pub(super) fn sample(&self, j: usize, rng: &mut fastrand::Rng) -> f64 {
        let x = self.sample_plain(j, rng);
        match self.mean.get(j) {
            Some(&m) => x.max(m),
            None => x,
        }
    }

    /// A draw of arm `j`'s success from its mixture posterior as it is.
    pub(super) fn sample_plain(&self, j: usize, rng: &mut fastrand::Rng) -> f64 {
        let comps = &self.comps[j * self.n_nodes..(j + 1) * self.n_nodes];
        let u = rng.f64();
        let (_, beta) = comps
            .iter()
            .find(|c| u < c.0)
            .or(comps.last())
            .copied()
            .unwrap_or((1.0, BetaDraw::new(1.0, 1.0)));
        beta.sample(rng)
    }

    pub(super) fn sample_all(&self, rng: &mut fastrand::Rng, p: &mut [f64]) {
        for (j, x) in p.iter_mut().enumerate() {
            *x = self.sample(j, rng);
        }
    }
}

/// A policy's beliefs for one task's features (posterior means), from [`Policy::beliefs`].
#[derive(Debug, Clone)]
pub struct Beliefs<'a> {
    policy: &'a Policy,
    eff: Eff,
}

impl Beliefs<'_> {
    /// The greedy plan (arm index per stage) and its expected reward.
    pub fn greedy(&self) -> (Vec<usize>, f64) {
        self.policy.greedy_in(&self.eff)
    }

    /// A plan's expected reward (0 when it does not have one known arm per stage).
    pub fn value(&self, plan: &[usize]) -> f64 {
        let p = self.policy;
        if plan.len() != p.stages.len()
            || plan.iter().zip(&p.stages).any(|(&a, s)| a >= s.arms.len())
        {
            return 0.0;
        }
        p.plan_value(&self.eff.mean, &self.eff, plan)
    }
}

/// Upper bound of a cell's rarity factor (it only needs to make the prior narrow).
pub(super) const MAX_RARITY_FACTOR: f64 = 1e6;

/// Per lattice node, the factor its prior counts when sampling: `(visits of its busiest parent
/// / its own visits)^rarity`, at least 1 (the global node, cells as busy as their parents, and
/// cells whose busiest parent has had fewer than `min_parent` visits; `min_parent.1` for
/// cells fixing two features or more, `min_parent.0` for the others).
pub(super) fn rarity_factors(
    lattice: &Lattice,
    found: &[Option<&Node>],
    rarity: f64,
    min_parent: (f64, f64),
) -> Vec<f64> {
    if rarity <= 0.0 {
        return vec![1.0; lattice.nodes.len()];
    }
    let visits = |i: usize| {
        found
            .get(i)
            .copied()
            .flatten()
            .map_or(0.0, |n| n.visits as f64)
    };
    lattice
        .nodes
        .iter()
        .enumerate()
        .map(|(i, ln)| {
            let parent = ln.parents.iter().map(|&p| visits(p)).fold(0.0, f64::max);
            let min_parent = if ln.mask.count_ones() >= 2 {
                min_parent.1
            } else {
                min_parent.0
            };
            if parent > 0.0 && parent >= min_parent {
                (parent / visits(i).max(1.0))
                    .powf(rarity)
                    .clamp(1.0, MAX_RARITY_FACTOR)
            } else {
                1.0
            }
        })
        .collect()
}

/// Arm `j`'s success posterior in one lattice node's cell (see [`Policy::cell_posteriors`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Cell {
    /// Posterior mean.
    pub(super) mean: f64,
    /// Pseudo-counts: the prior's (at most `pool_strength`) plus the data's.
    pub(super) strength: f64,
    /// The cell's own (discounted) tries.
    pub(super) data: f64,
}

/// Fills `out` with each level's predictive log evidence for arm `j` (0 for a level or arm
/// with none yet), less the structure prior's handicap for the features it fixes.
pub(super) fn level_evidence(
    config: &PolicyConfig,
    structure_prior: bool,
    lattice: &Lattice,
    models: &[Option<&ModelEvidence>],
    j: usize,
    out: &mut [f64],
) {
    for (i, (o, ln)) in out.iter_mut().zip(&lattice.nodes).enumerate() {
        let handicap = if structure_prior {
            config.level_penalty(ln.mask.count_ones())
        } else {
            0.0
        };
        *o = arm_evidence(models, i, j) - handicap;
    }
}

/// Arm `j`'s predictive log evidence at lattice node `i`'s level (0 when it has none yet).
pub(super) fn arm_evidence(models: &[Option<&ModelEvidence>], i: usize, j: usize) -> f64 {
    models
        .get(i)
        .copied()
        .flatten()
        .and_then(|m| m.log_evidence.get(j))
        .copied()
        .unwrap_or(0.0)
}

/// Per flat arm, per lattice node (`n_arms * n_nodes`, node-major within an arm): the mean over
/// the arm's stage's other arms of the level's evidence over the global level's, for the stages
/// of at least `min_arms` arms (0 elsewhere). See [`Tuning::stage_evidence_share`](super::Tuning).
pub(super) fn shared_evidence(
    offsets: &[usize],
    stages: &[StageArms],
    models: &[Option<&ModelEvidence>],
    n_nodes: usize,
    min_arms: usize,
) -> Vec<f64> {
    let n_arms = stages.iter().map(|s| s.arms.len()).sum::<usize>();
    let mut out = vec![0.0; n_arms * n_nodes];
    for (s, st) in stages.iter().enumerate() {
        let n = st.arms.len();
        if n < min_arms.max(2) {
            continue;
        }
        let arms = offsets[s]..offsets[s] + n;
        // Each arm's own evidence over the global level's, then the others' mean in its place.
        for j in arms.clone() {
            let global = arm_evidence(models, 0, j);
            for i in 0..n_nodes {
                out[j * n_nodes + i] = arm_evidence(models, i, j) - global;
            }
        }
        for i in 0..n_nodes {
            let sum: f64 = arms.clone().map(|j| out[j * n_nodes + i]).sum();
            for j in arms.clone() {
                let own = &mut out[j * n_nodes + i];
                *own = (sum - *own) / (n - 1) as f64;
            }
        }
    }
    out
}

impl Policy {
    /// Per lattice node, arm `j`'s success posterior `(mean, strength, data)` in the node's cell:
    /// the node's own (discounted) counts on top of a prior centred on its parents' means
    /// (weighted by their levels' `log_evidence` for the arm: the parent whose features matter
    /// for the arm speaks), with their strength capped at `pool_strength`. The global node, and
    /// the single-feature nodes unless `from_global`, use the flat prior: an arm's global counts
    /// come from where it was chosen, so a specialist's successes in its niche would lift it
    /// everywhere else.
    pub(super) fn cell_posteriors(
        &self,
        lattice: &Lattice,
        found: &[Option<&Node>],
        log_evidence: &[f64],
        from_global: bool,
        j: usize,
        out: &mut [Cell],
    ) {
        let (c, t) = (&self.config, &self.tuning);
        let level = |p: usize| log_evidence.get(p).copied().unwrap_or(0.0);
        for (i, ln) in lattice.nodes.iter().enumerate() {
            let from_prior = ln.parents.is_empty() || (!from_global && ln.mask.count_ones() == 1);
            let (pm, ps) = if from_prior {
                let strength = t.prior_alpha + t.prior_beta;
                (t.prior_alpha / strength, strength)
            } else {
                // Parent weights relative to the best parent (so at least one weighs 1, however
                // far the levels' evidence has drifted apart).
                let best = ln
                    .parents
                    .iter()
                    .map(|&p| level(p))
                    .fold(f64::NEG_INFINITY, f64::max);
                let (mut m, mut st, mut k) = (0.0, 0.0, 0.0);
                for &p in &ln.parents {
                    let w = (level(p) - best).exp();
                    m += w * out[p].mean;
                    st += w * out[p].strength;
                    k += w;
                }
                (m / k, (st / k).min(c.pool_strength))
            };
            let (s, f) = found[i]
                .and_then(|n| n.arms.get(j).map(|a| a.counts_at(n.visits, c.discount)))
                .unwrap_or((0.0, 0.0));
            let total = ps + s + f;
            let mean = if total > 0.0 {
                ((ps * pm + s) / total).clamp(1e-6, 1.0 - 1e-6)
            } else {
                pm
            };
            out[i] = Cell {
                mean,
                strength: total.max(1e-3),
                data: s + f,
            };
        }
    }

    pub(super) fn effective(&self, features: &BTreeMap<String, String>) -> Eff {
        let t = &self.tuning;
        self.effective_with(
            &Lattice::new(features, t.full_lattice_max_features),
            t.sharpen,
            t.evidence_sharpen,
            t.rarity_sharpen,
            true,
        )
    }

    /// [`Policy::effective`] with the posteriors sharpened by `sharpen`, the levels' evidence by
    /// `evidence_sharpen` and the cells' priors by `rarity` (see [`Tuning`](super::Tuning)), for
    /// a task's `lattice`, with or without the structure prior.
    pub(super) fn effective_with(
        &self,
        lattice: &Lattice,
        sharpen: f64,
        evidence_sharpen: f64,
        rarity: f64,
        structure_prior: bool,
    ) -> Eff {
        let (c, t) = (&self.config, &self.tuning);
        let n_nodes = lattice.nodes.len();
        let (found, models) = self.lattice_state(lattice);
        let mut eff = Eff {
            n_nodes,
            comps: Vec::with_capacity(self.n_arms * n_nodes),
            mean: Vec::with_capacity(self.n_arms),
            var: Vec::with_capacity(self.n_arms),
            latency: Vec::with_capacity(self.n_arms),
            cost: Vec::with_capacity(self.n_arms),
        };
        let mut lat: Vec<Option<f64>> = vec![None; n_nodes];
        let mut cost: Vec<Option<f64>> = vec![None; n_nodes];
        let mut logw = vec![0.0; n_nodes];
        let mut cells = vec![Cell::default(); n_nodes];
        let rarity_k = rarity_factors(
            lattice,
            &found,
            rarity,
            (t.rarity_min_parent, t.rarity_min_parent_fine),
        );
        let shared = if t.stage_evidence_share > 0.0 {
            shared_evidence(
                &self.offsets,
                &self.stages,
                &models,
                n_nodes,
                t.stage_evidence_min_arms,
            )
        } else {
            Vec::new()
        };
        for j in 0..self.n_arms {
            // Success: Bayesian model averaging over the levels of the hierarchy (which
            // features matter for this arm), weighted by each level's predictive evidence,
            // and by what the stage's other arms say of the level.
            level_evidence(c, structure_prior, lattice, &models, j, &mut logw);
            if let Some(sh) = shared.get(j * n_nodes..(j + 1) * n_nodes) {
                for (w, x) in logw.iter_mut().zip(sh) {
                    *w += t.stage_evidence_share * x;
                }
            }
            let top = logw.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let mut total_w = 0.0;
            let base = eff.comps.len();
            let (mut m1, mut m2) = (0.0, 0.0);
            self.cell_posteriors(lattice, &found, &logw, false, j, &mut cells);
            for i in 0..n_nodes {
                let w = ((logw[i] - top) * evidence_sharpen).exp();
                let Cell {
                    mean,
                    strength,
                    data,
                } = cells[i];
                // Sharpening weighs the data, not the prior: a cell with no data stays as broad
                // as its rarity allows.
                let prior = (strength - data).max(0.0);
                let strength = strength + (sharpen - 1.0) * data + prior * (rarity_k[i] - 1.0);
                let (a, b) = (mean * strength, (1.0 - mean) * strength);
                let var = mean * (1.0 - mean) / (a + b + 1.0);
                total_w += w;
                m1 += w * mean;
                m2 += w * (var + mean * mean);
                eff.comps.push((total_w, BetaDraw::new(a, b)));
            }
            for comp in &mut eff.comps[base..] {
                comp.0 /= total_w;
            }
            let mean = m1 / total_w;
            eff.mean.push(mean);
            eff.var.push((m2 / total_w - mean * mean).max(0.0));
            // Latency and cost: each node starts from its parents' estimates.
            for (i, ln) in lattice.nodes.iter().enumerate() {
                let (mut l_sum, mut l_n, mut c_sum, mut c_n) = (0.0, 0.0, 0.0, 0.0);
                for &p in &ln.parents {
                    if let Some(v) = lat[p] {
                        l_sum += v;
                        l_n += 1.0;
                    }
                    if let Some(v) = cost[p] {
                        c_sum += v;
                        c_n += 1.0;
                    }
                }
                let (pl, pc) = (
                    (l_n > 0.0).then(|| l_sum / l_n),
                    (c_n > 0.0).then(|| c_sum / c_n),
                );
                let (lw, ls, cw, cs) = found[i]
                    .and_then(|n| n.arms.get(j))
                    .map(|a| {
                        (
                            a.latency_weight,
                            a.latency_log_sum,
                            a.cost_weight,
                            a.cost_sum,
                        )
                    })
                    .unwrap_or((0.0, 0.0, 0.0, 0.0));
                let pls = t.pool_latency_strength;
                lat[i] = match pl {
                    Some(p) => Some((pls * p + ls) / (pls + lw)),
                    None if lw > 0.0 => Some(ls / lw),
                    None => None,
                };
                cost[i] = match pc {
                    Some(p) => Some((pls * p + cs) / (pls + cw)),
                    None if cw > 0.0 => Some(cs / cw),
                    None => None,
                };
            }
            let last = n_nodes - 1;
            // Unknown latency or cost: optimistic (0), so that the arm gets tried.
            eff.latency.push(lat[last].map(f64::exp).unwrap_or(0.0));
            eff.cost.push(cost[last].unwrap_or(0.0));
        }
        eff
    }

    pub(super) fn plan_value(&self, p: &[f64], eff: &Eff, plan: &[usize]) -> f64 {
        Self::value_of(self.pass_chance(p, plan), self.passed_value(eff, plan))
    }

    /// The chance that `plan` passes under the success draws `p` (flat arm order).
    pub(super) fn pass_chance(&self, p: &[f64], plan: &[usize]) -> f64 {
        let mut prob = 1.0;
        for (s, &a) in plan.iter().enumerate() {
            prob *= p[self.offsets[s] + a];
        }
        prob
    }

    /// The reward of `plan` when it passes, from its expected latency and cost (no draw
    /// changes it).
    pub(super) fn passed_value(&self, eff: &Eff, plan: &[usize]) -> f64 {
        let mut l = 0.0;
        let mut cst = 0.0;
        for (s, &a) in plan.iter().enumerate() {
            let j = self.offsets[s] + a;
            l += eff.latency[j];
            cst += eff.cost[j];
        }
        self.config.reward.passed_value(l, cst)
    }

    /// A plan's value from its chance of passing and its reward when it does.
    pub(super) fn value_of(chance: f64, passed: f64) -> f64 {
        (chance * passed).clamp(0.0, 1.0)
    }

    /// The best plan for the success probabilities `p` (flat arm order).
    pub(super) fn best_plan(&self, p: &[f64], eff: &Eff, plan: &mut Vec<usize>) -> f64 {
        let n_stages = self.stages.len();
        plan.clear();
        plan.resize(n_stages, 0);
        if self.plan_count() <= self.tuning.max_enumerate {
            let mut buf = [0usize; 16];
            let mut heap = Vec::new();
            let cur: &mut [usize] = if n_stages <= buf.len() {
                &mut buf[..n_stages]
            } else {
                heap.resize(n_stages, 0);
                &mut heap
            };
            let mut best = f64::NEG_INFINITY;
            loop {
                let v = self.plan_value(p, eff, cur);
                if v > best {
                    best = v;
                    plan.copy_from_slice(cur);
                }
                // Mixed-radix increment.
                let mut s = 0;
                loop {
                    if s == n_stages {
                        return best;
                    }
                    cur[s] += 1;
                    if cur[s] < self.stages[s].arms.len() {
                        break;
                    }
                    cur[s] = 0;
                    s += 1;
                }
            }
        }
        // Coordinate ascent from the per-stage best standalone arm.
        for (s, st) in self.stages.iter().enumerate() {
            let mut best = (f64::NEG_INFINITY, 0);
            for a in 0..st.arms.len() {
                let j = self.offsets[s] + a;
                let v = p[j] * self.config.reward.passed_value(eff.latency[j], eff.cost[j]);
                if v > best.0 {
                    best = (v, a);
                }
            }
            plan[s] = best.1;
        }
        let mut value = self.plan_value(p, eff, plan);
        for _ in 0..10 {
            let mut improved = false;
            for s in 0..n_stages {
                let mut best_a = plan[s];
                for a in 0..self.stages[s].arms.len() {
                    plan[s] = a;
                    let v = self.plan_value(p, eff, plan);
                    if v > value + 1e-12 {
                        value = v;
                        best_a = a;
                        improved = true;
                    }
                }
                plan[s] = best_a;
            }
            if !improved {
                break;
            }
        }
        value
    }

    /// The greedy plan (posterior means, no sampling) and its expected value.
    pub fn greedy(&self, features: &BTreeMap<String, String>) -> (Vec<usize>, f64) {
        self.beliefs(features).greedy()
    }

    /// The policy's beliefs for one task with `features`, to value many plans at the cost of one
    /// lookup.
    pub fn beliefs(&self, features: &BTreeMap<String, String>) -> Beliefs<'_> {
        Beliefs {
            policy: self,
            eff: self.effective(features),
        }
    }

    /// The policy's estimate of a plan's expected reward (posterior means) for `features` (0
    /// when the plan does not have one known arm per stage).
    pub fn plan_mean_value(&self, features: &BTreeMap<String, String>, plan: &[usize]) -> f64 {
        self.beliefs(features).value(plan)
    }

    /// How much less the policy expects from `plan` (the arms of an SOP, say) than from its own
    /// greedy plan for `features`, by posterior means: `None` if the plan names an unknown stage
    /// or arm, or does not have one arm per stage.
    pub fn shortfall(
        &self,
        features: &BTreeMap<String, String>,
        plan: &[ArmChoice],
    ) -> Option<f64> {
        self.shortfall_of(features, &self.choice_indices(plan)?)
    }

    /// [`Policy::shortfall`] of a plan given as arm indices (a distilled ranker's, say).
    pub fn shortfall_of(&self, features: &BTreeMap<String, String>, plan: &[usize]) -> Option<f64> {
        let plan = self.valid_plan(Some(plan))?;
        let eff = self.effective(features);
        let (_, best) = self.greedy_in(&eff);
        Some(self.shortfall_in(&eff, best, plan))
    }

    /// How much less the policy expects from a valid `plan` than `best` under `eff`.
    pub(super) fn shortfall_in(&self, eff: &Eff, best: f64, plan: &[usize]) -> f64 {
        (best - self.plan_value(&eff.mean, eff, plan)).max(0.0)
    }
}
