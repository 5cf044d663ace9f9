//! config: what a policy is set up with: the reward function and the settings a user may turn
//! (`[policy]` of the configuration file deserializes straight into [`PolicyConfig`]), the
//! algorithm's fixed tuning ([`Tuning`], chosen by measurement, not configuration), and their
//! checks.

use serde::{Deserialize, Serialize};

use super::PolicyError;

/// The reward function of FORMAT.md:
/// `success - latency * min(1, L / sla_ms) - cost * min(1, C / max_cost)` when the task passes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RewardParams {
    /// Earned when the task passes.
    pub success: f64,
    /// Weight of the latency penalty.
    pub latency: f64,
    /// Weight of the cost penalty.
    pub cost: f64,
    /// Cost at which the cost penalty is full.
    pub max_cost: f64,
    /// Latency (ms) at which the latency penalty is full.
    pub sla_ms: f64,
}

impl Default for RewardParams {
    fn default() -> Self {
        RewardParams {
            success: 1.0,
            latency: 0.2,
            cost: 0.1,
            max_cost: 0.1,
            sla_ms: 20_000.0,
        }
    }
}

impl RewardParams {
    /// The reward of a passed task with total latency `latency_ms` and total cost `cost`,
    /// clamped to [0, 1].
    pub fn passed_value(&self, latency_ms: f64, cost: f64) -> f64 {
        let lat = if self.sla_ms > 0.0 {
            (latency_ms / self.sla_ms).min(1.0)
        } else {
            1.0
        };
        let c = if self.max_cost > 0.0 {
            (cost / self.max_cost).min(1.0)
        } else {
            1.0
        };
        (self.success - self.latency * lat.max(0.0) - self.cost * c.max(0.0)).clamp(0.0, 1.0)
    }
}

/// How each first attempt's plan is chosen.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case", deny_unknown_fields)]
pub enum ChoiceRule {
    /// Information-directed sampling: from `samples` posterior draws, the greedy plan or one of
    /// its departures in a single stage, whichever has the smallest expected regret squared for
    /// what its outcome tells about which is best (a close contender is tried until the two are
    /// told apart; an arm far behind is left alone). A `thompson_share` of the choices is made
    /// by Thompson sampling instead, so that an arm written off after an unlucky start gets a
    /// second look. Each choice costs `samples` draws of every arm.
    InformationDirected {
        /// Posterior draws behind each choice (1 to [`MAX_IDS_SAMPLES`]).
        #[serde(default = "default_ids_samples")]
        samples: usize,
        /// Share of choices made by Thompson sampling all the same, in [0, 1].
        #[serde(default = "default_thompson_share")]
        thompson_share: f64,
    },
    /// Thompson sampling: the plan of one posterior draw, departing from the greedy plan in one
    /// stage at most. Cheaper per choice; explores an arm as often as it might be the best,
    /// whatever that costs.
    Thompson,
}

fn default_ids_samples() -> usize {
    32
}

fn default_thompson_share() -> f64 {
    0.1
}

impl Default for ChoiceRule {
    fn default() -> Self {
        ChoiceRule::InformationDirected {
            samples: default_ids_samples(),
            thompson_share: default_thompson_share(),
        }
    }
}

/// The policy's settings, each one a user can say when to turn (`[policy]` of the
/// configuration file, which refuses unknown keys; a snapshot written by another build reads
/// across added and removed settings).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PolicyConfig {
    /// The reward to maximise: the workflow's (a simulated environment's `[reward]`), set when
    /// the policy is built for it, not a configuration key.
    #[serde(skip)]
    pub reward: RewardParams,
    /// How each first attempt's plan is chosen (`[policy.choice]`).
    pub choice: ChoiceRule,
    /// Discount of a cluster's evidence per visit, in (0, 1] (1 = never forget): lower follows
    /// tools whose quality changes over time sooner, and forgets what was learned sooner.
    pub discount: f64,
    /// Pseudo-observations a cluster of tasks borrows from the coarser clusters above it: more
    /// when new kinds of task behave like the ones seen, less when each kind is its own.
    pub pool_strength: f64,
    /// Nats of evidence the drift detector needs to say an arm got worse in a cluster: lower
    /// follows a tool that breaks sooner and forgets a good arm after bad luck more often.
    pub change_threshold: f64,
    /// Nats of evidence the drift detector needs to say an arm got better.
    pub change_threshold_up: f64,
    /// How much a failure of unknown cause counts against an arm, in [0, 1] (infrastructure
    /// failures count 0, always): lower when the classifier often cannot tell.
    pub unknown_weight: f64,
    /// Draws of the choice rule, besides the one chosen, behind the first choice for a task's
    /// features since the policy last learned (each later one adds a draw): more makes choices
    /// from one table of draws closer to the rule's own distribution, and makes rare
    /// explorations less lumpy, at that many times a first choice's cost.
    pub propensity_draws: usize,
    /// Structure prior of the pooling over feature subsets (0 = none): a subset fixing `k` of
    /// the task's features starts `(k - 1/2)` times this many nats of evidence behind "all
    /// tasks". Raise it (1) where most tools and strategies ignore most of the task's
    /// features; a specialist's niche is then found later.
    pub structure_prior: f64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            reward: RewardParams::default(),
            choice: ChoiceRule::default(),
            discount: 0.999,
            pool_strength: 2.0,
            change_threshold: 10.0,
            change_threshold_up: 7.0,
            unknown_weight: 0.5,
            propensity_draws: 32,
            structure_prior: 0.0,
        }
    }
}

impl PolicyConfig {
    /// Checks every setting; the error names the key as `[policy]` spells it.
    pub fn validate(&self) -> Result<(), PolicyError> {
        check_config(self)
    }

    /// The structure prior's handicap of a level fixing `fixed` features: `fixed - 1/2` times
    /// [`PolicyConfig::structure_prior`] (none for the global level).
    pub(super) fn level_penalty(&self, fixed: u32) -> f64 {
        if fixed == 0 {
            0.0
        } else {
            self.structure_prior * (f64::from(fixed) - 0.5)
        }
    }
}

/// The algorithm's fixed tuning: settings chosen by measurement (docs/learning-log.md has each
/// one's), not by a user. Tests vary them to check what each one does.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tuning {
    /// Beta prior of the global node: pseudo-successes.
    pub prior_alpha: f64,
    /// Beta prior of the global node: pseudo-failures.
    pub prior_beta: f64,
    /// Pseudo-observations of latency and cost a node inherits from its parents.
    pub pool_latency_strength: f64,
    /// Sharpening of the posteriors the first attempts draw from (each observation counts this
    /// many times when sampling; the prior does not).
    pub sharpen: f64,
    /// Sharpening of the levels' evidence (their log weights are multiplied by it; 1 =
    /// Bayesian model averaging).
    pub evidence_sharpen: f64,
    /// Discount of a hierarchy level's predictive evidence per observation.
    pub model_discount: f64,
    /// Discount of latency and cost per observation.
    pub latency_discount: f64,
    /// Observations (since the last change) before the change detector may fire.
    pub change_min_obs: u32,
    /// Observations the detector needs before a change point to put one there.
    pub change_min_before: u32,
    /// The finest levels of the hierarchy that run change detection (1 = the exact cluster).
    pub change_levels: u32,
    /// Pseudo-observations kept (at the recent success rate) after a detected fall.
    pub change_keep: f64,
    /// Pseudo-observations kept after a detected rise (more: an arm found better on a few
    /// observations is tried a few times more, not taken on trust).
    pub change_keep_up: f64,
    /// Rate of the fast moving average of success that kept evidence is centred on.
    pub recent_rate: f64,
    /// Plans enumerated exhaustively up to this number; coordinate ascent beyond.
    pub max_enumerate: usize,
    /// Every feature subset is a pooling node up to this many features; beyond, the subsets
    /// of at most [`SPARSE_ORDER`](crate::learn::cluster::SPARSE_ORDER) features and the exact
    /// cluster.
    pub full_lattice_max_features: usize,
    /// With at least this many stages a Thompson choice departs from the greedy plan in one
    /// stage at most (0 = never).
    pub one_stage_exploration_from: usize,
    /// A fallback also draws each untried arm from its own counts in each of the task's
    /// single-feature cells visited at least this often, keeping the highest (0 = off).
    pub fallback_local_visits: f64,
    /// A fallback ranks untried arms by posterior mean plus this many standard deviations
    /// (0 = a posterior draw instead).
    pub fallback_upper_sd: f64,
    /// Sharpening of a cell's prior by its rarity when sampling: the pseudo-counts it inherits
    /// count `(visits of its busiest parent / its own visits)^rarity_sharpen` times (0 = none).
    pub rarity_sharpen: f64,
    /// Visits a single-feature cell's busiest parent needs before rarity sharpens the cell.
    pub rarity_min_parent: f64,
    /// The same for cells fixing two features or more.
    pub rarity_min_parent_fine: f64,
    /// Share of what a stage's other arms say about which features matter that each arm takes
    /// into its own weighing of the pooling levels (0 = none).
    pub stage_evidence_share: f64,
    /// Arms a stage must have for its arms to share that evidence.
    pub stage_evidence_min_arms: usize,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            prior_alpha: 1.0,
            prior_beta: 1.0,
            pool_latency_strength: 2.0,
            sharpen: 4.0,
            evidence_sharpen: 4.0,
            model_discount: 0.995,
            latency_discount: 0.95,
            change_min_obs: 8,
            change_min_before: 4,
            change_levels: 3,
            change_keep: 2.0,
            change_keep_up: 6.0,
            recent_rate: 0.3,
            max_enumerate: 4096,
            full_lattice_max_features: 3,
            one_stage_exploration_from: 3,
            fallback_local_visits: 50.0,
            fallback_upper_sd: 2.0,
            rarity_sharpen: 4.0,
            rarity_min_parent: 200.0,
            rarity_min_parent_fine: 200.0,
            stage_evidence_share: 0.3,
            stage_evidence_min_arms: 5,
        }
    }
}

impl Tuning {
    /// Pseudo-observations an arm keeps after a detected change: `change_keep_up` after a
    /// rise, `change_keep` after a fall.
    pub(crate) fn change_keep_for(&self, before: f64, after: f64) -> f64 {
        if after > before {
            self.change_keep_up
        } else {
            self.change_keep
        }
    }
}

/// The pseudo-observations of the flat prior every arm starts from (its successes and failures
/// together): what a posterior's strength holds beyond the evidence.
pub fn prior_pseudo_count() -> f64 {
    let t = Tuning::default();
    t.prior_alpha + t.prior_beta
}

/// The most posterior draws an information-directed choice may take.
pub const MAX_IDS_SAMPLES: usize = 4096;

/// Checks every setting; the error names the key as `[policy]` spells it.
pub(super) fn check_config(c: &PolicyConfig) -> Result<(), PolicyError> {
    let bad = |field: &'static str, reason: &str| {
        Err(PolicyError::BadConfig {
            field,
            reason: reason.to_string(),
        })
    };
    if !(c.discount > 0.0 && c.discount <= 1.0) {
        return bad("discount", "must be in (0, 1]");
    }
    if !(c.pool_strength >= 0.0 && c.pool_strength.is_finite()) {
        return bad("pool_strength", "must be a finite number >= 0");
    }
    if !(c.change_threshold > 0.0 && c.change_threshold.is_finite()) {
        return bad("change_threshold", "must be a finite number > 0");
    }
    if !(c.change_threshold_up > 0.0 && c.change_threshold_up.is_finite()) {
        return bad("change_threshold_up", "must be a finite number > 0");
    }
    if !(c.unknown_weight >= 0.0 && c.unknown_weight <= 1.0) {
        return bad("unknown_weight", "must be in [0, 1]");
    }
    if c.propensity_draws == 0 {
        return bad("propensity_draws", "must be >= 1");
    }
    if !(c.structure_prior >= 0.0 && c.structure_prior.is_finite()) {
        return bad("structure_prior", "must be a finite number >= 0");
    }
    if let ChoiceRule::InformationDirected {
        samples,
        thompson_share,
    } = c.choice
    {
        if samples == 0 || samples > MAX_IDS_SAMPLES {
            return bad(
                "choice.samples",
                &format!("must be from 1 to {MAX_IDS_SAMPLES}"),
            );
        }
        if !(0.0..=1.0).contains(&thompson_share) {
            return bad("choice.thompson_share", "must be in [0, 1]");
        }
    }
    let r = &c.reward;
    if !(r.sla_ms > 0.0 && r.sla_ms.is_finite()) {
        return bad("reward.sla_ms", "must be a finite number > 0");
    }
    if !(r.max_cost > 0.0 && r.max_cost.is_finite()) {
        return bad("reward.max_cost", "must be a finite number > 0");
    }
    for (field, v) in [
        ("reward.success", r.success),
        ("reward.latency", r.latency),
        ("reward.cost", r.cost),
    ] {
        if !v.is_finite() {
            return bad(field, "must be a finite number");
        }
    }
    Ok(())
}
