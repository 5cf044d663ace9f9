//! choices: the plan a policy chooses (information-directed, Thompson, SOP and ranker routing, runs
//! in flight), its propensities, determinism, shortfall and plan search.

use super::*;

/// `rounds` of "cheap" succeeding at extract, "a" succeeding and "b" failing at normalize.
fn learn_cheap_then_a(p: &mut Policy, f: &BTreeMap<String, String>, rounds: usize) {
    for _ in 0..rounds {
        for (s, arm, ok) in [
            ("extract", Arm::new("cheap", "x"), true),
            ("normalize", Arm::new("a", "s"), true),
            ("normalize", Arm::new("b", "s"), false),
        ] {
            p.update(&stage_obs(f.clone(), s, arm, ok, 100.0, 0.001));
        }
    }
}

#[test]
fn an_exploit_plan_takes_the_greedy_share_and_its_propensity_is_the_mixtures() {
    let mut p = policy();
    let f = feats(&[("k", "v")]);
    // "cheap" + "a" is clearly the greedy plan.
    learn_cheap_then_a(&mut p, &f, 40);
    let mut rng = fastrand::Rng::with_seed(3);
    assert_eq!(p.greedy(&f).0, vec![0, 0]);
    let exploit = [1usize, 0];
    let (mut hits, mut reported, n) = (0usize, 0.0, 400);
    for _ in 0..n {
        let c = p.choose_with(&f, Some(&exploit), &mut rng);
        assert_ne!(c.indices, vec![0, 0], "the greedy plan is always replaced");
        // (Exploration may draw the exploit plan too; the propensity covers both ways.)
        assert!(!c.ranked || (c.indices == exploit && c.greedy));
        if c.indices == exploit {
            hits += 1;
            reported += c.plan_propensity;
        }
    }
    assert!(hits > n / 2, "the exploit share is most choices: {hits}");
    let freq = hits as f64 / n as f64;
    let mean_reported = reported / hits as f64;
    assert!(
        (freq - mean_reported).abs() < 0.1,
        "observed {freq} vs reported propensity {mean_reported}"
    );
    // Without an exploit plan (or with a malformed one) the policy's own choice stands.
    let c = p.choose_with(&f, Some(&[5, 0]), &mut rng);
    assert!(!c.ranked);
}

#[test]
fn an_sop_takes_only_the_exploit_draws_and_the_propensities_are_the_mixtures() {
    let mut p = policy();
    let mut config = p.config().clone();
    config.propensity_draws = 400;
    p.set_config(config).expect("a valid configuration");
    let f = feats(&[("k", "v")]);
    learn_cheap_then_a(&mut p, &f, 6);
    let greedy = p.greedy(&f).0;
    assert_eq!(greedy, vec![0, 0]);
    // An SOP whose plan is not the greedy one, with the router's default 90% share.
    let sop = [1usize, 1];
    let routing = Routing {
        sop: Some((&sop, 0.9)),
        ..Routing::default()
    };
    let mut rng = fastrand::Rng::with_seed(11);
    let n = 600;
    let mut counts: BTreeMap<Vec<usize>, (usize, f64)> = BTreeMap::new();
    let (mut to_sop, mut explored) = (0, 0);
    for _ in 0..n {
        let c = p.choose_routed(&f, routing, &mut rng);
        if c.sop {
            to_sop += 1;
            assert_eq!(c.indices, sop);
            assert!(c.explored.is_empty() && c.greedy);
        }
        if !c.explored.is_empty() {
            // An exploration is never routed away to the SOP.
            explored += 1;
            assert!(!c.sop && !c.greedy, "{c:?}");
            assert!(c.indices != greedy);
        }
        let e = counts.entry(c.indices.clone()).or_default();
        e.0 += 1;
        e.1 += c.plan_propensity;
    }
    assert!(explored > 10, "the policy still explores: {explored}");
    // The SOP gets 90% of the draws that landed on the greedy plan; the holdout keeps the
    // rest.
    let holdout = counts.get(&greedy).map_or(0, |c| c.0);
    let share = to_sop as f64 / (to_sop + holdout) as f64;
    assert!((share - 0.9).abs() < 0.04, "{to_sop} vs {holdout}");
    // Each logged propensity is the mixture's: on average it matches how often the plan was
    // chosen.
    for (plan, (k, sum)) in &counts {
        let freq = *k as f64 / n as f64;
        let logged = sum / *k as f64;
        assert!(
            (logged - freq).abs() < 0.05,
            "{plan:?}: logged {logged} vs chosen {freq}"
        );
    }
}

#[test]
fn an_arm_being_explored_in_flight_is_not_explored_again_until_its_result_is_back() {
    let mut p = policy();
    let f = feats(&[("k", "v")]);
    // cheap and a known to work; premium and b untried.
    for _ in 0..3 {
        for (s, arm) in [
            ("extract", Arm::new("cheap", "x")),
            ("normalize", Arm::new("a", "s")),
        ] {
            p.update(&stage_obs(f.clone(), s, arm, true, 100.0, 0.001));
        }
    }
    assert_eq!(p.greedy(&f).0, vec![0, 0]);
    let mut rng = fastrand::Rng::with_seed(5);
    // Unhindered, both departures (premium at extract: flat arm 1; b at normalize: flat
    // arm 3) get explored.
    let mut seen = BTreeMap::<usize, usize>::new();
    for _ in 0..400 {
        for j in p.choose(&f, &mut rng).explored {
            *seen.entry(j).or_default() += 1;
        }
    }
    assert!(seen.get(&1).is_some_and(|&k| k > 5), "{seen:?}");
    assert!(seen.get(&3).is_some_and(|&k| k > 5), "{seen:?}");
    // With premium's exploration in flight, it is not drawn again; b still is.
    let exploring = [1usize];
    let routing = Routing {
        exploring: &exploring,
        ..Routing::default()
    };
    let mut again = BTreeMap::<usize, usize>::new();
    for _ in 0..400 {
        let c = p.choose_routed(&f, routing, &mut rng);
        assert_eq!(c.indices[0], 0, "{c:?}");
        for j in c.explored {
            *again.entry(j).or_default() += 1;
        }
    }
    assert!(!again.contains_key(&1), "{again:?}");
    assert!(again.get(&3).is_some_and(|&k| k > 5), "{again:?}");
}

#[test]
fn a_choice_of_four_stages_explores_one_stage_at_a_time_unless_told_otherwise() {
    // Four stages of three arms; one observation each of the first arms, so that every
    // stage is uncertain and a posterior draw often departs from the greedy plan in several.
    let stages = uniform_stages(4, 3);
    let mut p = Policy::new(PolicyConfig::default(), stages).expect("valid stages");
    let f = feats(&[("k", "v")]);
    for s in 0..4 {
        p.update(&stage_obs(
            f.clone(),
            &format!("s{s}"),
            Arm::new("t0", "x"),
            true,
            100.0,
            0.001,
        ));
    }
    let departures = |p: &Policy, rng: &mut fastrand::Rng| -> Vec<usize> {
        let greedy = p.greedy(&f).0;
        (0..300)
            .map(|_| {
                let c = p.choose(&f, rng);
                c.indices
                    .iter()
                    .zip(&greedy)
                    .filter(|(a, b)| a != b)
                    .count()
            })
            .collect()
    };
    let mut rng = fastrand::Rng::with_seed(5);
    // Information-directed sampling departs in one stage at most by construction.
    let one = departures(&p, &mut rng);
    assert!(one.iter().all(|&d| d <= 1), "{one:?}");
    assert!(one.contains(&1), "it still explores");
    // Thompson sampling, as told.
    p.set_config(thompson()).expect("a valid configuration");
    let one = departures(&p, &mut rng);
    assert!(one.iter().all(|&d| d <= 1), "{one:?}");
    assert!(one.contains(&1), "it still explores");
    p.tuning.one_stage_exploration_from = 0;
    let many = departures(&p, &mut rng);
    assert!(many.iter().any(|&d| d >= 2), "{many:?}");
}

#[test]
fn optimistic_draws_never_fall_below_the_mean() {
    let f = feats(&[("filetype", "pdf")]);
    let teach = |p: &mut Policy| {
        for i in 0..20 {
            let arm = Arm::new("b", "s");
            p.update(&stage_obs(
                f.clone(),
                "normalize",
                arm,
                i % 2 == 0,
                200.0,
                0.001,
            ));
        }
    };
    let mut rng = fastrand::Rng::with_seed(3);
    let mut p = policy();
    teach(&mut p);
    let j = p.arm_index("normalize", &Arm::new("b", "s")).unwrap();
    let eff = p.effective(&f);
    assert!((0..2000).all(|_| eff.sample(j, &mut rng) >= eff.mean[j]));
    let below = (0..2000)
        .filter(|_| eff.sample_plain(j, &mut rng) < eff.mean[j])
        .count();
    assert!(below > 500, "{below} of 2000 plain draws below the mean");
}

/// One stage: "leader" 16 of 20, "close" 3 of 4 (a contender, uncertain), "far" 1 of 2
/// (more uncertain, further behind). The shares of 4,000 first attempts (seeded) that are
/// "close" and "far".
fn contender_shares(config: PolicyConfig) -> (f64, f64) {
    let mut p = Policy::new(config, search_stage(&["leader", "close", "far"])).unwrap();
    let f = feats(&[("topic", "news")]);
    search_spread(&mut p, &f, "leader", 16, 4);
    search_spread(&mut p, &f, "close", 3, 1);
    search_spread(&mut p, &f, "far", 1, 1);
    (draw_share(&p, &f, &[1], 9), draw_share(&p, &f, &[2], 9))
}

#[test]
fn information_directed_choices_try_a_close_contender_and_leave_a_far_arm_alone() {
    // Thompson sampling gives both their chance of being the best (0.139 and 0.024 here);
    // information-directed sampling alone weighs the price too (0.135 and 0.0003).
    let (close, far) = contender_shares(ids_alone());
    let (close_ts, far_ts) = contender_shares(thompson());
    assert!(close > 0.1 && close_ts > 0.1, "close: {close}, {close_ts}");
    assert!(
        far_ts > 0.01 && far < far_ts / 10.0,
        "far: {far}, Thompson sampling {far_ts}"
    );
    // The default leaves a tenth of the choices to Thompson sampling: the far arm gets its
    // second look at about a tenth of Thompson sampling's rate, not never.
    let (close_mixed, far_mixed) = contender_shares(PolicyConfig::default());
    assert!(close_mixed > 0.1, "close: {close_mixed}");
    assert!(
        far_mixed > far_ts / 20.0 && far_mixed < far_ts / 5.0,
        "far: {far_mixed}, Thompson sampling {far_ts}, alone {far}"
    );
}

#[test]
fn choices_are_deterministic_given_the_seed_and_propensities_are_probabilities() {
    let mut p1 = policy();
    let mut p2 = policy();
    let f = feats(&[("tenant", "B")]);
    let (mut r1, mut r2) = (fastrand::Rng::with_seed(9), fastrand::Rng::with_seed(9));
    for _ in 0..50 {
        let a = simulate(&mut p1, &f, &mut r1);
        let b = simulate(&mut p2, &f, &mut r2);
        assert_eq!(a, b);
        assert!(a.plan_propensity > 0.0 && a.plan_propensity <= 1.0);
        let prod: f64 = a.plan.iter().map(|c| c.propensity).product();
        assert!((prod - a.plan_propensity).abs() < 1e-12);
    }
}

#[test]
fn shortfall_measures_a_plan_against_the_greedy_one() {
    let mut p = policy();
    let mut rng = fastrand::Rng::with_seed(5);
    let f = feats(&[("filetype", "pdf"), ("tenant", "A")]);
    for _ in 0..300 {
        simulate(&mut p, &f, &mut rng);
    }
    let plan = |a: &str, b: &str| {
        vec![
            ArmChoice {
                stage: "extract".into(),
                tool: a.into(),
                strategy: "x".into(),
                propensity: 1.0,
            },
            ArmChoice {
                stage: "normalize".into(),
                tool: b.into(),
                strategy: "s".into(),
                propensity: 1.0,
            },
        ]
    };
    // The reward-best plan (cheap, a) falls short of nothing; the slow, costly and less
    // valid one (premium, b) by a lot.
    assert_eq!(p.greedy(&f).0, vec![0, 0]);
    assert!(p.shortfall(&f, &plan("cheap", "a")).unwrap() < 1e-9);
    let gap = p.shortfall(&f, &plan("premium", "b")).unwrap();
    assert!(gap > 0.2, "{gap}");
    // A plan the policy cannot read is not judged.
    assert_eq!(p.shortfall(&f, &plan("nope", "a")), None);
    assert_eq!(p.shortfall(&f, &plan("cheap", "a")[..1]), None);
}

#[test]
fn coordinate_ascent_handles_many_plans() {
    let stages = uniform_stages(6, 5);
    let mut p = tuned(PolicyConfig::default(), stages, |t| t.max_enumerate = 100);
    assert_eq!(p.plan_count(), 15625);
    let f = feats(&[("k", "v")]);
    for _ in 0..30 {
        let mut so = Vec::new();
        for s in 0..6 {
            for a in 0..5 {
                so.push(StageObservation {
                    stage: format!("s{s}"),
                    arm: Arm::new(format!("t{a}"), "x"),
                    outcome: if a == s % 5 {
                        StageOutcome::Valid
                    } else {
                        StageOutcome::Invalid
                    },
                    latency_ms: 100.0,
                    cost: 0.001,
                });
            }
        }
        p.update(&Observation {
            features: f.clone(),
            stages: so,
        });
    }
    let (plan, _) = p.greedy(&f);
    assert_eq!(plan, vec![0, 1, 2, 3, 4, 0]);
    let mut rng = fastrand::Rng::with_seed(1);
    assert_eq!(p.choose(&f, &mut rng).indices.len(), 6);
}

#[test]
fn choices_from_one_table_are_the_rules_own_and_log_the_probability_they_were_picked_with() {
    let mut p = policy();
    let f = feats(&[("k", "v")]);
    // Some evidence, not settled: the rule explores now and then.
    learn_cheap_then_a(&mut p, &f, 3);
    let rule = p.plan_distribution(&f, 20_000, &mut fastrand::Rng::with_seed(5));
    assert!(rule.len() > 1, "the rule explores: {rule:?}");
    let sop = [1usize, 1];
    let routing = Routing {
        sop: Some((&sop, 0.5)),
        ..Routing::default()
    };
    let first = p.config().propensity_draws + 1;
    let mut tables = DrawTables::default();
    let mut rng = fastrand::Rng::with_seed(6);
    let n = 4_000;
    let mut counts: BTreeMap<Vec<usize>, usize> = BTreeMap::new();
    let mut ips = 0.0;
    for i in 0..n {
        let c = p.choose_tabled(&f, routing, &mut tables, &mut rng);
        // The i-th choice since the policy last changed picks among `first + i` draws: its
        // propensity is a count of them (halved when the router's coin was tossed).
        let draws = (first + i) as f64;
        let counted = c.plan_propensity * draws * 2.0;
        assert!(
            (counted - counted.round()).abs() < 1e-6 && c.plan_propensity > 0.0,
            "choice {i}: propensity {} of {draws} draws",
            c.plan_propensity
        );
        *counts.entry(c.indices.clone()).or_default() += 1;
        // Inverse-propensity estimate of the chance of the SOP's plan, which is 1 for it.
        if c.indices == sop {
            ips += 1.0 / c.plan_propensity;
        }
    }
    // The choices follow the rule: the policy's own plans at its rates, with the share of the
    // greedy plan split by the router's coin.
    let greedy = p.greedy(&f).0;
    for (plan, share) in &rule {
        let expected = if *plan == greedy { share / 2.0 } else { *share };
        let got = counts.get(plan).copied().unwrap_or(0) as f64 / n as f64;
        assert!(
            (got - expected).abs() < 0.03,
            "plan {plan:?}: chosen {got:.3}, the rule's {expected:.3}"
        );
    }
    let ips = ips / n as f64;
    assert!((ips - 1.0).abs() < 0.05, "inverse-propensity sum {ips:.3}");
    // Once the policy learns, the next choice draws a new table.
    learn_cheap_then_a(&mut p, &f, 1);
    let c = p.choose_tabled(&f, routing, &mut tables, &mut rng);
    let counted = c.plan_propensity * first as f64 * 2.0;
    assert!(
        (counted - counted.round()).abs() < 1e-6,
        "{}",
        c.plan_propensity
    );
}

#[test]
fn draw_tables_are_kept_for_at_most_max_tables_features() {
    let p = policy();
    let mut tables = DrawTables::default();
    let mut rng = fastrand::Rng::with_seed(8);
    for i in 0..super::super::draws::MAX_TABLES + 10 {
        let f = feats(&[("user", &format!("u{i}"))]);
        p.choose_tabled(&f, Routing::default(), &mut tables, &mut rng);
        assert!(tables.len() <= super::super::draws::MAX_TABLES);
    }
    // Past the cap the tables started again: the last ten features have theirs, and the next
    // choice for one of them adds to it.
    assert_eq!(tables.len(), 10);
    let f = feats(&[("user", &format!("u{}", super::super::draws::MAX_TABLES + 9))]);
    p.choose_tabled(&f, Routing::default(), &mut tables, &mut rng);
    assert_eq!(tables.len(), 10);
}

#[test]
fn a_tables_shortfall_is_the_policys_and_leaves_the_first_choice_its_draws() {
    let mut p = policy();
    let f = feats(&[("k", "v")]);
    learn_cheap_then_a(&mut p, &f, 3);
    let mut tables = DrawTables::default();
    for plan in [[0usize, 0], [0, 1], [1, 0], [1, 1]] {
        assert_eq!(
            tables.shortfall(&p, &f, &plan),
            p.shortfall_of(&f, &plan),
            "{plan:?}"
        );
    }
    assert_eq!(tables.shortfall(&p, &f, &[0]), None, "one arm short");
    assert_eq!(tables.shortfall(&p, &f, &[0, 9]), None, "an unknown arm");
    // The table it made has no draws: the first choice from it draws the first table's
    // draws, the same choice (and random stream) as without it.
    let mut fresh = DrawTables::default();
    let (mut a, mut b) = (fastrand::Rng::with_seed(11), fastrand::Rng::with_seed(11));
    for _ in 0..3 {
        let with = p.choose_tabled(&f, Routing::default(), &mut tables, &mut a);
        let without = p.choose_tabled(&f, Routing::default(), &mut fresh, &mut b);
        assert_eq!(with.indices, without.indices);
        assert_eq!(with.plan_propensity, without.plan_propensity);
    }
    assert_eq!(a.u64(..), b.u64(..));
    // Once the policy learns, the shortfall reads its new beliefs.
    learn_cheap_then_a(&mut p, &f, 2);
    assert_eq!(
        tables.shortfall(&p, &f, &[1, 1]),
        p.shortfall_of(&f, &[1, 1])
    );
}
