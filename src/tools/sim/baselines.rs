//! baselines: the walk over every plan that gives a task's oracle and random baseline, and the
//! memo that lets tasks with the same numbers in force share one walk (a thousand tasks of an
//! environment with a few dozen feature combinations walk a few dozen times, not a thousand).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Baselines, RewardConfig, Stage};

/// Walks kept at most; past this the memo starts again (a bound for long-lived holders).
const MEMO_CAPACITY: usize = 4096;

/// Baselines already walked, by the exact bits of the arms' numbers they were walked from.
#[derive(Debug, Default)]
pub(super) struct Memo {
    walked: Mutex<HashMap<Vec<u64>, Baselines>>,
    /// Walks made (the memo missed).
    walks: AtomicU64,
}

impl Memo {
    /// The baselines of `numbers` (per stage, per arm: pass probability, latency, cost), from
    /// the memo or walked (then kept). A poisoned lock only costs the memo, not the answer.
    pub(super) fn get_or_walk(
        &self,
        stages: &[Stage],
        reward: &RewardConfig,
        numbers: &[Vec<(f64, f64, f64)>],
    ) -> Baselines {
        // One environment's memo: its stages' arm counts never change, so the bits suffice.
        let key: Vec<u64> = numbers
            .iter()
            .flatten()
            .flat_map(|&(p, l, c)| [p.to_bits(), l.to_bits(), c.to_bits()])
            .collect();
        if let Some(b) = self.walked.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return b;
        }
        let b = walk(stages, reward, numbers);
        self.walks.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut m) = self.walked.lock() {
            if m.len() >= MEMO_CAPACITY {
                m.clear();
            }
            m.insert(key, b.clone());
        }
        b
    }

    /// Walks made so far (each a miss of the memo).
    #[cfg(test)]
    pub(super) fn walks(&self) -> u64 {
        self.walks.load(Ordering::Relaxed)
    }
}

/// The oracle and the random baseline over every plan of `numbers` (per stage, per arm: pass
/// probability, latency, cost), walked in file order with running products and sums so that no
/// plan is ever built.
fn walk(stages: &[Stage], reward: &RewardConfig, numbers: &[Vec<(f64, f64, f64)>]) -> Baselines {
    if numbers.iter().any(Vec::is_empty) {
        return Baselines {
            oracle_plan: Vec::new(),
            oracle: f64::NEG_INFINITY,
            random: 0.0,
        };
    }
    let k = numbers.len();
    // prefix[d] = (p_pass, latency, cost) over stages 0..d of the current plan.
    let mut prefix = vec![(1.0, 0.0, 0.0); k + 1];
    let mut at = vec![0usize; k];
    let fill = |prefix: &mut [(f64, f64, f64)], at: &[usize], from: usize| {
        for d in from..k {
            let (p, l, c) = prefix[d];
            let (ap, al, ac) = numbers[d][at[d]];
            prefix[d + 1] = (p * ap, l + al, c + ac);
        }
    };
    fill(&mut prefix, &at, 0);
    let (mut best, mut best_at) = (f64::NEG_INFINITY, at.clone());
    let (mut sum, mut count) = (0.0, 0u64);
    'plans: loop {
        let (p, l, c) = prefix[k];
        let value = (p * reward.gross(l, c)).clamp(0.0, 1.0);
        if value > best {
            best = value;
            best_at.clone_from(&at);
        }
        sum += value;
        count += 1;
        // The next plan in file order: the last stage turns fastest.
        let mut d = k;
        loop {
            if d == 0 {
                break 'plans;
            }
            d -= 1;
            at[d] += 1;
            if at[d] < numbers[d].len() {
                break;
            }
            at[d] = 0;
        }
        fill(&mut prefix, &at, d);
    }
    let oracle_plan = best_at
        .iter()
        .zip(stages)
        .filter_map(|(&j, s)| s.arms.get(j))
        .map(|a| (a.tool.clone(), a.strategy.clone()))
        .collect();
    Baselines {
        oracle_plan,
        oracle: best,
        random: sum / count as f64,
    }
}
