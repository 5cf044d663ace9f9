//! draws: the plans a policy has drawn for one task's features since it last changed, which its
//! choices are picked from and their propensities read off exactly.
//!
//! A choice used to be one draw of the policy's rule and its propensity the share of that plan
//! among `propensity_draws` more: every choice paid `propensity_draws + 1` draws, each of them
//! `samples` posterior samples of every arm under information-directed sampling. Picking the
//! choice uniformly among those draws instead is the same choice (the draws are exchangeable)
//! and makes the logged propensity exact given the draws (the plan's share of them is the
//! probability it was picked with), so off-policy estimates stay unbiased. The draws stay
//! valid while the posterior they were made from does: the next choice for the same features
//! before the policy learns anything adds one draw to them and picks from them all, and each
//! such choice costs one draw instead of `propensity_draws + 1`. A burst of tasks of one kind
//! (a restart resuming every unfinished run, a batch submitted at once) pays for the first.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use super::Policy;
use super::beliefs::Eff;
use super::choice::Scratch;

/// Versions handed to policies: a policy takes a new one at its creation and at every change
/// of its beliefs or configuration, so that draws made under one version are never read under
/// another (a clone shares its original's until either changes).
static VERSIONS: AtomicU64 = AtomicU64::new(1);

/// A version no policy had before.
pub(super) fn next_version() -> u64 {
    VERSIONS.fetch_add(1, Ordering::Relaxed)
}

/// Task features whose draws are kept at once: a burst of tasks that differ in every feature
/// (a user's id among them, say) would otherwise keep a table for each until the policy learns.
/// Past it, the tables start again (a table is a few kilobytes: its beliefs and buffers).
pub const MAX_TABLES: usize = 1024;

/// The plans drawn per task features while the policy stays at one version (see the module's
/// documentation); the caller keeps it next to the policy ([`Policy::choose_tabled`]).
#[derive(Debug, Clone, Default)]
pub struct DrawTables {
    /// The policy version the tables were drawn under (0 = none yet).
    version: u64,
    tables: HashMap<BTreeMap<String, String>, DrawTable>,
}

impl DrawTables {
    /// The table of `features` under `policy` as it is now, with one draw more when it had
    /// draws already, or `first` draws when it had none.
    pub(super) fn table(
        &mut self,
        policy: &Policy,
        features: &BTreeMap<String, String>,
        first: usize,
        rng: &mut fastrand::Rng,
    ) -> &mut DrawTable {
        let table = self.entry(policy, features);
        let draws = if table.total == 0 { first } else { 1 };
        table.draw(policy, draws, rng);
        table
    }

    /// How much less `policy` expects from `plan` than from its greedy plan for `features`
    /// ([`Policy::shortfall_of`]), from the beliefs of their table (made, without draws, when
    /// there is none): a choice that weighs a ranker's or an SOP's plan reads the beliefs it
    /// draws from instead of working them out again.
    pub fn shortfall(
        &mut self,
        policy: &Policy,
        features: &BTreeMap<String, String>,
        plan: &[usize],
    ) -> Option<f64> {
        let plan = policy.valid_plan(Some(plan))?;
        let table = self.entry(policy, features);
        Some(policy.shortfall_in(&table.eff, table.greedy_value, plan))
    }

    /// The table of `features` under `policy` as it is now (new ones have no draws yet).
    fn entry(&mut self, policy: &Policy, features: &BTreeMap<String, String>) -> &mut DrawTable {
        if self.version != policy.version {
            self.tables.clear();
            self.version = policy.version;
        }
        if self.tables.len() >= MAX_TABLES && !self.tables.contains_key(features) {
            self.tables.clear();
        }
        match self.tables.entry(features.clone()) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => v.insert(DrawTable::new(policy, features)),
        }
    }
}

#[cfg(test)]
impl DrawTables {
    /// Task features with a table.
    pub(super) fn len(&self) -> usize {
        self.tables.len()
    }
}

/// The plans a policy drew for one task's features (the raw draws of its rule, before any
/// routing), with the beliefs they were drawn from.
#[derive(Debug, Clone)]
pub(super) struct DrawTable {
    /// The task's beliefs.
    pub(super) eff: Eff,
    /// The greedy plan under them.
    pub(super) greedy: Vec<usize>,
    /// Its expected reward.
    pub(super) greedy_value: f64,
    scratch: Scratch,
    /// Each distinct plan drawn and how many times.
    plans: Vec<(Vec<usize>, u64)>,
    /// Draws in all.
    total: u64,
    /// The plan being drawn.
    buf: Vec<usize>,
}

impl DrawTable {
    /// The table of `policy`'s beliefs for `features`, with no draws yet.
    pub(super) fn new(policy: &Policy, features: &BTreeMap<String, String>) -> DrawTable {
        let eff = policy.effective(features);
        let (greedy, greedy_value) = policy.greedy_in(&eff);
        let scratch = Scratch::new(policy, &greedy);
        DrawTable {
            eff,
            greedy,
            greedy_value,
            scratch,
            plans: Vec::new(),
            total: 0,
            buf: Vec::new(),
        }
    }

    /// `draws` more draws (at least one).
    pub(super) fn draw(&mut self, policy: &Policy, draws: usize, rng: &mut fastrand::Rng) {
        for _ in 0..draws.max(1) {
            self.draw_one(policy, rng);
        }
    }

    /// One more draw.
    fn draw_one(&mut self, policy: &Policy, rng: &mut fastrand::Rng) {
        policy.rule_draw(
            &self.eff,
            &self.greedy,
            &mut self.scratch,
            rng,
            &mut self.buf,
        );
        self.total += 1;
        match self.plans.iter_mut().find(|(p, _)| *p == self.buf) {
            Some((_, n)) => *n += 1,
            None => self.plans.push((self.buf.clone(), 1)),
        }
    }

    /// One of the draws, each as likely.
    pub(super) fn pick(&self, rng: &mut fastrand::Rng) -> &[usize] {
        let mut x = rng.u64(0..self.total.max(1));
        for (plan, n) in &self.plans {
            if x < *n {
                return plan;
            }
            x -= n;
        }
        &self.greedy
    }

    /// Each distinct plan drawn with its share of the draws.
    pub(super) fn shares(&self) -> impl Iterator<Item = (&[usize], f64)> {
        let total = self.total.max(1) as f64;
        self.plans
            .iter()
            .map(move |(p, n)| (p.as_slice(), *n as f64 / total))
    }
}
