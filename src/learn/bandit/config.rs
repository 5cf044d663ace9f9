//! config: what a policy is set up with: the reward function, the bandit's settings (each with
//! the measurements that chose its default), and their checks.

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

/// Configuration of the policy (serde, with defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PolicyConfig {
    /// The reward to maximise.
    pub reward: RewardParams,
    /// Beta prior of the global node: pseudo-successes.
    pub prior_alpha: f64,
    /// Beta prior of the global node: pseudo-failures.
    pub prior_beta: f64,
    /// Cap on the pseudo-count a node inherits from its parents (hierarchical pooling).
    pub pool_strength: f64,
    /// Pseudo-observations of latency and cost a node inherits from its parents.
    pub pool_latency_strength: f64,
    /// Discount of success counts per visit of a node (1 = none).
    pub discount: f64,
    /// Sharpening of the posteriors the choices draw from (each observation counts
    /// this many times when sampling; the prior does not: 1 = plain Thompson sampling, more =
    /// less exploration of what the data already tells apart).
    pub sharpen: f64,
    /// Sharpening of the levels' evidence (their log weights are multiplied by it; 1 = Bayesian
    /// model averaging).
    pub evidence_sharpen: f64,
    /// Discount of a hierarchy level's predictive evidence per observation (1 = none).
    pub model_discount: f64,
    /// Discount of latency and cost per observation (1 = none).
    pub latency_discount: f64,
    /// Threshold of the change detector: the log-likelihood ratio of "the arm's success rate
    /// changed at some point in its latest observations" over "it did not" (a generalised
    /// likelihood-ratio test; its false-alarm rate is about the same whatever the rate).
    pub change_threshold: f64,
    /// The change detector's threshold for a change upward (an arm doing better than its
    /// evidence says). An arm written off is seen mostly in fallbacks, a few times per hundred
    /// tasks, so an upward change has to be found on fewer observations; a false alarm costs
    /// little (the arm is tried a few more times on first attempts), unlike a false alarm
    /// downward, which writes off a good arm.
    pub change_threshold_up: f64,
    /// Observations (since the last change) before the change detector may fire.
    pub change_min_obs: u32,
    /// Observations the detector needs before a change point to put one there.
    pub change_min_before: u32,
    /// The finest levels of the hierarchy that run change detection (1 = the exact cluster
    /// only, 2 = also the nodes of the next size down the task's lattice, and so on; a sparse
    /// lattice's sizes are the exact cluster's, two, one and none).
    pub change_levels: u32,
    /// Pseudo-observations kept (at the recent success rate) when a change is detected; the
    /// node's finer clusters forget the arm the same way.
    pub change_keep: f64,
    /// Pseudo-observations kept when an upward change is detected (see
    /// [`PolicyConfig::change_threshold_up`]): more than after a fall, so that an arm found
    /// better on a few observations is tried a few times more, not taken on trust.
    pub change_keep_up: f64,
    /// Rate of the fast moving average of success that the kept evidence is centred on.
    pub recent_rate: f64,
    /// Weight of a failure whose category is `Unknown` (infrastructure ones weigh 0, always).
    pub unknown_weight: f64,
    /// Posterior draws used to estimate a choice's propensity.
    pub propensity_draws: usize,
    /// Plans enumerated exhaustively up to this number; coordinate ascent beyond.
    pub max_enumerate: usize,
    /// Every feature subset is a pooling node up to this many features; beyond, the subsets of
    /// at most [`SPARSE_ORDER`](crate::learn::cluster::SPARSE_ORDER) features and the exact
    /// cluster. The default, 3, gives every task the same shape of hierarchy (none, one or two
    /// features, and the exact cluster): with four features the triples are nearly as sparse
    /// as the exact cluster and only dilute the levels' average.
    pub full_lattice_max_features: usize,
    /// A cell with one feature fixed starts from the global node's estimate (true) or from the
    /// configured prior (false, the default: an arm's global counts come from where it was
    /// chosen, so a specialist's successes in its niche would lift it everywhere else). This is
    /// what the policy samples and ranks from; the levels' evidence is always scored with
    /// every cell pooling from its parents.
    pub pool_from_global: bool,
    /// A cell's prior weighs its parents by their level's predictive evidence for the arm (true,
    /// the default) rather than equally: the parent whose features matter for the arm speaks.
    pub pool_by_evidence: bool,
    /// Optimistic Thompson sampling (true, the default): an arm's draw is never below its
    /// posterior mean, so exploration only ever looks upward. A leader that happens to draw low
    /// no longer hands the task to an arm already known to be worse, which lets `sharpen` stay
    /// low enough that an arm unlucky early (a specialist failing once in its niche) is still
    /// tried again.
    pub optimistic: bool,
    /// With at least this many stages (3, the default; 0 = never) a choice departs from the
    /// greedy plan in one stage at most: when the sampled plan differs in several, only the
    /// departure worth most by the sample is kept. Departures in several stages at once add
    /// their regrets on the same task, and with three to five stages most tasks would explore
    /// somewhere; one stage at a time learns the same arms for less. (With two stages it made no
    /// difference worth having: measured in the notes of issue 6.)
    pub one_stage_exploration_from: usize,
    /// Posterior samples behind each first-attempt choice made by information-directed
    /// sampling (32, the default; 0 = Thompson sampling, one sample a choice). The candidates
    /// are the greedy plan and its departures in one stage; from the samples of their values
    /// the choice takes the one whose expected regret squared is smallest for what its outcome
    /// tells about which candidate is best ([`crate::learn::ids::choose`]). Thompson sampling
    /// explores an arm as often as it might be the best; this also weighs the price: a close
    /// contender is tried until the two are told apart, an arm far behind is left alone however
    /// uncertain it is. With it, [`PolicyConfig::optimistic`] and
    /// [`PolicyConfig::one_stage_exploration_from`] apply to Thompson sampling only (the
    /// samples are the plain posterior's; departures are in one stage by construction). Core
    /// loop, three fallbacks a stage, feedback delay 3, 0 against 32: the shipped six 0.124 ->
    /// 0.120 (64 seeds), twelve many-arm environments 0.184 -> 0.169 and 0.174 -> 0.158, 16
    /// random ones 0.126 -> 0.117, 12 random ones 0.123 -> 0.109, 16 of five to eight arms
    /// 0.154 -> 0.145 (see docs/learning-log.md). Each choice costs `ids_samples` draws of
    /// every arm, and the propensity repeats it `propensity_draws` times.
    pub ids_samples: usize,
    /// Share of the first-attempt choices made by Thompson sampling even though
    /// [`PolicyConfig::ids_samples`] is on (0.1, the default; 0 = information-directed sampling
    /// alone). Information-directed sampling leaves an arm alone once its posterior puts it far
    /// enough behind, and an arm unlucky in its first tries stays there when the leader almost
    /// never fails (no fallback ever tries it again): bank statements' pdfminer, written off on
    /// pdf files behind vision_llm for the rest of a run. Thompson sampling tries it as often as
    /// it might be the best, so a share of its draws takes a second look at such an arm. Tree,
    /// bank statements, 200 runs (seeds 1001-1200): 0 against 0.1, regret ratio 0.084 (6 runs
    /// above 0.2) -> 0.079 (1); see docs/learning-log.md.
    pub thompson_share: f64,
    /// Sharpening of the posteriors a fallback arm is drawn from, after a stage failed (1, the
    /// default: the plain posterior). A fallback's regret is not the first attempt's: the
    /// task's plan was chosen already, and the replacement only has to be likely to work, so
    /// it is drawn from what the evidence honestly says rather than from the sharpened
    /// posterior that keeps the first attempt's exploration low. An arm unlucky early in a
    /// niche gets its second look there.
    pub fallback_sharpen: f64,
    /// Sharpening of the levels' evidence when drawing a fallback arm (1, the default: Bayesian
    /// model averaging), for the same reason.
    pub fallback_evidence_sharpen: f64,
    /// A fallback arm's sampled success is the highest of its posterior draw and a draw from
    /// its own counts (`Beta(1 + successes, 1 + failures)`, unpooled) in each of the task's
    /// single-feature cells visited at least this often (50, the default; 0: off). A good arm
    /// unlucky in its first few tries in a busy cell (bank statements' pdfminer failing two of
    /// its first four pdf files, web research's scholar one of two science questions) is
    /// otherwise written off there for the rest of the run: the sharpened posterior never
    /// draws it for a first attempt, and the plain one, pooled with coarser levels, rarely for
    /// a fallback. Its own few counts are a wide posterior, so it gets its second look when a
    /// leader fails (an arm never tried in the cell draws from `Beta(1, 1)`, a first look); an
    /// arm many tries have shown poor in the cell is a narrow one and does not. The counts are
    /// read as stored, not aged by
    /// [`ArmStats::counts_at`](crate::learn::posterior::ArmStats::counts_at) to the cell's
    /// latest visit as the
    /// posteriors are (measured so). Core loop, three fallbacks a stage, a feedback delay of
    /// three: bank statements and web research over 256 seeds each 0.127 (53 of 512 runs above
    /// 0.2) -> 0.123 (41), the shipped six (64 seeds) 0.126 -> 0.125, many-arm environments
    /// 0.181 -> 0.177 (12 fresh, 8 seeds) and 0.168 -> 0.165 (12, 12 seeds; 42 -> 35 of 144
    /// above), random ones 0.128 -> 0.127 (16 fresh) and 0.118 -> 0.119 (12), five to eight arms
    /// 0.157 either way; the success rate half a point lower (a second look fails more often
    /// than the runner-up).
    pub fallback_local_visits: f64,
    /// How a fallback ranks the stage's arms not tried yet: by an upper bound of success, the
    /// posterior mean plus this many standard deviations (2, the default), instead of by a
    /// posterior draw (0). A fallback's regret is not the first attempt's, so the arm it tries
    /// may as well be the one whose outcome could tell most: an arm little known where the
    /// task's features put it, before one known to be middling. A draw picks such an arm only
    /// by chance, and a good arm written off early in a niche stays written off.
    /// Core loop, three fallbacks a stage, a feedback delay of three, seeds 1-16 (2026-11-29),
    /// a draw against 2: the sixteen independent environments (`scripts/grader_envs.py 1 16`)
    /// 0.183 (80 of 256 runs above 0.2) -> 0.177 (72), twelve many-arm ones (`random_env --
    /// DIR 1 12 --wide`) 0.156 (48 of 192) -> 0.153 (39), twelve random ones 0.116 (10) -> 0.114
    /// (4), the shipped six 0.124 (7 of 96) -> 0.114 (4); drifted tasks after recovery about
    /// the same (0.131, 0.084, 0.079, 0.078 -> 0.128, 0.086, 0.070, 0.078).
    pub fallback_upper_sd: f64,
    /// Sharpening of a cell's prior by its rarity when sampling (4, the default; 0: none): the
    /// pseudo-counts a cell inherits from its parents count `(visits of its busiest parent /
    /// its own visits)^rarity_sharpen` times, so that a cell much rarer than its parent explores
    /// around the parent's estimate instead of trying each arm afresh. What a rare cell would
    /// learn by exploring is used only on its own rare tasks, while the exploration's regret is
    /// paid in full; with many arms and many clusters, trying every arm in every new cell was
    /// most of the regret. The cell's own data and the posterior means (the greedy plan) are
    /// unchanged, and a fallback after a failure is drawn without it, so a niche's specialist
    /// is still found where the others fail. See also [`PolicyConfig::rarity_min_parent`].
    pub rarity_sharpen: f64,
    /// Visits a cell's busiest parent must have had before the cell's prior is sharpened by
    /// its rarity (200, the default). Below, the parents' estimates rest on too little to hold
    /// a rarer cell back: early on, sharpening a rare cell around a parent that has seen a few
    /// dozen tasks wrote off arms that a few unlucky first tries had made look poor (bank
    /// statements' tree runs above 0.2: 7 of 160 at 100, 1 of 160 at 200 as without rarity;
    /// twelve many-arm environments: 0.228 at 100, 0.249 at 200, 0.299 without).
    pub rarity_min_parent: f64,
    /// [`PolicyConfig::rarity_min_parent`] for the cells that fix two features or more (200,
    /// the default, the same). Candidate: 20. A single feature's cell is where a specialist's
    /// niche shows first, and it keeps the floor; the finer cells below it then explore around
    /// their parents' estimates from early on instead of trying each arm afresh. Core loop,
    /// three fallbacks a stage, 200 against 20: twelve many-arm environments 0.187 -> 0.164
    /// (runs above 0.2: 17 -> 12 of 48), sixteen fresh ones 0.186 -> 0.174, 24 random ones
    /// 0.132 -> 0.130 and 24 fresh ones 0.132 -> 0.128, the six shipped ones 0.131 -> 0.126,
    /// web research and bank statements (seeds 49-112) 0.162 -> 0.161 and 0.091 -> 0.092.
    /// Measured again on the policy with `stage_evidence_share` and `fallback_local_visits`
    /// (2026-11-27), the gain was gone: the shipped six 0.125 -> 0.123, twelve fresh many-arm
    /// environments 0.177 -> 0.181, twelve many-arm ones 0.165 -> 0.167, five to eight arms
    /// 0.157 -> 0.154. Not the default.
    pub rarity_min_parent_fine: f64,
    /// Tries of an arm in a cell at which the data's [`PolicyConfig::sharpen`] reaches its full
    /// weight (0, the default: at once; opt-in): below, each try counts
    /// `1 + (sharpen - 1) * tries / sharpen_ramp` times, so that two failures in five tries do
    /// not weigh like eight in twenty and write off an arm that was only unlucky early. At 25
    /// (with the floor at 100) it took the tree's bank statements runs above 0.2 from about 4
    /// in 100 to about 1, but
    /// cost the many-arm environments (see docs/learning-log.md), and with it the serve
    /// test's 200 runs
    /// of one cluster promoted no SOP (without it they do).
    pub sharpen_ramp: f64,
    /// Structure prior of the hierarchy's levels, in nats of predictive log evidence (0, the
    /// default; opt-in): a level fixing one feature starts this far behind the global level,
    /// and each further feature it fixes adds [`PolicyConfig::level_penalty_more`]. Without
    /// it every level starts level with the global one, and since the levels fixing two or
    /// more features far outnumber the others (eleven of sixteen with four features), most of
    /// the early weight sits on cells with a handful of tries each: an arm that is the same
    /// everywhere is estimated and explored cell by cell. On environments whose arms ignore
    /// the features (core loop, four many-arm environments with their `when` overrides
    /// removed, 8 seeds) the regret ratio is 0.205 without it, 0.123 with the features removed,
    /// and 0.154 with 0.5 and 1. The price is a niche found later (a specialist's level has to
    /// earn its weight first): on the many-arm environments the pair gains (tree, 16 fresh
    /// ones: 0.164 -> 0.145), on web research and bank statements it loses (core loop, 64
    /// seeds: 0.162 -> 0.178 and 0.091 -> 0.100). See docs/learning-log.md.
    pub level_penalty_first: f64,
    /// The structure prior's handicap of each feature a level fixes beyond the first (0, the
    /// default); see [`PolicyConfig::level_penalty_first`].
    pub level_penalty_more: f64,
    /// Whether a fallback arm (after a stage failed) is drawn with the structure prior too
    /// (false, the default: from the levels' evidence alone, as if both penalties were 0). The
    /// prior's price is the niches it finds later; most niches are found by fallbacks (the
    /// generalist fails in the niche, the specialist is tried instead), and a fallback's choice
    /// costs no regret of its own (the task's plan was chosen already). Core loop, three
    /// fallbacks a stage, the prior (0.5, 1) in the fallbacks too against not: web research
    /// (seeds 49-112) 0.178 -> 0.165 (0.162 without the prior), bank statements 0.100 -> 0.098
    /// (0.091), twelve many-arm environments 0.158 -> 0.165 (0.187).
    pub level_penalty_in_fallback: bool,
    /// Weight of what a stage's other arms say about which features matter (0.3, the default;
    /// 0 = none): each level's evidence for an arm gains this share of the mean, over the
    /// stage's other arms, of that level's evidence over the global level's. Arms of a stage
    /// tend to depend on the same features (the topic decides between the search engines),
    /// and an arm seen little, or written off early, otherwise learns that its niche matters
    /// only from its own tries there, which it rarely gets. Only in stages of at least
    /// [`PolicyConfig::stage_evidence_min_arms`] arms. Core loop, three fallbacks a stage,
    /// 0 against 0.3: twelve many-arm environments 0.182 -> 0.168 (runs above 0.2: 69 -> 50 of
    /// 192), twelve fresh ones 0.168 -> 0.160 (45 -> 36 of 144), 24 random ones 0.138 ->
    /// 0.133, web research 0.163 -> 0.151 and support triage 0.161 -> 0.153 (64 seeds); the
    /// shipped environments whose stages have four arms or fewer are unchanged.
    pub stage_evidence_share: f64,
    /// Arms a stage must have before its arms share their evidence (5, the default; see
    /// [`PolicyConfig::stage_evidence_share`]). With fewer, one or two other arms' evidence
    /// says little about an arm's features and sharing it cost more than it taught (all
    /// stages: bank statements, whose stages have four arms and two, 0.093 -> 0.101, runs
    /// above 0.2: 4 -> 8 of 192).
    pub stage_evidence_min_arms: usize,
}

impl PolicyConfig {
    /// Pseudo-observations an arm keeps after a detected change: [`PolicyConfig::change_keep_up`]
    /// after a rise, [`PolicyConfig::change_keep`] after a fall.
    pub(super) fn change_keep_for(&self, before: f64, after: f64) -> f64 {
        if after > before {
            self.change_keep_up
        } else {
            self.change_keep
        }
    }

    /// The structure prior's handicap of a level fixing `fixed` features (see
    /// [`PolicyConfig::level_penalty_first`]).
    pub(super) fn level_penalty(&self, fixed: u32) -> f64 {
        self.level_penalty_first * f64::from(fixed.min(1))
            + self.level_penalty_more * f64::from(fixed.saturating_sub(1))
    }
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            reward: RewardParams::default(),
            prior_alpha: 1.0,
            prior_beta: 1.0,
            pool_strength: 2.0,
            pool_latency_strength: 2.0,
            discount: 0.999,
            sharpen: 4.0,
            evidence_sharpen: 4.0,
            model_discount: 0.995,
            latency_discount: 0.95,
            change_threshold: 10.0,
            change_threshold_up: 7.0,
            change_min_obs: 8,
            change_min_before: 4,
            change_levels: 3,
            change_keep: 2.0,
            change_keep_up: 6.0,
            recent_rate: 0.3,
            unknown_weight: 0.5,
            propensity_draws: 32,
            max_enumerate: 4096,
            full_lattice_max_features: 3,
            pool_from_global: false,
            pool_by_evidence: true,
            optimistic: true,
            one_stage_exploration_from: 3,
            ids_samples: 32,
            thompson_share: 0.1,
            fallback_sharpen: 1.0,
            fallback_evidence_sharpen: 1.0,
            fallback_local_visits: 50.0,
            fallback_upper_sd: 2.0,
            rarity_sharpen: 4.0,
            rarity_min_parent: 200.0,
            rarity_min_parent_fine: 200.0,
            sharpen_ramp: 0.0,
            level_penalty_first: 0.0,
            level_penalty_more: 0.0,
            level_penalty_in_fallback: false,
            stage_evidence_share: 0.3,
            stage_evidence_min_arms: 5,
        }
    }
}

/// The most posterior samples an information-directed choice may take
/// ([`PolicyConfig::ids_samples`]).
pub const MAX_IDS_SAMPLES: usize = 4096;

pub(super) fn check_config(c: &PolicyConfig) -> Result<(), PolicyError> {
    let bad = |field: &'static str, reason: &str| {
        Err(PolicyError::BadConfig {
            field,
            reason: reason.to_string(),
        })
    };
    if !(c.prior_alpha > 0.0 && c.prior_beta > 0.0) {
        return bad("prior_alpha/prior_beta", "must be > 0");
    }
    if !(c.discount > 0.0 && c.discount <= 1.0) {
        return bad("discount", "must be in (0, 1]");
    }
    if !(c.sharpen > 0.0 && c.sharpen.is_finite()) {
        return bad("sharpen", "must be > 0");
    }
    if !(c.evidence_sharpen > 0.0 && c.evidence_sharpen.is_finite()) {
        return bad("evidence_sharpen", "must be > 0");
    }
    if !(c.fallback_sharpen > 0.0 && c.fallback_sharpen.is_finite()) {
        return bad("fallback_sharpen", "must be > 0");
    }
    if !(c.level_penalty_first >= 0.0 && c.level_penalty_first.is_finite()) {
        return bad("level_penalty_first", "must be >= 0");
    }
    if !(c.level_penalty_more >= 0.0 && c.level_penalty_more.is_finite()) {
        return bad("level_penalty_more", "must be >= 0");
    }
    if !(c.stage_evidence_share >= 0.0 && c.stage_evidence_share.is_finite()) {
        return bad("stage_evidence_share", "must be >= 0");
    }
    if !(c.rarity_sharpen >= 0.0 && c.rarity_sharpen.is_finite()) {
        return bad("rarity_sharpen", "must be >= 0");
    }
    if !(c.rarity_min_parent >= 0.0 && c.rarity_min_parent.is_finite()) {
        return bad("rarity_min_parent", "must be >= 0");
    }
    if !(c.rarity_min_parent_fine >= 0.0 && c.rarity_min_parent_fine.is_finite()) {
        return bad("rarity_min_parent_fine", "must be >= 0");
    }
    if !(c.sharpen_ramp >= 0.0 && c.sharpen_ramp.is_finite()) {
        return bad("sharpen_ramp", "must be >= 0");
    }
    if !(c.fallback_evidence_sharpen > 0.0 && c.fallback_evidence_sharpen.is_finite()) {
        return bad("fallback_evidence_sharpen", "must be > 0");
    }
    if !(c.fallback_local_visits >= 0.0 && c.fallback_local_visits.is_finite()) {
        return bad("fallback_local_visits", "must be >= 0");
    }
    if !(c.fallback_upper_sd >= 0.0 && c.fallback_upper_sd.is_finite()) {
        return bad("fallback_upper_sd", "must be >= 0");
    }
    if !(c.model_discount > 0.0 && c.model_discount <= 1.0) {
        return bad("model_discount", "must be in (0, 1]");
    }
    if !(c.latency_discount > 0.0 && c.latency_discount <= 1.0) {
        return bad("latency_discount", "must be in (0, 1]");
    }
    if !(c.pool_strength >= 0.0 && c.pool_latency_strength >= 0.0) {
        return bad("pool_strength", "must be >= 0");
    }
    if !(c.unknown_weight >= 0.0 && c.unknown_weight <= 1.0) {
        return bad("unknown_weight", "must be in [0, 1]");
    }
    if !(c.change_keep >= 0.0 && c.recent_rate > 0.0 && c.recent_rate <= 1.0) {
        return bad("change_keep/recent_rate", "must be >= 0 and in (0, 1]");
    }
    if !(c.change_threshold > 0.0 && c.change_threshold.is_finite()) {
        return bad("change_threshold", "must be a finite number > 0");
    }
    if !(c.change_threshold_up > 0.0 && c.change_threshold_up.is_finite()) {
        return bad("change_threshold_up", "must be a finite number > 0");
    }
    if c.propensity_draws == 0 {
        return bad("propensity_draws", "must be >= 1");
    }
    if c.ids_samples > MAX_IDS_SAMPLES {
        return bad("ids_samples", &format!("must be at most {MAX_IDS_SAMPLES}"));
    }
    if !(0.0..=1.0).contains(&c.thompson_share) {
        return bad("thompson_share", "must be in [0, 1]");
    }
    if c.full_lattice_max_features > 8 {
        return bad(
            "full_lattice_max_features",
            "must be at most 8 (the full hierarchy has 2^n levels)",
        );
    }
    if c.max_enumerate == 0 {
        return bad("max_enumerate", "must be >= 1");
    }
    if !(c.reward.sla_ms > 0.0 && c.reward.max_cost > 0.0) {
        return bad("reward.sla_ms/reward.max_cost", "must be > 0");
    }
    Ok(())
}
