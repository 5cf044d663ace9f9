//! ids: the choice of information-directed sampling (Russo and Van Roy, "Learning to Optimize
//! via Information-Directed Sampling", 2018, in its variance-based form): given posterior samples
//! of each candidate action's value, the action whose expected regret squared is smallest for
//! the information its outcome gives about which action is the best.
//!
//! Thompson sampling explores an action as often as the posterior thinks it is the best; this
//! choice also weighs what exploring costs. A close contender whose outcome would settle which
//! of the two is best is worth a try; an action that is far behind, or whose value would tell
//! nothing about the ranking, is not, however uncertain it is.

/// The action to take: the index (into the `actions` candidates) minimising
/// `regret^2 / information`, from `values`, where `values[i * actions + k]` is action `k`'s value
/// under posterior sample `i`. `None` when there is no candidate or no sample.
///
/// An action's expected regret is the samples' mean of the best value minus its own; its
/// information is the variance, over which action is the best, of its value's mean given that
/// action: how much learning its value would move the belief in the best action. An action
/// with no regret is free and taken; ties go to the lowest index (put the greedy plan first).
pub fn choose(values: &[f64], actions: usize) -> Option<usize> {
    if actions == 0 || values.len() < actions {
        return None;
    }
    let samples = values.len() / actions;
    let n = samples as f64;
    let row = |i: usize| &values[i * actions..(i + 1) * actions];
    // Per sample, its best action; per best action seen, a slot with its count and value sums.
    let mut slot_of = vec![usize::MAX; actions];
    let mut slots: Vec<(f64, Vec<f64>)> = Vec::new();
    let mut mean = vec![0.0; actions];
    let mut best_mean = 0.0;
    for i in 0..samples {
        let r = row(i);
        let (best, top) =
            r.iter().enumerate().fold(
                (0, f64::NEG_INFINITY),
                |(b, t), (k, &v)| {
                    if v > t { (k, v) } else { (b, t) }
                },
            );
        best_mean += top / n;
        if slot_of[best] == usize::MAX {
            slot_of[best] = slots.len();
            slots.push((0.0, vec![0.0; actions]));
        }
        let slot = &mut slots[slot_of[best]];
        slot.0 += 1.0;
        for ((sum, m), &v) in slot.1.iter_mut().zip(mean.iter_mut()).zip(r) {
            *sum += v;
            *m += v / n;
        }
    }
    let mut choice: Option<(f64, usize)> = None;
    for (k, &m) in mean.iter().enumerate() {
        let regret = (best_mean - m).max(0.0);
        let information: f64 = slots
            .iter()
            .map(|(count, sums)| {
                let d = sums[k] / count - m;
                count / n * d * d
            })
            .sum();
        let ratio = if regret <= 0.0 {
            0.0
        } else if information > 0.0 {
            regret * regret / information
        } else {
            f64::INFINITY
        };
        if choice.is_none_or(|(r, _)| ratio < r) {
            choice = Some((ratio, k));
        }
    }
    choice.map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `samples` rows of values for the actions, from a function of the sample index.
    fn table(samples: usize, f: impl Fn(usize) -> Vec<f64>) -> (Vec<f64>, usize) {
        let rows: Vec<Vec<f64>> = (0..samples).map(f).collect();
        let actions = rows.first().map_or(0, Vec::len);
        (rows.concat(), actions)
    }

    #[test]
    fn a_settled_belief_takes_the_best_action() {
        // Action 0 is the best in every sample: no regret, nothing to learn.
        let (v, k) = table(16, |i| vec![0.8, 0.5 + 0.01 * i as f64 / 16.0, 0.3]);
        assert_eq!(choose(&v, k), Some(0));
    }

    #[test]
    fn a_close_uncertain_contender_is_tried_and_a_far_one_is_not() {
        // Action 0 is known (0.70); action 1 is uncertain around 0.68 and best in half the
        // samples; action 2 is as uncertain but around 0.40, never the best.
        let (v, k) = table(32, |i| {
            let swing = if i % 2 == 0 { 0.1 } else { -0.14 };
            vec![0.70, 0.68 + swing, 0.40 + swing]
        });
        assert_eq!(choose(&v, k), Some(1));
        // With the contender far behind, the known best is kept.
        let (v, k) = table(32, |i| {
            let swing = if i % 2 == 0 { 0.1 } else { -0.14 };
            vec![0.70, 0.40 + swing, 0.30 + swing]
        });
        assert_eq!(choose(&v, k), Some(0));
    }

    #[test]
    fn uncertainty_that_changes_no_ranking_is_not_explored() {
        // Action 1 swings widely but stays below action 0 in every sample: its outcome would
        // not move the belief in the best action, so it is not worth its regret.
        let (v, k) = table(32, |i| vec![0.9, if i % 2 == 0 { 0.85 } else { 0.2 }]);
        assert_eq!(choose(&v, k), Some(0));
    }

    #[test]
    fn no_candidates_or_samples_choose_nothing() {
        assert_eq!(choose(&[], 0), None);
        assert_eq!(choose(&[], 3), None);
        assert_eq!(choose(&[0.5, 0.4], 3), None);
    }
}
