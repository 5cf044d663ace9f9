//! sop: standard operating procedures: candidates from repeated successful plans in a cluster,
//! promotion on statistical evidence (minimum sample, one-sided uplift test over the cluster's
//! baseline, no critical incident in the window), versioning, matching for the planner, and an
//! A/B router that keeps a share of traffic on the baseline and rolls an SOP back when its live
//! success falls significantly below its evidence. For agent stages, the calls a model keeps
//! making when it passes are proposed as a procedure (a candidate SOP), trialled on a share of
//! the cluster's tasks, and promoted on the same test over its trials.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::learn::cluster::{cluster_key, key_hash};
use crate::learn::procedure::Procedure;
use crate::learn::sop_index::SopIndex;
use crate::learn::stats::{fisher_exact_greater, mann_whitney_greater, two_proportion_z};
use crate::record::{ArmChoice, Sop, SopStatus};

/// Configuration of SOP promotion and routing (serde, with defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SopConfig {
    /// Runs of the plan in the cluster before it can be promoted.
    pub min_trials: u64,
    /// Baseline runs in the cluster before a comparison is made. Fisher's exact test is valid
    /// on small samples (a small baseline needs a large uplift to pass), and a policy that
    /// learns fast explores a cluster only a handful of times, so this is low.
    pub min_baseline_trials: u64,
    /// Significance level of the one-sided uplift test.
    pub alpha: f64,
    /// Share of the matching traffic's exploit draws the router keeps on the baseline (the
    /// policy's greedy plan): the A/B holdout.
    pub baseline_share: f64,
    /// Live runs of a stable SOP before a rollback test is made.
    pub rollback_min_trials: u64,
    /// Significance level of the rollback test (Fisher's exact test: the evidence's success
    /// rate above the live one).
    pub rollback_alpha: f64,
    /// A critical incident on the plan within this window (ms) blocks promotion.
    pub incident_window_ms: u64,
    /// Evidence run ids kept per SOP.
    pub max_evidence: usize,
    /// The router leaves a task to the policy, though a stable SOP matches, when the policy
    /// expects this much more reward from its own greedy plan than from the SOP's (what it has
    /// learned since the promotion, a drift for one, outweighs the SOP's evidence).
    pub defer_margin: f64,
    /// Passed first attempts of a cluster that made the same calls (the same procedure) before
    /// the procedure is proposed as a candidate. Lower proposes sooner, from less agreement.
    pub propose_after: u64,
    /// Share of the matching traffic's exploit draws a candidate procedure is trialled on (its
    /// trials are the evidence it is promoted on). Higher gathers evidence sooner, at the risk
    /// of more runs through a procedure not yet proven.
    pub trial_share: f64,
}

impl Default for SopConfig {
    fn default() -> Self {
        SopConfig {
            min_trials: 20,
            min_baseline_trials: 5,
            alpha: 0.05,
            baseline_share: 0.1,
            rollback_min_trials: 10,
            rollback_alpha: 0.01,
            incident_window_ms: 24 * 3600 * 1000,
            max_evidence: 50,
            defer_margin: 0.05,
            propose_after: 5,
            trial_share: 0.25,
        }
    }
}

/// Outcome tallies of one plan (or of a cluster's baseline).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Tally {
    /// Runs that passed.
    pub successes: u64,
    /// Runs.
    pub trials: u64,
    /// Latest passing run ids (evidence), newest last.
    pub evidence: Vec<String>,
    /// Time of the latest critical incident (ms), if any.
    pub last_incident_ms: Option<u64>,
}

/// What consolidation changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SopEvent {
    /// A plan was promoted to a stable SOP (a new version when the SOP id existed).
    Promoted(Sop),
    /// A stable SOP (or a candidate whose trials fell short) was rolled back.
    RolledBack(Sop),
    /// A procedure was proposed: a candidate, trialled before it can be promoted.
    Proposed(Sop),
}

/// Live results of a stable SOP since its promotion.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveTally {
    /// Runs through the SOP that passed.
    pub successes: u64,
    /// Runs through the SOP.
    pub trials: u64,
}

/// The SOP book: tallies per cluster and plan, every SOP version, and their live results.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SopBook {
    /// The configuration (JSON text when stored, so that a setting added in a later build does
    /// not make the book unreadable).
    #[serde(with = "crate::store::envelope::as_json")]
    pub config: SopConfig,
    /// Cluster key -> plan key -> tally.
    pub plans: BTreeMap<String, BTreeMap<String, (Vec<ArmChoice>, Tally)>>,
    /// Cluster key -> every run of the cluster not through a stable SOP.
    pub clusters: BTreeMap<String, (BTreeMap<String, String>, Tally)>,
    /// Every SOP version ever made, oldest first.
    pub sops: Vec<Sop>,
    /// `sop_id@version` -> live results.
    pub live: BTreeMap<String, LiveTally>,
    /// Cluster key -> the procedures its passed first attempts made, by their calls.
    pub proposals: BTreeMap<String, BTreeMap<String, Proposal>>,
    /// Cluster key -> the rewards of its latest runs outside any SOP ([`REWARD_WINDOW`]).
    pub model_rewards: BTreeMap<String, Vec<f64>>,
    /// `sop_id@version` of a candidate -> the rewards of its latest trials.
    pub trial_rewards: BTreeMap<String, Vec<f64>>,
    /// The SOPs by the preconditions a task's features must have to match them (not stored:
    /// made again from `sops`).
    #[serde(skip)]
    pub(crate) index: SopIndex,
}

/// Rewards kept per cluster (and per candidate) for the test of a procedure's uplift: the
/// latest runs, so that a cluster's early learning does not stand for the model of today.
pub const REWARD_WINDOW: usize = 100;

/// Adds `reward` to a window of the latest [`REWARD_WINDOW`].
fn window(rewards: &mut Vec<f64>, reward: f64) {
    rewards.push(reward);
    let excess = rewards.len().saturating_sub(REWARD_WINDOW);
    rewards.drain(..excess);
}

/// A finished run as the SOP book records it.
#[derive(Debug, Clone, Copy)]
pub struct SopRun<'a> {
    /// The task's features.
    pub features: &'a BTreeMap<String, String>,
    /// The first attempt's plan.
    pub plan: &'a [ArmChoice],
    /// Whether it passed on its first attempt.
    pub passed: bool,
    /// Its reward.
    pub reward: f64,
    /// The run.
    pub run_id: &'a str,
    /// The SOP it ran through (id, version), if any.
    pub via_sop: Option<(&'a str, u32)>,
    /// The procedure its agent stages made, when it ran through none (empty otherwise).
    pub procedure: &'a [Procedure],
}

/// The passed first attempts of a cluster that made one procedure's calls.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// The procedure of each agent stage, as the latest run made it.
    pub procedure: Vec<Procedure>,
    /// The plan of the latest run that made it (the model and variant that answer after it).
    pub plan: Vec<ArmChoice>,
    /// Runs that made it.
    pub runs: u64,
    /// Of those, the latest in a row whose answers had the same template.
    pub answers_agree: u64,
}

/// The key of a run's procedures: their calls' keys, joined.
fn procedure_key(procedure: &[Procedure]) -> String {
    procedure
        .iter()
        .map(Procedure::calls_key)
        .collect::<Vec<_>>()
        .join("|")
}

/// The key of a plan: `stage:tool/strategy` joined by `,`.
pub fn plan_key(plan: &[ArmChoice]) -> String {
    plan.iter()
        .map(|a| format!("{}:{}/{}", a.stage, a.tool, a.strategy))
        .collect::<Vec<_>>()
        .join(",")
}

fn live_key(sop_id: &str, version: u32) -> String {
    format!("{sop_id}@{version}")
}

/// The live tally of an SOP version in `live` (keyed by [`live_key`]), found without making its
/// key: a consolidation looks up every stable SOP's.
fn live_of<'a>(
    live: &'a BTreeMap<String, LiveTally>,
    sop_id: &str,
    version: u32,
) -> Option<&'a LiveTally> {
    use std::ops::Bound;
    live.range::<str, _>((Bound::Included(sop_id), Bound::Unbounded))
        .take_while(|(k, _)| k.starts_with(sop_id))
        .find(|(k, _)| {
            k[sop_id.len()..]
                .strip_prefix('@')
                .and_then(|v| v.parse::<u32>().ok())
                == Some(version)
        })
        .map(|(_, t)| t)
}

/// Whether every precondition in `pre` holds in `features`.
pub(crate) fn matches(pre: &BTreeMap<String, String>, features: &BTreeMap<String, String>) -> bool {
    pre.iter().all(|(k, v)| features.get(k) == Some(v))
}

impl SopBook {
    /// An empty book.
    pub fn new(config: SopConfig) -> SopBook {
        SopBook {
            config,
            ..SopBook::default()
        }
    }

    /// Records a finished run. Runs through a stable SOP count towards its live results, runs
    /// through a candidate towards its trials; the others towards the plan's tally and the
    /// cluster's baseline, and their procedure towards its proposal.
    pub fn record_run(&mut self, run: &SopRun<'_>) {
        let SopRun {
            features,
            plan,
            passed,
            reward,
            run_id,
            via_sop,
            procedure,
        } = *run;
        let max_ev = self.config.max_evidence;
        if let Some((id, version)) = via_sop {
            if let Some(sop) = self.sops.iter_mut().find(|s| {
                s.sop_id == id && s.version == version && s.status == SopStatus::Candidate
            }) {
                sop.trials += 1;
                if passed {
                    sop.successes += 1;
                    sop.evidence.push(run_id.to_string());
                    let excess = sop.evidence.len().saturating_sub(max_ev);
                    sop.evidence.drain(..excess);
                }
                window(
                    self.trial_rewards.entry(live_key(id, version)).or_default(),
                    reward,
                );
                return;
            }
            let live = self.live.entry(live_key(id, version)).or_default();
            live.trials += 1;
            live.successes += u64::from(passed);
            if passed
                && let Some(sop) = self
                    .sops
                    .iter_mut()
                    .find(|s| s.sop_id == id && s.version == version)
            {
                sop.evidence.push(run_id.to_string());
                let excess = sop.evidence.len().saturating_sub(self.config.max_evidence);
                sop.evidence.drain(..excess);
            }
            return;
        }
        let cluster = cluster_key(features);
        window(
            self.model_rewards.entry(cluster.clone()).or_default(),
            reward,
        );
        if passed && !procedure.is_empty() {
            let proposal = self
                .proposals
                .entry(cluster.clone())
                .or_default()
                .entry(procedure_key(procedure))
                .or_default();
            let answers = |p: &[Procedure]| p.iter().map(|p| p.answer.clone()).collect::<Vec<_>>();
            proposal.answers_agree = if answers(&proposal.procedure) == answers(procedure) {
                proposal.answers_agree + 1
            } else {
                1
            };
            proposal.runs += 1;
            proposal.procedure = procedure.to_vec();
            proposal.plan = plan
                .iter()
                .map(|a| ArmChoice {
                    propensity: 1.0,
                    ..a.clone()
                })
                .collect();
        }
        let add = |t: &mut Tally| {
            t.trials += 1;
            if passed {
                t.successes += 1;
                t.evidence.push(run_id.to_string());
                let excess = t.evidence.len().saturating_sub(max_ev);
                t.evidence.drain(..excess);
            }
        };
        let c = self
            .clusters
            .entry(cluster.clone())
            .or_insert_with(|| (features.clone(), Tally::default()));
        add(&mut c.1);
        let bare: Vec<ArmChoice> = plan
            .iter()
            .map(|a| ArmChoice {
                propensity: 1.0,
                ..a.clone()
            })
            .collect();
        let p = self
            .plans
            .entry(cluster)
            .or_default()
            .entry(plan_key(plan))
            .or_insert_with(|| (bare, Tally::default()));
        add(&mut p.1);
    }

    /// Records a critical incident (data loss, a guard violation, an escalation) on a plan in
    /// the cluster of `features`: it blocks promotion for the incident window.
    pub fn record_incident(
        &mut self,
        features: &BTreeMap<String, String>,
        plan: &[ArmChoice],
        now_ms: u64,
    ) {
        let cluster = cluster_key(features);
        let key = plan_key(plan);
        let bare: Vec<ArmChoice> = plan.to_vec();
        let entry = self
            .plans
            .entry(cluster)
            .or_default()
            .entry(key)
            .or_insert_with(|| (bare, Tally::default()));
        entry.1.last_incident_ms = Some(now_ms);
    }

    /// The one-sided p-value of a plan's uplift over the rest of its cluster (Fisher's exact
    /// test; the z-test when every expected cell count is at least 10).
    pub fn uplift_p_value(plan: &Tally, cluster: &Tally) -> (f64, u64, u64) {
        let bs = cluster.successes.saturating_sub(plan.successes);
        let bn = cluster.trials.saturating_sub(plan.trials);
        let n = plan.trials + bn;
        let k = plan.successes + bs;
        let big = n > 0 && {
            let p = k as f64 / n as f64;
            let m = (plan.trials.min(bn)) as f64;
            m * p >= 10.0 && m * (1.0 - p) >= 10.0
        };
        let t = if big {
            two_proportion_z(plan.successes, plan.trials, bs, bn)
        } else {
            fisher_exact_greater(plan.successes, plan.trials, bs, bn)
        };
        (t.p_value, bs, bn)
    }

    /// Promotes the plans that earned it and rolls back the SOPs whose live success fell
    /// significantly below their evidence.
    pub fn consolidate(&mut self, now_ms: u64) -> Vec<SopEvent> {
        let mut events = Vec::new();
        // Rollbacks first.
        for sop in self.sops.iter_mut() {
            if sop.status != SopStatus::Stable {
                continue;
            }
            let Some(live) = live_of(&self.live, &sop.sop_id, sop.version) else {
                continue;
            };
            if live.trials < self.config.rollback_min_trials || sop.trials == 0 {
                continue;
            }
            // One-sided exact test: the evidence's success rate above the live one.
            let p = fisher_exact_greater(sop.successes, sop.trials, live.successes, live.trials)
                .p_value;
            if p < self.config.rollback_alpha {
                sop.status = SopStatus::RolledBack;
                sop.updated_ms = now_ms;
                events.push(SopEvent::RolledBack(sop.clone()));
                // Its plan (its procedure) must earn promotion again from fresh evidence.
                let cluster = cluster_key(&sop.preconditions);
                if let Some(proposals) = self.proposals.get_mut(&cluster) {
                    proposals.remove(&procedure_key(&sop.procedure));
                }
                if let Some(plans) = self.plans.get_mut(&cluster)
                    && let Some(t) = plans.get_mut(&plan_key(&sop.plan))
                {
                    t.1 = Tally {
                        last_incident_ms: t.1.last_incident_ms,
                        ..Tally::default()
                    };
                }
            }
        }
        // Promotions: per cluster, the best plan by p-value among those that qualify.
        let cfg = self.config.clone();
        let mut promote: Vec<(String, Vec<ArmChoice>, Tally, Tally, f64)> = Vec::new();
        for (cluster, plans) in &self.plans {
            let Some((_, ctally)) = self.clusters.get(cluster) else {
                continue;
            };
            let mut best: Option<(f64, &Vec<ArmChoice>, &Tally)> = None;
            for (plan, tally) in plans.values() {
                if tally.trials < cfg.min_trials {
                    continue;
                }
                if tally
                    .last_incident_ms
                    .is_some_and(|t| now_ms.saturating_sub(t) < cfg.incident_window_ms)
                {
                    continue;
                }
                let (p, _, bn) = SopBook::uplift_p_value(tally, ctally);
                if bn < cfg.min_baseline_trials || p >= cfg.alpha {
                    continue;
                }
                if best.is_none_or(|(bp, _, _)| p < bp) {
                    best = Some((p, plan, tally));
                }
            }
            if let Some((p, plan, tally)) = best {
                let already = self
                    .sops_of_cluster(cluster)
                    .any(|s| s.status == SopStatus::Stable && plan_key(&s.plan) == plan_key(plan));
                if !already {
                    promote.push((
                        cluster.clone(),
                        plan.clone(),
                        tally.clone(),
                        ctally.clone(),
                        p,
                    ));
                }
            }
        }
        for (cluster, plan, tally, ctally, p) in promote {
            let Some((features, _)) = self.clusters.get(&cluster) else {
                continue;
            };
            let features = features.clone();
            let sop_id = format!("sop-{:016x}", key_hash(&cluster));
            let mut version = 1;
            for s in self.sops.iter_mut().filter(|s| s.sop_id == sop_id) {
                version = version.max(s.version + 1);
                if s.status == SopStatus::Stable {
                    s.status = SopStatus::Retired;
                    s.updated_ms = now_ms;
                }
            }
            let sop = Sop {
                sop_id,
                version,
                preconditions: features,
                plan,
                status: SopStatus::Stable,
                successes: tally.successes,
                trials: tally.trials,
                baseline_successes: ctally.successes.saturating_sub(tally.successes),
                baseline_trials: ctally.trials.saturating_sub(tally.trials),
                p_value: Some(p),
                evidence: tally.evidence.clone(),
                created_ms: now_ms,
                updated_ms: now_ms,
                procedure: Vec::new(),
            };
            self.sops.push(sop.clone());
            self.index.extend(&self.sops);
            events.push(SopEvent::Promoted(sop));
        }
        self.consolidate_procedures(now_ms, &mut events);
        events
    }

    /// Candidates whose trials earned it are promoted (as a plan is: enough trials and baseline
    /// runs, a significant one-sided uplift over the cluster's baseline, no critical incident;
    /// the uplift is the reward's, by the Mann-Whitney test of the trials' rewards against the
    /// model's latest in the cluster), those whose trials passed or earned significantly less
    /// than the model are rolled back, and the procedure
    /// most made by a cluster's passed first attempts is proposed where no candidate or stable
    /// procedure is.
    fn consolidate_procedures(&mut self, now_ms: u64, events: &mut Vec<SopEvent>) {
        let cfg = self.config.clone();
        let mut promoted = Vec::new();
        for i in 0..self.sops.len() {
            let sop = &self.sops[i];
            if sop.status != SopStatus::Candidate || sop.trials < cfg.min_trials {
                continue;
            }
            let cluster = cluster_key(&sop.preconditions);
            let Some((_, baseline)) = self.clusters.get(&cluster) else {
                continue;
            };
            if baseline.trials < cfg.min_baseline_trials {
                continue;
            }
            let key = live_key(&sop.sop_id, sop.version);
            let none = Vec::new();
            let trial_rewards = self.trial_rewards.get(&key).unwrap_or(&none);
            let model_rewards = self.model_rewards.get(&cluster).unwrap_or(&none);
            // The uplift: its trials' rewards above the model's latest in the cluster (a
            // procedure saves the model's turns and failed calls: the reward says what that
            // is worth).
            let p = mann_whitney_greater(trial_rewards, model_rewards).p_value;
            let incident = self
                .plans
                .get(&cluster)
                .and_then(|plans| plans.get(&plan_key(&sop.plan)))
                .and_then(|(_, t)| t.last_incident_ms)
                .is_some_and(|t| now_ms.saturating_sub(t) < cfg.incident_window_ms);
            // Worse: it passes significantly less often than the model, or earns significantly
            // less.
            let worse = fisher_exact_greater(
                baseline.successes,
                baseline.trials,
                sop.successes,
                sop.trials,
            )
            .p_value
                < cfg.rollback_alpha
                || mann_whitney_greater(model_rewards, trial_rewards).p_value < cfg.rollback_alpha;
            let (baseline_successes, baseline_trials) = (baseline.successes, baseline.trials);
            let sop = &mut self.sops[i];
            if worse {
                sop.status = SopStatus::RolledBack;
                sop.updated_ms = now_ms;
                events.push(SopEvent::RolledBack(sop.clone()));
                if let Some(proposals) = self.proposals.get_mut(&cluster) {
                    proposals.remove(&procedure_key(&sop.procedure));
                }
                self.trial_rewards.remove(&key);
            } else if p < cfg.alpha && !incident {
                sop.status = SopStatus::Stable;
                sop.p_value = Some(p);
                sop.baseline_successes = baseline_successes;
                sop.baseline_trials = baseline_trials;
                sop.updated_ms = now_ms;
                promoted.push(i);
                // Stable, it is judged by its live tally: its trials' rewards are done with.
                self.trial_rewards.remove(&key);
            }
        }
        for i in promoted {
            let (id, version) = (self.sops[i].sop_id.clone(), self.sops[i].version);
            for s in self
                .sops
                .iter_mut()
                .filter(|s| s.sop_id == id && s.version != version && s.status == SopStatus::Stable)
            {
                s.status = SopStatus::Retired;
                s.updated_ms = now_ms;
            }
            events.push(SopEvent::Promoted(self.sops[i].clone()));
        }
        // Proposals, where no procedure is on trial or in force.
        let mut proposed = Vec::new();
        for (cluster, proposals) in &self.proposals {
            let taken = self.sops_of_cluster(cluster).any(|s| {
                !s.procedure.is_empty()
                    && matches!(s.status, SopStatus::Candidate | SopStatus::Stable)
            });
            if taken {
                continue;
            }
            let best = proposals
                .values()
                .filter(|p| p.runs >= cfg.propose_after)
                .max_by_key(|p| p.runs);
            let (Some(best), Some((features, _))) = (best, self.clusters.get(cluster)) else {
                continue;
            };
            let plan = best.plan.clone();
            let mut procedure = best.procedure.clone();
            if best.answers_agree < cfg.propose_after {
                // The model's answers did not agree on one template: it still writes them.
                for p in &mut procedure {
                    p.answer = None;
                }
            }
            proposed.push((cluster.clone(), features.clone(), plan, procedure));
        }
        for (cluster, features, plan, procedure) in proposed {
            let sop_id = format!("sop-{:016x}", key_hash(&cluster));
            let version = self
                .sops
                .iter()
                .filter(|s| s.sop_id == sop_id)
                .map(|s| s.version + 1)
                .max()
                .unwrap_or(1);
            let sop = Sop {
                sop_id,
                version,
                preconditions: features,
                plan,
                status: SopStatus::Candidate,
                successes: 0,
                trials: 0,
                baseline_successes: 0,
                baseline_trials: 0,
                p_value: None,
                evidence: Vec::new(),
                created_ms: now_ms,
                updated_ms: now_ms,
                procedure,
            };
            self.sops.push(sop.clone());
            self.index.extend(&self.sops);
            events.push(SopEvent::Proposed(sop));
        }
    }

    /// Every version of the SOPs of `cluster` (whose preconditions' cluster key it is), in
    /// book order: the consolidation asks for each cluster every tenth experience, and the book
    /// may hold thousands of SOPs.
    fn sops_of_cluster<'a>(&'a self, cluster: &str) -> impl Iterator<Item = &'a Sop> + 'a {
        self.index
            .of_cluster(&self.sops, cluster)
            .into_iter()
            .filter_map(|i| self.sops.get(i))
    }

    /// The stable SOP whose preconditions match `features` (the most specific, then the
    /// newest version).
    pub fn matching_stable_sop(&self, features: &BTreeMap<String, String>) -> Option<&Sop> {
        self.matching(features).0
    }

    /// [`SopBook::matching_stable_sop`] and [`SopBook::matching_candidate`] in one pass over
    /// the book.
    pub fn matching(&self, features: &BTreeMap<String, String>) -> (Option<&Sop>, Option<&Sop>) {
        let rank = |s: &Sop| (s.preconditions.len(), s.version);
        let (mut stable, mut candidate): (Option<&Sop>, Option<&Sop>) = (None, None);
        for i in self.index.candidates(&self.sops, features) {
            let Some(s) = self.sops.get(i) else { continue };
            let slot = match s.status {
                SopStatus::Stable => &mut stable,
                SopStatus::Candidate if !s.procedure.is_empty() => &mut candidate,
                _ => continue,
            };
            // The last of equal rank, as `max_by_key` keeps.
            if slot.is_none_or(|b| rank(s) >= rank(b)) && matches(&s.preconditions, features) {
                *slot = Some(s);
            }
        }
        (stable, candidate)
    }

    /// The share of the matching traffic's exploit draws a stable SOP gets from the router (the
    /// rest is the baseline holdout; explorations stay the policy's, see
    /// [`crate::learn::bandit::Routing`]).
    pub fn sop_share(&self) -> f64 {
        1.0 - self.config.baseline_share.clamp(0.0, 1.0)
    }

    /// The candidate procedure on trial whose preconditions match `features`, if any.
    pub fn matching_candidate(&self, features: &BTreeMap<String, String>) -> Option<&Sop> {
        self.matching(features).1
    }

    /// Stable SOPs.
    pub fn stable(&self) -> impl Iterator<Item = &Sop> {
        self.sops.iter().filter(|s| s.status == SopStatus::Stable)
    }

    /// Live results of an SOP version.
    pub fn live(&self, sop_id: &str, version: u32) -> LiveTally {
        live_of(&self.live, sop_id, version)
            .cloned()
            .unwrap_or_default()
    }

    /// The persistent state (serde).
    pub fn snapshot(&self) -> SopBook {
        self.clone()
    }

    /// The persistent state without its SOPs, for an owner that stores each SOP apart (and
    /// puts them back in book order before [`SopBook::restore`]).
    pub fn snapshot_without_sops(&self) -> SopBook {
        SopBook {
            config: self.config.clone(),
            plans: self.plans.clone(),
            clusters: self.clusters.clone(),
            sops: Vec::new(),
            live: self.live.clone(),
            proposals: self.proposals.clone(),
            model_rewards: self.model_rewards.clone(),
            trial_rewards: self.trial_rewards.clone(),
            index: SopIndex::default(),
        }
    }

    /// A book from a snapshot.
    pub fn restore(mut snapshot: SopBook) -> SopBook {
        snapshot.index.extend(&snapshot.sops);
        snapshot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feats(t: &str) -> BTreeMap<String, String> {
        [("filetype", "pdf"), ("tenant", t)]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn plan(tool: &str) -> Vec<ArmChoice> {
        vec![ArmChoice {
            stage: "extract".into(),
            tool: tool.into(),
            strategy: "s".into(),
            propensity: 0.5,
        }]
    }

    /// A run of a tool-stage plan (no procedure), rewarded 1 when it passed.
    fn run<'a>(
        features: &'a BTreeMap<String, String>,
        plan: &'a [ArmChoice],
        passed: bool,
        run_id: &'a str,
        via_sop: Option<(&'a str, u32)>,
    ) -> SopRun<'a> {
        SopRun {
            features,
            plan,
            passed,
            reward: f64::from(u8::from(passed)),
            run_id,
            via_sop,
            procedure: &[],
        }
    }

    fn feed(book: &mut SopBook, f: &BTreeMap<String, String>, tool: &str, ok: u64, n: u64) {
        for i in 0..n {
            book.record_run(&run(f, &plan(tool), i < ok, &format!("{tool}-{i}"), None));
        }
    }

    #[test]
    fn promotes_only_with_enough_samples_and_a_significant_uplift() {
        let mut book = SopBook::new(SopConfig::default());
        let f = feats("A");
        feed(&mut book, &f, "good", 15, 15);
        feed(&mut book, &f, "bad", 5, 12);
        assert!(book.consolidate(0).is_empty(), "15 < min_trials");
        feed(&mut book, &f, "good", 10, 10);
        let ev = book.consolidate(0);
        assert_eq!(ev.len(), 1);
        let SopEvent::Promoted(sop) = &ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!(sop.version, 1);
        assert_eq!(sop.trials, 25);
        assert_eq!(sop.baseline_trials, 12);
        assert!(sop.p_value.unwrap() < 0.05);
        assert!(!sop.evidence.is_empty());
        assert_eq!(book.matching_stable_sop(&f).unwrap().plan[0].tool, "good");
        assert!(book.matching_stable_sop(&feats("B")).is_none());
        // No second promotion of the same plan.
        assert!(book.consolidate(1).is_empty());
    }

    #[test]
    fn an_sop_version_s_live_tally_is_its_own() {
        let mut book = SopBook::new(SopConfig::default());
        let f = feats("A");
        let p = plan("good");
        for (id, version, n) in [("sop-a", 1, 1), ("sop-a", 12, 2), ("sop-ab", 1, 4)] {
            for i in 0..n {
                book.record_run(&run(&f, &p, true, &format!("r{i}"), Some((id, version))));
            }
        }
        assert_eq!(book.live("sop-a", 1).trials, 1);
        assert_eq!(book.live("sop-a", 12).trials, 2);
        assert_eq!(book.live("sop-ab", 1).trials, 4);
        assert_eq!(book.live("sop-a", 2).trials, 0);
        assert_eq!(book.live("sop", 1).trials, 0);
    }

    #[test]
    fn a_baseline_below_the_minimum_is_no_baseline() {
        let mut book = SopBook::new(SopConfig::default());
        let f = feats("A");
        feed(&mut book, &f, "good", 40, 40);
        feed(&mut book, &f, "bad", 0, 4);
        assert!(book.consolidate(0).is_empty(), "4 baseline runs < 5");
        feed(&mut book, &f, "bad", 1, 2);
        let ev = book.consolidate(0);
        assert_eq!(ev.len(), 1, "6 baseline runs, 1 passed: {ev:?}");
    }

    #[test]
    fn no_uplift_no_promotion() {
        let mut book = SopBook::new(SopConfig::default());
        let f = feats("A");
        feed(&mut book, &f, "x", 18, 20);
        feed(&mut book, &f, "y", 17, 20);
        assert!(book.consolidate(0).is_empty());
    }

    #[test]
    fn a_critical_incident_blocks_promotion_in_its_window() {
        let mut book = SopBook::new(SopConfig::default());
        let f = feats("A");
        feed(&mut book, &f, "good", 25, 25);
        feed(&mut book, &f, "bad", 3, 12);
        book.record_incident(&f, &plan("good"), 1_000);
        assert!(book.consolidate(2_000).is_empty());
        let later = 1_000 + book.config.incident_window_ms;
        assert_eq!(book.consolidate(later).len(), 1);
    }

    #[test]
    fn a_failing_sop_is_rolled_back_and_a_new_version_needs_fresh_evidence() {
        let mut book = SopBook::new(SopConfig::default());
        let f = feats("A");
        feed(&mut book, &f, "good", 30, 30);
        feed(&mut book, &f, "bad", 4, 15);
        assert_eq!(book.consolidate(0).len(), 1);
        let (sop_id, v) = {
            let s = book.matching_stable_sop(&f).unwrap();
            (s.sop_id.clone(), s.version)
        };
        // Live results as good as the evidence: no rollback.
        for i in 0..10 {
            let (p, id) = (plan("good"), format!("l{i}"));
            book.record_run(&run(&f, &p, i != 3, &id, Some((&sop_id, v))));
        }
        assert!(book.consolidate(5).is_empty());
        // Then it breaks.
        for i in 0..10 {
            let (p, id) = (plan("good"), format!("m{i}"));
            book.record_run(&run(&f, &p, false, &id, Some((&sop_id, v))));
        }
        let ev = book.consolidate(6);
        assert!(matches!(&ev[..], [SopEvent::RolledBack(s)] if s.sop_id == sop_id));
        assert!(book.matching_stable_sop(&f).is_none());
        // A new version needs fresh evidence.
        feed(&mut book, &f, "good", 25, 25);
        let ev = book.consolidate(7);
        assert!(matches!(&ev[..], [SopEvent::Promoted(s)] if s.version == v + 1));
        let json = serde_json::to_string(&book.snapshot()).unwrap();
        let back = SopBook::restore(serde_json::from_str(&json).unwrap());
        assert_eq!(back, book);
    }

    /// A two-call procedure of agent stage `answer`, answered by `answer` (a literal).
    fn procedure(query: &str, answer: &str) -> Vec<Procedure> {
        use crate::learn::procedure::{Piece, ProcedureCall, Source};
        vec![Procedure {
            stage: "answer".into(),
            calls: vec![
                ProcedureCall {
                    tool: "search".into(),
                    args: vec![("q".into(), Source::Literal(format!("\"{query}\"")))],
                },
                ProcedureCall {
                    tool: "fetch".into(),
                    args: vec![(
                        "id".into(),
                        Source::Result {
                            call: 0,
                            field: "id".into(),
                        },
                    )],
                },
            ],
            answer: Some(vec![Piece::Text(answer.into())]),
        }]
    }

    /// Records run `i` of the model (`via: None`, having made `p`) or a trial of `via`, passed
    /// when it earned more than 0.5.
    fn procedure_run(
        book: &mut SopBook,
        f: &BTreeMap<String, String>,
        via: Option<&Sop>,
        i: u64,
        reward: f64,
        p: &[Procedure],
    ) {
        let (plan, id) = (plan("model"), format!("run-{}-{i}", via.is_some()));
        book.record_run(&SopRun {
            features: f,
            plan: &plan,
            passed: reward > 0.5,
            reward,
            run_id: &id,
            via_sop: via.map(|s| (s.sop_id.as_str(), s.version)),
            procedure: p,
        });
    }

    fn model_run(
        book: &mut SopBook,
        f: &BTreeMap<String, String>,
        i: u64,
        reward: f64,
        p: &[Procedure],
    ) {
        procedure_run(book, f, None, i, reward, p);
    }

    fn trial_run(book: &mut SopBook, f: &BTreeMap<String, String>, sop: &Sop, i: u64, reward: f64) {
        procedure_run(book, f, Some(sop), i, reward, &[]);
    }

    #[test]
    fn a_procedure_made_again_and_again_is_proposed_and_promoted_on_its_trials_rewards() {
        let mut book = SopBook::new(SopConfig::default());
        let f = feats("A");
        let p = procedure("x", "done");
        // Four passed runs made it: not yet.
        for i in 0..4 {
            model_run(&mut book, &f, i, 0.90, &p);
        }
        assert!(book.consolidate(0).is_empty());
        assert!(book.matching_candidate(&f).is_none());
        model_run(&mut book, &f, 4, 0.90, &p);
        let ev = book.consolidate(1);
        let [SopEvent::Proposed(candidate)] = &ev[..] else {
            panic!("{ev:?}")
        };
        assert_eq!(candidate.status, SopStatus::Candidate);
        assert_eq!(
            candidate.procedure, p,
            "the answers agreed: the template is kept"
        );
        assert_eq!(
            book.matching_candidate(&f).unwrap().sop_id,
            candidate.sop_id
        );
        assert!(
            book.matching_stable_sop(&f).is_none(),
            "a candidate is not in force"
        );
        // The model goes on, earning 0.80-0.89; the trials earn 0.95-0.99.
        for i in 0..40 {
            model_run(&mut book, &f, 10 + i, 0.80 + (i % 10) as f64 * 0.01, &[]);
        }
        for i in 0..19 {
            trial_run(&mut book, &f, candidate, i, 0.95 + (i % 5) as f64 * 0.01);
        }
        assert!(book.consolidate(2).is_empty(), "19 trials < min_trials");
        trial_run(&mut book, &f, candidate, 19, 0.97);
        let ev = book.consolidate(3);
        let [SopEvent::Promoted(sop)] = &ev[..] else {
            panic!("{ev:?}")
        };
        assert_eq!((sop.trials, sop.successes), (20, 20));
        assert!(sop.p_value.unwrap() < 0.05);
        assert_eq!(book.matching_stable_sop(&f).unwrap().procedure, p);
        assert!(book.matching_candidate(&f).is_none());
        // No second proposal while it is in force.
        for i in 0..10 {
            model_run(&mut book, &f, 100 + i, 0.9, &p);
        }
        assert!(book.consolidate(4).is_empty());
    }

    #[test]
    fn a_candidate_that_earns_less_than_the_model_is_rolled_back_and_one_no_better_waits() {
        let mut book = SopBook::new(SopConfig::default());
        let f = feats("A");
        let p = procedure("x", "done");
        for i in 0..5 {
            model_run(&mut book, &f, i, 0.9, &p);
        }
        let ev = book.consolidate(0);
        let [SopEvent::Proposed(candidate)] = &ev[..] else {
            panic!("{ev:?}")
        };
        // As good as the model: no uplift, no promotion, no rollback.
        for i in 0..30 {
            model_run(&mut book, &f, 10 + i, 0.85 + (i % 10) as f64 * 0.01, &[]);
            trial_run(&mut book, &f, candidate, i, 0.85 + (i % 10) as f64 * 0.01);
        }
        assert!(book.consolidate(1).is_empty());
        // Then its trials fail.
        for i in 0..20 {
            trial_run(&mut book, &f, candidate, 30 + i, 0.0);
        }
        let ev = book.consolidate(2);
        assert!(
            matches!(&ev[..], [SopEvent::RolledBack(s)] if s.sop_id == candidate.sop_id),
            "{ev:?}"
        );
        assert!(book.matching_candidate(&f).is_none());
        // Its proposal starts again from nothing.
        assert!(book.consolidate(3).is_empty());
    }

    #[test]
    fn answers_that_do_not_agree_leave_the_answer_to_the_model() {
        let mut book = SopBook::new(SopConfig::default());
        let f = feats("A");
        for i in 0..5 {
            model_run(
                &mut book,
                &f,
                i,
                0.9,
                &procedure("x", &format!("answer {i}")),
            );
        }
        let ev = book.consolidate(0);
        let [SopEvent::Proposed(candidate)] = &ev[..] else {
            panic!("{ev:?}")
        };
        assert_eq!(candidate.procedure[0].calls.len(), 2);
        assert_eq!(candidate.procedure[0].answer, None);
    }

    #[test]
    fn the_calls_most_made_are_proposed() {
        let mut book = SopBook::new(SopConfig::default());
        let f = feats("A");
        for i in 0..6 {
            model_run(&mut book, &f, i, 0.9, &procedure("x", "done"));
        }
        for i in 0..9 {
            model_run(&mut book, &f, 10 + i, 0.9, &procedure("y", "done"));
        }
        let ev = book.consolidate(0);
        let [SopEvent::Proposed(candidate)] = &ev[..] else {
            panic!("{ev:?}")
        };
        assert_eq!(candidate.procedure, procedure("y", "done"));
    }
}
